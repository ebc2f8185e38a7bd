//! Verification: waits, bounded by the policy, until the fenced instance
//! no longer holds any volume a detach was sent for (the volume is
//! `available`, or already attached to the replacement's node). What it still
//! holds when the bound runs out is reported stuck, and the node's outcome
//! says so.

use std::time::Instant;

use tracing::warn;

use super::Ctx;
use crate::core::instance::VolumeId;
use crate::core::metrics::{self, Dependency};
use crate::core::plan::NodeRun;
use crate::core::policy::Policy;

/// Polls the cloud for the pending volumes of every run until all are free
/// or `policy.detach_wait` has passed.
pub(super) async fn volumes(ctx: &Ctx<'_>, policy: &Policy, runs: &mut [NodeRun]) {
    let pending = |runs: &[NodeRun]| -> Vec<VolumeId> {
        runs.iter().flat_map(|r| r.pending().cloned()).collect()
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + policy.detach_wait;
    loop {
        let waiting = pending(runs);
        if waiting.is_empty() {
            break;
        }
        match ctx.cloud.describe_volumes(&waiting).await {
            Ok(described) => runs.iter_mut().for_each(|r| r.observe(&described)),
            Err(e) => {
                ctx.meter.error(Dependency::Ec2);
                warn!(error = %e, "could not check detached volumes");
            }
        }
        if pending(runs).is_empty() || tokio::time::Instant::now() >= deadline {
            ctx.meter.stage(metrics::Stage::Verify, started.elapsed());
            break;
        }
        tokio::time::sleep(policy.poll_interval).await;
    }
    runs.iter_mut().for_each(NodeRun::verified);
}
