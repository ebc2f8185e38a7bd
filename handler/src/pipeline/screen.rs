//! The screen: before any request to the apiserver, the instances the
//! trigger names are described once, and those EC2 shows as another
//! cluster's (tags, VPC) are let go. Every cluster's function hears of every
//! instance of its account and region that stops; for one that is not its
//! own it makes one EC2 call and nothing else. The answers are kept as the
//! confirmation of the instances that stay, so no instance is asked twice,
//! and their private DNS names let the Nodes be read by name.

use std::collections::HashMap;

use tracing::info;

use super::{Ctx, confirm};
use crate::core::decide::{Skip, Verdict};
use crate::core::facts::Confirmation;
use crate::core::instance::InstanceId;
use crate::core::ownership::{self, Foreign};
use crate::core::plan::{self, NodeRun};
use crate::core::policy::Policy;
use crate::core::resolve::Resolution;
use crate::core::suspect::{NodeRef, Suspect};

/// What the screen leaves: the suspects to look up in Kubernetes, the runs
/// of those let go, and what EC2 said.
pub(super) struct Screened {
    pub(super) suspects: Vec<Suspect>,
    pub(super) foreign: Vec<NodeRun>,
    pub(super) confirmations: HashMap<InstanceId, Confirmation>,
}

/// Describes the instances the suspects name and, when the cluster's
/// identity is known, lets go those of other clusters. Without an identity
/// it describes them only when every suspect is named by instance.
pub(super) async fn screen(ctx: &Ctx<'_>, policy: &Policy, suspects: Vec<Suspect>) -> Screened {
    let mut ids: Vec<InstanceId> = suspects
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
    let by_instance = suspects
        .iter()
        .all(|s| matches!(s.target, NodeRef::Instance(_)));
    if ids.is_empty() || !(policy.identity.is_known() || by_instance) {
        return Screened {
            suspects,
            foreign: Vec::new(),
            confirmations: HashMap::new(),
        };
    }
    let confirmations = confirm::instances(ctx, &ids).await;
    if !policy.identity.is_known() {
        return Screened {
            suspects,
            foreign: Vec::new(),
            confirmations,
        };
    }
    let why = |id: &InstanceId| {
        plan::seen(Some(id), &confirmations)
            .and_then(|facts| ownership::foreign(facts, &policy.identity))
    };
    let (mut kept, mut foreign) = (Vec::new(), Vec::new());
    for suspect in suspects {
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
    let targets = plan::targets(suspects, resolutions, &[], &confirmations, None);
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
    let foreign = plan::plan(&targets, &verdicts, &[], &confirmations);
    Screened {
        suspects: kept,
        foreign,
        confirmations,
    }
}
