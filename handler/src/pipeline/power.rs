//! Active fencing's step, between the decision and the fence: a candidate
//! whose machine EC2 still calls running is judged by [`power::judge`];
//! one it allows is powered off under the Lease (the Nodes listed and EC2
//! asked again first), marked on its Node, and waited for until EC2 reports
//! it stopped. The fence that follows is the usual one, with its own
//! confirmations: nothing here taints or detaches.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{Ctx, PipelineError, confirm, nodes};
use crate::core::decide::{Skip, Verdict};
use crate::core::events::NodeEvent;
use crate::core::facts::{Confirmation, NodeFacts, StatusChecks};
use crate::core::instance::{InstanceId, InstanceState};
use crate::core::kube_model::PowerStamp;
use crate::core::metrics::Dependency;
use crate::core::plan::Target;
use crate::core::policy::Policy;
use crate::core::power::{
    self, ActiveFencing, Candidate, PowerOutcome, PowerReport, PowerVerdict, Refusal, Surroundings,
};
use crate::core::suspect::Origin;
use crate::core::view::NodeView;

/// How often EC2 is asked while a powered-off machine is stopping: a forced
/// stop takes tens of seconds, and each look is a DescribeInstances call.
const POLL: Duration = Duration::from_secs(2);

/// What the step did: a report per target it judged (by index), and
/// whether any machine was powered off (the targets are then decided again).
#[derive(Default)]
pub(super) struct Powered {
    pub reports: HashMap<usize, PowerReport>,
    pub sent: bool,
}

/// The targets this step looks at: power-off candidates decided "instance
/// not off" because EC2 reports them running.
fn candidates(targets: &[Target], verdicts: &[Verdict]) -> Vec<usize> {
    targets
        .iter()
        .zip(verdicts)
        .enumerate()
        .filter(|(_, (t, v))| {
            t.power_off
                && t.node.is_some()
                && matches!(
                    v,
                    Verdict::Skip {
                        reason: Skip::InstanceNotOff {
                            state: InstanceState::Running
                        }
                    }
                )
        })
        .map(|(k, _)| k)
        .collect()
}

/// Judges the candidates and powers off those the rules allow; updates
/// `confirmations` with what EC2 reports after the wait.
pub(super) async fn step(
    ctx: &Ctx<'_>,
    policy: &Policy,
    dry_run: bool,
    targets: &[Target],
    verdicts: &[Verdict],
    view: &NodeView,
    confirmations: &mut HashMap<InstanceId, Confirmation>,
) -> Result<Powered, PipelineError> {
    let picked = candidates(targets, verdicts);
    let Some(settings) = policy.active_fencing else {
        // Off: only an operator's explicit request hears why nothing happened.
        let reports = picked
            .into_iter()
            .filter(|k| targets[*k].origins.contains(&Origin::Direct))
            .map(|k| (k, PowerReport::refused(Refusal::Disabled, None, None)))
            .collect();
        return Ok(Powered {
            reports,
            sent: false,
        });
    };
    if picked.is_empty() {
        return Ok(Powered::default());
    }
    let names: Vec<&str> = picked
        .iter()
        .filter_map(|k| targets[*k].node.map(|i| view.nodes[i].name.as_str()))
        .collect();
    // The partition guard counts every Node.
    let full;
    let view = if view.is_partial() {
        full = nodes::full(ctx).await?;
        &full
    } else {
        view
    };
    let ids: Vec<InstanceId> = picked
        .iter()
        .filter_map(|k| targets[*k].instance.clone())
        .collect();
    let checks = status_checks(ctx, &ids).await;
    let verdicts = judge(policy, &settings, view, confirmations, &names);
    let mut reports: HashMap<usize, PowerReport> = HashMap::new();
    let mut allowed = Vec::new();
    for ((k, name), verdict) in picked.iter().zip(&names).zip(verdicts) {
        let node = view.nodes.iter().find(|n| n.name == *name);
        let checks = node
            .and_then(|n| n.instance.as_ref())
            .and_then(|id| checks.get(id))
            .cloned();
        match verdict {
            PowerVerdict::Refuse { refusal } => {
                info!(
                    node = name,
                    reason = refusal.code(),
                    "not powering off: {refusal}"
                );
                if !dry_run && records(&refusal) {
                    ctx.record(name, NodeEvent::power_off_refused(&refusal))
                        .await;
                }
                let dark_for = node.and_then(|n| power::not_ready_for(n, now()));
                reports.insert(*k, PowerReport::refused(refusal, dark_for, checks));
            }
            PowerVerdict::PowerOff { not_ready_for } if dry_run => {
                reports.insert(
                    *k,
                    PowerReport::new(
                        PowerOutcome::Planned,
                        format!(
                            "would power off: NotReady for {not_ready_for} s and EC2 reports it running"
                        ),
                        Some(not_ready_for),
                        checks,
                    ),
                );
            }
            PowerVerdict::PowerOff { not_ready_for } => {
                allowed.push((*k, *name, not_ready_for, checks));
            }
        }
    }
    if allowed.is_empty() {
        return Ok(Powered {
            reports,
            sent: false,
        });
    }
    let sent = under_lease(ctx, policy, &settings, &allowed, &mut reports).await?;
    if !sent.is_empty() {
        wait_stopped(ctx, &settings, &sent, confirmations, &mut reports).await;
    }
    Ok(Powered {
        reports,
        sent: !sent.is_empty(),
    })
}

/// Refusals worth a Warning Event: a guard held back a node that was dead
/// long enough. A node not NotReady long enough yet is no news.
fn records(refusal: &Refusal) -> bool {
    matches!(
        refusal,
        Refusal::Partition { .. }
            | Refusal::ZoneDark { .. }
            | Refusal::CapReached { .. }
            | Refusal::PoweredOffBefore { .. }
    )
}

/// The verdict for each named Node, over `view` and what EC2 said.
fn judge(
    policy: &Policy,
    settings: &ActiveFencing,
    view: &NodeView,
    confirmations: &HashMap<InstanceId, Confirmation>,
    names: &[&str],
) -> Vec<PowerVerdict> {
    let found: Vec<Option<&NodeFacts>> = names
        .iter()
        .map(|name| view.nodes.iter().find(|n| n.name == *name))
        .collect();
    let candidates: Vec<Candidate<'_>> = found
        .iter()
        .flatten()
        .map(|node| Candidate {
            node,
            confirmation: node.instance.as_ref().and_then(|id| confirmations.get(id)),
        })
        .collect();
    let around = Surroundings {
        nodes: &view.nodes,
        out_of_service: view.taken(confirmations),
        limit: policy.cap(view.cluster_size()),
        now: now(),
    };
    let mut judged = power::judge(&candidates, &around, Some(settings)).into_iter();
    // One verdict per Node found, in order; a Node gone is not powered off.
    found
        .iter()
        .map(|node| {
            node.and_then(|_| judged.next())
                .unwrap_or(PowerVerdict::Refuse {
                    refusal: Refusal::NodeGone,
                })
        })
        .collect()
}

/// Under the Lease: lists the Nodes and asks EC2 again, judges once more
/// (a node may have turned Ready, another invocation may have taken the
/// cap's room), powers off those still allowed and marks their Nodes.
/// Returns the (target index, instance) pairs whose stop EC2 accepted.
async fn under_lease(
    ctx: &Ctx<'_>,
    policy: &Policy,
    settings: &ActiveFencing,
    allowed: &[(usize, &str, u64, Option<StatusChecks>)],
    reports: &mut HashMap<usize, PowerReport>,
) -> Result<Vec<(usize, InstanceId)>, PipelineError> {
    let namespace = &policy.control_namespace;
    let taken = ctx
        .cluster
        .acquire_lease(namespace, &ctx.correlation_id)
        .await
        .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
    let deadline = Instant::from_std(taken.stamped) + policy.lease.valid_for;
    let out = async {
        if taken.waited && ctx.switched_off_since(namespace).await.on {
            for (k, name, ..) in allowed {
                warn!(
                    node = name,
                    "the kill switch turned on while waiting: not powering off"
                );
                reports.insert(*k, planned_after_switch());
            }
            return Ok(Vec::new());
        }
        let fresh = nodes::full(ctx).await?;
        let names: Vec<&str> = allowed.iter().map(|(_, name, ..)| *name).collect();
        let ids: Vec<InstanceId> = names
            .iter()
            .filter_map(|name| fresh.nodes.iter().find(|n| n.name == *name))
            .filter_map(|n| n.instance.clone())
            .collect();
        let again = confirm::instances(ctx, &ids).await;
        let verdicts = judge(policy, settings, &fresh, &again, &names);
        let mut sent = Vec::new();
        for ((k, name, _, checks), verdict) in allowed.iter().zip(verdicts) {
            let node = fresh.nodes.iter().find(|n| n.name == *name);
            let (PowerVerdict::PowerOff { not_ready_for }, Some(node), Some(id)) =
                (&verdict, node, node.and_then(|n| n.instance.clone()))
            else {
                if let PowerVerdict::Refuse { refusal } = verdict {
                    info!(node = name, "not powering off after all: {refusal}");
                    let dark_for = node.and_then(|n| power::not_ready_for(n, now()));
                    reports.insert(*k, PowerReport::refused(refusal, dark_for, checks.clone()));
                }
                continue;
            };
            let acted = |outcome, reason: String| {
                PowerReport::new(outcome, reason, Some(*not_ready_for), checks.clone())
            };
            if Instant::now() >= deadline {
                // Another invocation may count now: a retry decides again.
                warn!(node = name, "the fencing Lease ran out: not powering off");
                reports.insert(
                    *k,
                    acted(
                        PowerOutcome::Failed,
                        "the fencing Lease ran out before the stop; a retry decides again".into(),
                    ),
                );
                continue;
            }
            let why = reason(*not_ready_for, checks.as_ref(), &ctx.correlation_id);
            match ctx.cloud.power_off(&id).await {
                Ok(()) => {
                    info!(node = name, instance = %id, "powered off: {why}");
                    mark(ctx, node, &why).await;
                    ctx.record(name, NodeEvent::powered_off(&id, &why)).await;
                    reports.insert(
                        *k,
                        acted(PowerOutcome::StopPending, format!("powered off; {why}")),
                    );
                    sent.push((*k, id));
                }
                Err(e) => {
                    ctx.meter.error(Dependency::Ec2);
                    warn!(node = name, error = %e, "could not power off");
                    reports.insert(*k, acted(PowerOutcome::Failed, e.to_string()));
                }
            }
        }
        Ok(sent)
    }
    .await;
    ctx.release_lease(namespace).await;
    out
}

fn planned_after_switch() -> PowerReport {
    PowerReport::new(
        PowerOutcome::Planned,
        "the kill switch turned on while waiting for the Lease: not powered off",
        None,
        None,
    )
}

/// Now, in Unix seconds.
fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// What the Node's annotation and Event say of a power-off.
fn reason(not_ready_for: u64, checks: Option<&StatusChecks>, correlation_id: &str) -> String {
    let checks = checks.map_or_else(
        || "status checks not reported".to_owned(),
        |c| format!("status checks: {c}"),
    );
    format!(
        "NotReady for {not_ready_for} s while EC2 reported it running; {checks}; run {correlation_id}"
    )
}

/// Records the power-off on the Node, so that it is never repeated before
/// the node boots and reports again; a failure is logged (the machine is
/// stopping either way, and a stopped one is never powered off).
async fn mark(ctx: &Ctx<'_>, node: &NodeFacts, why: &str) {
    let stamp = PowerStamp {
        at: k8s_openapi::jiff::Timestamp::now().to_string(),
        boot_id: node.power.boot_id.clone(),
        reason: why.to_owned(),
    };
    if let Err(e) = ctx.cluster.mark_powered_off(&node.name, &stamp).await {
        ctx.meter.error(Dependency::Kubernetes);
        warn!(node = node.name, error = %e, "could not record the power-off on the Node");
    }
}

/// Asks EC2 until every powered-off instance is reported stopped, or the
/// wait is over; what it said last goes into `confirmations`.
async fn wait_stopped(
    ctx: &Ctx<'_>,
    settings: &ActiveFencing,
    sent: &[(usize, InstanceId)],
    confirmations: &mut HashMap<InstanceId, Confirmation>,
    reports: &mut HashMap<usize, PowerReport>,
) {
    let deadline = Instant::now() + settings.wait;
    let ids: Vec<InstanceId> = sent.iter().map(|(_, id)| id.clone()).collect();
    loop {
        let answers = confirm::instances(ctx, &ids).await;
        let stopped = answers.values().all(Confirmation::confirms_off);
        confirmations.extend(answers);
        if stopped || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL.min(deadline - Instant::now())).await;
    }
    for (k, id) in sent {
        let off = confirmations
            .get(id)
            .is_some_and(Confirmation::confirms_off);
        if let Some(report) = reports.get_mut(k) {
            if off {
                report.outcome = PowerOutcome::Stopped;
            } else {
                warn!(instance = %id, "not stopped within POWER_OFF_WAIT_SECONDS: no taint; a retry looks again");
                report
                    .reason
                    .push_str("; not reported stopped within POWER_OFF_WAIT_SECONDS");
            }
        }
    }
}

/// The status checks EC2 reports; none when it cannot be asked (they are
/// recorded, never required).
async fn status_checks(ctx: &Ctx<'_>, ids: &[InstanceId]) -> HashMap<InstanceId, StatusChecks> {
    match ctx.cloud.status_checks(ids).await {
        Ok(found) => found.into_iter().collect(),
        Err(e) => {
            ctx.meter.error(Dependency::Ec2);
            warn!(error = %e, "could not read the status checks; powering off without them");
            HashMap::new()
        }
    }
}
