//! Discover the volumes of every node to fence: its VolumeAttachments and
//! their PersistentVolumes, read by name when every Node records its
//! volumes (the attach/detach controller's `status.volumesAttached`), else
//! one list of each for all the nodes; one description of the volumes from
//! the cloud, whatever the number of nodes; and each node's pods, for the
//! volumes of pods the taint never evicts; a Node one of whose disks
//! another machine that may run holds is refused ([`held`]). In legacy
//! mode also every VolumeAttachment of the node, whatever its driver. A
//! failed read is an error on the node's report (the node is then not
//! reported fenced), never a reason to guess.

use futures::{StreamExt, join};
use tracing::{info, warn};

use crate::core::model::facts::{AttachmentFacts, FenceMode, NodeFacts, PodRef, PvFacts};
use crate::core::model::instance::VolumeId;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::plan::NodeRun;
use crate::core::rules::volumes;
use crate::pipeline::ctx::{Ctx, PARALLEL_NODES};
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::stages::held;
use crate::shell::cluster::ClusterError;

/// Reads by name in flight at once. EC2 caps the volumes of an instance at
/// a few dozen, so a node's attachments take a few rounds at most.
const PARALLEL_READS: usize = 8;

/// Sets each fencing run's volumes and what to do with each.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let Some(mode) = inv.mode.filter(|_| inv.fencing()) else {
        return Ok(());
    };
    let nodes = inv.view.as_ref().map_or(&[][..], |v| &v.nodes[..]);
    volumes(ctx, mode, &mut inv.runs, nodes).await;
    Ok(())
}

async fn volumes(ctx: &Ctx<'_>, mode: FenceMode, runs: &mut [NodeRun], nodes: &[NodeFacts]) {
    let mut errors = Vec::new();
    let by_name = match attachment_names(runs, mode) {
        Some(names) => read_by_name(ctx, &names)
            .await
            .inspect_err(|e| {
                ctx.meter.error(Dependency::Kubernetes);
                // A role without `get` (an older RBAC manifest), or a flaky
                // read: the lists give the same answer.
                warn!(error = %e, "could not read the attachments by name: listing them");
            })
            .ok(),
        None => None,
    };
    let (vas, pvs) = match by_name {
        Some(read) => read,
        None => list(ctx, &mut errors).await,
    };
    let of_node: Vec<Option<Vec<_>>> = runs
        .iter()
        .map(|r| {
            let node = r.node()?;
            let machine = r.fencing().map(|plan| &plan.instance.id)?;
            Some(volumes::volumes_of_node(node, Some(machine), &vas, &pvs))
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
            ctx.meter.error(e.dependency());
            errors.push(e.to_string());
            Vec::new()
        })
    };
    let pods = pods_of_nodes(ctx, runs).await;
    for ((run, node_volumes), pods) in runs.iter_mut().zip(of_node).zip(pods) {
        let Some(node_volumes) = node_volumes else {
            continue;
        };
        run.failed_with(errors.iter().cloned());
        match pods {
            Ok(pods) => {
                let kept = volumes::kept_by_pods(&node_volumes, &pods, &pvs);
                run.plan_volumes(node_volumes, &described, &kept);
                if mode == FenceMode::Legacy
                    && let Some(node) = run.node().map(str::to_owned)
                {
                    let attachments = volumes::attachments_of_node(&node, &vas);
                    run.plan_attachments(&attachments, &pods, &pvs);
                }
            }
            // Which volumes a pod keeps is unknown: none is planned.
            Err(e) => run.failed_with([e.to_string()]),
        }
    }
    held::refuse(ctx, runs, &described, nodes).await;
}

/// Every VolumeAttachment and PersistentVolume in the cluster.
async fn list(ctx: &Ctx<'_>, errors: &mut Vec<String>) -> (Vec<AttachmentFacts>, Vec<PvFacts>) {
    let (vas, pvs) = join!(
        ctx.reads.list_volume_attachments(),
        ctx.reads.list_persistent_volumes()
    );
    (
        or_failed(ctx, vas, errors).unwrap_or_default(),
        or_failed(ctx, pvs, errors).unwrap_or_default(),
    )
}

/// The VolumeAttachments `names`, those that exist, and the
/// PersistentVolumes they name; the first error if a read failed.
async fn read_by_name(
    ctx: &Ctx<'_>,
    names: &[String],
) -> Result<(Vec<AttachmentFacts>, Vec<PvFacts>), ClusterError> {
    let vas = each(names.iter().map(String::as_str), |name| {
        ctx.reads.get_volume_attachment(name)
    })
    .await?;
    let mut pv_names: Vec<&str> = vas.iter().filter_map(|va| va.pv_name.as_deref()).collect();
    pv_names.sort_unstable();
    pv_names.dedup();
    let pvs = each(pv_names, |name| ctx.reads.get_persistent_volume(name)).await?;
    info!(
        named = names.len(),
        found = vas.len(),
        "the nodes' attachments read by name, as their Nodes record them"
    );
    Ok((vas, pvs))
}

/// The objects `read` finds under `names`, a few reads at once; the first
/// error if one failed.
async fn each<'a, T, Fut>(
    names: impl IntoIterator<Item = &'a str>,
    read: impl Fn(&'a str) -> Fut,
) -> Result<Vec<T>, ClusterError>
where
    Fut: Future<Output = Result<Option<T>, ClusterError>>,
{
    let read: Vec<_> = futures::stream::iter(names)
        .map(read)
        .buffered(PARALLEL_READS)
        .collect()
        .await;
    let found: Vec<Option<T>> = read.into_iter().collect::<Result<_, _>>()?;
    Ok(found.into_iter().flatten().collect())
}

/// The value, or `None` with the error counted and kept for the reports.
fn or_failed<T>(
    ctx: &Ctx<'_>,
    result: Result<T, ClusterError>,
    errors: &mut Vec<String>,
) -> Option<T> {
    result
        .inspect_err(|e| {
            ctx.meter.error(Dependency::Kubernetes);
            errors.push(e.to_string());
        })
        .ok()
}

/// The attachments of every fencing run's node by name; `None` when one of
/// the Nodes does not record its volumes (one list then serves them all).
fn attachment_names(runs: &[NodeRun], mode: FenceMode) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for run in runs {
        let (Some(plan), Some(node)) = (run.fencing(), run.node()) else {
            continue;
        };
        names.extend(volumes::attachment_names(
            node,
            plan.attached.as_deref(),
            mode,
        )?);
    }
    names.sort();
    names.dedup();
    Some(names)
}

/// The pods of each fencing run's node: a pod that tolerates the
/// out-of-service taint stays, and keeps its volumes, in either mode (the
/// legacy recipe frees what the taint would).
async fn pods_of_nodes(ctx: &Ctx<'_>, runs: &[NodeRun]) -> Vec<Result<Vec<PodRef>, ClusterError>> {
    futures::stream::iter(runs)
        .map(|run| async move {
            match (run.node(), run.fencing()) {
                (Some(node), Some(plan)) => ctx
                    .reads
                    .pods_on_node(node, &plan.out_of_service)
                    .await
                    .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes)),
                _ => Ok(Vec::new()),
            }
        })
        .buffered(PARALLEL_NODES)
        .collect()
        .await
}
