//! The screen: before any request to the apiserver, the machines the
//! trigger names are described once, and those the cloud shows as another
//! cluster's (tags, VPC) are let go. Every cluster's function hears of every
//! instance of its account and region that stops; for one that is not its
//! own it makes one cloud call and nothing else. The answers are the first
//! look at the machines that stay, so none is asked twice, and their private
//! DNS names let the Nodes be read by name.

use tracing::info;

use crate::core::inbound::suspect::{NodeRef, Suspect};
use crate::core::model::instance::InstanceId;
use crate::core::rules::decide::{Skip, Verdict};
use crate::core::rules::ownership::{self, Foreign};
use crate::core::rules::plan;
use crate::core::rules::resolve::Resolution;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;

/// Describes the machines the suspects name and, when the cluster's
/// identity is known, settles those of other clusters. Without an identity
/// it describes them only when every suspect is named by instance.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let mut ids: Vec<InstanceId> = inv
        .suspects
        .iter()
        .filter_map(|s| match &s.target {
            NodeRef::Instance(id) => Some(id.clone()),
            NodeRef::Name(_) | NodeRef::Address(_) => None,
        })
        .collect();
    ids.sort();
    ids.dedup();
    // Worth a call of its own only to screen, or to read every Node by
    // name; otherwise the decision's one batched call asks about them all.
    let by_instance = inv
        .suspects
        .iter()
        .all(|s| matches!(s.target, NodeRef::Instance(_)));
    let identity = &inv.policy.identity;
    if ids.is_empty() || !(identity.is_known() || by_instance) {
        return Ok(());
    }
    inv.looks.first(ctx, &ids).await;
    if !identity.is_known() {
        return Ok(());
    }
    let answers = inv.looks.answers();
    let why = |id: &InstanceId| {
        plan::seen(Some(id), answers).and_then(|facts| ownership::foreign(facts, identity))
    };
    let (mut kept, mut foreign): (Vec<Suspect>, Vec<(Suspect, InstanceId)>) =
        (Vec::new(), Vec::new());
    for suspect in std::mem::take(&mut inv.suspects) {
        match &suspect.target {
            NodeRef::Instance(id) if why(id).is_some() => {
                let id = id.clone();
                foreign.push((suspect, id));
            }
            _ => kept.push(suspect),
        }
    }
    let resolutions = foreign
        .iter()
        .map(|(_, id)| Resolution::Instance(id.clone()))
        .collect();
    let suspects = foreign.into_iter().map(|(s, _)| s).collect();
    let targets = plan::targets(suspects, resolutions, &[], answers, None);
    let verdicts: Vec<Verdict> = targets
        .iter()
        .map(|t| {
            // Every target here is a foreign instance; the fallback keeps
            // the verdicts in step with the targets all the same.
            let reason = t
                .instance
                .as_ref()
                .and_then(why)
                .map_or(Skip::NotInCluster, Foreign::skip);
            info!(suspect = %t.reference, reason = reason.code(), "another cluster's instance: not looked up");
            Verdict::Skip { reason }
        })
        .collect();
    let settled = plan::plan(&targets, &verdicts, &[], answers);
    inv.suspects = kept;
    inv.settle(settled);
    Ok(())
}
