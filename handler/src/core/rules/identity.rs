//! Which machine UUIDs are identities. A UUID tells the Node's machine
//! from every other only when it is unique: a placeholder (see
//! [`SystemUuid::parse`]), or a UUID two Nodes report, or one two Systems
//! of the inventory serve, names no one machine, and counts as missing:
//! nothing is fenced nor powered off on it.

use std::collections::HashMap;

use crate::core::model::facts::NodeFacts;
use crate::core::model::redfish::{Doubt, SystemUuid};

/// Takes for no identity every UUID that more than one of `nodes` reports
/// (in either SMBIOS byte order): which of them a System with it backs
/// cannot be told. Only a list of every Node shows them all.
pub fn doubt_shared_by_nodes(nodes: &mut [NodeFacts]) {
    let mut count: HashMap<[u8; 16], usize> = HashMap::new();
    for key in nodes.iter().filter_map(|n| n.machine.system_uuid.key()) {
        *count.entry(key).or_default() += 1;
    }
    for node in nodes.iter_mut() {
        let uuid = node.machine.system_uuid;
        if uuid
            .key()
            .is_some_and(|k| count.get(&k).copied().unwrap_or(0) > 1)
        {
            node.machine.system_uuid = uuid.doubted(Doubt::SharedByNodes);
        }
    }
}

/// Whether the UUID a System shows is its own alone, given what the other
/// Systems of the inventory served (`None` for one never read): the UUID,
/// or the doubt that makes it no identity. A System never read holds back
/// no other machine's fencing: it is that System's own witness failure.
/// What it cannot rule out (that it, dark since it entered the inventory,
/// serves the same UUID) is the residual risk docs/onprem.md names.
pub fn unique_among_systems(
    uuid: SystemUuid,
    others: impl IntoIterator<Item = Option<SystemUuid>>,
) -> SystemUuid {
    let Some(key) = uuid.key() else {
        return uuid;
    };
    if others
        .into_iter()
        .flatten()
        .any(|other| other.key() == Some(key))
    {
        return uuid.doubted(Doubt::SharedBySystems);
    }
    uuid
}

/// Why the UUIDs that tie `node` to its machine's answer are no identity,
/// when one of them is doubtful: the Node's own first, then the System's.
pub fn doubt(node: &NodeFacts, machine: SystemUuid) -> Option<Doubt> {
    node.machine.system_uuid.doubt().or_else(|| machine.doubt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::Readiness;

    const A: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
    /// A in the other SMBIOS byte order.
    const A_SWAPPED: &str = "596b9427-449e-a74f-8e91-f3527a1ef094";
    const B: &str = "4c4c4544-0042-3510-8052-b4c04f4d3732";

    fn node(name: &str, uuid: &str) -> NodeFacts {
        let mut n = NodeFacts::bare(name, Readiness::Unknown);
        n.machine.system_uuid = SystemUuid::parse(Some(uuid));
        n
    }

    #[test]
    fn a_uuid_two_nodes_report_is_no_identity_in_either_byte_order() {
        let mut nodes = vec![node("a", A), node("b", B), node("c", A_SWAPPED)];
        doubt_shared_by_nodes(&mut nodes);
        let uuids: Vec<SystemUuid> = nodes.iter().map(|n| n.machine.system_uuid).collect();
        assert_eq!(uuids[0], SystemUuid::Doubtful(Doubt::SharedByNodes));
        assert_eq!(uuids[1], SystemUuid::parse(Some(B)));
        assert_eq!(uuids[2], SystemUuid::Doubtful(Doubt::SharedByNodes));
        assert_eq!(
            doubt(&nodes[0], SystemUuid::parse(Some(A))),
            Some(Doubt::SharedByNodes)
        );
        assert_eq!(doubt(&nodes[1], SystemUuid::parse(Some(B))), None);
    }

    #[test]
    fn a_uuid_is_a_system_s_own_unless_another_system_that_answered_serves_it() {
        let a = SystemUuid::parse(Some(A));
        let b = SystemUuid::parse(Some(B));
        let swapped = SystemUuid::parse(Some(A_SWAPPED));
        assert_eq!(unique_among_systems(a, [Some(b)]), a);
        assert_eq!(unique_among_systems(a, []), a);
        assert_eq!(
            unique_among_systems(a, [Some(b), Some(swapped)]),
            SystemUuid::Doubtful(Doubt::SharedBySystems)
        );
        // Issue 58, item 2: a System never read (its BMC dark, or refusing
        // the credentials) is no veto over every other machine.
        assert_eq!(unique_among_systems(a, [Some(b), None]), a);
        assert_eq!(unique_among_systems(a, [None, None]), a);
        // A share found is what counts, whatever went unread.
        assert_eq!(
            unique_among_systems(a, [None, Some(a)]),
            SystemUuid::Doubtful(Doubt::SharedBySystems)
        );
        assert_eq!(
            unique_among_systems(SystemUuid::Missing, [None]),
            SystemUuid::Missing
        );
    }
}
