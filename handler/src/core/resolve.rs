//! Matching suspects to Nodes: by `spec.providerID` first, then by name,
//! private DNS name or InternalIP. Pure.

use crate::core::facts::{InstanceFacts, NodeFacts};
use crate::core::instance::InstanceId;
use crate::core::suspect::NodeRef;

/// Where a suspect points after looking at the node list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A Node of this cluster (index into the node list).
    Node(usize),
    /// An instance no Node claims by provider id; may still match by private
    /// DNS name once EC2 has described it.
    Instance(InstanceId),
    /// Nothing in this cluster matches.
    Unmatched,
}

/// Resolves one reference against the node list.
pub fn resolve(target: &NodeRef, nodes: &[NodeFacts]) -> Resolution {
    let found = match target {
        NodeRef::Instance(id) => nodes.iter().position(|n| n.instance.as_ref() == Some(id)),
        NodeRef::Name(name) => nodes
            .iter()
            .position(|n| n.name == name.as_str())
            .or_else(|| {
                nodes
                    .iter()
                    .position(|n| n.host_names.iter().any(|h| h == name.as_str()))
            }),
        NodeRef::Address(ip) => nodes.iter().position(|n| n.internal_ips.contains(ip)),
    };
    match (found, target) {
        (Some(i), _) => Resolution::Node(i),
        (None, NodeRef::Instance(id)) => Resolution::Instance(id.clone()),
        (None, _) => Resolution::Unmatched,
    }
}

/// The fallback for instances without a matching provider id: a Node named
/// after, or addressed by, the instance's private DNS name. A Node whose
/// provider id names another instance is never matched this way.
pub fn resolve_by_dns(instance: &InstanceFacts, nodes: &[NodeFacts]) -> Option<usize> {
    let dns = instance
        .private_dns_name
        .as_deref()
        .filter(|d| !d.is_empty())?;
    nodes.iter().position(|n| {
        let claims_other = n.instance.as_ref().is_some_and(|i| i != &instance.id);
        !claims_other && (n.name == dns || n.host_names.iter().any(|h| h == dns))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::facts::Readiness;
    use crate::core::instance::InstanceState;
    use crate::core::names::NodeName;

    fn node(name: &str, instance: Option<&str>, ip: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            instance: instance.and_then(InstanceId::parse),
            readiness: Readiness::Unknown,
            internal_ips: vec![ip.parse().unwrap()],
            host_names: vec![format!("{name}.ec2.internal")],
            taints: vec![],
            ready_since: None,
            fenced: None,
        }
    }

    #[test]
    fn by_provider_id_name_host_and_ip() {
        let nodes = vec![
            node("a", Some("i-0000000a"), "10.0.0.1"),
            node("b", Some("i-0000000b"), "10.0.0.2"),
            node("c", None, "10.0.0.3"),
        ];
        let id = |s| NodeRef::Instance(InstanceId::parse(s).unwrap());
        assert_eq!(resolve(&id("i-0000000b"), &nodes), Resolution::Node(1));
        assert_eq!(
            resolve(&id("i-0000000f"), &nodes),
            Resolution::Instance(InstanceId::parse("i-0000000f").unwrap())
        );
        assert_eq!(
            resolve(&NodeRef::Name(NodeName::parse("c").unwrap()), &nodes),
            Resolution::Node(2)
        );
        assert_eq!(
            resolve(
                &NodeRef::Name(NodeName::parse("a.ec2.internal").unwrap()),
                &nodes
            ),
            Resolution::Node(0)
        );
        assert_eq!(
            resolve(&NodeRef::Address("10.0.0.2".parse().unwrap()), &nodes),
            Resolution::Node(1)
        );
        assert_eq!(
            resolve(&NodeRef::Name(NodeName::parse("zzz").unwrap()), &nodes),
            Resolution::Unmatched
        );
    }

    #[test]
    fn dns_fallback_never_steals_a_node_of_another_instance() {
        let nodes = vec![
            node("ip-10-0-0-1.ec2.internal", Some("i-0000000a"), "10.0.0.1"),
            node("ip-10-0-0-2.ec2.internal", None, "10.0.0.2"),
        ];
        let facts = |id: &str, dns: &str| InstanceFacts {
            id: InstanceId::parse(id).unwrap(),
            state: InstanceState::Stopped,
            private_dns_name: Some(dns.into()),
            root_device_name: None,
        };
        assert_eq!(
            resolve_by_dns(&facts("i-0000000f", "ip-10-0-0-1.ec2.internal"), &nodes),
            None
        );
        assert_eq!(
            resolve_by_dns(&facts("i-0000000f", "ip-10-0-0-2.ec2.internal"), &nodes),
            Some(1)
        );
        assert_eq!(resolve_by_dns(&facts("i-0000000f", ""), &nodes), None);
    }
}
