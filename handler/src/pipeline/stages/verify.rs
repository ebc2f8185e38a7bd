//! Verification: waits, bounded by the policy, until the fenced machines no
//! longer hold any volume a detach was sent for (the volume is `available`,
//! or already attached to the replacement's node). What they still hold
//! when the bound runs out is reported stuck, and the node's outcome says
//! so.

use std::time::Instant;

use tracing::warn;

use crate::core::model::instance::VolumeId;
use crate::core::outbound::metrics;
use crate::core::rules::plan::NodeRun;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::wait;

/// Polls the cloud for the pending volumes of every run until all are free
/// or the policy's bound has passed.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let pending = |runs: &[NodeRun]| -> Vec<VolumeId> {
        runs.iter().flat_map(|r| r.pending().cloned()).collect()
    };
    let started = Instant::now();
    let deadline = inv.until(tokio::time::Instant::now() + inv.policy.detach_wait);
    let Invocation {
        switch,
        runs,
        policy,
        ..
    } = inv;
    let mut looked = false;
    let every = policy.poll_interval;
    let look = async || {
        let waiting = pending(runs);
        if waiting.is_empty() {
            return Ok::<_, std::convert::Infallible>(true);
        }
        looked = true;
        match ctx.cloud.describe_volumes(&waiting).await {
            Ok(described) => runs.iter_mut().for_each(|r| r.observe(&described)),
            Err(e) => {
                ctx.meter.error(e.dependency());
                warn!(error = %e, "could not check detached volumes");
            }
        }
        Ok(pending(runs).is_empty())
    };
    let ns = &policy.control_namespace;
    let _ = wait::poll(
        ctx,
        switch,
        ns,
        (deadline, every),
        "the detached volumes",
        look,
    )
    .await;
    if looked {
        ctx.meter.stage(metrics::Stage::Verify, started.elapsed());
    }
    inv.runs.iter_mut().for_each(NodeRun::verified);
    Ok(())
}
