//! Force-deleting the pods of a fenced node (grace period 0, each naming its
//! uid), so that their controllers replace them at once. Only once the
//! machine is confirmed off, right before: the kubelet cannot stop them, so a
//! pod deleted while its machine ran would keep running beside its
//! replacement.

use tracing::{info, warn};

use crate::core::model::facts::{PodRef, Readiness};
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::plan::NodeRun;
use crate::pipeline::ctx::Ctx;
use crate::shell::cluster::ClusterError;

/// Force-deletes the pods bound to `node` that `goes` picks; records how
/// many on the run and in an Event. A failed list or delete is an error on
/// the run.
pub(crate) async fn force_delete(
    ctx: &Ctx<'_>,
    node: &str,
    run: &mut NodeRun,
    goes: impl Fn(&PodRef) -> bool,
) {
    let values = run
        .plan()
        .map(|p| p.out_of_service.clone())
        .unwrap_or_default();
    let pods = match ctx.reads.pods_on_node(node, &values).await {
        Ok(pods) => pods,
        Err(e) => {
            tally(ctx, run, vec![Err(e)]);
            return;
        }
    };
    let going: Vec<&PodRef> = pods.iter().filter(|p| goes(p)).collect();
    // Pods are bound by name. The Node judged still there after the list
    // (a uid never comes back) means every pod listed was bound to it; a
    // Node registered again under the name holds pods of a live machine.
    // And not Ready: a kubelet that reports in again (back, or another
    // machine's that adopted the Node) runs its pods, which a delete would
    // leave running beside their replacements.
    if let Some(judged) = run
        .node_uid()
        .filter(|_| !going.is_empty())
        .map(str::to_owned)
    {
        match ctx.reads.get_node(node).await {
            Ok(Some(now)) if now.uid.as_deref() == Some(judged.as_str()) => {
                if now.readiness == Readiness::Ready {
                    warn!("the Node reports Ready again: its pods are not deleted");
                    run.failed_with([format!(
                        "node {node} reports Ready again (its kubelet runs): its pods are not deleted"
                    )]);
                    return;
                }
            }
            Ok(_) => {
                warn!(
                    "the Node of that name is no longer the one judged: its pods are not deleted"
                );
                run.failed_with([format!(
                    "node {node} was deleted or registered again (uid {judged} is gone): its pods are not deleted"
                )]);
                return;
            }
            Err(e) => {
                tally(ctx, run, vec![Err(e)]);
                return;
            }
        }
    }
    let mut results = Vec::new();
    for pod in going {
        results.push(ctx.writes.force_delete_pod(pod).await);
    }
    let deleted = tally(ctx, run, results);
    run.pods_deleted(deleted);
    if deleted > 0 {
        info!(deleted, "pods force-deleted");
        ctx.record(node, NodeEvent::pods_deleted(deleted)).await;
    }
}

/// Counts the calls that succeeded; each failure is counted, logged and
/// kept on the run (its outcome becomes `failed`).
pub(crate) fn tally(
    ctx: &Ctx<'_>,
    run: &mut NodeRun,
    results: Vec<Result<(), ClusterError>>,
) -> usize {
    let mut done = 0;
    for result in results {
        match result {
            Ok(()) => done += 1,
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "fencing step failed");
                run.failed_with([e.to_string()]);
            }
        }
    }
    done
}
