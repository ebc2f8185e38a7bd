//! Plain facts gathered from Kubernetes and EC2, reduced to what the decision
//! needs. The shell fills them in; the core only reads them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use crate::core::model::instance::{
    AttachmentState, InstanceId, InstanceState, VolumeId, VolumeState,
};
use crate::core::model::redfish::SystemUuid;

/// The out-of-service taint key (KEP-2268).
pub const OUT_OF_SERVICE_KEY: &str = "node.kubernetes.io/out-of-service";
/// The value node-fencer applies.
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
/// The effect node-fencer applies; only `NoExecute` makes pods go.
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";
/// The effect of the second taint of the pair Rook/Ceph documents for a
/// fenced node (`OUT_OF_SERVICE_NO_SCHEDULE=true`).
pub(crate) const NO_SCHEDULE_EFFECT: &str = "NoSchedule";

/// The node's `Ready` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Readiness {
    /// `Ready=True`: the kubelet reports in. Never fenced.
    Ready,
    /// `Ready=False`.
    NotReady,
    /// `Ready=Unknown` or no condition: the kubelet went silent.
    Unknown,
}

/// A taint, as the decision sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaintFacts {
    /// The key.
    pub key: String,
    /// The value, if any.
    pub value: Option<String>,
    /// The effect.
    pub effect: String,
}

/// What Kubernetes says about one Node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`: a Node deleted and registered again under the same
    /// name is another object.
    pub uid: Option<String>,
    /// The instance from `spec.providerID`, when it is an AWS one.
    pub instance: Option<InstanceId>,
    /// The `Ready` condition.
    pub(crate) readiness: Readiness,
    /// `InternalIP` addresses.
    pub(crate) internal_ips: Vec<IpAddr>,
    /// `InternalDNS` and `Hostname` addresses.
    pub(crate) host_names: Vec<String>,
    /// The taints.
    pub taints: Vec<TaintFacts>,
    /// When the `Ready` condition last turned `True` (Unix seconds), if it is `True`.
    pub(crate) ready_since: Option<i64>,
    /// What node-fencer recorded when it fenced this Node, if it did.
    pub fenced: Option<FenceMark>,
    /// The CSI volumes attached to the Node as Kubernetes records them, when
    /// the attach/detach controller manages its attachments; `None` when it
    /// does not (the node's attachments are then found by listing them).
    pub attached: Option<Vec<CsiVolume>>,
    /// What tells its machine from another one of the same name.
    pub machine: MachineIdentity,
    /// What active fencing looks at.
    pub power: PowerFacts,
    /// `metadata.labels`: what `NODE_SELECTOR` and the opt-out read.
    pub labels: BTreeMap<String, String>,
    /// node-fencer's note that it saw the Node's machine off, if it made one.
    pub seen_off: Option<SeenOff>,
    /// `metadata.resourceVersion` as read: the fast path's mark is written
    /// only over the version read before its proof.
    #[serde(skip)]
    pub version: Option<String>,
}

/// node-fencer's note on a Node that the Node's machine was off while the
/// kubelet's Lease had been written after the machine's stop: a later write
/// of the Lease, while the machine has not started since, comes from a
/// kubelet on another machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SeenOff {
    /// The machine, as its id is written.
    pub machine: String,
    /// The machine's last start as the cloud recorded it then (Unix seconds).
    pub started_at: i64,
    /// Since when it is known off (Unix seconds): when its trigger reported
    /// it got there (the cloud's clock), or else when node-fencer saw it off
    /// (node-fencer's clock).
    pub at: i64,
}

/// What tells one machine from another carrying the same name. An EC2
/// instance id is never reused, so on AWS nothing is needed; a Compute
/// Engine VM deleted and created again (a managed instance group's repair,
/// GKE's auto-repair) keeps its name, provider id and zone, and only its
/// numeric id and creation time tell them apart.
/// On-premises, the inventory's name for a machine is only as right as the
/// operator's last edit, and a board can be swapped behind a BMC: the
/// System's UUID, held to the one the Node's kubelet read when it
/// registered, tells whether the BMC's answer is about the Node's machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MachineIdentity {
    /// The machine's numeric id: for a VM, Compute Engine's `id`; for a
    /// Node, its `container.googleapis.com/instance_id` annotation.
    pub uid: Option<u64>,
    /// When it was created (Unix seconds): for a VM, its
    /// `creationTimestamp`; for a Node, its own.
    pub(crate) created_at: Option<i64>,
    /// The SMBIOS UUID: for a Redfish machine, the System's `UUID`; for a
    /// Node, `status.nodeInfo.systemUUID`. Unread for the clouds' machines.
    pub system_uuid: SystemUuid,
}

impl MachineIdentity {
    /// False when this machine is known not to be `node`'s: another id than
    /// the Node records, or, without ids to compare, created after the
    /// Node was (a machine exists before its kubelet registers). Nothing
    /// known proves nothing either way.
    ///
    /// A machine whose UUID was asked for must show one, and the Node's:
    /// an answer about an unknown System proves nothing about the Node's
    /// machine, so it is not taken for it.
    pub fn may_be_machine_of(&self, node: &MachineIdentity) -> bool {
        let system = match self.system_uuid {
            SystemUuid::Unread => true,
            SystemUuid::Missing | SystemUuid::Doubtful(_) | SystemUuid::Known(_) => {
                self.system_uuid.same_machine(node.system_uuid)
            }
        };
        system && self.same_cloud_machine(node)
    }

    fn same_cloud_machine(&self, node: &MachineIdentity) -> bool {
        match (self.uid, node.uid) {
            (Some(machine), Some(recorded)) => machine == recorded,
            _ => match (self.created_at, node.created_at) {
                (Some(machine), Some(registered)) => machine <= registered,
                _ => true,
            },
        }
    }

    /// False when `again` is known to describe another machine than this
    /// one (a later look at the same name).
    pub fn may_be_same_as(&self, again: &MachineIdentity) -> bool {
        let system = match (self.system_uuid, again.system_uuid) {
            (SystemUuid::Unread, SystemUuid::Unread) => true,
            (first, later) => first.same_machine(later),
        };
        let uid = match (self.uid, again.uid) {
            (Some(first), Some(later)) => first == later,
            _ => true,
        };
        system && uid
    }
}

/// What active fencing needs to know of a Node beyond the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PowerFacts {
    /// When the `Ready` condition last turned away from `True` (Unix
    /// seconds), while it is not `True`.
    pub(crate) not_ready_since: Option<i64>,
    /// `status.nodeInfo.bootID`: the kubelet reports a new one after every boot.
    pub(crate) boot_id: Option<String>,
    /// The `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
    /// node-fencer's record of powering the machine off, if it did.
    pub powered_off: Option<PowerMark>,
    /// The Node carries the control-plane role label
    /// (`node-role.kubernetes.io/control-plane`, or the older `master`):
    /// it may host an etcd member, never powered off unless configured.
    pub control_plane: bool,
}

impl PowerFacts {
    /// True when the kubelet reports another boot than `recorded`: the
    /// machine booted and its kubelet reported since. An unknown boot id,
    /// then or now, proves nothing.
    pub(crate) fn booted_since(&self, recorded: Option<&str>) -> bool {
        matches!((recorded, self.boot_id.as_deref()), (Some(then), Some(now)) if then != now)
    }
}

/// node-fencer's record on a Node whose machine it powered off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerMark {
    /// When (RFC 3339).
    pub at: String,
    /// The boot id the Node reported then; a different one now proves the
    /// machine booted and its kubelet reported since.
    pub(crate) boot_id: Option<String>,
}

/// EC2's status checks of a running instance, as it reports them (`ok`,
/// `impaired`, `insufficient-data`, `initializing`, `not-applicable`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StatusChecks {
    /// The instance check (the guest: kernel, network configuration).
    pub instance: String,
    /// The system check (the host and its network).
    pub system: String,
}

impl std::fmt::Display for StatusChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "instance {}, system {}", self.instance, self.system)
    }
}

/// A CSI volume as the attach/detach controller names it in a Node's
/// status: `kubernetes.io/csi/<driver>^<volume handle>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CsiVolume {
    /// The CSI driver.
    pub driver: String,
    /// The driver's volume handle (for EBS, the volume id).
    pub handle: String,
}

impl NodeFacts {
    /// When node-fencer powered the Node's machine off, if it did and the
    /// Node has not booted and reported since: the kubelet reports a new
    /// boot id after every boot, so an unchanged (or unknown) one proves no
    /// recovery.
    pub(crate) fn powered_off_before(&self) -> Option<&str> {
        let mark = self.power.powered_off.as_ref()?;
        (!self.power.booted_since(mark.boot_id.as_deref())).then_some(mark.at.as_str())
    }

    /// The time (Unix seconds) of node-fencer's power-off mark when
    /// `machine`, the cloud's answer, shows the Node's own machine running
    /// and last started before the mark: it has not been off since, so the
    /// power-off never took effect. `None` otherwise, and wherever the cloud
    /// records no start (a BMC).
    pub(crate) fn running_since_before_power_off(
        &self,
        machine: Option<&Confirmation>,
    ) -> Option<i64> {
        let at = self
            .powered_off_before()
            .and_then(crate::core::model::values::unix_seconds)?;
        let Some(Confirmation::Seen(m)) = machine else {
            return None;
        };
        let unbroken = self.instance.as_ref() == Some(&m.id)
            && m.state == InstanceState::Running
            && m.started_at.is_some_and(|started| started < at);
        unbroken.then_some(at)
    }

    /// True for a Node powered off by node-fencer and not fenced yet: it
    /// takes room under the cap before its taint does.
    pub(crate) fn power_off_in_flight(&self) -> bool {
        !self.is_out_of_service() && self.powered_off_before().is_some()
    }

    /// True when the node carries an out-of-service taint that evicts (any
    /// value), or node-fencer fenced it the legacy way: either counts
    /// against the cap.
    pub(crate) fn is_out_of_service(&self) -> bool {
        self.has_out_of_service_taint()
            || self
                .fenced
                .as_ref()
                .is_some_and(|m| m.mode == FenceMode::Legacy)
    }

    /// The values of the out-of-service taints that evict which the Node
    /// carries, and node-fencer's own when `adding` it.
    pub fn out_of_service_values(&self, adding: bool) -> Vec<String> {
        let mut values: Vec<String> = self
            .taints
            .iter()
            .filter(|t| t.key == OUT_OF_SERVICE_KEY && t.effect == OUT_OF_SERVICE_EFFECT)
            .map(|t| t.value.clone().unwrap_or_default())
            .collect();
        if adding || values.is_empty() {
            values.push(OUT_OF_SERVICE_VALUE.to_owned());
        }
        values.sort();
        values.dedup();
        values
    }

    /// True when the node carries an out-of-service taint that evicts.
    pub(crate) fn has_out_of_service_taint(&self) -> bool {
        self.taints
            .iter()
            .any(|t| t.key == OUT_OF_SERVICE_KEY && t.effect == OUT_OF_SERVICE_EFFECT)
    }
}

/// How a node is fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceMode {
    /// The out-of-service taint: Kubernetes deletes the pods and detaches
    /// the volumes itself (KEP-2268; on by default from 1.26, GA in 1.28).
    Taint,
    /// For clusters without it: force-delete the node's pods and its
    /// VolumeAttachments; the Node object stays.
    Legacy,
}

impl FenceMode {
    /// The name used in annotations, the report and the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::Taint => "taint",
            Self::Legacy => "legacy",
        }
    }
}

/// node-fencer's record on a Node it fenced (its annotations).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FenceMark {
    /// How it was fenced.
    pub mode: FenceMode,
    /// The instance EC2 confirmed off, when the annotation is readable.
    pub instance: Option<InstanceId>,
    /// The state EC2 reported for it then.
    pub state: Option<InstanceState>,
    /// The EBS volumes it planned to force-detach.
    pub volumes: Vec<VolumeId>,
    /// When (the annotation's text, RFC 3339): names this fencing, so a
    /// recovery never clears a newer one.
    pub at: String,
    /// The invocation that fenced it (a Lambda retry keeps the id).
    pub correlation_id: Option<String>,
    /// An operator confirmed the node healthy after this fencing (manual
    /// recovery): `node-fencer.io/recovery-confirmed` names this `at`.
    pub confirmed: bool,
    /// The fencing applied the `NoSchedule` taint too, and ends only with
    /// proof of a power cycle.
    pub no_schedule: bool,
    /// The boot id the Node reported when it was fenced.
    pub(crate) boot_id: Option<String>,
}

/// What EC2 says about one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceFacts {
    /// The id.
    pub id: InstanceId,
    /// The lifecycle state.
    pub state: InstanceState,
    /// The private DNS name, the usual node name on EKS. Never proof of
    /// identity: other VPCs reuse the same names.
    pub private_dns_name: Option<String>,
    /// The VPC it runs in.
    pub vpc_id: Option<String>,
    /// Its private addresses (every network interface).
    pub private_ips: Vec<IpAddr>,
    /// Its tags, key and value.
    pub tags: Vec<(String, String)>,
    /// The root device name (e.g. `/dev/xvda`), never detached.
    pub root_device_name: Option<String>,
    /// The volume the machine boots from, never detached nor listed among
    /// the fencing's volumes: where the cloud's description of a disk does
    /// not name the device it is attached as (Compute Engine's), the device
    /// alone cannot tell it.
    pub root_volume: Option<VolumeId>,
    /// Its numeric id and creation time, where the name alone is not
    /// enough (Compute Engine).
    pub identity: MachineIdentity,
    /// When the cloud recorded its last stop (Unix seconds), where it
    /// records one: EC2's `StateTransitionReason`, Compute Engine's
    /// `lastStopTimestamp`; what the rules make of it is theirs to say.
    pub stopped_at: Option<i64>,
    /// When the machine last started (Unix seconds), where the cloud
    /// records it: EC2's `LaunchTime` (the last start, not the first
    /// launch), Compute Engine's `lastStartTimestamp`. A BMC records none.
    pub started_at: Option<i64>,
}

impl InstanceFacts {
    /// A later look at this machine's name, as an answer about this
    /// machine: another machine under the same name is not this one, which
    /// is then not found.
    pub fn same_machine(&self, again: &Confirmation) -> Confirmation {
        match again {
            Confirmation::Seen(later) if !self.identity.may_be_same_as(&later.identity) => {
                Confirmation::NotFound
            }
            other => other.clone(),
        }
    }
}

#[cfg(test)]
impl NodeFacts {
    /// A Node named `name` with nothing but its readiness known.
    pub fn bare(name: &str, readiness: Readiness) -> Self {
        Self {
            seen_off: None,
            version: None,
            name: name.into(),
            uid: None,
            instance: None,
            readiness,
            internal_ips: vec![],
            host_names: vec![],
            taints: vec![],
            ready_since: None,
            fenced: None,
            attached: None,
            machine: Default::default(),
            power: PowerFacts::default(),
            labels: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
impl TaintFacts {
    /// The out-of-service taint as node-fencer applies it.
    pub fn out_of_service() -> Self {
        Self {
            key: OUT_OF_SERVICE_KEY.into(),
            value: Some(OUT_OF_SERVICE_VALUE.into()),
            effect: OUT_OF_SERVICE_EFFECT.into(),
        }
    }
}

#[cfg(test)]
impl InstanceFacts {
    /// An instance in `state` with root device `/dev/xvda` and nothing else
    /// known: what most tests need.
    pub fn bare(id: InstanceId, state: InstanceState) -> Self {
        Self {
            id,
            state,
            private_dns_name: None,
            vpc_id: None,
            private_ips: vec![],
            tags: vec![],
            root_device_name: Some("/dev/xvda".into()),
            root_volume: None,
            identity: Default::default(),
            stopped_at: None,
            started_at: None,
        }
    }
}

/// The out-of-band answer for one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
#[expect(
    clippy::large_enum_variant,
    reason = "a handful of answers per invocation, most of them `Seen`: a box each would buy nothing"
)]
pub enum Confirmation {
    /// EC2 described the instance.
    Seen(InstanceFacts),
    /// EC2 does not know the instance (in this account and region).
    NotFound,
    /// The lookup failed (throttled, denied, unreachable): nothing is known.
    LookupFailed {
        /// The error, for the report.
        error: String,
    },
}

impl Confirmation {
    /// True only when EC2 said, in this lookup, that the instance is off.
    pub fn confirms_off(&self) -> bool {
        matches!(self, Self::Seen(facts) if facts.state.is_off())
    }
}

/// A VolumeAttachment, as the volume mapping needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachmentFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`: a delete names this very object, never a successor
    /// created under the same name.
    pub uid: String,
    /// `spec.attacher`.
    pub attacher: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `spec.source.persistentVolumeName`.
    pub(crate) pv_name: Option<String>,
    /// The EBS volume of an inline (migrated in-tree) volume spec.
    pub(crate) inline_volume: Option<VolumeId>,
}

/// A PersistentVolume, as the volume mapping needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvFacts {
    /// `metadata.name`.
    pub name: String,
    /// The EBS volume behind it (CSI `ebs.csi.aws.com` or in-tree), if any.
    pub volume: Option<VolumeId>,
    /// The claim bound to it (`spec.claimRef`): namespace and name.
    pub claim: Option<(String, String)>,
    /// Its CSI volume (`spec.csi`), whatever the driver: how the Node's
    /// `status.volumesInUse` names it.
    pub csi: Option<CsiVolume>,
    /// Several nodes may attach it at once: its access modes name
    /// ReadWriteMany or ReadOnlyMany, or none at all (the attach/detach
    /// controller's own test before it attaches a volume to a second node).
    pub shared: bool,
}

/// A pod bound to a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its `metadata.uid`: the force-delete names this very pod, never the
    /// replacement its controller creates under the same name.
    pub uid: String,
    /// It tolerates, for good (no `tolerationSeconds`), every out-of-service
    /// taint the Node carries (node-fencer's, and another writer's with
    /// another value), and is not being deleted: no taint evicts it, so it
    /// stays bound to the Node, its VolumeAttachments with it.
    pub stays: bool,
    /// Once the taints are on, Kubernetes deletes it at once: it does not
    /// tolerate one of them at all (a taint evicts it, then the pod garbage
    /// collector force-deletes it), or it is being deleted already (the
    /// garbage collector force-deletes it). A pod tolerating them for a
    /// while is neither: it goes when its time is up.
    pub(crate) leaves_now: bool,
    /// The PersistentVolumeClaims it mounts (generic ephemeral volumes
    /// included, by the name Kubernetes gives their claims).
    pub claims: Vec<String>,
    /// The disks its spec names inline, without a PersistentVolume (in-tree
    /// `awsElasticBlockStore.volumeID`, `gcePersistentDisk.pdName`), by the
    /// name a pod spec gives them ([`VolumeId::disk_name`]).
    pub(crate) inline: Vec<String>,
    /// It has run to its end (`Succeeded` or `Failed`): the attach/detach
    /// controller no longer wants its volumes attached.
    pub(crate) finished: bool,
}

impl PodRef {
    /// `namespace/name`, as people name pods.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One attachment of an EBS volume, as EC2 reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VolumeAttachmentState {
    /// The instance.
    pub instance: InstanceId,
    /// The device name on the instance.
    pub device: Option<String>,
    /// Attaching, attached, detaching, detached, busy.
    pub state: AttachmentState,
}

/// What EC2 says about one EBS volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VolumeFacts {
    /// The id.
    pub id: VolumeId,
    /// Available, in use, ...
    pub state: VolumeState,
    /// Its attachments.
    pub attachments: Vec<VolumeAttachmentState>,
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    fn id(uid: Option<u64>, created_at: Option<i64>) -> MachineIdentity {
        MachineIdentity {
            uid,
            created_at,
            ..MachineIdentity::default()
        }
    }

    fn system(uuid: Option<&str>) -> MachineIdentity {
        MachineIdentity {
            system_uuid: SystemUuid::parse(uuid),
            ..MachineIdentity::default()
        }
    }

    /// A BMC's answer is about the Node's machine only when the System's
    /// UUID is the one its kubelet read: another UUID, none, or a Node
    /// without one proves nothing, and the answer is not taken for it.
    #[test]
    fn a_system_is_the_nodes_machine_only_by_its_uuid() {
        const UUID: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
        let node = system(Some(UUID));
        assert!(system(Some(UUID)).may_be_machine_of(&node));
        assert!(system(Some("596b9427-449e-a74f-8e91-f3527a1ef094")).may_be_machine_of(&node));
        assert!(!system(Some("27946b59-9e44-4fa7-8e91-f3527a1ef095")).may_be_machine_of(&node));
        assert!(!system(None).may_be_machine_of(&node));
        assert!(!system(Some(UUID)).may_be_machine_of(&system(None)));
        // The clouds' machines are not asked for one: the Node's UUID,
        // whatever it is, holds nothing back.
        assert!(MachineIdentity::default().may_be_machine_of(&node));
        assert!(MachineIdentity::default().may_be_machine_of(&system(None)));
        // A later look at another System under the same name is not the same.
        assert!(system(Some(UUID)).may_be_same_as(&system(Some(UUID))));
        assert!(!system(Some(UUID)).may_be_same_as(&system(None)));
        assert!(
            !system(Some(UUID))
                .may_be_same_as(&system(Some("27946b59-9e44-4fa7-8e91-f3527a1ef095")))
        );
    }

    #[test]
    fn a_vm_of_another_id_or_created_after_its_node_is_not_the_nodes() {
        let node = id(Some(7), Some(1_000));
        assert!(id(Some(7), Some(900)).may_be_machine_of(&node));
        assert!(
            !id(Some(8), Some(900)).may_be_machine_of(&node),
            "another id"
        );
        // The id decides when both are known, whatever the times say.
        assert!(id(Some(7), Some(2_000)).may_be_machine_of(&node));
        // Without the Node's id: the creation times.
        let unannotated = id(None, Some(1_000));
        assert!(id(Some(8), Some(1_000)).may_be_machine_of(&unannotated));
        assert!(
            !id(Some(8), Some(1_001)).may_be_machine_of(&unannotated),
            "created after"
        );
        // Nothing known (EC2): nothing proves another machine.
        assert!(MachineIdentity::default().may_be_machine_of(&node));
        assert!(id(Some(8), None).may_be_machine_of(&MachineIdentity::default()));
    }

    #[test]
    fn a_later_look_at_another_vm_of_the_name_finds_the_machine_gone() {
        let vm = InstanceId::parse("gce://proj-fencer/us-central1-a/node-1").expect("a VM");
        let seen = |uid| {
            let mut facts = InstanceFacts::bare(vm.clone(), InstanceState::Stopped);
            facts.identity.uid = uid;
            facts
        };
        let first = seen(Some(7));
        assert_eq!(
            first.same_machine(&Confirmation::Seen(seen(Some(8)))),
            Confirmation::NotFound
        );
        assert_eq!(
            first.same_machine(&Confirmation::Seen(seen(Some(7)))),
            Confirmation::Seen(seen(Some(7)))
        );
        let failed = Confirmation::LookupFailed { error: "x".into() };
        assert_eq!(first.same_machine(&failed), failed);
    }
}
