//! The cluster-wide lists as node-fencer reads them: only the fields it
//! looks at are decoded. A Node as served carries its managed fields, images,
//! capacity and system info, which decoding into `k8s_openapi`'s full types
//! turns into thousands of allocations per Node; that decoding was most of
//! node-fencer's own CPU per event (docs/benchmark.md, "Where the CPU
//! goes"). Unknown fields are skipped without being kept. Each slim object
//! is turned back into the full type with the fields it read, so the core
//! reads it as before.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AttachedVolume, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo,
    PersistentVolumeSpec,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;

/// `/api/v1/nodes`.
pub const NODES: &str = "/api/v1/nodes";
/// `/api/v1/persistentvolumes`.
pub const PERSISTENT_VOLUMES: &str = "/api/v1/persistentvolumes";
/// `/apis/storage.k8s.io/v1/volumeattachments`.
pub const VOLUME_ATTACHMENTS: &str = "/apis/storage.k8s.io/v1/volumeattachments";

/// A list's items.
#[derive(Deserialize)]
pub struct List<T> {
    /// The objects.
    pub items: Vec<T>,
    /// How many more there are, for a list with a `limit`.
    #[serde(default)]
    pub metadata: ListMeta,
}

/// What node-fencer reads of a list's metadata.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// The objects after this page; unset on the last page, and whenever the
    /// list has a selector.
    pub remaining_item_count: Option<i64>,
    /// The token that asks for the next page; unset or empty on the last.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// What node-fencer reads of an object's metadata.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

impl Meta {
    fn full(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            uid: self.uid,
            resource_version: self.resource_version,
            creation_timestamp: self.creation_timestamp,
            labels: self.labels,
            annotations: self.annotations,
            ..ObjectMeta::default()
        }
    }
}

/// What node-fencer reads of a Node's status.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimNodeStatus {
    addresses: Option<Vec<NodeAddress>>,
    conditions: Option<Vec<NodeCondition>>,
    volumes_attached: Option<Vec<AttachedVolume>>,
    volumes_in_use: Option<Vec<String>>,
    node_info: Option<SlimNodeInfo>,
}

/// What node-fencer reads of a Node's system info: the boot id, and the
/// SMBIOS UUID a BMC's System is held to.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimNodeInfo {
    #[serde(rename = "bootID", default)]
    boot_id: String,
    #[serde(rename = "systemUUID", default)]
    system_uuid: String,
}

/// A Node with its metadata's name and annotations, its spec, and its
/// status' addresses, conditions and volumes.
#[derive(Deserialize)]
pub struct SlimNode {
    metadata: Meta,
    spec: Option<NodeSpec>,
    status: Option<SlimNodeStatus>,
}

impl From<SlimNode> for Node {
    fn from(n: SlimNode) -> Self {
        Node {
            metadata: n.metadata.full(),
            spec: n.spec,
            status: n.status.map(|s| NodeStatus {
                addresses: s.addresses,
                conditions: s.conditions,
                volumes_attached: s.volumes_attached,
                volumes_in_use: s.volumes_in_use,
                node_info: s.node_info.map(|i| NodeSystemInfo {
                    boot_id: i.boot_id,
                    system_uuid: i.system_uuid,
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
        }
    }
}

/// A PersistentVolume with its name and its spec (the spec holds the volume
/// source and the claim; it is small).
#[derive(Deserialize)]
pub struct SlimPersistentVolume {
    metadata: Meta,
    spec: Option<PersistentVolumeSpec>,
}

impl From<SlimPersistentVolume> for PersistentVolume {
    fn from(pv: SlimPersistentVolume) -> Self {
        PersistentVolume {
            metadata: pv.metadata.full(),
            spec: pv.spec,
            status: None,
        }
    }
}

/// A VolumeAttachment with its name, uid and spec (its status, with the
/// driver's attach metadata and errors, is not read).
#[derive(Deserialize)]
pub struct SlimVolumeAttachment {
    metadata: Meta,
    spec: VolumeAttachmentSpec,
}

impl From<SlimVolumeAttachment> for VolumeAttachment {
    fn from(va: SlimVolumeAttachment) -> Self {
        VolumeAttachment {
            metadata: va.metadata.full(),
            spec: va.spec,
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::kube_read;

    /// A Node as a kubelet of v1.36 reports it, managed fields and all.
    const NODE: &str = r#"{
      "apiVersion": "v1", "kind": "Node",
      "metadata": {
        "name": "ip-10-0-1-17.ec2.internal", "uid": "6b1c",
        "resourceVersion": "4711", "creationTimestamp": "2026-11-20T10:00:00Z",
        "labels": {"kubernetes.io/hostname": "ip-10-0-1-17.ec2.internal", "topology.kubernetes.io/zone": "us-east-1a"},
        "annotations": {"node-fencer.io/fenced-at": "2026-11-24T10:00:00Z",
                        "node-fencer.io/instance": "i-0123456789abcdef0=stopped",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "node.alpha.kubernetes.io/ttl": "0"},
        "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
          "time": "2026-11-20T10:00:00Z", "fieldsType": "FieldsV1",
          "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}}}}}}]
      },
      "spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0",
               "taints": [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]},
      "status": {
        "capacity": {"cpu": "2", "memory": "8Gi"},
        "allocatable": {"cpu": "1930m", "memory": "7Gi"},
        "conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
          "lastHeartbeatTime": "2026-11-24T09:59:00Z", "lastTransitionTime": "2026-11-24T09:59:40Z"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.1.17"},
                      {"type": "Hostname", "address": "ip-10-0-1-17.ec2.internal"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "ec2", "systemUUID": "ec2", "bootID": "b", "kernelVersion": "6.1",
          "osImage": "Amazon Linux 2023", "containerRuntimeVersion": "containerd://1.7",
          "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}],
        "volumesInUse": ["kubernetes.io/csi/ebs.csi.aws.com^vol-0123456789abcdef0"],
        "volumesAttached": [{"name": "kubernetes.io/csi/ebs.csi.aws.com^vol-0123456789abcdef0",
                             "devicePath": ""},
                            {"name": "kubernetes.io/csi/efs.csi.aws.com^fs-1::fsap-2", "devicePath": ""}]
      }
    }"#;

    const PV: &str = r#"{
      "apiVersion": "v1", "kind": "PersistentVolume",
      "metadata": {"name": "pvc-1", "uid": "9a", "managedFields": [{"manager": "csi-provisioner",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:csi": {}}}}]},
      "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
               "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0"},
               "claimRef": {"namespace": "db", "name": "data-db-0"}},
      "status": {"phase": "Bound"}
    }"#;

    #[test]
    fn a_slim_node_gives_the_facts_the_full_node_gives() {
        let full: Node = serde_json::from_str(NODE).unwrap();
        let slim: SlimNode = serde_json::from_str(NODE).unwrap();
        let facts = kube_read::node_facts(&Node::from(slim));
        assert_eq!(facts, kube_read::node_facts(&full));
        let facts = facts.unwrap();
        assert!(facts.is_out_of_service());
        assert!(facts.fenced.is_some());
        assert_eq!(facts.internal_ips.len(), 1);
        assert_eq!(facts.power.zone.as_deref(), Some("us-east-1a"));
        assert_eq!(facts.power.boot_id.as_deref(), Some("b"));
        let attached = facts.attached.unwrap();
        let drivers: Vec<&str> = attached.iter().map(|v| v.driver.as_str()).collect();
        assert_eq!(drivers, ["ebs.csi.aws.com", "efs.csi.aws.com"]);
    }

    #[test]
    fn a_slim_volume_gives_the_facts_the_full_volume_gives() {
        let full: PersistentVolume = serde_json::from_str(PV).unwrap();
        let slim: SlimPersistentVolume = serde_json::from_str(PV).unwrap();
        let facts = kube_read::pv_facts(&PersistentVolume::from(slim));
        assert_eq!(facts, kube_read::pv_facts(&full));
        assert!(facts.unwrap().volume.is_some());
    }

    #[test]
    fn a_slim_attachment_gives_the_facts_the_full_attachment_gives() {
        const VA: &str = r#"{
          "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
          "metadata": {"name": "csi-0a1b", "uid": "5e", "managedFields": [{"manager": "kcm"}]},
          "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "ip-10-0-1-17.ec2.internal",
                   "source": {"persistentVolumeName": "pvc-1"}},
          "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/xvdba"}}
        }"#;
        let full: VolumeAttachment = serde_json::from_str(VA).unwrap();
        let slim: SlimVolumeAttachment = serde_json::from_str(VA).unwrap();
        let facts = kube_read::attachment_facts(&VolumeAttachment::from(slim));
        assert_eq!(facts, kube_read::attachment_facts(&full));
        assert_eq!(facts.unwrap().uid, "5e");
    }

    #[test]
    fn a_list_decodes_whatever_else_it_carries() {
        let list = format!(
            r#"{{"kind": "NodeList", "apiVersion": "v1", "metadata": {{"resourceVersion": "9"}}, "items": [{NODE}, {NODE}]}}"#
        );
        let list: List<SlimNode> = serde_json::from_str(&list).unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.metadata.remaining_item_count, None);
        let page = format!(
            r#"{{"metadata": {{"continue": "x", "remainingItemCount": 4999}}, "items": [{NODE}]}}"#
        );
        let page: List<SlimNode> = serde_json::from_str(&page).unwrap();
        assert_eq!(page.metadata.remaining_item_count, Some(4999));
        assert_eq!(page.metadata.continue_token.as_deref(), Some("x"));
    }
}
