//! Matching suspects to Nodes: by `spec.providerID` first, then by name,
//! private DNS name or InternalIP. Pure.

use crate::core::inbound::suspect::NodeRef;
use crate::core::model::facts::{InstanceFacts, NodeFacts};
use crate::core::model::instance::InstanceId;

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

/// What proves, for a cluster without a cloud provider, that an instance is
/// one of its Nodes' machines: the cluster's VPC and, where set, a tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterScope {
    /// The cluster's VPC (`CLUSTER_VPC_ID`).
    pub vpc: String,
    /// A tag the cluster's instances carry (`CLUSTER_TAG`): its key, and its
    /// value when one is given.
    pub tag: Option<(String, Option<String>)>,
}

impl ClusterScope {
    /// True when the instance runs in the cluster's VPC and carries its tag.
    pub fn holds(&self, instance: &InstanceFacts) -> bool {
        let tagged = match &self.tag {
            None => true,
            Some((key, value)) => instance
                .tags
                .iter()
                .any(|(k, v)| k == key && value.as_ref().is_none_or(|want| want == v)),
        };
        instance.vpc_id.as_deref() == Some(self.vpc.as_str()) && tagged
    }
}

/// Who an instance is when no Node claims it by provider id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unclaimed {
    /// This Node's own machine: in the cluster's scope, and the only Node
    /// without a provider id whose InternalIP is one of the instance's.
    Node(usize),
    /// A Node without a provider id carries the instance's private DNS name,
    /// but no scope is configured: nothing proves it is that Node's machine
    /// (other VPCs reuse the same names), so it names the Node and no instance.
    Unproven(usize),
    /// None of this cluster's Nodes.
    Nothing,
}

/// The rule for an instance no Node claims by provider id. A name is never
/// proof: another VPC of the account reusing the CIDR has instances with the
/// same private DNS names and addresses. Only the cluster's scope (its VPC and
/// tag) plus the Node's InternalIP name the Node's own machine.
pub(crate) fn resolve_unclaimed(
    instance: &InstanceFacts,
    nodes: &[NodeFacts],
    scope: Option<&ClusterScope>,
) -> Unclaimed {
    let unclaimed = || {
        nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.instance.is_none())
    };
    match scope {
        Some(scope) => {
            if !scope.holds(instance) {
                return Unclaimed::Nothing;
            }
            let mut matches = unclaimed().filter(|(_, n)| {
                n.internal_ips
                    .iter()
                    .any(|ip| instance.private_ips.contains(ip))
            });
            match (matches.next(), matches.next()) {
                (Some((i, _)), None) => Unclaimed::Node(i),
                // Two Nodes on one address: neither is proven.
                _ => Unclaimed::Nothing,
            }
        }
        None => {
            let Some(dns) = instance
                .private_dns_name
                .as_deref()
                .filter(|d| !d.is_empty())
            else {
                return Unclaimed::Nothing;
            };
            unclaimed()
                .find(|(_, n)| n.name == dns || n.host_names.iter().any(|h| h == dns))
                .map_or(Unclaimed::Nothing, |(i, _)| Unclaimed::Unproven(i))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::Readiness;
    use crate::core::model::instance::InstanceState;
    use crate::core::model::names::NodeName;

    fn node(name: &str, instance: Option<&str>, ip: &str) -> NodeFacts {
        NodeFacts {
            seen_off: None,
            version: None,
            labels: Default::default(),
            uid: None,
            attached: None,
            machine: Default::default(),
            power: Default::default(),
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

    fn instance(id: &str, vpc: &str, ip: &str, dns: &str) -> InstanceFacts {
        InstanceFacts {
            id: InstanceId::parse(id).unwrap(),
            state: InstanceState::Stopped,
            private_dns_name: Some(dns.into()),
            vpc_id: Some(vpc.into()),
            private_ips: vec![ip.parse().unwrap()],
            tags: vec![("kubernetes.io/cluster/prod".into(), "owned".into())],
            root_device_name: None,
            root_volume: None,
            identity: Default::default(),
            stopped_at: None,
            started_at: None,
        }
    }

    /// Issue 12, item 1: another VPC reusing the CIDR has instances with the
    /// same private DNS names and addresses.
    #[test]
    fn only_the_cluster_scope_and_the_internal_ip_name_a_nodes_machine() {
        let nodes = vec![
            node("ip-10-0-0-1.ec2.internal", Some("i-0000000a"), "10.0.0.1"),
            node("ip-10-0-0-2.ec2.internal", None, "10.0.0.2"),
        ];
        let ours = instance(
            "i-0000000b",
            "vpc-0aaa",
            "10.0.0.2",
            "ip-10-0-0-2.ec2.internal",
        );
        let twin = instance(
            "i-0000000c",
            "vpc-0bbb",
            "10.0.0.2",
            "ip-10-0-0-2.ec2.internal",
        );
        let scope = ClusterScope {
            vpc: "vpc-0aaa".into(),
            tag: None,
        };
        assert_eq!(
            resolve_unclaimed(&ours, &nodes, Some(&scope)),
            Unclaimed::Node(1)
        );
        assert_eq!(
            resolve_unclaimed(&twin, &nodes, Some(&scope)),
            Unclaimed::Nothing
        );
        // Without a scope the name matches, and proves nothing.
        assert_eq!(
            resolve_unclaimed(&ours, &nodes, None),
            Unclaimed::Unproven(1)
        );
        assert_eq!(
            resolve_unclaimed(&twin, &nodes, None),
            Unclaimed::Unproven(1)
        );
        // A Node that names another instance is never matched.
        let other = instance(
            "i-0000000f",
            "vpc-0aaa",
            "10.0.0.1",
            "ip-10-0-0-1.ec2.internal",
        );
        assert_eq!(
            resolve_unclaimed(&other, &nodes, Some(&scope)),
            Unclaimed::Nothing
        );
        assert_eq!(resolve_unclaimed(&other, &nodes, None), Unclaimed::Nothing);
        // The tag, when set, must be there with its value.
        for (tag, want) in [
            (("kubernetes.io/cluster/prod", None), Unclaimed::Node(1)),
            (
                ("kubernetes.io/cluster/prod", Some("owned")),
                Unclaimed::Node(1),
            ),
            (
                ("kubernetes.io/cluster/prod", Some("shared")),
                Unclaimed::Nothing,
            ),
            (("kubernetes.io/cluster/dev", None), Unclaimed::Nothing),
        ] {
            let scope = ClusterScope {
                vpc: "vpc-0aaa".into(),
                tag: Some((tag.0.into(), tag.1.map(Into::into))),
            };
            assert_eq!(
                resolve_unclaimed(&ours, &nodes, Some(&scope)),
                want,
                "{tag:?}"
            );
        }
        // Two Nodes on one address: neither is proven.
        let mut two = nodes.clone();
        two.push(node("copy", None, "10.0.0.2"));
        assert_eq!(
            resolve_unclaimed(&ours, &two, Some(&scope)),
            Unclaimed::Nothing
        );
    }
}
