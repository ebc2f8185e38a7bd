//! The act stage of each tainted node: in legacy mode the [`super::legacy`]
//! recipe first, then the force-detach of every volume the plan names. A
//! detach the cloud answers "not attached" to is left to the verification,
//! which trusts only what it sees.

use std::time::Instant;

use futures::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use super::{Ctx, PARALLEL_NODES, legacy};
use crate::core::events::NodeEvent;
use crate::core::facts::FenceMode;
use crate::core::metrics::{self, Dependency};
use crate::core::plan::{NodeRun, Stage};
use crate::core::report::VolumeOutcome;

/// Acts on every tainted run, a few nodes at once.
pub(super) async fn act(ctx: &Ctx<'_>, mode: FenceMode, runs: &mut [NodeRun]) {
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
    if mode == FenceMode::Legacy {
        legacy::recipe(ctx, &node, run).await;
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
                // left to the verification, which trusts only `available`.
                info!(volume = %v.volume, error = %e, "volume no longer attached, or detaching");
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
