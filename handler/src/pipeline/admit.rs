//! Admission: the last look before the first irreversible step. After the
//! optional delay, an invocation that is about to write new taints takes the
//! cluster's Lease, recounts the cap against the Nodes as they are now, asks
//! the cloud again, writes the taints, and lets the Lease go. Dry runs take
//! no Lease and no cap room.

use std::collections::HashMap;

use tracing::{info, warn};

use super::{Ctx, PipelineError, Switched, confirm, refused, taint};
use crate::core::facts::{Confirmation, FenceMode};
use crate::core::instance::InstanceId;
use crate::core::metrics::Dependency;
use crate::core::plan::{self, NodePlan, NodeRun, Stage};
use crate::core::policy::Policy;

/// Admits the runs still decided for fencing and taints them; a run that is
/// refused or not confirmed again is skipped with its reason. Returns the
/// kill switch as read after the waits (on: the runs became plans).
pub(super) async fn admit(
    ctx: &Ctx<'_>,
    policy: &Policy,
    mode: FenceMode,
    known: &HashMap<InstanceId, Confirmation>,
    runs: &mut [NodeRun],
) -> Result<Switched, PipelineError> {
    let live = runs.iter().any(|r| r.fencing().is_some_and(|p| !p.dry_run));
    let new_taints = runs
        .iter()
        .any(|r| r.fencing().is_some_and(NodePlan::writes_new_taint));
    if live && !policy.confirm_again_after.is_zero() {
        info!(
            delay_s = policy.confirm_again_after.as_secs(),
            "waiting before the second confirmation"
        );
        tokio::time::sleep(policy.confirm_again_after).await;
    }
    let namespace = &policy.control_namespace;
    let lease_waited = new_taints
        && ctx
            .cluster
            .acquire_lease(namespace, &ctx.correlation_id)
            .await
            .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
    // After a wait (the delay, or the Lease held by another invocation), the
    // kill switch is read again before the first write.
    let waited = lease_waited || (live && !policy.confirm_again_after.is_zero());
    let switched = if waited {
        ctx.switched_off_since(namespace).await
    } else {
        Switched::default()
    };
    if switched.on {
        warn!("the kill switch turned on while waiting: the rest is a plan");
        runs.iter_mut().for_each(NodeRun::plan_only);
    }
    let recount = (new_taints && !switched.on).then_some(known);
    let held = under_lease(ctx, policy, mode, recount, runs).await;
    if new_taints
        && let Err(e) = ctx
            .cluster
            .release_lease(namespace, &ctx.correlation_id)
            .await
    {
        // It expires on its own; the next holder waits at most that long.
        ctx.meter.error(Dependency::Kubernetes);
        warn!(error = %e, "could not release the fencing lease");
    }
    held.map(|()| switched)
}

/// Recounts (when new taints are planned: `recount` holds what the
/// invocation knows of the machines), confirms again and taints.
async fn under_lease(
    ctx: &Ctx<'_>,
    policy: &Policy,
    mode: FenceMode,
    recount: Option<&HashMap<InstanceId, Confirmation>>,
    runs: &mut [NodeRun],
) -> Result<(), PipelineError> {
    if let Some(known) = recount {
        let fresh = ctx.cluster.list_nodes().await.inspect_err(|_| {
            ctx.meter.error(Dependency::Kubernetes);
        })?;
        let refused_now = plan::recount(runs, &fresh, known, policy.cap(fresh.len()));
        for k in refused_now {
            if let (Some(node), Stage::Skipped(reason)) = (&runs[k].node, &runs[k].stage) {
                refused(ctx, node, reason).await;
            }
        }
    }

    // Asked again right before the first irreversible step.
    let live: Vec<InstanceId> = runs
        .iter()
        .filter_map(|r| r.fencing().filter(|p| !p.dry_run))
        .map(|p| p.instance.id.clone())
        .collect();
    let again = if live.is_empty() {
        HashMap::new()
    } else {
        confirm::instances(ctx, &live).await
    };
    for run in runs.iter_mut().filter(|r| r.stage == Stage::Decided) {
        let id = run.plan.as_ref().map(|p| p.instance.id.clone());
        run.confirm_again(id.and_then(|id| again.get(&id)), policy.fence_hibernated);
        if let Stage::Skipped(reason) = &run.stage {
            warn!(node = run.node.as_deref().unwrap_or("-"), %reason, "re-confirmation did not confirm; not fencing");
        }
    }
    taint::nodes(ctx, mode, runs).await;
    Ok(())
}
