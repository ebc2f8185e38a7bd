//! The on-premises half of preflight: each Node the inventory places is
//! looked at on its BMC, as a fencing would, and its System held to the
//! UUID its kubelet read; inventory entries that back no Node are named.

use super::{Check, Status, failed, row};
use crate::core::model::facts::{InstanceFacts, NodeFacts};
use crate::core::model::instance::{InstanceId, Provider};
use crate::core::rules::identity;
use crate::shell::cloud::Cloud;
use crate::shell::onprem::OnPrem;

/// The BMC checks, when there is an inventory.
pub(super) async fn check(
    onprem: Option<&OnPrem>,
    nodes: Option<&[NodeFacts]>,
    checks: &mut Vec<Check>,
) {
    let Some(onprem) = onprem else { return };
    // A UUID two Nodes report is no identity, as in a fencing.
    let mut nodes = nodes.unwrap_or_default().to_vec();
    identity::doubt_shared_by_nodes(&mut nodes);
    let nodes = nodes.as_slice();
    let placed: Vec<(&NodeFacts, &InstanceId)> = nodes
        .iter()
        .filter_map(|n| n.instance.as_ref().map(|i| (n, i)))
        .filter(|(_, i)| i.provider() == Provider::Redfish)
        .collect();
    let unplaced: Vec<String> = onprem
        .inventory
        .machines()
        .map(|b| InstanceId::redfish(&b.machine))
        .filter(|id| !placed.iter().any(|(_, i)| *i == id))
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
    let ids: Vec<InstanceId> = placed.iter().map(|(_, i)| (*i).clone()).collect();
    let looked = onprem.bmcs.describe_each(&ids).await;
    for (failed_ids, e) in &looked.failed {
        checks.push(failed(
            format!("BMC {}", names(failed_ids)),
            e.to_string(),
            "check the endpoint, the credentials (REDFISH_CREDENTIALS_DIR) and the CA bundle; until the BMC answers, its Node is never fenced",
        ));
    }
    let fine = held_to_nodes(&looked.found, &placed, checks);
    checks.push(row(
        "BMCs",
        if fine == placed.len() {
            Status::Pass
        } else {
            Status::Fail
        },
        format!(
            "{fine} of {} Node(s) placed by the inventory answered on their BMC, their System's UUID the Node's",
            placed.len()
        ),
    ));
}

/// How many of the Systems `found` are the machines of the Nodes that
/// `placed` puts on them; a row for each that is not, with the reason.
fn held_to_nodes(
    found: &[InstanceFacts],
    placed: &[(&NodeFacts, &InstanceId)],
    checks: &mut Vec<Check>,
) -> usize {
    let mut fine = 0;
    for facts in found {
        let Some((node, _)) = placed.iter().find(|(_, i)| **i == facts.id) else {
            continue;
        };
        if facts.identity.may_be_machine_of(&node.machine) {
            fine += 1;
        } else if let Some(doubt) = identity::doubt(node, facts.identity.system_uuid) {
            checks.push(failed(
                format!("BMC {}", facts.id),
                format!(
                    "the UUID that ties Node {} to this System names no one machine: {doubt}; its Node is never fenced nor powered off",
                    node.name
                ),
                "give each board a UUID of its own (the vendor's tool writes SMBIOS; a VM's definition sets it)",
            ));
        } else {
            checks.push(failed(
                format!("BMC {}", facts.id),
                format!(
                    "the System's UUID is not the one Node {}'s kubelet read (status.nodeInfo.systemUUID), or one of them is missing: its Node is never fenced nor powered off",
                    node.name
                ),
                "point the inventory entry at the Node's own machine (endpoint and system)",
            ));
        }
    }
    fine
}

fn names(ids: &[InstanceId]) -> String {
    ids.iter()
        .map(InstanceId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
