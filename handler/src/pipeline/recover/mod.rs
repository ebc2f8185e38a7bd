//! The recovery check, a small workflow of its own: every invocation looks
//! at the nodes node-fencer fenced that are Ready again (and at those a
//! trigger asks to recover), records an operator's confirmation first,
//! gathers what the decision needs ([`view`]), waits out the settle delay
//! once for a requested node that only lacks it, and ends each fencing
//! [`crate::core::rules::recovery::decide`] says is safe to end ([`end`]).

mod end;
mod view;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tracing::{info, warn};

use crate::core::inbound::suspect::{Intent, NodeRef, Suspect};
use crate::core::model::facts::{NodeFacts, Readiness};
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::outbound::report::RecoveryReport;
use crate::core::rules::recovery::{Hold, RecoveryVerdict};
use crate::core::rules::resolve::{self, Resolution};
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::wait;
use crate::shell::cluster::ConfirmOutcome;
use view::{Candidate, Rules, View};

/// Runs the recovery check over the fenced nodes and the requested ones.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let left = inv.left();
    let Invocation {
        policy,
        switch,
        looks,
        view,
        requested,
        recoveries,
        confirming,
        ..
    } = inv;
    let nodes = view.as_ref().map_or(&[][..], |v| v.nodes.as_slice());
    let candidates = candidates(nodes, std::mem::take(requested), recoveries);
    if candidates.is_empty() {
        return Ok(());
    }
    let rules = Rules {
        settle: policy.recovery_settle,
        policy: policy.recovery,
    };
    let first_seen = ctx.now().as_second();
    let started = tokio::time::Instant::now();
    // An operator's confirmations are written first; the decision reads them
    // back from the Nodes.
    let (confirmed, confirm_errors) =
        confirm(ctx, switch.is_on(), &candidates, confirming.as_deref()).await;
    let reread;
    let nodes = if confirmed.is_empty() {
        nodes
    } else {
        reread = read_again(ctx, nodes, &confirmed).await;
        &reread[..]
    };
    let mut view = View::gather(ctx, rules, nodes, &candidates, (looks, false)).await;
    let mut verdicts = view.decide(rules, &candidates, (0, ctx.now().as_second()));
    // A requested recovery that only waits for the settle delay waits here,
    // once, rather than for a retry minutes later.
    if let Some(secs) = settling(&verdicts, &candidates)
        && !switch.is_on()
    {
        let pause = Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(rules.settle);
        // Never past the request: a node not settled by then is the retry's.
        let pause = left.map_or(pause, |left| pause.min(left));
        info!(
            wait_s = pause.as_secs(),
            "a requested node is Ready again; waiting out the settle delay"
        );
        let ns = &policy.control_namespace;
        wait::pause(ctx, switch, ns, pause, "the settle delay").await;
        match ctx.reads.list_nodes().await {
            Ok(fresh) => {
                // After the wait, every machine is asked again.
                view = View::gather(ctx, rules, &fresh, &candidates, (looks, true)).await;
                let waited = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
                verdicts = view.decide(rules, &candidates, (waited, ctx.now().as_second()));
            }
            Err(e) => {
                // The verdicts before the delay stand: still settling, so
                // a requested recovery reports waiting and is retried.
                ctx.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "could not re-read the nodes after the settle delay");
            }
        }
    }
    let context = end::Context {
        dry_run: switch.is_on(),
        rules,
        first_seen,
        view: &view,
        confirm_errors: &confirm_errors,
    };
    for (name, verdict) in verdicts {
        if let Some(report) = end::conclude(ctx, &context, &candidates[&name], &name, verdict).await
        {
            recoveries.push(report);
        }
    }
    Ok(())
}

/// The nodes to look at: routinely, only the fenced nodes that are Ready
/// again (one still down cannot recover, and asking the cloud about it on
/// every invocation is waste); and every node a request names. A request
/// that names no Node is reported at once.
fn candidates(
    nodes: &[NodeFacts],
    requested: Vec<Suspect>,
    reports: &mut Vec<RecoveryReport>,
) -> BTreeMap<String, Candidate> {
    let mut candidates: BTreeMap<String, Candidate> = BTreeMap::new();
    for node in nodes
        .iter()
        .filter(|n| n.fenced.is_some() && n.readiness == Readiness::Ready)
    {
        candidates.insert(
            node.name.clone(),
            Candidate {
                requested: false,
                confirm: false,
                origins: Vec::new(),
            },
        );
    }
    for suspect in requested {
        let Some(node) = find(&suspect.target, nodes) else {
            info!(suspect = %suspect.target, "recovery asked for a machine no node matches");
            reports.push(end::unmatched(suspect.target.to_string(), suspect.origin));
            continue;
        };
        let c = candidates
            .entry(node.name.clone())
            .or_insert_with(|| Candidate {
                requested: true,
                confirm: false,
                origins: Vec::new(),
            });
        c.requested = true;
        c.confirm |= suspect.intent == Intent::Confirm;
        c.origins.push(suspect.origin);
    }
    candidates
}

/// The longest settle delay a requested node still has to wait out, when
/// that is all it waits for.
fn settling(
    verdicts: &[(String, RecoveryVerdict)],
    candidates: &BTreeMap<String, Candidate>,
) -> Option<i64> {
    verdicts
        .iter()
        .filter(|(name, _)| candidates[name.as_str()].requested)
        .filter_map(|(_, v)| match v {
            RecoveryVerdict::Hold(Hold::Settling { remaining_secs }) => Some(*remaining_secs),
            _ => None,
        })
        .max()
}

/// Records the confirmations operators asked for (nothing in a dry run),
/// of the fencing `fenced_at` names when it names one: the Nodes confirmed,
/// and the errors by Node.
async fn confirm(
    ctx: &Ctx<'_>,
    dry_run: bool,
    candidates: &BTreeMap<String, Candidate>,
    fenced_at: Option<&str>,
) -> (Vec<String>, HashMap<String, String>) {
    let mut confirmed = Vec::new();
    let mut errors = HashMap::new();
    for name in candidates.iter().filter(|(_, c)| c.confirm).map(|(n, _)| n) {
        if dry_run {
            info!(node = %name, "dry run: would record the operator's confirmation");
            continue;
        }
        match ctx.writes.confirm_recovery(name, fenced_at).await {
            Ok(ConfirmOutcome::Confirmed) => {
                info!(node = %name, "an operator confirmed the node healthy");
                confirmed.push(name.clone());
            }
            Ok(ConfirmOutcome::NotFenced | ConfirmOutcome::NodeGone) => {
                info!(node = %name, "nothing of node-fencer's to confirm");
            }
            Ok(ConfirmOutcome::AnotherFencing) => {
                let asked = fenced_at.unwrap_or_default();
                warn!(node = %name, asked, "the confirmation names another fencing than the node's: nothing confirmed");
                errors.insert(
                    name.clone(),
                    format!(
                        "the confirmation names the fencing of {asked}, and the node carries another one (see `node-fencer check`): nothing confirmed"
                    ),
                );
            }
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                warn!(node = %name, error = %e, "could not record the confirmation");
                errors.insert(name.clone(), e.to_string());
            }
        }
    }
    (confirmed, errors)
}

/// `nodes`, with the Nodes `names` read again (their confirmation written
/// since), and the confirmation recorded as an Event on each.
async fn read_again(ctx: &Ctx<'_>, nodes: &[NodeFacts], names: &[String]) -> Vec<NodeFacts> {
    let mut nodes = nodes.to_vec();
    for name in names {
        match ctx.reads.get_node(name).await {
            Ok(Some(fresh)) => {
                if let Some(mark) = &fresh.fenced {
                    ctx.record(name, NodeEvent::recovery_confirmed(&mark.at))
                        .await;
                }
                match nodes.iter_mut().find(|n| n.name == *name) {
                    Some(n) => *n = fresh,
                    None => nodes.push(fresh),
                }
            }
            Ok(None) => nodes.retain(|n| n.name != *name),
            Err(e) => {
                // The decision then reads the Node as it was: still
                // unconfirmed, so the fencing stays.
                ctx.meter.error(Dependency::Kubernetes);
                warn!(node = %name, error = %e, "could not read the node again after its confirmation");
            }
        }
    }
    nodes
}

/// The Node a recovery request names: by the usual resolution, or by the
/// instance node-fencer recorded (the Node may name a new one by now).
fn find<'a>(target: &NodeRef, nodes: &'a [NodeFacts]) -> Option<&'a NodeFacts> {
    match resolve::resolve(target, nodes) {
        Resolution::Node(i) => Some(&nodes[i]),
        Resolution::Instance(id) => nodes.iter().find(|n| {
            n.fenced
                .as_ref()
                .is_some_and(|m| m.instance.as_ref() == Some(&id))
        }),
        Resolution::Unmatched => None,
    }
}
