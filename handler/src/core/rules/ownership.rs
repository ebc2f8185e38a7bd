//! Whose machine an instance is, from what EC2 says of it alone. EC2
//! state-change events are per account and region: every cluster's function
//! hears of every instance that stops. An instance that EC2 shows in another
//! VPC, or tagged for other clusters only, is not this cluster's, and is let
//! go before any request to the apiserver. Pure.
//!
//! Only positive evidence makes an instance foreign: an instance without a
//! VPC (EC2 drops it from some terminated instances) or without any cluster
//! tag may be ours, and goes on to the usual lookup.

use crate::core::model::facts::InstanceFacts;
use crate::core::rules::decide::Skip;

/// The tag keys whose value names the instance's cluster.
const NAME_TAGS: [&str; 3] = [
    "eks:cluster-name",
    "aws:eks:cluster-name",
    "eks:eks-cluster-name",
];

/// The prefix of the tag key `kubernetes.io/cluster/NAME` (value `owned`
/// or `shared`) that cloud providers, eksctl and Karpenter put on nodes.
const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";

/// What the cluster is, as configured: either part may be unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterIdentity {
    /// Its name, as its instances' cluster tags carry it (`CLUSTER_NAME`, or
    /// the name in a `CLUSTER_TAG` of `kubernetes.io/cluster/NAME`).
    pub name: Option<String>,
    /// Its VPC (`CLUSTER_VPC_ID`).
    pub vpc: Option<String>,
}

impl ClusterIdentity {
    /// True when something is known to tell another cluster's instance by.
    pub fn is_known(&self) -> bool {
        self.name.is_some() || self.vpc.is_some()
    }
}

/// Why an instance is not this cluster's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// Its cluster tags name other clusters, never this one.
    OtherCluster(String),
    /// It runs in another VPC.
    OtherVpc(String),
}

impl Foreign {
    /// The decision's reason for skipping the instance.
    pub fn skip(self) -> Skip {
        match self {
            Self::OtherCluster(cluster) => Skip::OtherCluster { cluster },
            Self::OtherVpc(vpc) => Skip::OtherVpc { vpc },
        }
    }
}

/// The clusters the instance's tags name, in tag order.
fn clusters_named(instance: &InstanceFacts) -> Vec<&str> {
    instance
        .tags
        .iter()
        .filter_map(|(key, value)| {
            if NAME_TAGS.contains(&key.as_str()) {
                Some(value.as_str())
            } else {
                key.strip_prefix(CLUSTER_TAG_PREFIX)
            }
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// Why `instance` is not this cluster's machine, if EC2's description shows
/// it; `None` when it may be (the usual lookup decides).
pub fn foreign(instance: &InstanceFacts, identity: &ClusterIdentity) -> Option<Foreign> {
    if let (Some(ours), Some(theirs)) = (&identity.vpc, &instance.vpc_id)
        && ours != theirs
    {
        return Some(Foreign::OtherVpc(theirs.clone()));
    }
    let ours = identity.name.as_deref()?;
    let named = clusters_named(instance);
    match named.first() {
        Some(first) if !named.contains(&ours) => Some(Foreign::OtherCluster((*first).to_owned())),
        _ => None,
    }
}

/// The cluster name in a `kubernetes.io/cluster/NAME` tag key.
pub(crate) fn name_in_tag_key(key: &str) -> Option<&str> {
    key.strip_prefix(CLUSTER_TAG_PREFIX)
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::instance::{InstanceId, InstanceState};

    fn instance(vpc: Option<&str>, tags: &[(&str, &str)]) -> InstanceFacts {
        let id = InstanceId::parse("i-0123456789abcdef0").unwrap();
        InstanceFacts {
            vpc_id: vpc.map(str::to_owned),
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..InstanceFacts::bare(id, InstanceState::Stopped)
        }
    }

    fn identity(name: Option<&str>, vpc: Option<&str>) -> ClusterIdentity {
        ClusterIdentity {
            name: name.map(str::to_owned),
            vpc: vpc.map(str::to_owned),
        }
    }

    const VPC: &str = "vpc-0123abcd";

    #[test]
    fn an_instance_tagged_for_another_cluster_only_is_foreign_by_every_tag_form() {
        let ours = identity(Some("prod"), None);
        for tags in [
            [("kubernetes.io/cluster/staging", "owned")],
            [("eks:cluster-name", "staging")],
            [("aws:eks:cluster-name", "staging")],
            [("eks:eks-cluster-name", "staging")],
        ] {
            assert_eq!(
                foreign(&instance(None, &tags), &ours),
                Some(Foreign::OtherCluster("staging".into())),
                "{tags:?}"
            );
        }
    }

    #[test]
    fn an_instance_that_names_this_cluster_among_others_is_not_foreign() {
        let ours = identity(Some("prod"), None);
        let shared = instance(
            None,
            &[
                ("kubernetes.io/cluster/staging", "shared"),
                ("kubernetes.io/cluster/prod", "owned"),
            ],
        );
        assert_eq!(foreign(&shared, &ours), None);
        let eks = instance(None, &[("eks:cluster-name", "prod")]);
        assert_eq!(foreign(&eks, &ours), None);
    }

    #[test]
    fn without_evidence_an_instance_may_be_ours() {
        // No cluster tag, no VPC, or nothing configured: the usual lookup decides.
        let untagged = instance(None, &[("Name", "worker")]);
        assert_eq!(foreign(&untagged, &identity(Some("prod"), Some(VPC))), None);
        let tagged = instance(Some("vpc-99999999"), &[("eks:cluster-name", "staging")]);
        assert_eq!(foreign(&tagged, &ClusterIdentity::default()), None);
        assert!(!ClusterIdentity::default().is_known());
        // An empty name in a tag names no cluster.
        let empty = instance(
            None,
            &[
                ("eks:cluster-name", ""),
                ("kubernetes.io/cluster/", "owned"),
            ],
        );
        assert_eq!(foreign(&empty, &identity(Some("prod"), None)), None);
    }

    #[test]
    fn an_instance_in_another_vpc_is_foreign_whatever_its_tags() {
        let ours = identity(Some("prod"), Some(VPC));
        let elsewhere = instance(Some("vpc-99999999"), &[("eks:cluster-name", "prod")]);
        assert_eq!(
            foreign(&elsewhere, &ours),
            Some(Foreign::OtherVpc("vpc-99999999".into()))
        );
        let here = instance(Some(VPC), &[]);
        assert_eq!(foreign(&here, &ours), None);
        // EC2 leaves the VPC out of some terminated instances: unknown is not other.
        let gone = instance(None, &[]);
        assert_eq!(foreign(&gone, &identity(None, Some(VPC))), None);
    }

    #[test]
    fn the_name_is_read_from_a_cluster_tag_key() {
        assert_eq!(name_in_tag_key("kubernetes.io/cluster/prod"), Some("prod"));
        assert_eq!(name_in_tag_key("kubernetes.io/cluster/"), None);
        assert_eq!(name_in_tag_key("team"), None);
    }
}
