//! Discover the volumes of every node to fence: one list of
//! VolumeAttachments, one of PersistentVolumes, one description of the
//! volumes from the cloud, whatever the number of nodes. A failed list is
//! an error on each node's report (the node is then not reported fenced),
//! never a reason to guess.

use futures::join;

use super::Ctx;
use crate::core::instance::VolumeId;
use crate::core::metrics::Dependency;
use crate::core::plan::NodeRun;
use crate::core::volumes;
use crate::shell::cluster::ClusterError;

/// Sets each fencing run's volumes and what to do with each.
pub(super) async fn volumes(ctx: &Ctx<'_>, runs: &mut [NodeRun]) {
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
    for (run, node_volumes) in runs.iter_mut().zip(of_node) {
        let Some(node_volumes) = node_volumes else {
            continue;
        };
        run.plan_volumes(node_volumes, &described);
        run.errors.extend(errors.iter().cloned());
    }
}
