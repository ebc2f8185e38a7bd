//! The end of the recovery check for one node: its report, and, when the
//! verdict says so, the fencing ended on the Node (only node-fencer's own
//! taint and marks, checked again at patch time) and recorded.

use std::collections::HashMap;

use tracing::{info, warn};

use super::view::{Candidate, Rules, View};
use crate::core::inbound::suspect::Origin;
use crate::core::model::facts::{Confirmation, FenceMode, NodeFacts};
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::kube_patch::Ending;
use crate::core::outbound::metrics::Dependency;
use crate::core::outbound::report::{RecoveryOutcome, RecoveryReport};
use crate::core::rules::recovery::{Hold, RecoveryPolicy, RecoveryVerdict};
use crate::pipeline::ctx::Ctx;
use crate::shell::cluster::UntaintOutcome;

/// What every node's conclusion shares.
pub(super) struct Context<'a> {
    /// Plan only.
    pub(super) dry_run: bool,
    /// The settle delay and who ends a fencing.
    pub(super) rules: Rules,
    /// When this check first saw the nodes (Unix seconds).
    pub(super) first_seen: i64,
    /// What the decision looked at.
    pub(super) view: &'a View,
    /// The operators' confirmations that could not be written, by Node.
    pub(super) confirm_errors: &'a HashMap<String, String>,
}

/// The report for one node, after acting on its verdict; `None` for the
/// routine look at a node that stays fenced, which is not news.
pub(super) async fn conclude(
    ctx: &Ctx<'_>,
    cx: &Context<'_>,
    c: &Candidate,
    name: &str,
    verdict: RecoveryVerdict,
) -> Option<RecoveryReport> {
    let node = cx.view.nodes.get(name);
    let instance = node.and_then(|n| n.instance.clone());
    let state = instance
        .as_ref()
        .and_then(|i| match cx.view.confirmations.get(i) {
            Some(Confirmation::Seen(f)) => Some(f.state.clone()),
            _ => None,
        });
    let mut report = RecoveryReport {
        node: name.to_owned(),
        instance_id: instance,
        instance_state: state,
        outcome: RecoveryOutcome::Kept,
        reason: String::new(),
        hold: None,
        taint_removed: false,
        requested: c.requested,
        errors: cx.confirm_errors.get(name).cloned().into_iter().collect(),
        origins: c.origins.clone(),
    };
    match verdict {
        RecoveryVerdict::Hold(hold) => {
            report.outcome = if hold.pending() {
                RecoveryOutcome::Waiting
            } else {
                RecoveryOutcome::Kept
            };
            report.reason = hold.to_string();
            info!(node = %name, hold = hold.code(), requested = c.requested, "recovery held: {hold}");
            if c.requested && hold.pending() {
                ctx.record(name, NodeEvent::recovery_waiting(&hold)).await;
            }
            report.hold = Some(hold);
            // The routine look at a node that stays fenced is not news.
            if !c.requested && report.outcome == RecoveryOutcome::Kept {
                return None;
            }
        }
        RecoveryVerdict::Recover { fenced_at } if cx.dry_run => {
            report.outcome = RecoveryOutcome::Planned;
            report.reason = "dry run: would remove node-fencer's taint and annotations".into();
            info!(node = %name, fenced_at, "recovery planned (dry run)");
        }
        RecoveryVerdict::Recover { fenced_at } => {
            let ending = Ending {
                fenced_at: &fenced_at,
                settle_secs: i64::try_from(cx.rules.settle.as_secs()).unwrap_or(i64::MAX),
                seen_ready_at: cx.first_seen,
                needs_confirmation: cx.rules.policy == RecoveryPolicy::Manual,
            };
            end(ctx, name, &ending, node, &mut report).await;
        }
    }
    Some(report)
}

/// Writes the end of one fencing and records it.
pub(super) async fn end(
    ctx: &Ctx<'_>,
    name: &str,
    ending: &Ending<'_>,
    node: Option<&NodeFacts>,
    report: &mut RecoveryReport,
) {
    match ctx.writes.untaint_node(name, ending).await {
        Ok(UntaintOutcome::Ended { taint_removed }) => {
            report.outcome = RecoveryOutcome::Recovered;
            report.taint_removed = taint_removed;
            let legacy = node
                .and_then(|n| n.fenced.as_ref())
                .is_some_and(|m| m.mode == FenceMode::Legacy);
            let event = NodeEvent::fencing_ended(ending.fenced_at, taint_removed, legacy);
            report.reason.clone_from(&event.note);
            info!(node = name, taint_removed, "fencing ended");
            ctx.record(name, event).await;
        }
        Ok(UntaintOutcome::NodeNotReady) => {
            report.outcome = RecoveryOutcome::Waiting;
            report.reason = Hold::NodeNotReady.to_string();
            report.hold = Some(Hold::NodeNotReady);
        }
        Ok(UntaintOutcome::NotSettled { remaining_secs }) => {
            // The Node flapped since the list: its new Ready time counts.
            let hold = Hold::Settling { remaining_secs };
            info!(
                node = name,
                remaining_secs, "not Ready for the settle delay at patch time"
            );
            report.outcome = RecoveryOutcome::Waiting;
            report.reason = hold.to_string();
            report.hold = Some(hold);
        }
        Ok(UntaintOutcome::NotOurs) => {
            report.reason = Hold::NotFenced.to_string();
            report.hold = Some(Hold::NotFenced);
        }
        Ok(UntaintOutcome::NotConfirmed) => {
            // The confirmation was withdrawn since the decision read it.
            let hold = Hold::AwaitingConfirmation {
                fenced_at: ending.fenced_at.to_owned(),
            };
            report.reason = hold.to_string();
            report.hold = Some(hold);
        }
        Ok(UntaintOutcome::NodeGone) => {
            report.reason = "the node no longer exists".into();
        }
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node = name, error = %e, "could not end the fencing");
            report.outcome = RecoveryOutcome::Failed;
            report.reason = "the taint could not be removed".into();
            report.errors.push(e.to_string());
        }
    }
}

/// A recovery request that names no Node of this cluster.
pub(super) fn unmatched(target: String, origin: Origin) -> RecoveryReport {
    RecoveryReport {
        node: target,
        instance_id: None,
        instance_state: None,
        outcome: RecoveryOutcome::Kept,
        reason: "no node of this cluster matches".into(),
        hold: None,
        taint_removed: false,
        requested: true,
        errors: Vec::new(),
        origins: vec![origin],
    }
}
