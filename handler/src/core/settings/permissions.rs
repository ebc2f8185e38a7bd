//! The exact AWS API calls, Google Cloud permissions and Kubernetes verbs
//! the code makes. The IAM policy and the custom role in `infra/` and the
//! ClusterRole in `infra/kubernetes/rbac.yaml` are tested against these
//! lists, and these lists against the code.

/// Every AWS action the function calls, as IAM spells it.
const AWS_ACTIONS: &[&str] = &[
    "ec2:DescribeInstances",
    "ec2:DescribeVolumes",
    "ec2:DetachVolume",
    "eks:DescribeCluster",
    "secretsmanager:GetSecretValue",
    "ssm:GetParameter",
];

/// The AWS actions active fencing adds (`ACTIVE_FENCING=stuck` or `on`): granted only
/// then, and `ec2:StopInstances` only on the cluster's own instances (a tag
/// condition in `infra/`).
const POWER_OFF_AWS_ACTIONS: &[&str] = &["ec2:DescribeInstanceStatus", "ec2:StopInstances"];

/// The AWS action the notifications add (`NOTIFY_TOPIC` an SNS topic):
/// granted only then, and only on that topic.
const NOTIFY_AWS_ACTIONS: &[&str] = &["sns:Publish"];

/// The Google Cloud permission the notifications add (`NOTIFY_TOPIC` a
/// Pub/Sub topic): granted only then, and only on that topic.
const NOTIFY_GCP_PERMISSIONS: &[&str] = &["pubsub.topics.publish"];

/// Every Google Cloud permission the service uses, as IAM spells it:
/// Compute Engine's reads and the detach, and `container.clusters.get`,
/// which GKE requires of any Google identity it lets in (RBAC then
/// decides what it may do).
const GCP_PERMISSIONS: &[&str] = &[
    "compute.disks.get",
    "compute.instances.detachDisk",
    "compute.instances.get",
    "compute.zoneOperations.get",
    "container.clusters.get",
];

/// The Google Cloud permission active fencing adds (`ACTIVE_FENCING=stuck` or `on`):
/// granted only then, and only on the cluster's node VMs (the same IAM
/// condition on their names as the detach, in `infra/`).
const POWER_OFF_GCP_PERMISSIONS: &[&str] = &["compute.instances.stop"];

/// Where a Google Cloud permission can be tested with Compute Engine's
/// `testIamPermissions`, which answers the subset of the asked permissions
/// the caller holds on one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcpProbe {
    /// On a VM (`instances.testIamPermissions`).
    Instance,
    /// On a disk (`disks.testIamPermissions`).
    Disk,
    /// Nowhere Compute Engine can test: operations have no IAM policy of
    /// their own and the cluster is another API's resource.
    NotTestable,
}

/// Where `permission` is tested.
pub fn gcp_probe(permission: &str) -> GcpProbe {
    if permission.starts_with("compute.instances.") {
        GcpProbe::Instance
    } else if permission.starts_with("compute.disks.") {
        GcpProbe::Disk
    } else {
        GcpProbe::NotTestable
    }
}

/// The permissions of [`GCP_PERMISSIONS`] tested on `probe`'s resource.
pub fn gcp_permissions_on(probe: GcpProbe) -> Vec<&'static str> {
    GCP_PERMISSIONS
        .iter()
        .copied()
        .filter(|p| gcp_probe(p) == probe)
        .collect()
}

/// The permissions active fencing adds on Compute Engine, all tested on a
/// VM.
pub fn gcp_power_off_permissions() -> &'static [&'static str] {
    POWER_OFF_GCP_PERMISSIONS
}

/// Every cluster-wide Kubernetes permission the function uses: (API group,
/// resource, verbs). VolumeAttachments `delete` serves the legacy mode
/// only; pods `list` and `delete` serve both (taint mode: the volumes of
/// pods that tolerate the taint stay attached, the pods it evicts are
/// force-deleted right after it). `nodes/status` `patch` serves
/// `FAST_NOT_READY` (the `Ready` condition of a Node whose kubelet is
/// proven silent) and the legacy mode (the freed volumes released from
/// `volumesInUse`).
pub(crate) const KUBERNETES_RULES: &[(&str, &str, &[&str])] = &[
    ("", "nodes", &["get", "list", "patch"]),
    ("", "nodes/status", &["patch"]),
    ("", "persistentvolumes", &["get", "list"]),
    ("", "pods", &["list", "delete"]),
    (
        "storage.k8s.io",
        "volumeattachments",
        &["get", "list", "delete"],
    ),
    ("events.k8s.io", "events", &["create"]),
];

/// Every permission the function uses in `CONTROL_NAMESPACE` (the fencing
/// Lease and the kill-switch ConfigMap, both named `node-fencer`).
pub(crate) const CONTROL_RULES: &[(&str, &str, &[&str])] = &[
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    ),
    ("", "configmaps", &["get"]),
];

/// Where the kubelets' Leases are, one per Node of its name.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Every permission the function uses in [`NODE_LEASE_NAMESPACE`]: reading
/// a Node's kubelet Lease (`FAST_NOT_READY` only).
pub const NODE_LEASE_RULES: &[(&str, &str, &[&str])] =
    &[("coordination.k8s.io", "leases", &["get"])];

/// Where the manifest is kept, from the repository's root: Terraform's
/// checks read it instead of this file's source.
pub const MANIFEST_PATH: &str = "infra/manifest.json";

/// What this build needs from the cloud, the cluster and its environment,
/// as one JSON document (`node-fencer manifest`): the AWS actions and
/// Google permissions (those of active fencing and of the notifications
/// apart), the Kubernetes rules cluster-wide and in the control namespace, every
/// environment variable with what it accepts, the metrics (CloudWatch's and
/// Prometheus'), and the Lease wait.
pub fn manifest() -> serde_json::Value {
    let rules = |rules: &[(&str, &str, &[&str])]| -> Vec<serde_json::Value> {
        rules
            .iter()
            .map(|(group, resource, verbs)| {
                serde_json::json!({"group": group, "resource": resource, "verbs": verbs})
            })
            .collect()
    };
    let variables: Vec<serde_json::Value> = crate::core::settings::variables::VARIABLES
        .iter()
        .map(|(name, accepts)| serde_json::json!({"name": name, "accepts": accepts}))
        .collect();
    serde_json::json!({
        "aws_actions": AWS_ACTIONS,
        "gcp_permissions": GCP_PERMISSIONS,
        "power_off_aws_actions": POWER_OFF_AWS_ACTIONS,
        "power_off_gcp_permissions": POWER_OFF_GCP_PERMISSIONS,
        "notify_aws_actions": NOTIFY_AWS_ACTIONS,
        "notify_gcp_permissions": NOTIFY_GCP_PERMISSIONS,
        "kubernetes_rules": rules(KUBERNETES_RULES),
        "control_rules": rules(CONTROL_RULES),
        "node_lease_rules": rules(NODE_LEASE_RULES),
        "variables": variables,
        "metrics": metrics(),
        "prometheus_metrics": prometheus_metrics(),
        "lease_wait_seconds": crate::core::rules::control::LEASE_WAIT.as_secs(),
    })
}

/// The metrics the code emits (CloudWatch EMF, on Lambda): the namespace,
/// and each metric's unit and full dimension set.
fn metrics() -> serde_json::Value {
    use crate::core::outbound::metrics::{CATALOG, NAMESPACE};
    let metrics: Vec<serde_json::Value> = CATALOG
        .iter()
        .map(|(name, unit, extra)| {
            let mut dimensions = vec!["Function"];
            dimensions.extend(extra.iter());
            serde_json::json!({"name": name, "unit": unit, "dimensions": dimensions})
        })
        .collect();
    serde_json::json!({"namespace": NAMESPACE, "metrics": metrics})
}

/// The families `serve`'s `/metrics` exposes (on-premises): each name,
/// type and label set, against which infra/onprem's rules and dashboard
/// are checked.
fn prometheus_metrics() -> Vec<serde_json::Value> {
    crate::core::outbound::prometheus::FAMILIES
        .iter()
        .map(|(name, kind, labels, _)| {
            serde_json::json!({"name": name, "type": kind, "labels": labels})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{
        AWS_ACTIONS, GCP_PERMISSIONS, GcpProbe, NOTIFY_AWS_ACTIONS, NOTIFY_GCP_PERMISSIONS,
        POWER_OFF_AWS_ACTIONS, POWER_OFF_GCP_PERMISSIONS, gcp_permissions_on, gcp_probe, manifest,
    };
    use std::collections::BTreeSet;

    /// The checked-in manifest is what this build says; after a change to
    /// the lists, `make manifest` writes it anew.
    #[test]
    fn the_checked_in_manifest_is_current() {
        let file: serde_json::Value =
            serde_json::from_str(include_str!("../../../../infra/manifest.json"))
                .expect("infra/manifest.json is JSON");
        assert!(
            file == manifest(),
            "infra/manifest.json is out of date: run `make manifest`"
        );
    }

    /// SDK operations as they appear in the code (`.describe_instances()`)
    /// mapped to IAM actions. A new SDK call without an entry here fails the
    /// scan below, and so does an entry that no code calls any more.
    const OPERATIONS: &[(&str, &str)] = &[
        (".describe_instances()", "ec2:DescribeInstances"),
        (".describe_volumes()", "ec2:DescribeVolumes"),
        (".detach_volume()", "ec2:DetachVolume"),
        (".describe_cluster()", "eks:DescribeCluster"),
        (".get_secret_value()", "secretsmanager:GetSecretValue"),
        (".get_parameter()", "ssm:GetParameter"),
        (".describe_instance_status()", "ec2:DescribeInstanceStatus"),
        (".stop_instances()", "ec2:StopInstances"),
        (".publish()", "sns:Publish"),
    ];

    const SHELL: &[&str] = &[
        include_str!("../../shell/cloud/aws.rs"),
        include_str!("../../shell/connect.rs"),
        include_str!("../../shell/cluster/mod.rs"),
        include_str!("../../shell/cluster/reads.rs"),
        include_str!("../../shell/cluster/writes.rs"),
        include_str!("../../shell/cluster/coordination.rs"),
        include_str!("../../shell/notify.rs"),
    ];

    #[test]
    fn the_action_list_is_what_the_code_calls() {
        let called: BTreeSet<&str> = OPERATIONS
            .iter()
            .filter(|(call, _)| SHELL.iter().any(|src| src.contains(call)))
            .map(|(_, action)| *action)
            .collect();
        let listed: BTreeSet<&str> = AWS_ACTIONS
            .iter()
            .chain(POWER_OFF_AWS_ACTIONS)
            .chain(NOTIFY_AWS_ACTIONS)
            .copied()
            .collect();
        assert_eq!(called, listed);
    }

    /// Compute Engine calls as they appear in the code, whitespace removed
    /// (`self.instances.get()`), mapped to the permission each needs; a
    /// regional disk's `get` needs the same permission as a zonal one's. The Google token GKE takes needs
    /// `container.clusters.get`.
    const GCE_CALLS: &[(&str, &str)] = &[
        ("self.instances.get()", "compute.instances.get"),
        (".instances.detach_disk()", "compute.instances.detachDisk"),
        (".instances.stop()", "compute.instances.stop"),
        ("self.disks.get()", "compute.disks.get"),
        ("self.region_disks.get()", "compute.disks.get"),
        ("self.operations.get()", "compute.zoneOperations.get"),
        (
            ".build_access_token_credentials()",
            "container.clusters.get",
        ),
        // The notifications' REST call to Pub/Sub.
        (":publish\"", "pubsub.topics.publish"),
    ];

    #[test]
    fn each_gcp_permission_is_tested_on_the_resource_it_guards() {
        assert_eq!(
            gcp_permissions_on(GcpProbe::Instance),
            ["compute.instances.detachDisk", "compute.instances.get"]
        );
        assert_eq!(gcp_permissions_on(GcpProbe::Disk), ["compute.disks.get"]);
        assert!(
            POWER_OFF_GCP_PERMISSIONS
                .iter()
                .all(|p| gcp_probe(p) == GcpProbe::Instance)
        );
        assert_eq!(
            gcp_permissions_on(GcpProbe::NotTestable),
            ["compute.zoneOperations.get", "container.clusters.get"]
        );
    }

    #[test]
    fn the_gcp_permission_list_is_what_the_code_calls() {
        let shell: Vec<String> = [
            include_str!("../../shell/cloud/gce.rs"),
            include_str!("../../shell/connect.rs"),
            include_str!("../../shell/notify.rs"),
        ]
        .iter()
        .map(|src| src.split_whitespace().collect())
        .collect();
        let called: BTreeSet<&str> = GCE_CALLS
            .iter()
            .filter(|(call, _)| shell.iter().any(|src| src.contains(call)))
            .map(|(_, permission)| *permission)
            .collect();
        let listed: BTreeSet<&str> = GCP_PERMISSIONS
            .iter()
            .chain(POWER_OFF_GCP_PERMISSIONS)
            .chain(NOTIFY_GCP_PERMISSIONS)
            .copied()
            .collect();
        assert_eq!(called, listed);
        // Every client method the Compute Engine shell calls is mapped.
        let gce = &shell[0];
        for client in [
            "self.instances.",
            "self.disks.",
            "self.region_disks.",
            "self.operations.",
        ] {
            for (i, _) in gce.match_indices(client) {
                let call = gce[i..].split_inclusive("()").next().unwrap_or_default();
                // Testing permissions needs none: preflight asks it.
                let free = call.ends_with(".test_iam_permissions()");
                assert!(
                    free || GCE_CALLS.iter().any(|(c, _)| call.ends_with(c)),
                    "`{call}` is called but maps to no permission"
                );
            }
        }
    }

    #[test]
    fn no_unlisted_sdk_client_is_used() {
        // Every `aws_sdk_*::Client` the shell builds must belong to a listed service.
        for src in SHELL {
            for (i, _) in src.match_indices("aws_sdk_") {
                let service: String = src[i + 8..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                // SDK crate names and IAM service prefixes coincide for every service used.
                let iam = service.as_str();
                assert!(
                    AWS_ACTIONS
                        .iter()
                        .chain(NOTIFY_AWS_ACTIONS)
                        .any(|a| a.starts_with(&format!("{iam}:"))),
                    "aws_sdk_{service} is used but no {iam}: action is listed"
                );
            }
        }
    }
}
