//! The last refusal before the taint: a fencing run whose Node's disks
//! another machine that may run holds ([`held_disks`]). The disks the
//! discovery described say which machines hold them; those machines are
//! described in one call for the whole batch. A question that fails leaves
//! the Node for the retry, never fenced unasked.

use tracing::warn;

use crate::core::model::facts::{InstanceFacts, NodeFacts, VolumeFacts};
use crate::core::model::instance::InstanceId;
use crate::core::rules::decide::Skip;
use crate::core::rules::held_disks;
use crate::core::rules::plan::NodeRun;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::stages::plan::refused;

/// Refuses each fencing run one of whose Node's disks another machine that
/// may run holds, and that no other Ready Node of `nodes` names.
pub(crate) async fn refuse(
    ctx: &Ctx<'_>,
    runs: &mut [NodeRun],
    described: &[VolumeFacts],
    nodes: &[NodeFacts],
) {
    let held: Vec<_> = runs
        .iter()
        .map(|run| {
            run.fencing().map_or_else(Vec::new, |plan| {
                held_disks::held_elsewhere(&plan.instance.id, &plan.node_volumes, described)
            })
        })
        .collect();
    let mut ids: Vec<InstanceId> = held.iter().flatten().map(|(_, m)| m.clone()).collect();
    if ids.is_empty() {
        return;
    }
    ids.sort();
    ids.dedup();
    let holders: Result<Vec<InstanceFacts>, String> =
        ctx.cloud.describe_instances(&ids).await.map_err(|e| {
            ctx.meter.error(e.dependency());
            format!("the machines that hold the Node's disks could not be described: {e}")
        });
    for (run, held) in runs.iter_mut().zip(held) {
        let (Some(node), Some(plan)) = (run.node().map(str::to_owned), run.fencing()) else {
            continue;
        };
        if held.is_empty() {
            continue;
        }
        let reason = match &holders {
            Ok(holders) => {
                let Some(by) = held_disks::judge(&node, &held, holders, nodes) else {
                    continue;
                };
                warn!(
                    node,
                    machine = %plan.instance.id,
                    holder = by.by.machine,
                    disk = by.volume,
                    state = by.by.state,
                    "another machine holds the Node's disk: not fenced"
                );
                let machine = plan.instance.id.as_str().to_owned();
                Skip::DiskHeld { machine, by }
            }
            Err(error) => Skip::LookupFailed {
                error: error.clone(),
            },
        };
        // A dry run changes nothing, not even the Node's Events.
        if !plan.dry_run && matches!(reason, Skip::DiskHeld { .. }) {
            refused(ctx, &node, &reason).await;
        }
        run.skip(reason);
    }
}
