//! The legacy recipe, for clusters without the out-of-service taint: the
//! pods still bound to the node are force-deleted (grace period 0) so their
//! controllers replace them, and the node's VolumeAttachments of its EBS
//! volumes are deleted so the attach/detach controller lets go of them. The
//! Node object stays (deleting it loses its labels, taints and history).

use tracing::{info, warn};

use super::Ctx;
use crate::core::events::NodeEvent;
use crate::core::metrics::Dependency;
use crate::core::plan::NodeRun;
use crate::shell::cluster::ClusterError;

/// Runs the recipe for one node; every failure is an error on its run.
pub(super) async fn recipe(ctx: &Ctx<'_>, node: &str, run: &mut NodeRun) {
    match ctx.cluster.pods_on_node(node).await {
        Ok(pods) => {
            let mut results = Vec::new();
            for pod in &pods {
                results.push(ctx.cluster.force_delete_pod(pod).await);
            }
            let deleted = tally(ctx, run, results);
            run.pods_deleted = deleted;
            if deleted > 0 {
                info!(deleted, "pods force-deleted");
                ctx.record(node, NodeEvent::pods_deleted(deleted)).await;
            }
        }
        Err(e) => {
            tally(ctx, run, vec![Err(e)]);
        }
    }
    let mut attachments: Vec<(String, String)> = run
        .plan
        .iter()
        .flat_map(|p| {
            p.node_volumes
                .iter()
                .map(|v| (v.attachment.clone(), v.attachment_uid.clone()))
        })
        .collect();
    attachments.sort_unstable();
    attachments.dedup();
    let mut results = Vec::new();
    for (name, uid) in &attachments {
        results.push(ctx.cluster.delete_volume_attachment(name, uid).await);
    }
    let deleted = tally(ctx, run, results);
    run.attachments_deleted = deleted;
    if deleted > 0 {
        info!(deleted, "volumeattachments deleted");
        ctx.record(node, NodeEvent::attachments_deleted(deleted))
            .await;
    }
}

/// Counts the calls that succeeded; each failure is counted, logged and
/// kept on the run (its outcome becomes `failed`).
fn tally(ctx: &Ctx<'_>, run: &mut NodeRun, results: Vec<Result<(), ClusterError>>) -> usize {
    let mut done = 0;
    for result in results {
        match result {
            Ok(()) => done += 1,
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "legacy fencing step failed");
                run.errors.push(e.to_string());
            }
        }
    }
    done
}
