//! Kubernetes objects read into facts, and the taint patch written from a
//! Node. Pure: the shell fetches and sends, this module only looks.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod, Taint, Toleration};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{Value, json};

use crate::core::model::facts::{
    AttachmentFacts, CsiVolume, FenceMark, FenceMode, MachineIdentity, NO_SCHEDULE_EFFECT,
    NodeFacts, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE, PodRef, PowerFacts,
    PowerMark, PvFacts, Readiness, TaintFacts,
};
use crate::core::model::instance::{
    InstanceId, InstanceState, VolumeId, instance_from_provider_id,
};
use crate::core::rules::volumes::cloud_disk;

/// Annotation prefix for what node-fencer records on a Node it fenced.
pub const ANNOTATION_PREFIX: &str = "node-fencer.io/";
/// The taint node-fencer applied, as `key=value:effect`.
pub const ANNOTATION_TAINT: &str = "node-fencer.io/taint";
/// When it was applied (RFC 3339).
pub const ANNOTATION_FENCED_AT: &str = "node-fencer.io/fenced-at";
/// The instance and the state EC2 reported at decision time.
pub const ANNOTATION_INSTANCE: &str = "node-fencer.io/instance";
/// The correlation id of the invocation that applied it.
pub const ANNOTATION_CORRELATION: &str = "node-fencer.io/correlation-id";
/// How the node was fenced: `taint` or `legacy`.
pub const ANNOTATION_MODE: &str = "node-fencer.io/mode";
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
pub const ANNOTATION_BOOT_ID: &str = "node-fencer.io/boot-id";
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
    })
}

/// The annotation GKE puts on a Node: its VM's numeric id.
pub const ANNOTATION_GKE_INSTANCE_ID: &str = "container.googleapis.com/instance_id";

/// What tells the Node's machine from another of the same name: the VM id
/// GKE records, and when the Node was created.
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
pub fn boot_id(node: &Node) -> Option<String> {
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

/// What node-fencer records on a Node whose machine it powers off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PowerStamp {
    /// RFC 3339 time of the power-off.
    pub at: String,
    /// The boot id the Node reported when it was judged.
    pub boot_id: Option<String>,
    /// Why, in words.
    pub reason: String,
}

/// The merge patch that records a power-off on the Node: annotations only,
/// so it needs no resourceVersion and drops nothing.
pub fn power_mark_patch(stamp: &PowerStamp) -> Value {
    json!({"metadata": {
        "annotations": {
            ANNOTATION_POWERED_OFF_AT: stamp.at,
            ANNOTATION_POWERED_OFF_BOOT_ID: stamp.boot_id.as_deref().unwrap_or(""),
            ANNOTATION_POWER_OFF_REASON: stamp.reason,
        },
        // Labelled like a fenced Node: a power-off in flight takes room
        // under the cap, and the invocations that read only the labelled
        // Nodes must count it too.
        "labels": {LABEL_FENCED: "true"},
    }})
}

/// The merge patch that takes back a power-off mark whose stop the cloud
/// refused: the machine runs as before, so neither the cap nor the
/// never-twice rule may count it.
pub fn power_unmark_patch() -> Value {
    json!({"metadata": {
        "annotations": {
            ANNOTATION_POWERED_OFF_AT: null,
            ANNOTATION_POWERED_OFF_BOOT_ID: null,
            ANNOTATION_POWER_OFF_REASON: null,
        },
        "labels": {LABEL_FENCED: null},
    }})
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
pub fn readiness(node: &Node) -> Readiness {
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
    let csi = spec
        .and_then(|s| s.csi.as_ref())
        .and_then(|c| cloud_disk(&c.driver, &c.volume_handle));
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
    Some(PvFacts {
        name: pv.metadata.name.clone()?,
        volume: csi.or(in_tree),
        claim,
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

/// The out-of-service taint that evicts (any value).
fn is_out_of_service(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_KEY && t.effect == OUT_OF_SERVICE_EFFECT
}

/// True for the `NoSchedule` out-of-service taint of the pair, as
/// node-fencer writes it (the API keeps no time for `NoSchedule` taints: the
/// fencing's annotation says it was node-fencer's).
fn is_our_no_schedule(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_KEY
        && t.effect == NO_SCHEDULE_EFFECT
        && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
}

/// True for the out-of-service taint node-fencer wrote at `fenced_at`: its
/// value, and its `timeAdded` to the second (the API keeps seconds). An
/// operator's taint (another value, or re-applied later) is not ours.
fn is_ours(t: &Taint, fenced_at: &str) -> bool {
    let at = fenced_at
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second());
    is_out_of_service(t)
        && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
        && at.is_some()
        && t.time_added.as_ref().map(|added| added.0.as_second()) == at
}

/// What node-fencer records with the taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The instance EC2 confirmed off.
    pub instance: InstanceId,
    /// Its state at decision time.
    pub state: InstanceState,
    /// RFC 3339 time of the decision.
    pub at: String,
    /// The invocation's correlation id.
    pub correlation_id: String,
    /// How the node is fenced.
    pub mode: FenceMode,
    /// The EBS volumes planned for force-detach.
    pub volumes: Vec<VolumeId>,
    /// Also apply the `NoSchedule` out-of-service taint.
    pub no_schedule: bool,
}

/// What the taint step found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintOutcome {
    /// The taint was added by this call.
    Applied,
    /// The taint was already there.
    AlreadyPresent,
    /// The Node became Ready since the decision; nothing was written.
    NodeReady,
    /// The Node no longer exists.
    NodeGone,
}

/// What the recovery step found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UntaintOutcome {
    /// The fencing is ended; `taint_removed` says whether a taint went with it.
    Ended {
        /// Whether the out-of-service taint was removed.
        taint_removed: bool,
    },
    /// The Node no longer carries this fencing's mark; nothing was written.
    NotOurs,
    /// The Node is not Ready any more; nothing was written.
    NodeNotReady,
    /// The Node is Ready, but (as read at patch time) not for the settle
    /// delay yet; nothing was written.
    NotSettled {
        /// Seconds still to wait.
        remaining_secs: i64,
    },
    /// The Node no longer exists.
    NodeGone,
    /// Recovery is manual, and the Node read at patch time carries no
    /// confirmation of this fencing's end; nothing was written.
    NotConfirmed,
}

/// What to do about the taint, given the Node as it is now.
#[derive(Clone, Debug, PartialEq)]
pub enum TaintPatch {
    /// Send this merge patch.
    Apply(Value),
    /// The taint is there already.
    AlreadyPresent,
    /// The taint is there, stamped with this invocation's correlation id: an
    /// earlier attempt of this run applied it and its answer was lost.
    AppliedByThisRun,
    /// The Node turned Ready since the decision: do not fence.
    NodeReady,
    /// The Node has no resourceVersion to guard the write with.
    NoResourceVersion,
    /// An existing taint could not be restated; writing would drop it.
    Unrepresentable,
}

/// Builds the merge patch that fences the Node: the out-of-service taint
/// (taint mode) and the annotations that record it. The patch carries the
/// resourceVersion it was built from, so the API server refuses it (409) if
/// anyone changed the Node in between, and it restates every existing taint,
/// so none is dropped.
pub fn taint_patch(node: &Node, stamp: &Stamp) -> TaintPatch {
    if readiness(node) == Readiness::Ready {
        return TaintPatch::NodeReady;
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return TaintPatch::NoResourceVersion;
    };
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let present = match stamp.mode {
        FenceMode::Taint => existing.iter().any(is_out_of_service),
        FenceMode::Legacy => fence_mark(node).is_some(),
    };
    if present {
        let ours = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CORRELATION))
            .is_some_and(|id| *id == stamp.correlation_id);
        return if ours {
            TaintPatch::AppliedByThisRun
        } else {
            TaintPatch::AlreadyPresent
        };
    }
    let volumes: Vec<&str> = stamp.volumes.iter().map(VolumeId::as_str).collect();
    let mut annotations = json!({
        ANNOTATION_FENCED_AT: stamp.at,
        ANNOTATION_INSTANCE: format!("{}={}", stamp.instance, stamp.state),
        ANNOTATION_CORRELATION: stamp.correlation_id,
        ANNOTATION_MODE: stamp.mode.name(),
        ANNOTATION_VOLUMES: volumes.join(","),
    });
    if let Some(boot) = boot_id(node) {
        annotations[ANNOTATION_BOOT_ID] = json!(boot);
    }
    if stamp.mode == FenceMode::Legacy {
        return TaintPatch::Apply(json!({
            "metadata": {"resourceVersion": rv, "annotations": annotations, "labels": {LABEL_FENCED: "true"}}
        }));
    }
    // Restating a taint we cannot serialise would drop it: refuse instead.
    let Ok(mut taints) = existing
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<Value>, _>>()
    else {
        return TaintPatch::Unrepresentable;
    };
    taints.push(json!({
        "key": OUT_OF_SERVICE_KEY,
        "value": OUT_OF_SERVICE_VALUE,
        "effect": OUT_OF_SERVICE_EFFECT,
        "timeAdded": stamp.at,
    }));
    let mut applied = vec![format!(
        "{OUT_OF_SERVICE_KEY}={OUT_OF_SERVICE_VALUE}:{OUT_OF_SERVICE_EFFECT}"
    )];
    // One already there (an operator's) is left as it is, and not ours to remove.
    if stamp.no_schedule && !existing.iter().any(is_our_no_schedule) {
        taints.push(json!({
            "key": OUT_OF_SERVICE_KEY,
            "value": OUT_OF_SERVICE_VALUE,
            "effect": NO_SCHEDULE_EFFECT,
        }));
        applied.push(format!(
            "{OUT_OF_SERVICE_KEY}={OUT_OF_SERVICE_VALUE}:{NO_SCHEDULE_EFFECT}"
        ));
    }
    annotations[ANNOTATION_TAINT] = json!(applied.join(","));
    TaintPatch::Apply(json!({
        "metadata": {"resourceVersion": rv, "annotations": annotations, "labels": {LABEL_FENCED: "true"}},
        "spec": { "taints": taints }
    }))
}

/// What confirming a fencing's end did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// The Node carries the confirmation of its fencing now.
    Confirmed,
    /// node-fencer has not fenced this Node: nothing to confirm.
    NotFenced,
    /// The Node's fencing is another one than the confirmation names.
    AnotherFencing,
    /// The Node no longer exists.
    NodeGone,
}

/// What to write to confirm the end of a Node's fencing.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfirmPatch {
    /// Send this merge patch, guarded by the resourceVersion: the
    /// confirmation names the fencing's `fenced-at`.
    Apply(Value),
    /// The Node carries this fencing's confirmation already.
    Already,
    /// node-fencer has not fenced this Node.
    NotFenced,
    /// The Node's fencing is another one than the confirmation names.
    AnotherFencing,
    /// The Node has no resourceVersion to guard the write with.
    NoResourceVersion,
}

/// What confirming the end of the Node's fencing writes; `fenced_at`, when
/// given, names the fencing confirmed (an operator looked at that one).
pub fn confirm_patch(node: &Node, fenced_at: Option<&str>) -> ConfirmPatch {
    let Some(mark) = fence_mark(node) else {
        return ConfirmPatch::NotFenced;
    };
    if let Some(asked) = fenced_at
        && !crate::core::model::values::same_time(asked, &mark.at)
    {
        return ConfirmPatch::AnotherFencing;
    }
    if mark.confirmed {
        return ConfirmPatch::Already;
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return ConfirmPatch::NoResourceVersion;
    };
    ConfirmPatch::Apply(json!({"metadata": {
        "resourceVersion": rv,
        "annotations": {ANNOTATION_RECOVERY_CONFIRMED: mark.at}
    }}))
}

/// What to do to end a fencing, given the Node as it is now.
#[derive(Clone, Debug, PartialEq)]
pub enum UntaintPatch {
    /// Send this merge patch; `removes_taint` tells whether it drops the taint.
    Apply {
        /// The patch.
        patch: Value,
        /// Whether the out-of-service taint goes with it.
        removes_taint: bool,
    },
    /// The Node carries no mark of this fencing (cleared, re-fenced since,
    /// or a new object under the same name): nothing of ours to remove.
    NotOurs,
    /// The Node is not Ready: recovery must wait.
    NodeNotReady,
    /// The Node has not been Ready for the settle delay: recovery must wait.
    NotSettled {
        /// Seconds still to wait.
        remaining_secs: i64,
    },
    /// The Node has no resourceVersion to guard the write with.
    NoResourceVersion,
    /// A remaining taint could not be restated; writing would drop it.
    Unrepresentable,
    /// Recovery is manual and no operator confirmed this fencing's end.
    NotConfirmed,
}

/// The fencing to end and the settle rule it must meet on the Node read at
/// patch time: a Node that flapped since the list the decision came from
/// shows a newer Ready transition there.
#[derive(Clone, Copy, Debug)]
pub struct Ending<'a> {
    /// The fencing, by its `fenced-at`.
    pub fenced_at: &'a str,
    /// How long the Node must have been Ready, in seconds.
    pub settle_secs: i64,
    /// Since when the invocation has seen the Node Ready (Unix seconds):
    /// the start of the settle delay when the condition does not say.
    pub seen_ready_at: i64,
    /// Recovery is manual: the Node read at patch time must carry an
    /// operator's confirmation of this fencing's end.
    pub needs_confirmation: bool,
}

/// Builds the merge patch that ends the fencing `ending` names, at `now`
/// (Unix seconds): removes the out-of-service taint only when node-fencer's
/// annotation says node-fencer applied it, and clears node-fencer's
/// annotations. Guarded by the resourceVersion, like the taint patch; every
/// other taint is restated.
pub fn untaint_patch(node: &Node, ending: &Ending<'_>, now: i64) -> UntaintPatch {
    let fenced_at = ending.fenced_at;
    let Some(mark) = fence_mark(node).filter(|m| m.at == fenced_at) else {
        return UntaintPatch::NotOurs;
    };
    if ending.needs_confirmation && !mark.confirmed {
        return UntaintPatch::NotConfirmed;
    }
    if readiness(node) != Readiness::Ready {
        return UntaintPatch::NodeNotReady;
    }
    let since = ready_since(node).unwrap_or(ending.seen_ready_at);
    let remaining_secs = ending.settle_secs - (now - since);
    if remaining_secs > 0 {
        return UntaintPatch::NotSettled { remaining_secs };
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return UntaintPatch::NoResourceVersion;
    };
    let applied_taint = mark.mode == FenceMode::Taint
        && node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION_TAINT));
    let cleared: serde_json::Map<String, Value> = ANNOTATIONS
        .iter()
        .map(|k| ((*k).to_owned(), Value::Null))
        .collect();
    let mut patch = json!({"metadata": {
        "resourceVersion": rv, "annotations": cleared, "labels": {LABEL_FENCED: null}
    }});
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| is_ours(t, fenced_at) || (mark.no_schedule && is_our_no_schedule(t));
    let removes_taint = applied_taint && existing.iter().any(ours);
    if removes_taint {
        let Ok(kept) = existing
            .iter()
            .filter(|t| !ours(t))
            .map(serde_json::to_value)
            .collect::<Result<Vec<Value>, _>>()
        else {
            return UntaintPatch::Unrepresentable;
        };
        patch["spec"] = json!({ "taints": kept });
    }
    UntaintPatch::Apply {
        patch,
        removes_taint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ready: &str, taints: Value, rv: Option<&str>) -> Node {
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

    const NOW: i64 = 1_795_000_000;

    /// Ending the fencing `at` with no settle delay left to wait.
    fn settled(fenced_at: &str) -> Ending<'_> {
        Ending {
            fenced_at,
            settle_secs: 30,
            seen_ready_at: NOW - 30,
            needs_confirmation: false,
        }
    }

    fn stamp() -> Stamp {
        Stamp {
            instance: InstanceId::parse("i-0123456789abcdef0").unwrap(),
            state: InstanceState::Stopped,
            at: "2026-11-22T10:00:00Z".into(),
            correlation_id: "c-1".into(),
            mode: FenceMode::Taint,
            volumes: vec![VolumeId::parse("vol-0123456789abcdef0").unwrap()],
            no_schedule: false,
        }
    }

    /// A Node fenced by `stamp()`, Ready again, with another taint beside ours.
    fn fenced_and_back() -> Node {
        fenced_and_back_by(&stamp())
    }

    /// A Node fenced by `stamp`, Ready again, with another taint beside ours.
    fn fenced_and_back_by(stamp: &Stamp) -> Node {
        let mut n = node(
            "Unknown",
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
            Some("5"),
        );
        n.status.as_mut().unwrap().node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
            boot_id: "boot-1".into(),
            ..Default::default()
        });
        let TaintPatch::Apply(patch) = taint_patch(&n, stamp) else {
            panic!("expected a patch");
        };
        assert_eq!(patch["metadata"]["labels"][LABEL_FENCED], "true");
        n.metadata.annotations =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap();
        n.spec.as_mut().unwrap().taints =
            serde_json::from_value(patch["spec"]["taints"].clone()).unwrap();
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        n
    }

    #[test]
    fn the_mark_reads_back_what_the_patch_wrote() {
        let n = fenced_and_back();
        let mark = fence_mark(&n).unwrap();
        assert_eq!(mark.mode, FenceMode::Taint);
        assert_eq!(mark.at, "2026-11-22T10:00:00Z");
        assert_eq!(mark.instance.unwrap().as_str(), "i-0123456789abcdef0");
        assert_eq!(mark.volumes, stamp().volumes);
        assert!(node_facts(&n).unwrap().fenced.is_some());
        assert_eq!(fence_mark(&node("True", json!([]), Some("1"))), None);
    }

    /// Rook/Ceph's pair: both taints go on, the annotation says so and
    /// records the boot; recovery removes both, and an operator's
    /// `NoSchedule` taint that was there first is neither doubled nor ours.
    #[test]
    fn the_no_schedule_pair_is_applied_recorded_and_removed_together() {
        let pair = Stamp {
            no_schedule: true,
            ..stamp()
        };
        let n = fenced_and_back_by(&pair);
        let effects: Vec<&str> = n
            .spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .unwrap()
            .iter()
            .filter(|t| t.key == OUT_OF_SERVICE_KEY)
            .map(|t| t.effect.as_str())
            .collect();
        assert_eq!(effects, ["NoExecute", "NoSchedule"]);
        let mark = fence_mark(&n).unwrap();
        assert!(mark.no_schedule);
        assert_eq!(mark.boot_id.as_deref(), Some("boot-1"));
        let UntaintPatch::Apply { patch, .. } =
            untaint_patch(&n, &settled("2026-11-22T10:00:00Z"), NOW)
        else {
            panic!("expected a patch");
        };
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
        );
        // Without the setting, only the NoExecute taint, and no claim on the pair.
        let single = fenced_and_back();
        assert!(!fence_mark(&single).unwrap().no_schedule);

        // An operator's NoSchedule out-of-service taint, there first, stays.
        let theirs =
            json!({"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoSchedule"});
        let before = node("Unknown", json!([theirs]), Some("5"));
        let TaintPatch::Apply(patch) = taint_patch(&before, &pair) else {
            panic!("expected a patch");
        };
        let taints = patch["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 2, "{taints:?}");
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_TAINT],
            format!("{OUT_OF_SERVICE_KEY}=nodeshutdown:NoExecute")
        );
    }

    #[test]
    fn recovery_removes_only_our_taint_and_clears_our_annotations() {
        let n = fenced_and_back();
        let UntaintPatch::Apply {
            patch,
            removes_taint,
        } = untaint_patch(&n, &settled("2026-11-22T10:00:00Z"), NOW)
        else {
            panic!("expected a patch");
        };
        assert!(removes_taint);
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        let labels = &patch["metadata"]["labels"];
        assert!(
            labels.get(LABEL_FENCED).is_some_and(Value::is_null),
            "{labels}"
        );
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
        );
        for key in ANNOTATIONS {
            assert_eq!(patch["metadata"]["annotations"][key], Value::Null, "{key}");
            assert!(
                patch["metadata"]["annotations"].get(key).is_some(),
                "{key} cleared"
            );
        }
        // Issue 12, item 9: a taint an operator put back (another value, or
        // the same value added later) stays, while our annotations go.
        for theirs in [
            json!({"key": OUT_OF_SERVICE_KEY, "value": "manual", "effect": "NoExecute",
                   "timeAdded": "2026-11-22T10:00:00Z"}),
            json!({"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoExecute",
                   "timeAdded": "2026-11-22T10:05:00Z"}),
            json!({"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoExecute"}),
        ] {
            let mut put_back = n.clone();
            put_back.spec.as_mut().unwrap().taints = Some(vec![
                serde_json::from_value(
                    json!({"key": "dedicated", "value": "db", "effect": "NoSchedule"}),
                )
                .unwrap(),
                serde_json::from_value(theirs.clone()).unwrap(),
            ]);
            let UntaintPatch::Apply {
                patch,
                removes_taint,
            } = untaint_patch(&put_back, &settled("2026-11-22T10:00:00Z"), NOW)
            else {
                panic!("expected a patch");
            };
            assert!(!removes_taint, "{theirs}");
            assert!(patch.get("spec").is_none(), "{theirs}: {patch}");
            assert_eq!(
                patch["metadata"]["annotations"][ANNOTATION_FENCED_AT],
                Value::Null
            );
        }
        // Another fencing since (a newer mark), or no mark at all: not ours.
        assert_eq!(
            untaint_patch(&n, &settled("2026-11-22T09:00:00Z"), NOW),
            UntaintPatch::NotOurs
        );
        let mut theirs = n.clone();
        theirs.metadata.annotations = None;
        assert_eq!(
            untaint_patch(&theirs, &settled("2026-11-22T10:00:00Z"), NOW),
            UntaintPatch::NotOurs
        );
        // Not Ready yet.
        let mut down = n.clone();
        down.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "Unknown".into();
        assert_eq!(
            untaint_patch(&down, &settled("2026-11-22T10:00:00Z"), NOW),
            UntaintPatch::NodeNotReady
        );
    }

    #[test]
    fn manual_recovery_needs_a_confirmation_of_this_very_fencing() {
        let at = "2026-11-22T10:00:00Z";
        let mut n = fenced_and_back();
        let manual = Ending {
            needs_confirmation: true,
            ..settled(at)
        };
        assert_eq!(untaint_patch(&n, &manual, NOW), UntaintPatch::NotConfirmed);
        let ConfirmPatch::Apply(patch) = confirm_patch(&n, None) else {
            panic!("a fenced node's end can be confirmed");
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_RECOVERY_CONFIRMED],
            at
        );
        assert_eq!(
            confirm_patch(&node("True", json!([]), Some("5")), None),
            ConfirmPatch::NotFenced
        );
        let confirm = |n: &mut Node, value: &str| {
            n.metadata
                .annotations
                .get_or_insert_default()
                .insert(ANNOTATION_RECOVERY_CONFIRMED.into(), value.into());
        };
        // A confirmation of an earlier fencing does not end this one.
        confirm(&mut n, "2026-11-01T08:00:00Z");
        assert!(!fence_mark(&n).unwrap().confirmed);
        assert_eq!(untaint_patch(&n, &manual, NOW), UntaintPatch::NotConfirmed);
        confirm(&mut n, at);
        assert!(fence_mark(&n).unwrap().confirmed);
        assert_eq!(confirm_patch(&n, None), ConfirmPatch::Already);
        let UntaintPatch::Apply {
            patch,
            removes_taint,
        } = untaint_patch(&n, &manual, NOW)
        else {
            panic!("a confirmed, settled fencing ends");
        };
        assert!(removes_taint);
        // The confirmation goes with the rest of node-fencer's record.
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_RECOVERY_CONFIRMED],
            Value::Null
        );
        assert!(
            patch["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .contains_key(ANNOTATION_RECOVERY_CONFIRMED)
        );
    }

    #[test]
    fn the_settle_delay_is_checked_on_the_node_read_at_patch_time() {
        let at = "2026-11-22T10:00:00Z";
        let mut n = fenced_and_back();
        // No transition time: the delay runs from the invocation's first sighting.
        let early = Ending {
            seen_ready_at: NOW - 10,
            ..settled(at)
        };
        assert_eq!(
            untaint_patch(&n, &early, NOW),
            UntaintPatch::NotSettled { remaining_secs: 20 }
        );
        // Issue 12, item 10: the Node flapped after the list the decision
        // came from; its fresh transition time wins over the first sighting.
        let ready = &mut n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
        ready.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(NOW - 5).unwrap(),
        ));
        assert_eq!(
            untaint_patch(&n, &settled(at), NOW),
            UntaintPatch::NotSettled { remaining_secs: 25 }
        );
        assert!(matches!(
            untaint_patch(&n, &settled(at), NOW + 25),
            UntaintPatch::Apply { .. }
        ));
    }

    #[test]
    fn a_legacy_fence_writes_no_taint_and_recovery_removes_none() {
        let legacy = Stamp {
            mode: FenceMode::Legacy,
            ..stamp()
        };
        let mut n = node(
            "Unknown",
            json!([{"key": OUT_OF_SERVICE_KEY, "value": "someone", "effect": "NoExecute"}]),
            Some("3"),
        );
        let TaintPatch::Apply(patch) = taint_patch(&n, &legacy) else {
            panic!("expected a patch");
        };
        assert!(patch.get("spec").is_none(), "{patch}");
        assert_eq!(patch["metadata"]["annotations"][ANNOTATION_MODE], "legacy");
        assert_eq!(patch["metadata"]["labels"][LABEL_FENCED], "true");
        n.metadata.annotations =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap();
        assert_eq!(
            taint_patch(
                &n,
                &Stamp {
                    correlation_id: "c-2".into(),
                    ..legacy.clone()
                }
            ),
            TaintPatch::AlreadyPresent
        );
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        let UntaintPatch::Apply {
            patch,
            removes_taint,
        } = untaint_patch(&n, &settled(&legacy.at), NOW)
        else {
            panic!("expected a patch");
        };
        // Someone else's out-of-service taint stays.
        assert!(!removes_taint);
        assert!(patch.get("spec").is_none(), "{patch}");
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
    fn the_patch_keeps_other_taints_and_carries_the_resource_version() {
        let others = json!([
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-22T09:59:00Z"},
            {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
        ]);
        let TaintPatch::Apply(patch) = taint_patch(&node("Unknown", others, Some("42")), &stamp())
        else {
            panic!("expected a patch");
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let taints = patch["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 3);
        assert_eq!(taints[0]["key"], "node.kubernetes.io/unreachable");
        assert_eq!(taints[1]["value"], "db");
        assert_eq!(taints[2]["key"], OUT_OF_SERVICE_KEY);
        assert_eq!(taints[2]["effect"], "NoExecute");
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_INSTANCE],
            "i-0123456789abcdef0=stopped"
        );
    }

    #[test]
    fn no_patch_when_present_ready_or_unversioned() {
        let present = json!([{"key": OUT_OF_SERVICE_KEY, "value": "x", "effect": "NoExecute"}]);
        assert_eq!(
            taint_patch(&node("False", present, Some("1")), &stamp()),
            TaintPatch::AlreadyPresent
        );
        assert_eq!(
            taint_patch(&node("True", json!([]), Some("1")), &stamp()),
            TaintPatch::NodeReady
        );
        assert_eq!(
            taint_patch(&node("False", json!([]), None), &stamp()),
            TaintPatch::NoResourceVersion
        );
        let no_schedule = json!([{"key": OUT_OF_SERVICE_KEY, "effect": "NoSchedule"}]);
        assert!(matches!(
            taint_patch(&node("False", no_schedule, Some("1")), &stamp()),
            TaintPatch::Apply(_)
        ));
    }

    #[test]
    fn a_taint_stamped_by_this_run_counts_as_applied_by_it() {
        let present = json!([{"key": OUT_OF_SERVICE_KEY, "value": "x", "effect": "NoExecute"}]);
        let mut ours = node("False", present, Some("2"));
        ours.metadata.annotations = Some(
            [(ANNOTATION_CORRELATION.to_owned(), "c-1".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(taint_patch(&ours, &stamp()), TaintPatch::AppliedByThisRun);
        let other_run = Stamp {
            correlation_id: "c-2".into(),
            ..stamp()
        };
        assert_eq!(taint_patch(&ours, &other_run), TaintPatch::AlreadyPresent);
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
        assert_eq!(machine_identity(&garbage), MachineIdentity::default());
    }
}
