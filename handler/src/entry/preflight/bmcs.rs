//! The on-premises half of preflight: each Node the inventory places is
//! looked at on its BMC as a fencing would look at it, the witness round of
//! `serve` on demand ([`witness::look_at`]); inventory entries that back no
//! Node are named.

use super::{Check, Status, failed, row};
use crate::core::model::facts::NodeFacts;
use crate::core::model::instance::{InstanceId, Provider};
use crate::core::rules::reach::Reach;
use crate::entry::witness;
use crate::shell::onprem::OnPrem;

/// The BMC checks, when there is an inventory; `active`: whether active
/// fencing is on, so that a `ForceOff` must be possible too.
pub(super) async fn check(
    onprem: Option<&OnPrem>,
    nodes: Option<&[NodeFacts]>,
    active: bool,
    checks: &mut Vec<Check>,
) {
    let Some(onprem) = onprem else { return };
    let nodes = nodes.unwrap_or_default();
    let placed: Vec<&InstanceId> = nodes
        .iter()
        .filter_map(|n| n.instance.as_ref())
        .filter(|i| i.provider() == Provider::Redfish)
        .collect();
    let unplaced: Vec<String> = onprem
        .inventory
        .machines()
        .map(|b| InstanceId::redfish(&b.machine))
        .filter(|id| !placed.contains(&id))
        .map(|id| id.to_string())
        .collect();
    if !unplaced.is_empty() {
        checks.push(row(
            "BMC inventory",
            Status::Warn,
            format!(
                "{} machine(s) back no Node of this cluster (no Node of that name, nor labelled for them): {}",
                unplaced.len(),
                unplaced.join(", ")
            ),
        ));
    }
    // Every placed Node, whatever NODE_SELECTOR says: a Node brought into
    // reach later must find its BMC serving too.
    let witnessed = witness::look_at(&onprem.bmcs, nodes, &Reach::EVERYWHERE, active).await;
    let mut fine = 0;
    for w in &witnessed {
        match &w.verdict {
            Ok(()) => fine += 1,
            Err(failing) => checks.push(failed(
                format!("BMC {}", w.machine),
                format!(
                    "Node {} ({}): {}; its Node is never fenced nor powered off until it is mended",
                    w.node,
                    failing.reason.code(),
                    failing.detail
                ),
                failing.fix,
            )),
        }
    }
    checks.push(row(
        "BMCs",
        if fine == witnessed.len() {
            Status::Pass
        } else {
            Status::Fail
        },
        format!(
            "{fine} of {} Node(s) placed by the inventory answered on their BMC, their System's UUID the Node's",
            witnessed.len()
        ),
    ));
}
