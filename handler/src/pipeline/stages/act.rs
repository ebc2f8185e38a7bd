//! The act stage of each tainted node: the cloud is asked once more, for
//! every node at once, whether the machines are still off; then, for each
//! node it confirms, its pods (in taint mode those the taint evicts at once,
//! see [`super::pods`]; in legacy mode every pod that does not stay), and,
//! asked once more about that node's machine alone, right before its first
//! detach (pod deletions, other nodes and Compute Engine operations take
//! time, and a VM restarts on its own after a host error), the
//! [`super::legacy`] recipe's VolumeAttachments in that mode and the
//! force-detach of every volume the plan names. A detach the cloud answers
//! "not attached" to is left to the verification, which trusts only what
//! it sees.

use std::time::Instant;

use futures::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use crate::core::model::facts::{FenceMode, InstanceFacts};
use crate::core::model::instance::{InstanceId, VolumeId};
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics;
use crate::core::rules::plan::{DetachAnswer, NodeRun, Stage};
use crate::pipeline::ctx::{Ctx, PARALLEL_NODES};
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::ANSWER_RESERVE;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::looks;
use crate::pipeline::stages::{legacy, pods};
use crate::shell::cloud::{CloudCall, CloudError, Detach};

/// Acts on every tainted run still confirmed off, a few nodes at once.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let Some(mode) = inv.mode.filter(|_| inv.fencing()) else {
        return Ok(());
    };
    let ids: Vec<InstanceId> = inv
        .runs
        .iter()
        .filter(|r| *r.stage() == Stage::Tainted)
        .filter_map(|r| r.plan().map(|p| p.instance.id.clone()))
        .collect();
    let again = inv.looks.again(ctx, &ids).await;
    let fence_hibernated = inv.policy.fence_hibernated;
    let deadline = inv
        .deadline
        .map(|d| d.checked_sub(ANSWER_RESERVE).unwrap_or(d));
    for run in inv.runs.iter_mut().filter(|r| *r.stage() == Stage::Tainted) {
        let id = run.plan().map(|p| p.instance.id.clone());
        run.confirm_before_detach(id.and_then(|id| again.get(&id)), fence_hibernated);
        if let Stage::DetachHeld(reason) = run.stage() {
            warn!(node = run.node().unwrap_or("-"), %reason, "not confirmed off right before the detach; nothing freed");
        }
    }
    futures::stream::iter(inv.runs.iter_mut().filter(|r| *r.stage() == Stage::Tainted))
        .map(|run| {
            let span = info_span!(
                "act",
                node = run.node().unwrap_or("-"),
                instance = run.instance_id().map_or("-", |i| i.as_str())
            );
            one(ctx, mode, (fence_hibernated, deadline), run).instrument(span)
        })
        .buffer_unordered(PARALLEL_NODES)
        .collect::<Vec<()>>()
        .await;
    Ok(())
}

async fn one(
    ctx: &Ctx<'_>,
    mode: FenceMode,
    (fence_hibernated, deadline): (bool, Option<tokio::time::Instant>),
    run: &mut NodeRun,
) {
    let Some(machine) = run.plan().map(|p| p.instance.clone()) else {
        return;
    };
    let node = run.node().unwrap_or_default().to_owned();
    match mode {
        FenceMode::Legacy => legacy::pods(ctx, &node, run).await,
        // The pod garbage collector would delete these on its next pass
        // (every 20 s) now that the taint is on; deleting them here lets
        // their controllers replace them at once.
        FenceMode::Taint => pods::force_delete(ctx, &node, run, |p| p.leaves_now).await,
    }
    let frees = run.plan().is_some_and(|p| {
        p.detaches().next().is_some() || (mode == FenceMode::Legacy && !p.attachments.is_empty())
    });
    if frees {
        let again = looks::ask(ctx, std::slice::from_ref(&machine.id)).await;
        run.confirm_before_detach(again.get(&machine.id), fence_hibernated);
        if let Stage::DetachHeld(reason) = run.stage() {
            warn!(%reason, "not confirmed off right before the node's first detach; nothing freed");
            return;
        }
    }
    if let Some(left) = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
        && let needs = budget(run)
        && left < needs
    {
        warn!(
            left_s = left.as_secs(),
            needs_s = needs.as_secs(),
            "too little of the request's time left for the node's detaches"
        );
        run.out_of_time(left, needs);
        return;
    }
    if mode == FenceMode::Legacy {
        legacy::attachments(ctx, &node, run).await;
    }
    detach(ctx, (&node, &machine), run, deadline).await;
}

/// What a node's detaches may take: a Compute Engine detach is an
/// operation followed for up to a minute, an EC2 one answers at once (a
/// BMC has no disks to detach); and a margin for the legacy recipe's deletions and the Event.
fn budget(run: &NodeRun) -> std::time::Duration {
    let secs: u64 = run
        .plan()
        .map(|p| {
            p.detaches()
                .map(|v| match v.provider() {
                    crate::core::model::instance::Provider::Gce => 65,
                    crate::core::model::instance::Provider::Aws
                    | crate::core::model::instance::Provider::Redfish => 10,
                })
                .sum()
        })
        .unwrap_or(0);
    std::time::Duration::from_secs(10 + secs)
}

/// The force-detach of every volume the plan names, for this fencing. A
/// detach unanswered at `until` (the request's end, its answer's reserve
/// kept) counts as failed, for the retry: the cloud's own call budget (30
/// s on EC2, its retries included) may outlast the time the budget check
/// above found enough, and the runtime would kill the request mid-call.
async fn detach(
    ctx: &Ctx<'_>,
    (node, machine): (&str, &InstanceFacts),
    run: &mut NodeRun,
    until: Option<tokio::time::Instant>,
) {
    run.start_detaching();
    let fencing = run.fencing_at().unwrap_or(&ctx.correlation_id).to_owned();
    let order = Detach {
        machine,
        fencing: &fencing,
    };
    let started = Instant::now();
    let pending: Vec<_> = run.pending().cloned().collect();
    let mut detached = Vec::new();
    for volume in &pending {
        let call = ctx.cloud.detach_volume(volume, &order);
        let answered = match until {
            None => call.await,
            Some(until) => tokio::time::timeout_at(until, call)
                .await
                .unwrap_or_else(|_| Err(unanswered(volume))),
        };
        let answer = match answered {
            Ok(()) => {
                info!(volume = %volume, "force-detach sent");
                detached.push(volume.to_string());
                DetachAnswer::Sent
            }
            Err(e) if e.is_already_detached() => {
                // Someone else detached it first, or a detach is under way:
                // left to the verification, which trusts only what the
                // cloud shows.
                info!(volume = %volume, error = %e, "volume no longer attached, or detaching");
                DetachAnswer::NotAttached(e.to_string())
            }
            Err(e) if e.is_never_detached() => {
                warn!(volume = %volume, error = %e, "never detached: refused");
                DetachAnswer::Refused(e.to_string())
            }
            Err(e) => {
                ctx.meter.error(e.dependency());
                warn!(volume = %volume, error = %e, "force-detach failed");
                DetachAnswer::Failed(e.to_string())
            }
        };
        run.detach_answered(volume, answer);
    }
    if !pending.is_empty() {
        ctx.meter.stage(metrics::Stage::Detach, started.elapsed());
    }
    if !detached.is_empty() {
        ctx.record(node, NodeEvent::volumes_detached(&detached, &machine.id))
            .await;
    }
}

/// The error of a detach the cloud did not answer before the request's end.
fn unanswered(volume: &VolumeId) -> CloudError {
    CloudError::new(
        volume.provider(),
        CloudCall::Detach(volume.to_string()),
        "no answer before the request's end: left for its retry, which finds the volume as the cloud has it",
    )
}
