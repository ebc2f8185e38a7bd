//! Discover the volumes of every node to fence: one list of
//! VolumeAttachments, one of PersistentVolumes, one description of the
//! volumes from the cloud, whatever the number of nodes; and each node's
//! pods, for the volumes of pods the taint never evicts. In legacy mode
//! also every VolumeAttachment of the node, whatever its driver. A failed
//! list is an error on the node's report (the node is then not reported
//! fenced), never a reason to guess.

use futures::{StreamExt, join};

use super::{Ctx, PARALLEL_NODES};
use crate::core::facts::{FenceMode, PodRef};
use crate::core::instance::VolumeId;
use crate::core::metrics::Dependency;
use crate::core::plan::NodeRun;
use crate::core::volumes;
use crate::shell::cluster::ClusterError;

/// Sets each fencing run's volumes and what to do with each.
pub(super) async fn volumes(ctx: &Ctx<'_>, mode: FenceMode, runs: &mut [NodeRun]) {
    let mut errors = Vec::new();
    let (vas, pvs) = join!(
        ctx.cluster.list_volume_attachments(),
        ctx.cluster.list_persistent_volumes()
    );
    let mut failed = |e: ClusterError| {
        ctx.meter.error(Dependency::Kubernetes);
        errors.push(e.to_string());
    };
    let vas = vas.unwrap_or_else(|e| {
        failed(e);
        Vec::new()
    });
    let pvs = pvs.unwrap_or_else(|e| {
        failed(e);
        Vec::new()
    });
    let of_node: Vec<Option<Vec<_>>> = runs
        .iter()
        .map(|r| {
            let node = r.node.as_deref().filter(|_| r.fencing().is_some())?;
            Some(volumes::volumes_of_node(node, &vas, &pvs))
        })
        .collect();
    let mut ids: Vec<VolumeId> = of_node
        .iter()
        .flatten()
        .flatten()
        .map(|v| v.volume.clone())
        .collect();
    ids.sort();
    ids.dedup();
    let described = if ids.is_empty() {
        Vec::new()
    } else {
        ctx.cloud.describe_volumes(&ids).await.unwrap_or_else(|e| {
            ctx.meter.error(Dependency::Ec2);
            errors.push(e.to_string());
            Vec::new()
        })
    };
    let pods = pods_of_nodes(ctx, runs).await;
    for ((run, node_volumes), pods) in runs.iter_mut().zip(of_node).zip(pods) {
        let Some(node_volumes) = node_volumes else {
            continue;
        };
        run.errors.extend(errors.iter().cloned());
        match pods {
            Ok(pods) => {
                let kept = volumes::kept_by_pods(&node_volumes, &pods, &pvs);
                run.plan_volumes(node_volumes, &described, &kept);
                if mode == FenceMode::Legacy
                    && let Some(node) = run.node.clone()
                {
                    let attachments = volumes::attachments_of_node(&node, &vas);
                    run.plan_attachments(&attachments, &pods, &pvs);
                }
            }
            // Which volumes a pod keeps is unknown: none is planned.
            Err(e) => run.errors.push(e.to_string()),
        }
    }
}

/// The pods of each fencing run's node: a pod that tolerates the
/// out-of-service taint stays, and keeps its volumes, in either mode (the
/// legacy recipe frees what the taint would).
async fn pods_of_nodes(ctx: &Ctx<'_>, runs: &[NodeRun]) -> Vec<Result<Vec<PodRef>, ClusterError>> {
    futures::stream::iter(runs)
        .map(|run| async move {
            match run.node.as_deref().filter(|_| run.fencing().is_some()) {
                Some(node) => ctx.cluster.pods_on_node(node).await.inspect_err(|_| {
                    ctx.meter.error(Dependency::Kubernetes);
                }),
                None => Ok(Vec::new()),
            }
        })
        .buffered(PARALLEL_NODES)
        .collect()
        .await
}
