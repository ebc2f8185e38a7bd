//! Kubernetes objects read into facts, and the names of the marks
//! node-fencer writes on a Node and reads back. Pure: the shell fetches,
//! this module only looks.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod, Toleration};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use crate::core::model::facts::{
    AttachmentFacts, CsiVolume, FenceMark, FenceMode, MachineIdentity, NO_SCHEDULE_EFFECT,
    NodeFacts, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, PodRef, PowerFacts, PowerMark, PvFacts,
    Readiness, SeenOff, TaintFacts,
};
use crate::core::model::instance::cloud_disk;
use crate::core::model::instance::{
    InstanceId, InstanceState, VolumeId, instance_from_provider_id,
};
use crate::core::model::redfish::SystemUuid;

/// Annotation prefix for what node-fencer records on a Node it fenced.
pub const ANNOTATION_PREFIX: &str = "node-fencer.io/";
/// The taint node-fencer applied, as `key=value:effect`.
pub const ANNOTATION_TAINT: &str = "node-fencer.io/taint";
/// When it was applied (RFC 3339).
pub const ANNOTATION_FENCED_AT: &str = "node-fencer.io/fenced-at";
/// The instance and the state EC2 reported at decision time.
pub const ANNOTATION_INSTANCE: &str = "node-fencer.io/instance";
/// The correlation id of the invocation that applied it.
pub(crate) const ANNOTATION_CORRELATION: &str = "node-fencer.io/correlation-id";
/// How the node was fenced: `taint` or `legacy`.
pub(crate) const ANNOTATION_MODE: &str = "node-fencer.io/mode";
/// The EBS volumes it planned to force-detach, comma-separated.
pub const ANNOTATION_VOLUMES: &str = "node-fencer.io/volumes";
/// The label on every Node node-fencer fenced (value `true`): the Nodes
/// that take room under the cap on its account are one label-selected
/// list, not a list of the whole cluster.
pub const LABEL_FENCED: &str = "node-fencer.io/fenced";
/// An operator's confirmation that a fenced node is healthy (manual
/// recovery): the `fenced-at` of the fencing it ends, so a confirmation
/// never ends a later fencing.
pub const ANNOTATION_RECOVERY_CONFIRMED: &str = "node-fencer.io/recovery-confirmed";
/// When node-fencer powered the Node's machine off (active fencing).
pub const ANNOTATION_POWERED_OFF_AT: &str = "node-fencer.io/powered-off-at";
/// The boot id the Node reported when its machine was powered off.
pub const ANNOTATION_POWERED_OFF_BOOT_ID: &str = "node-fencer.io/powered-off-boot-id";
/// Why it was powered off: how long NotReady, the status checks, the run.
pub const ANNOTATION_POWER_OFF_REASON: &str = "node-fencer.io/power-off-reason";
/// The boot id the Node reported when it was fenced: a later one proves a
/// power cycle.
pub(crate) const ANNOTATION_BOOT_ID: &str = "node-fencer.io/boot-id";
/// node-fencer's note that it saw the Node's machine off
/// ([`SeenOff`]): `<machine> <last start> <seen at>`, the times in Unix
/// seconds. Not among [`ANNOTATIONS`]: it records no fencing, and a
/// recovery leaves it, as it stops applying once the machine starts.
pub const ANNOTATION_MACHINE_SEEN_OFF: &str = "node-fencer.io/machine-seen-off";
/// The labels that mark a control-plane Node (kubeadm, kOps and most
/// installers set the first; clusters older than 1.24 the second).
pub const LABELS_CONTROL_PLANE: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];
/// The Node label naming its zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Every annotation node-fencer writes; recovery clears them all.
pub const ANNOTATIONS: [&str; 11] = [
    ANNOTATION_TAINT,
    ANNOTATION_FENCED_AT,
    ANNOTATION_INSTANCE,
    ANNOTATION_CORRELATION,
    ANNOTATION_MODE,
    ANNOTATION_VOLUMES,
    ANNOTATION_RECOVERY_CONFIRMED,
    ANNOTATION_POWERED_OFF_AT,
    ANNOTATION_POWERED_OFF_BOOT_ID,
    ANNOTATION_POWER_OFF_REASON,
    ANNOTATION_BOOT_ID,
];

/// Reads a Node into facts; `None` for a Node without a name.
pub fn node_facts(node: &Node) -> Option<NodeFacts> {
    let name = node.metadata.name.clone()?;
    let spec = node.spec.as_ref();
    let status = node.status.as_ref();
    let instance = spec
        .and_then(|s| s.provider_id.as_deref())
        .and_then(instance_from_provider_id);
    let addresses = status
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let internal_ips = addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    let host_names = addresses
        .iter()
        .filter(|a| a.type_ == "InternalDNS" || a.type_ == "Hostname")
        .map(|a| a.address.clone())
        .collect();
    let taints = spec
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|t| TaintFacts {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        })
        .collect();
    Some(NodeFacts {
        name,
        uid: node.metadata.uid.clone(),
        instance,
        readiness: readiness(node),
        internal_ips,
        host_names,
        taints,
        ready_since: ready_since(node),
        fenced: fence_mark(node),
        attached: attached_volumes(node),
        machine: machine_identity(node),
        power: power_facts(node),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        version: node.metadata.resource_version.clone(),
        seen_off: node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_MACHINE_SEEN_OFF))
            .and_then(|v| seen_off(v)),
    })
}

/// Reads node-fencer's note that it saw the machine off; `None` for a value
/// it did not write (an operator's edit is not believed, only ignored).
pub fn seen_off(value: &str) -> Option<SeenOff> {
    let mut parts = value.split(' ');
    let machine = parts.next().filter(|m| !m.is_empty())?.to_owned();
    let started_at = parts.next()?.parse().ok()?;
    let at = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some(SeenOff {
        machine,
        started_at,
        at,
    })
}

/// The annotation's value for `note`, as [`seen_off`] reads it.
pub fn seen_off_value(note: &SeenOff) -> String {
    format!("{} {} {}", note.machine, note.started_at, note.at)
}

/// The annotation GKE puts on a Node: its VM's numeric id.
pub const ANNOTATION_GKE_INSTANCE_ID: &str = "container.googleapis.com/instance_id";

/// What tells the Node's machine from another of the same name: the VM id
/// GKE records, when the Node was created, and the SMBIOS UUID its kubelet
/// read when it registered.
pub fn machine_identity(node: &Node) -> MachineIdentity {
    MachineIdentity {
        uid: node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_GKE_INSTANCE_ID))
            .and_then(|id| id.parse().ok()),
        created_at: node
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        system_uuid: SystemUuid::parse(
            node.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.system_uuid.as_str()),
        ),
    }
}

/// What active fencing reads of a Node.
pub fn power_facts(node: &Node) -> PowerFacts {
    let annotations = node.metadata.annotations.as_ref();
    let powered_off = annotations
        .and_then(|a| a.get(ANNOTATION_POWERED_OFF_AT))
        .map(|at| PowerMark {
            at: at.clone(),
            boot_id: annotations
                .and_then(|a| a.get(ANNOTATION_POWERED_OFF_BOOT_ID))
                .filter(|b| !b.is_empty())
                .cloned(),
        });
    let labels = node.metadata.labels.as_ref();
    PowerFacts {
        not_ready_since: not_ready_since(node),
        boot_id: boot_id(node),
        zone: labels.and_then(|l| l.get(LABEL_ZONE)).cloned(),
        powered_off,
        control_plane: labels
            .is_some_and(|l| LABELS_CONTROL_PLANE.iter().any(|k| l.contains_key(*k))),
    }
}

/// `status.nodeInfo.bootID`, when the kubelet reported one.
pub(crate) fn boot_id(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty())
}

/// When the `Ready` condition turned away from `True` (Unix seconds);
/// `None` while it is `True`, or when no condition says.
pub fn not_ready_since(node: &Node) -> Option<i64> {
    if readiness(node) == Readiness::Ready {
        return None;
    }
    ready_condition(node)?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
}

fn ready_condition(node: &Node) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The annotation a kubelet sets at registration when the attach/detach
/// controller, not the kubelet, attaches the node's volumes.
pub const ANNOTATION_CONTROLLER_MANAGED: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
/// How the attach/detach controller names a CSI volume in a Node's status.
const CSI_UNIQUE_PREFIX: &str = "kubernetes.io/csi/";

/// The CSI volumes of the Node's `status.volumesAttached` (what the
/// attach/detach controller attached) and `status.volumesInUse` (what the
/// kubelet mounts), sorted and without repeats; `None` unless that
/// controller manages the Node's attachments, as only then does it keep
/// `volumesAttached`.
pub fn attached_volumes(node: &Node) -> Option<Vec<CsiVolume>> {
    let managed = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_CONTROLLER_MANAGED))
        .is_some_and(|v| v == "true");
    if !managed {
        return None;
    }
    let status = node.status.as_ref();
    let attached = status
        .and_then(|s| s.volumes_attached.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|v| v.name.as_str());
    let in_use = status
        .and_then(|s| s.volumes_in_use.as_deref())
        .unwrap_or_default()
        .iter()
        .map(String::as_str);
    let mut volumes: Vec<CsiVolume> = attached.chain(in_use).filter_map(csi_volume).collect();
    volumes.sort();
    volumes.dedup();
    Some(volumes)
}

/// `kubernetes.io/csi/<driver>^<handle>` read into its parts; `None` for
/// any other plugin's name, or a part missing.
fn csi_volume(unique_name: &str) -> Option<CsiVolume> {
    let (driver, handle) = unique_name
        .strip_prefix(CSI_UNIQUE_PREFIX)?
        .split_once('^')?;
    (!driver.is_empty() && !handle.is_empty()).then(|| CsiVolume {
        driver: driver.into(),
        handle: handle.into(),
    })
}

/// How the attach/detach controller names `volume` in a Node's status, the
/// inverse of [`attached_volumes`]' reading (for the fakes and fixtures that
/// record volumes as it does).
pub fn csi_unique_name(volume: &CsiVolume) -> String {
    format!("{CSI_UNIQUE_PREFIX}{}^{}", volume.driver, volume.handle)
}

/// When the `Ready` condition turned `True` (Unix seconds); `None` unless it
/// is `True` now and says when.
pub fn ready_since(node: &Node) -> Option<i64> {
    if readiness(node) != Readiness::Ready {
        return None;
    }
    ready_condition(node)?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
}

/// node-fencer's record on the Node, read back from its annotations. A Node
/// with `fenced-at` is fenced; a mark written before `mode` existed is a
/// taint.
pub fn fence_mark(node: &Node) -> Option<FenceMark> {
    let annotations = node.metadata.annotations.as_ref()?;
    let at = annotations.get(ANNOTATION_FENCED_AT)?.clone();
    let mode = match annotations.get(ANNOTATION_MODE).map(String::as_str) {
        Some("legacy") => FenceMode::Legacy,
        _ => FenceMode::Taint,
    };
    // `i-…=state`, as the taint patch writes it.
    let recorded = annotations.get(ANNOTATION_INSTANCE).map(String::as_str);
    let (id, state) = match recorded.map(|v| v.split_once('=')) {
        Some(Some((id, state))) => (Some(id), Some(InstanceState::from_name(state))),
        Some(None) => (recorded, None),
        None => (None, None),
    };
    let instance = id.and_then(InstanceId::parse);
    let volumes = annotations
        .get(ANNOTATION_VOLUMES)
        .map(|v| v.split(',').filter_map(VolumeId::parse).collect())
        .unwrap_or_default();
    let confirmed = annotations
        .get(ANNOTATION_RECOVERY_CONFIRMED)
        .is_some_and(|v| *v == at);
    let no_schedule = annotations.get(ANNOTATION_TAINT).is_some_and(|t| {
        t.split(',')
            .any(|t| t.ends_with(&format!(":{NO_SCHEDULE_EFFECT}")))
    });
    Some(FenceMark {
        mode,
        instance,
        state,
        volumes,
        at,
        correlation_id: annotations.get(ANNOTATION_CORRELATION).cloned(),
        confirmed,
        no_schedule,
        boot_id: annotations
            .get(ANNOTATION_BOOT_ID)
            .filter(|b| !b.is_empty())
            .cloned(),
    })
}

/// The node's `Ready` condition; a missing condition counts as `Unknown`.
pub(crate) fn readiness(node: &Node) -> Readiness {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|c| c.type_ == "Ready");
    match ready.map(|c| c.status.as_str()) {
        Some("True") => Readiness::Ready,
        Some("False") => Readiness::NotReady,
        _ => Readiness::Unknown,
    }
}

/// Reads a VolumeAttachment into facts.
pub fn attachment_facts(va: &VolumeAttachment) -> Option<AttachmentFacts> {
    let inline = va.spec.source.inline_volume_spec.as_ref();
    let inline_volume = inline.and_then(|spec| {
        spec.aws_elastic_block_store
            .as_ref()
            .and_then(|ebs| VolumeId::ebs(&ebs.volume_id))
            .or_else(|| {
                spec.csi
                    .as_ref()
                    .and_then(|c| cloud_disk(&c.driver, &c.volume_handle))
            })
    });
    Some(AttachmentFacts {
        name: va.metadata.name.clone()?,
        uid: va.metadata.uid.clone()?,
        attacher: va.spec.attacher.clone(),
        node_name: va.spec.node_name.clone(),
        pv_name: va.spec.source.persistent_volume_name.clone(),
        inline_volume,
    })
}

/// Reads a PersistentVolume into facts: the disk from the CSI
/// `volumeHandle` of `ebs.csi.aws.com` or `pd.csi.storage.gke.io`, or the
/// in-tree `awsElasticBlockStore` or `gcePersistentDisk`.
pub fn pv_facts(pv: &PersistentVolume) -> Option<PvFacts> {
    let spec = pv.spec.as_ref();
    let csi_source = spec.and_then(|s| s.csi.as_ref());
    let csi = csi_source.and_then(|c| cloud_disk(&c.driver, &c.volume_handle));
    let in_tree = spec
        .and_then(|s| s.aws_elastic_block_store.as_ref())
        .and_then(|e| VolumeId::ebs(&e.volume_id))
        .or_else(|| {
            let pd = spec?.gce_persistent_disk.as_ref()?;
            in_tree_pd(&pd.pd_name, pv.metadata.labels.as_ref()?)
        });
    let claim = spec
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|c| Some((c.namespace.clone()?, c.name.clone()?)));
    let modes = spec
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    let shared = modes.is_empty()
        || modes
            .iter()
            .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
    Some(PvFacts {
        name: pv.metadata.name.clone()?,
        volume: csi.or(in_tree),
        claim,
        csi: csi_source.map(|c| CsiVolume {
            driver: c.driver.clone(),
            handle: c.volume_handle.clone(),
        }),
        shared,
    })
}

/// The PD CSI handle of an in-tree `gcePersistentDisk`, as CSI migration
/// translates it: the project left `UNSPECIFIED` (the VM's), the zone from
/// the PV's zone label, two zones joined by `__` meaning a regional disk.
fn in_tree_pd(
    pd_name: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<VolumeId> {
    let zones = labels
        .get(LABEL_ZONE)
        .or_else(|| labels.get("failure-domain.beta.kubernetes.io/zone"))?;
    let location = match zones.split_once("__") {
        None => format!("zones/{zones}"),
        Some((zone, _)) => format!("regions/{}", zone.rsplit_once('-')?.0),
    };
    VolumeId::pd(&format!("projects/UNSPECIFIED/{location}/disks/{pd_name}"))
}

/// Reads a Pod into what fencing needs of it, judged against the
/// out-of-service taints the Node carries once fenced (`values`: their
/// values, node-fencer's `nodeshutdown` and any other writer's).
pub fn pod_ref(pod: &Pod, values: &[String]) -> Option<PodRef> {
    let name = pod.metadata.name.clone()?;
    let spec = pod.spec.as_ref();
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let tolerated = |value: &str, for_good: bool| {
        tolerations.iter().any(|t| {
            tolerates_out_of_service(t, value) && (!for_good || t.toleration_seconds.is_none())
        })
    };
    let for_good = values.iter().all(|v| tolerated(v, true));
    let at_all = values.iter().all(|v| tolerated(v, false));
    let volumes = spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    let claims = volumes
        .iter()
        .filter_map(|v| {
            if let Some(pvc) = &v.persistent_volume_claim {
                return Some(pvc.claim_name.clone());
            }
            // A generic ephemeral volume's claim is named `<pod>-<volume>`.
            v.ephemeral.as_ref().map(|_| format!("{name}-{}", v.name))
        })
        .collect();
    let inline = volumes
        .iter()
        .filter_map(|v| {
            let ebs = v.aws_elastic_block_store.as_ref();
            let named = ebs
                .map(|e| e.volume_id.as_str())
                .or_else(|| v.gce_persistent_disk.as_ref().map(|pd| pd.pd_name.as_str()))?;
            Some(named.rsplit('/').next().unwrap_or(named).to_owned())
        })
        .collect();
    Some(PodRef {
        namespace: pod.metadata.namespace.clone()?,
        uid: pod.metadata.uid.clone()?,
        name,
        stays: !values.is_empty() && for_good && !terminating,
        leaves_now: terminating || !at_all,
        claims,
        inline,
        finished: matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ),
    })
}

/// True when the toleration matches an out-of-service taint of this value
/// (`key=value:NoExecute`), for however long, as Kubernetes matches them:
/// an empty key with `Exists` matches every key, an empty effect every
/// effect, `Equal` (the default) needs the value.
fn tolerates_out_of_service(t: &Toleration, taint_value: &str) -> bool {
    let exists = t.operator.as_deref() == Some("Exists");
    let key = match t.key.as_deref() {
        None | Some("") => exists,
        Some(k) => k == OUT_OF_SERVICE_KEY,
    };
    let value = exists || t.value.as_deref() == Some(taint_value);
    let effect = matches!(
        t.effect.as_deref(),
        None | Some("") | Some(OUT_OF_SERVICE_EFFECT)
    );
    key && value && effect
}

/// A Node as the tests of the read and the write side start from.
#[cfg(test)]
pub(crate) mod fixtures {
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    /// A Node with this `Ready` status, these taints and resourceVersion.
    pub(crate) fn node(ready: &str, taints: Value, rv: Option<&str>) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "worker-2", "resourceVersion": rv},
            "spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0", "taints": taints},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "addresses": [
                    {"type": "InternalIP", "address": "10.0.1.17"},
                    {"type": "InternalDNS", "address": "ip-10-0-1-17.ec2.internal"},
                    {"type": "Hostname", "address": "ip-10-0-1-17.ec2.internal"}
                ]
            }
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::node;
    use super::*;
    use crate::core::model::facts::OUT_OF_SERVICE_VALUE;
    use serde_json::{Value, json};

    #[test]
    fn the_note_of_a_machine_seen_off_reads_back_and_an_edit_is_ignored() {
        let note = SeenOff {
            machine: "i-0123456789abcdef0".into(),
            started_at: 1_795_000_000,
            at: 1_795_003_600,
        };
        assert_eq!(seen_off(&seen_off_value(&note)), Some(note));
        for odd in [
            "",
            " 1 2",
            "i-0123456789abcdef0 1795000000",
            "i-0123456789abcdef0 soon 1795003600",
            "i-0123456789abcdef0 1795000000 1795003600 extra",
        ] {
            assert_eq!(seen_off(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn a_pod_stays_only_if_it_tolerates_the_taint_for_good() {
        let pod = |tolerations: Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "store-0", "namespace": "db", "uid": "u-1"},
                "spec": {
                    "containers": [],
                    "tolerations": tolerations,
                    "volumes": [
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data-store-0"}},
                        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                        {"name": "config", "configMap": {"name": "c"}}
                    ]
                }
            }))
            .unwrap()
        };
        let oos = OUT_OF_SERVICE_KEY;
        // (tolerations, stays for good, evicted at once)
        for (tolerations, stays, leaves_now) in [
            (json!([{"operator": "Exists"}]), true, false),
            (
                json!([{"operator": "Exists", "effect": "NoExecute"}]),
                true,
                false,
            ),
            (json!([{"key": oos, "operator": "Exists"}]), true, false),
            (
                json!([{"key": oos, "value": "nodeshutdown", "effect": "NoExecute"}]),
                true,
                false,
            ),
            (
                json!([{"key": oos, "operator": "Equal", "value": "nodeshutdown"}]),
                true,
                false,
            ),
            (json!([{"key": oos, "value": "other"}]), false, true),
            (
                json!([{"key": oos, "operator": "Exists", "effect": "NoSchedule"}]),
                false,
                true,
            ),
            // Evicted, but only once its time is up: left to Kubernetes.
            (
                json!([{"key": oos, "operator": "Exists", "tolerationSeconds": 300}]),
                false,
                false,
            ),
            (
                json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]),
                false,
                true,
            ),
            (json!([{"key": "", "value": "nodeshutdown"}]), false, true),
            (json!([]), false, true),
        ] {
            let ours = [OUT_OF_SERVICE_VALUE.to_owned()];
            let p = pod_ref(&pod(tolerations.clone()), &ours).unwrap();
            assert_eq!(
                (p.stays, p.leaves_now),
                (stays, leaves_now),
                "{tolerations}"
            );
            assert_eq!(p.claims, ["data-store-0", "store-0-scratch"]);
            assert_eq!(p.key(), "db/store-0");
        }
        // Being deleted already: the garbage collector takes it, whatever it tolerates.
        let mut terminating = pod(json!([{"operator": "Exists"}]));
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let ours = [OUT_OF_SERVICE_VALUE.to_owned()];
        let p = pod_ref(&terminating, &ours).unwrap();
        assert_eq!((p.stays, p.leaves_now), (false, true));
    }

    /// Issue 33, item 15: the Node carries another writer's out-of-service
    /// taint (another value): a pod stays only if it tolerates that one too,
    /// and one that tolerates only node-fencer's value is evicted at once.
    #[test]
    fn a_pod_is_judged_against_the_taints_the_node_carries() {
        let pod = |tolerations: Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "store-0", "namespace": "db", "uid": "u-1"},
                "spec": {"containers": [], "tolerations": tolerations}
            }))
            .unwrap()
        };
        let oos = OUT_OF_SERVICE_KEY;
        let theirs = ["shutdown".to_owned()];
        let both = ["shutdown".to_owned(), OUT_OF_SERVICE_VALUE.to_owned()];
        let ours_only = pod(json!([{"key": oos, "value": "nodeshutdown", "effect": "NoExecute"}]));
        let p = pod_ref(&ours_only, &theirs).unwrap();
        assert_eq!((p.stays, p.leaves_now), (false, true));
        let theirs_only = pod(json!([{"key": oos, "value": "shutdown"}]));
        let p = pod_ref(&theirs_only, &theirs).unwrap();
        assert_eq!((p.stays, p.leaves_now), (true, false));
        let p = pod_ref(&theirs_only, &both).unwrap();
        assert_eq!((p.stays, p.leaves_now), (false, true), "ours evicts it");
        let any = pod(json!([{"key": oos, "operator": "Exists"}]));
        let p = pod_ref(&any, &both).unwrap();
        assert_eq!((p.stays, p.leaves_now), (true, false));
    }

    /// Issue 33, item 14: the disks a pod names inline, without a PV.
    #[test]
    fn a_pods_inline_disks_are_read() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "legacy-0", "namespace": "db", "uid": "u-2"},
            "spec": {"containers": [], "volumes": [
                {"name": "a", "awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0123abcd"}},
                {"name": "b", "gcePersistentDisk": {"pdName": "data-disk"}},
                {"name": "c", "emptyDir": {}}
            ]}
        }))
        .unwrap();
        let p = pod_ref(&pod, &[OUT_OF_SERVICE_VALUE.to_owned()]).unwrap();
        assert_eq!(p.inline, ["vol-0123abcd", "data-disk"]);
    }

    /// Issue 60: a pod that ran to its end holds no volume any more.
    #[test]
    fn a_pod_that_ran_to_its_end_is_finished() {
        let ours = [OUT_OF_SERVICE_VALUE.to_owned()];
        for (phase, finished) in [
            (Some("Succeeded"), true),
            (Some("Failed"), true),
            (Some("Running"), false),
            (Some("Pending"), false),
            (None, false),
        ] {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "job-0", "namespace": "db", "uid": "u-3"},
                "spec": {"containers": []},
                "status": {"phase": phase}
            }))
            .unwrap();
            assert_eq!(
                pod_ref(&pod, &ours).unwrap().finished,
                finished,
                "{phase:?}"
            );
        }
    }

    /// Issue 60: the attach/detach controller's test of whether several
    /// nodes may attach a volume at once.
    #[test]
    fn a_volume_several_nodes_may_attach_is_shared() {
        for (modes, shared) in [
            (json!(["ReadWriteOnce"]), false),
            (json!(["ReadWriteOncePod"]), false),
            (json!(["ReadWriteOnce", "ReadOnlyMany"]), true),
            (json!(["ReadWriteMany"]), true),
            (json!([]), true),
            (Value::Null, true),
        ] {
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": "pv-a"},
                "spec": {"accessModes": modes.clone(),
                         "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0"}}
            }))
            .unwrap();
            assert_eq!(pv_facts(&pv).unwrap().shared, shared, "{modes}");
        }
    }

    #[test]
    fn facts_from_a_node() {
        let n = node("Unknown", json!([]), Some("7"));
        let f = node_facts(&n).unwrap();
        assert_eq!(f.instance.unwrap().as_str(), "i-0123456789abcdef0");
        assert_eq!(f.readiness, Readiness::Unknown);
        assert_eq!(
            f.internal_ips,
            ["10.0.1.17".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(f.host_names.len(), 2);
        assert_eq!(readiness(&node("True", json!([]), None)), Readiness::Ready);
        assert_eq!(
            readiness(&node("False", json!([]), None)),
            Readiness::NotReady
        );
        assert_eq!(readiness(&Node::default()), Readiness::Unknown);
    }

    #[test]
    fn the_attached_volumes_are_read_only_where_the_controller_keeps_them() {
        let with = |annotation: Option<&str>| -> Node {
            let annotations = annotation
                .map(|v| json!({ANNOTATION_CONTROLLER_MANAGED: v}))
                .unwrap_or(json!({}));
            serde_json::from_value(json!({
                "metadata": {"name": "n", "annotations": annotations},
                "status": {
                    "volumesAttached": [
                        {"name": "kubernetes.io/csi/ebs.csi.aws.com^vol-0b", "devicePath": ""},
                        {"name": "kubernetes.io/csi/ebs.csi.aws.com^vol-0a", "devicePath": ""},
                        {"name": "kubernetes.io/aws-ebs/aws://us-east-1a/vol-0c", "devicePath": ""},
                        {"name": "kubernetes.io/csi/^vol-0d", "devicePath": ""},
                        {"name": "kubernetes.io/csi/ebs.csi.aws.com^", "devicePath": ""},
                        {"name": "kubernetes.io/csi/ebs.csi.aws.com", "devicePath": ""}
                    ],
                    "volumesInUse": [
                        "kubernetes.io/csi/ebs.csi.aws.com^vol-0a",
                        "kubernetes.io/csi/cstor.csi.openebs.io^pvc-9"
                    ]
                }
            }))
            .unwrap()
        };
        let csi = |driver: &str, handle: &str| CsiVolume {
            driver: driver.into(),
            handle: handle.into(),
        };
        // Attached or in use, sorted, once each; other plugins' names and
        // names missing a part are not volumes node-fencer can name.
        assert_eq!(
            attached_volumes(&with(Some("true"))),
            Some(vec![
                csi("cstor.csi.openebs.io", "pvc-9"),
                csi("ebs.csi.aws.com", "vol-0a"),
                csi("ebs.csi.aws.com", "vol-0b"),
            ])
        );
        // Without the controller, `volumesAttached` says nothing: unknown,
        // not empty.
        assert_eq!(
            csi_volume(&csi_unique_name(&csi("ebs.csi.aws.com", "vol-0a"))),
            Some(csi("ebs.csi.aws.com", "vol-0a"))
        );
        assert_eq!(attached_volumes(&with(None)), None);
        assert_eq!(attached_volumes(&with(Some("false"))), None);
        let bare: Node =
            serde_json::from_value(json!({"metadata": {"name": "n", "annotations": {ANNOTATION_CONTROLLER_MANAGED: "true"}}}))
                .unwrap();
        assert_eq!(attached_volumes(&bare), Some(vec![]));
    }

    #[test]
    fn pv_and_attachment_facts() {
        let csi: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-a"},
            "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0"}}
        }))
        .unwrap();
        assert_eq!(
            pv_facts(&csi).unwrap().volume.unwrap().as_str(),
            "vol-0123456789abcdef0"
        );
        let other: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-b"},
            "spec": {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0"}}
        }))
        .unwrap();
        assert_eq!(pv_facts(&other).unwrap().volume, None);
        let in_tree: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-c"},
            "spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0123abcd"}}
        }))
        .unwrap();
        assert_eq!(
            pv_facts(&in_tree).unwrap().volume.unwrap().as_str(),
            "vol-0123abcd"
        );
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": "csi-1", "uid": "7c1e0a52-0000-4000-8000-000000000001"},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "worker-2",
                     "source": {"persistentVolumeName": "pv-a"}}
        }))
        .unwrap();
        let f = attachment_facts(&va).unwrap();
        assert_eq!(
            (f.node_name.as_str(), f.pv_name.as_deref()),
            ("worker-2", Some("pv-a"))
        );
        assert_eq!(f.uid, "7c1e0a52-0000-4000-8000-000000000001");
    }

    #[test]
    fn persistent_disks_by_csi_handle_and_in_tree_with_their_zone() {
        let pv = |spec: Value, labels: Value| -> PersistentVolume {
            serde_json::from_value(
                json!({"metadata": {"name": "pv", "labels": labels}, "spec": spec}),
            )
            .unwrap()
        };
        let volume = |pv: &PersistentVolume| pv_facts(pv).unwrap().volume.map(|v| v.to_string());
        let handle = "projects/proj-fencer/regions/us-central1/disks/pd-r";
        let csi = pv(
            json!({"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": handle}}),
            json!({}),
        );
        assert_eq!(volume(&csi).as_deref(), Some(handle));
        // An EBS id under the PD driver, or a PD handle under another, is neither.
        let mixed = pv(
            json!({"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "vol-0123abcd"}}),
            json!({}),
        );
        assert_eq!(volume(&mixed), None);
        let in_tree = |labels| pv(json!({"gcePersistentDisk": {"pdName": "pd-1"}}), labels);
        assert_eq!(
            volume(&in_tree(
                json!({"topology.kubernetes.io/zone": "us-central1-a"})
            ))
            .as_deref(),
            Some("projects/UNSPECIFIED/zones/us-central1-a/disks/pd-1")
        );
        assert_eq!(
            volume(&in_tree(
                json!({"failure-domain.beta.kubernetes.io/zone": "us-central1-a__us-central1-b"})
            ))
            .as_deref(),
            Some("projects/UNSPECIFIED/regions/us-central1/disks/pd-1")
        );
        assert_eq!(volume(&in_tree(json!({}))), None, "no zone, no disk named");
    }

    #[test]
    fn gke_records_the_vm_id_on_the_node() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "creationTimestamp": "2026-11-20T10:00:00Z",
                         "annotations": {ANNOTATION_GKE_INSTANCE_ID: "1234567890123456789"}}
        }))
        .unwrap();
        let identity = machine_identity(&node);
        assert_eq!(identity.uid, Some(1_234_567_890_123_456_789));
        assert_eq!(identity.created_at, Some(1_795_168_800));
        let garbage: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "annotations": {ANNOTATION_GKE_INSTANCE_ID: "i-123"}}
        }))
        .unwrap();
        assert_eq!(
            machine_identity(&garbage),
            MachineIdentity {
                system_uuid: SystemUuid::Missing,
                ..MachineIdentity::default()
            }
        );
    }

    /// The SMBIOS UUID the kubelet read is what a BMC's System is held to.
    #[test]
    fn the_kubelet_records_the_machines_uuid() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"nodeInfo": {"systemUUID": "27946B59-9E44-4FA7-8E91-F3527A1EF094",
                "machineID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64"}}
        }))
        .unwrap();
        assert_eq!(
            machine_identity(&node).system_uuid,
            SystemUuid::parse(Some("27946b59-9e44-4fa7-8e91-f3527a1ef094"))
        );
        assert!(matches!(
            machine_identity(&node).system_uuid,
            SystemUuid::Known(_)
        ));
    }
}
