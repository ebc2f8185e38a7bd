//! The taint (legacy mode: the mark) on each admitted node: a guarded patch
//! that keeps every other taint, written only while the fencing Lease is
//! ours; then, once the Lease is free, the Events that record them.

use std::time::Instant;

use futures::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use crate::core::model::facts::FenceMode;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::kube_patch::TaintOutcome;
use crate::core::outbound::metrics::{self, Dependency};
use crate::core::rules::plan::{NodeRun, Stage};
use crate::pipeline::ctx::{Ctx, PARALLEL_NODES};
use crate::pipeline::lease::Hold;

/// Taints every admitted run, a few nodes at once, each only while `hold`
/// (when the Lease was taken) says the Lease is still ours.
pub(crate) async fn nodes(
    ctx: &Ctx<'_>,
    mode: FenceMode,
    no_schedule: bool,
    hold: Option<&Hold>,
    runs: &mut [NodeRun],
) {
    // One time for the whole batch: it names this fencing on every Node.
    let at = ctx.now().to_string();
    let at = at.as_str();
    futures::stream::iter(runs.iter_mut().filter(|r| *r.stage() == Stage::Admitted))
        .map(|run| {
            let span = info_span!(
                "fence",
                node = run.node().unwrap_or("-"),
                instance = run.instance_id().map_or("-", |i| i.as_str())
            );
            one(ctx, mode, at, no_schedule, hold, run).instrument(span)
        })
        .buffer_unordered(PARALLEL_NODES)
        .collect::<Vec<()>>()
        .await;
}

async fn one(
    ctx: &Ctx<'_>,
    mode: FenceMode,
    at: &str,
    no_schedule: bool,
    hold: Option<&Hold>,
    run: &mut NodeRun,
) {
    let (Some(stamp), Some(node), Some(plan)) = (
        run.stamp(mode, at, &ctx.correlation_id, no_schedule),
        run.node().map(str::to_owned),
        run.plan(),
    ) else {
        return;
    };
    if !plan.add_taint {
        // A Lambda retry keeps the request id: a fencing stamped with it was
        // written by an earlier attempt of this invocation, which may have
        // stopped before its Event; [`record`] writes it now.
        let ours = plan.marked_by.as_deref() == Some(ctx.correlation_id.as_str());
        run.tainted(Ok(ours.then_some(TaintOutcome::Applied)));
        return;
    }
    // A new taint is written only under the Lease, and bounded by the time
    // the last renewal leaves: past it another invocation may count.
    let left = match hold.map(Hold::left) {
        Some(None) => {
            warn!("the fencing Lease is no longer ours; the taint is not written");
            run.tainted(Err(
                "the fencing Lease was lost before the taint was written; retry".into(),
            ));
            return;
        }
        Some(Some(left)) => Some(left),
        None => None,
    };
    let started = Instant::now();
    let write = ctx.writes.taint_node(&node, &stamp);
    let result = match left {
        Some(left) => match tokio::time::timeout(left, write).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err("the fencing Lease ran out during the taint write; retry".into()),
        },
        None => write.await.map_err(|e| e.to_string()),
    };
    ctx.meter.stage(metrics::Stage::Taint, started.elapsed());
    match &result {
        Ok(TaintOutcome::Applied) => match mode {
            FenceMode::Taint => info!("out-of-service taint applied"),
            FenceMode::Legacy => info!("fenced the legacy way (marked)"),
        },
        Ok(TaintOutcome::AlreadyPresent) => info!("already fenced"),
        Ok(TaintOutcome::AnotherNode) => {
            warn!(
                "the Node of that name is no longer the one judged (another uid or machine): not tainted"
            )
        }
        Ok(TaintOutcome::NodeReady | TaintOutcome::NodeGone) => {}
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "taint failed; no volume is detached");
        }
    }
    run.tainted(result.map(Some));
    if let Stage::Skipped(reason) = run.stage() {
        warn!(%reason, "node changed before the taint; not fencing");
    }
}

/// Records the Event of every taint this invocation applied.
pub(crate) async fn record(ctx: &Ctx<'_>, mode: FenceMode, runs: &[NodeRun]) {
    for run in runs
        .iter()
        .filter(|r| *r.stage() == Stage::Tainted && r.taint_applied())
    {
        let (Some(node), Some(plan)) = (run.node(), run.plan()) else {
            continue;
        };
        let (instance, state) = (&plan.instance.id, &plan.instance.state);
        let event = match mode {
            FenceMode::Taint => NodeEvent::taint_applied(instance, state),
            FenceMode::Legacy => NodeEvent::fenced_legacy(instance, state),
        };
        ctx.record(node, event).await;
    }
}
