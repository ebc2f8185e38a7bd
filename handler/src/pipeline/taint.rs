//! The taint (legacy mode: the mark) on each admitted node: a guarded patch
//! that keeps every other taint, and the Event that records it.

use std::time::Instant;

use futures::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use super::{Ctx, PARALLEL_NODES};
use crate::core::events::NodeEvent;
use crate::core::facts::FenceMode;
use crate::core::kube_model::TaintOutcome;
use crate::core::metrics::{self, Dependency};
use crate::core::plan::{NodeRun, Stage};

/// Taints every admitted run, a few nodes at once.
pub(super) async fn nodes(ctx: &Ctx<'_>, mode: FenceMode, runs: &mut [NodeRun]) {
    // One time for the whole batch: it names this fencing on every Node.
    let at = k8s_openapi::jiff::Timestamp::now().to_string();
    let at = at.as_str();
    futures::stream::iter(runs.iter_mut().filter(|r| r.stage == Stage::Admitted))
        .map(|run| {
            let span = info_span!(
                "fence",
                node = run.node.as_deref().unwrap_or("-"),
                instance = run.instance_id.as_ref().map_or("-", |i| i.as_str())
            );
            one(ctx, mode, at, run).instrument(span)
        })
        .buffer_unordered(PARALLEL_NODES)
        .collect::<Vec<()>>()
        .await;
}

async fn one(ctx: &Ctx<'_>, mode: FenceMode, at: &str, run: &mut NodeRun) {
    let (Some(stamp), Some(node), Some(plan)) = (
        run.stamp(mode, at, &ctx.correlation_id),
        run.node.clone(),
        run.plan.as_ref(),
    ) else {
        return;
    };
    if plan.add_taint {
        let started = Instant::now();
        let result = ctx.cluster.taint_node(&node, &stamp).await;
        ctx.meter.stage(metrics::Stage::Taint, started.elapsed());
        match &result {
            Ok(TaintOutcome::Applied) => match mode {
                FenceMode::Taint => info!("out-of-service taint applied"),
                FenceMode::Legacy => info!("fenced the legacy way (marked)"),
            },
            Ok(TaintOutcome::AlreadyPresent) => info!("already fenced"),
            Ok(TaintOutcome::NodeReady | TaintOutcome::NodeGone) => {}
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "taint failed; no volume is detached");
            }
        }
        run.tainted(result.map(Some).map_err(|e| e.to_string()));
    } else {
        // A Lambda retry keeps the request id: a fencing stamped with it was
        // written by an earlier attempt of this invocation, which may have
        // stopped before its Event. Recorded now; the Event's name makes a
        // second copy impossible.
        let ours = plan.marked_by.as_deref() == Some(ctx.correlation_id.as_str());
        run.tainted(Ok(ours.then_some(TaintOutcome::Applied)));
    }
    match &run.stage {
        Stage::Tainted if run.taint_applied => {
            let event = match mode {
                FenceMode::Taint => NodeEvent::taint_applied(&stamp.instance, &stamp.state),
                FenceMode::Legacy => NodeEvent::fenced_legacy(&stamp.instance, &stamp.state),
            };
            ctx.record(&node, event).await;
        }
        Stage::Skipped(reason) => warn!(%reason, "node changed before the taint; not fencing"),
        _ => {}
    }
}
