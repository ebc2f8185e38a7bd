//! What is stuck on the hung Nodes active fencing would power off
//! (`ACTIVE_FENCING=stuck`): every VolumeAttachment and PersistentVolume,
//! one list of each whatever the number of Nodes, and each Node's pods,
//! judged by [`crate::core::rules::stuck`]. A read that failed leaves its
//! Node unread, which refuses the power-off: a retry reads again.

use futures::{StreamExt, join};
use tracing::{info, warn};

use crate::core::model::facts::NodeFacts;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::stuck::{self, Stranding};
use crate::core::rules::volumes;
use crate::pipeline::ctx::{Ctx, PARALLEL_NODES};

/// What is stuck on each of `nodes`, by Node name.
pub(crate) async fn read(ctx: &Ctx<'_>, nodes: &[&NodeFacts]) -> Vec<(String, Stranding)> {
    let unread = || {
        nodes
            .iter()
            .map(|n| (n.name.clone(), Stranding::Unread))
            .collect()
    };
    let (vas, pvs) = join!(
        ctx.reads.list_volume_attachments(),
        ctx.reads.list_persistent_volumes()
    );
    let (vas, pvs) = match (vas, pvs) {
        (Ok(vas), Ok(pvs)) => (vas, pvs),
        (Err(e), _) | (_, Err(e)) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "could not list the volumes: no hung node is known to hold one");
            return unread();
        }
    };
    futures::stream::iter(nodes)
        .map(|node| async {
            // The pods judged against the taint node-fencer would add: one
            // that tolerates it for good keeps its volume even once fenced.
            let taints = node.out_of_service_values(true);
            let stranding = match ctx.reads.pods_on_node(&node.name, &taints).await {
                Ok(pods) => {
                    let attachments = volumes::attachments_of_node(&node.name, &vas);
                    let found = stuck::stranded(&attachments, &pods, &pvs);
                    match found.first() {
                        Some(s) => info!(
                            node = node.name,
                            volume = s.volume,
                            pod = s.pod,
                            stuck = found.len(),
                            "a volume only one node may attach is stuck on the hung node"
                        ),
                        None => info!(node = node.name, "nothing is stuck on the hung node"),
                    }
                    Stranding::Read(found)
                }
                Err(e) => {
                    ctx.meter.error(Dependency::Kubernetes);
                    warn!(node = node.name, error = %e, "could not list the node's pods");
                    Stranding::Unread
                }
            };
            (node.name.clone(), stranding)
        })
        .buffered(PARALLEL_NODES)
        .collect()
        .await
}
