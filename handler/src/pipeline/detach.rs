//! The act stage of each tainted node: the cloud is asked once more, for
//! every node at once, whether the instances are still off; then, for each
//! node it confirms, the [`super::legacy`] recipe in that mode (in taint
//! mode the force-delete of the pods the taint evicts at once, see
//! [`super::pods`]) and the force-detach of every volume the plan names. A detach the cloud answers
//! "not attached" to is left to the verification, which trusts only what it
//! sees.

use std::time::Instant;

use futures::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use super::{Ctx, PARALLEL_NODES, confirm, legacy, pods};
use crate::core::events::NodeEvent;
use crate::core::facts::FenceMode;
use crate::core::instance::InstanceId;
use crate::core::metrics::{self, Dependency};
use crate::core::plan::{NodeRun, Stage};
use crate::core::policy::Policy;
use crate::core::report::VolumeOutcome;

/// Acts on every tainted run still confirmed off, a few nodes at once.
pub(super) async fn act(ctx: &Ctx<'_>, policy: &Policy, mode: FenceMode, runs: &mut [NodeRun]) {
    let ids: Vec<InstanceId> = runs
        .iter()
        .filter(|r| r.stage == Stage::Tainted)
        .filter_map(|r| r.plan.as_ref().map(|p| p.instance.id.clone()))
        .collect();
    let again = confirm::instances(ctx, &ids).await;
    for run in runs.iter_mut().filter(|r| r.stage == Stage::Tainted) {
        let id = run.plan.as_ref().map(|p| p.instance.id.clone());
        run.confirm_before_detach(id.and_then(|id| again.get(&id)), policy.fence_hibernated);
        if let Stage::DetachHeld(reason) = &run.stage {
            warn!(node = run.node.as_deref().unwrap_or("-"), %reason, "not confirmed off right before the detach; nothing freed");
        }
    }
    futures::stream::iter(runs.iter_mut().filter(|r| r.stage == Stage::Tainted))
        .map(|run| {
            let span = info_span!(
                "act",
                node = run.node.as_deref().unwrap_or("-"),
                instance = run.instance_id.as_ref().map_or("-", |i| i.as_str())
            );
            one(ctx, mode, run).instrument(span)
        })
        .buffer_unordered(PARALLEL_NODES)
        .collect::<Vec<()>>()
        .await;
}

async fn one(ctx: &Ctx<'_>, mode: FenceMode, run: &mut NodeRun) {
    let Some(instance) = run.plan.as_ref().map(|p| p.instance.id.clone()) else {
        return;
    };
    let node = run.node.clone().unwrap_or_default();
    match mode {
        FenceMode::Legacy => legacy::recipe(ctx, &node, run).await,
        // The pod garbage collector would delete these on its next pass
        // (every 20 s) now that the taint is on; deleting them here lets
        // their controllers replace them at once.
        FenceMode::Taint => pods::force_delete(ctx, &node, run, |p| p.leaves_now).await,
    }
    run.start_detaching();
    let mut detached = Vec::new();
    let mut errors = Vec::new();
    let started = Instant::now();
    let mut sent = false;
    for v in run
        .volumes
        .iter_mut()
        .filter(|v| v.outcome == VolumeOutcome::Stuck)
    {
        sent = true;
        match ctx.cloud.detach_volume(&v.volume, &instance).await {
            Ok(()) => {
                info!(volume = %v.volume, "force-detach sent");
                detached.push(v.volume.to_string());
            }
            Err(e) if e.is_already_detached() => {
                // Someone else detached it first, or a detach is under way:
                // left to the verification, which trusts only what EC2 shows.
                info!(volume = %v.volume, error = %e, "volume no longer attached, or detaching");
                v.detail = Some(e.to_string());
            }
            Err(e) if e.is_never_detached() => {
                warn!(volume = %v.volume, error = %e, "never detached: refused");
                v.outcome = VolumeOutcome::Refused;
                v.detail = Some(e.to_string());
            }
            Err(e) => {
                ctx.meter.error(Dependency::Ec2);
                warn!(volume = %v.volume, error = %e, "force-detach failed");
                v.outcome = VolumeOutcome::Failed;
                v.detail = Some(e.to_string());
                errors.push(e.to_string());
            }
        }
    }
    if sent {
        ctx.meter.stage(metrics::Stage::Detach, started.elapsed());
    }
    run.errors.extend(errors);
    if !detached.is_empty() {
        ctx.record(&node, NodeEvent::volumes_detached(&detached, &instance))
            .await;
    }
}
