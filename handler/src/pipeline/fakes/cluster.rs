//! The fake Kubernetes: Nodes written through the real patch decisions,
//! attachments, pods, Events, the Lease, the census and the kill switch.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    AttachedVolume, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::Value;

use crate::core::model::facts::{
    AttachmentFacts, CsiVolume, NodeFacts, OUT_OF_SERVICE_KEY, PvFacts, SeenOff,
};
use crate::core::model::instance::{EBS_CSI_DRIVER, InstanceId, Provider, VolumeId};
use crate::core::model::kube_read;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::kube_patch::{
    self, ConfirmOutcome, ConfirmPatch, Ending, PowerStamp, Stamp, TaintOutcome, TaintPatch,
    UntaintOutcome, UntaintPatch,
};
use crate::core::rules::control::KillSwitch;
use crate::core::rules::in_use::{self, ReleaseOutcome, ReleasePatch};
use crate::core::rules::mode::ServerVersion;
use crate::core::rules::silence::{KubeletLease, LeaseRead};
use crate::core::rules::view::Census;
use crate::shell::cluster::{
    ClusterError, ClusterReads, Coordination, FencingWrites, JudgedNode, LeaseTaken, MarkOutcome,
    PodRef, mark_patch_now,
};

use super::Recorder;

fn injected() -> kube::Error {
    kube::Error::Service("injected fault".into())
}

/// An in-memory Kubernetes: Nodes, attachments, pods, Events, the Lease.
pub struct FakeCluster {
    calls: Recorder,
    state: Mutex<ClusterState>,
}

struct ClusterState {
    nodes: BTreeMap<String, Node>,
    attachments: Vec<AttachmentFacts>,
    pvs: Vec<PvFacts>,
    pods: BTreeMap<String, Vec<PodRef>>,
    /// By object name, in the order written: a name written again is kept once.
    events: Vec<(String, String, NodeEvent)>,
    kill_switch: KillSwitch,
    lease: Option<String>,
    version: ServerVersion,
    writes: u64,
    /// A Node that turns Ready right before the next taint write reads it.
    ready_before_taint: Option<String>,
    gone_before_taint: Option<String>,
    /// The kill switch from its n-th read on (1-based).
    switch_at: Option<(usize, KillSwitch)>,
    /// The next Lease taken is taken after waiting for another holder.
    lease_held: bool,
    /// The Lease's holder is an invocation still at work (one run beside
    /// another on this world): it is waited for.
    lease_live: bool,
    /// From the n-th renewal on (1-based), another invocation holds the Lease.
    lease_taken_at: Option<usize>,
    /// The next Lease is taken only after waiting this long for another holder.
    lease_held_for: Option<Duration>,
    renewals: usize,
    switch_reads: usize,
    /// Node lists so far.
    lists: usize,
    /// From the n-th node list on (1-based), this Node reads this `Ready` status.
    turns_at: Option<(String, usize, &'static str)>,
    /// The census Lease's count.
    census: Option<Census>,
    /// The kubelets' Leases in `kube-node-lease`, by Node.
    kubelet_leases: BTreeMap<String, LeaseRead>,
    /// From the n-th read of a Node's kubelet Lease on (1-based), it reads
    /// renewed at this time: a kubelet heard between two reads.
    renews_at_read: Option<(String, usize, i64)>,
    /// Right after the n-th read of a Node's kubelet Lease (1-based), its
    /// kubelet writes the Node's status and renews its Lease at this time.
    writes_after_read: Option<(String, usize, i64)>,
    kubelet_lease_reads: usize,
    /// The next status write of this Node meets a conflicting writer.
    status_conflict: Option<String>,
    /// Nodes an operator's inventory places on a BMC's machine (they have
    /// no provider id of a cloud).
    placed: BTreeMap<String, InstanceId>,
    /// Once the next Lease is taken, this Node is placed on this machine
    /// (an inventory edited, a label moved, mid-invocation).
    placed_on_lease: Option<(String, InstanceId)>,
    /// The power-off mark's write takes this long.
    mark_pause: Option<Duration>,
    /// From the n-th read of the Nodes on (1-based), each read is answered
    /// only after this long: an apiserver that hangs.
    reads_hang_from: Option<(usize, Duration)>,
    /// Right before the next `nodes/status` mark, this Node is deleted and
    /// registered again under its name (a new uid).
    reregistered_before_mark: Option<String>,
    /// Likewise before the next taint write.
    reregistered_before_taint: Option<String>,
    /// Likewise while its pods are listed for the n-th time (1-based).
    reregistered_listing_pods: Option<(String, usize)>,
    /// While its pods are listed the n-th time, this Node's kubelet reports
    /// it Ready again.
    ready_listing_pods: Option<(String, usize)>,
    /// Re-registered right before the next release of `volumesInUse`.
    reregistered_before_release: Option<String>,
}

impl ClusterState {
    /// A Node read into facts, placed as the inventory places it.
    fn facts_of(&self, node: &Node) -> Option<NodeFacts> {
        let mut facts = kube_read::node_facts(node)?;
        if let Some(machine) = self.placed.get(&facts.name) {
            facts.instance = Some(machine.clone());
        }
        Some(facts)
    }
}

impl FakeCluster {
    /// An empty cluster at Kubernetes 1.36 logging to `calls`.
    pub fn new(calls: Recorder) -> Self {
        Self {
            calls,
            state: Mutex::new(ClusterState {
                nodes: BTreeMap::new(),
                attachments: Vec::new(),
                pvs: Vec::new(),
                pods: BTreeMap::new(),
                events: Vec::new(),
                kill_switch: KillSwitch::Off,
                lease: None,
                version: ServerVersion {
                    major: 1,
                    minor: 36,
                },
                writes: 0,
                ready_before_taint: None,
                gone_before_taint: None,
                switch_at: None,
                switch_reads: 0,
                lease_held: false,
                lease_live: false,
                lease_taken_at: None,
                lease_held_for: None,
                renewals: 0,
                lists: 0,
                turns_at: None,
                census: None,
                kubelet_leases: BTreeMap::new(),
                renews_at_read: None,
                writes_after_read: None,
                kubelet_lease_reads: 0,
                status_conflict: None,
                placed: BTreeMap::new(),
                placed_on_lease: None,
                mark_pause: None,
                reads_hang_from: None,
                reregistered_before_mark: None,
                reregistered_before_taint: None,
                reregistered_listing_pods: None,
                ready_listing_pods: None,
                reregistered_before_release: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a Node for `instance` with the given `Ready` status
    /// (`True`, `False`, `Unknown`).
    pub fn node(&self, name: &str, instance: &InstanceId, ready: &str) {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(match instance.provider() {
                    Provider::Aws => format!("aws:///us-east-1a/{instance}"),
                    Provider::Gce | Provider::Redfish => instance.to_string(),
                }),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        };
        self.lock().nodes.insert(name.into(), node);
    }

    /// Sets a Node's `Ready` status.
    pub fn set_ready(&self, name: &str, ready: &str) {
        let mut state = self.lock();
        if let Some(c) = state
            .nodes
            .get_mut(name)
            .and_then(|n| n.status.as_mut())
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
        {
            c.status = ready.into();
            c.last_transition_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
    }

    /// From the `nth` read of the Nodes on (a list or a read by name,
    /// 1-based), `name` reads NotReady, as the node controller marks it once
    /// the grace period is over.
    pub fn not_ready_from_list(&self, name: &str, nth: usize) {
        self.lock().turns_at = Some((name.into(), nth, "Unknown"));
    }

    /// From the `nth` read of the Nodes on, `name` reads Ready: its kubelet
    /// reports again.
    pub fn ready_from_list(&self, name: &str, nth: usize) {
        self.lock().turns_at = Some((name.into(), nth, "True"));
    }

    /// Labels the Node.
    pub fn label(&self, name: &str, key: &str, value: &str) {
        if let Some(node) = self.lock().nodes.get_mut(name) {
            node.metadata
                .labels
                .get_or_insert_default()
                .insert(key.into(), value.into());
        }
    }

    /// Sets annotation `key` on Node `name`, as a writer before this run did.
    pub fn annotate(&self, name: &str, key: &str, value: &str) {
        if let Some(node) = self.lock().nodes.get_mut(name) {
            node.metadata
                .annotations
                .get_or_insert_default()
                .insert(key.into(), value.into());
        }
    }

    /// Places `name` on the BMC machine `machine`, as the inventory does.
    pub fn place(&self, name: &str, machine: &InstanceId) {
        self.lock().placed.insert(name.into(), machine.clone());
    }

    /// Once the next Lease is taken, `name` is placed on `machine`.
    pub fn place_on_lease(&self, name: &str, machine: &InstanceId) {
        self.lock().placed_on_lease = Some((name.into(), machine.clone()));
    }

    /// Right before the next `nodes/status` mark, `name` is deleted and
    /// registered again under its name: another Node object.
    pub fn reregistered_before_mark(&self, name: &str) {
        self.lock().reregistered_before_mark = Some(name.into());
    }

    /// Right before the next taint write, `name` is deleted and registered
    /// again under its name: another Node object.
    pub fn reregistered_before_taint(&self, name: &str) {
        self.lock().reregistered_before_taint = Some(name.into());
    }

    /// Right before the next release of its `volumesInUse` (legacy mode),
    /// `name` is deleted and registered again under its name.
    pub fn reregistered_before_release(&self, name: &str) {
        self.lock().reregistered_before_release = Some(name.into());
    }

    /// While its pods are listed for the `nth` time (1-based), `name` is
    /// deleted and registered again under its name: another Node object.
    pub fn reregistered_listing_pods(&self, name: &str, nth: usize) {
        self.lock().reregistered_listing_pods = Some((name.into(), nth));
    }

    /// While its pods are listed for the `nth` time (1-based), `name`'s
    /// kubelet reports it Ready again: a kubelet back, or another machine's
    /// adopting the Node.
    pub fn ready_listing_pods(&self, name: &str, nth: usize) {
        self.lock().ready_listing_pods = Some((name.into(), nth));
    }

    /// From the `nth` read of the Nodes on (a list or a read by name,
    /// 1-based), each is answered only after `pause`: the apiserver hangs.
    pub fn reads_hang_from(&self, nth: usize, pause: Duration) {
        self.lock().reads_hang_from = Some((nth, pause));
    }

    /// The power-off mark's write takes `pause`.
    pub fn mark_takes(&self, pause: Duration) {
        self.lock().mark_pause = Some(pause);
    }

    /// Sets the machine UUID the Node's kubelet reports.
    pub fn system_uuid(&self, name: &str, uuid: &str) {
        if let Some(node) = self.lock().nodes.get_mut(name) {
            let status = node.status.get_or_insert_default();
            status.node_info.get_or_insert_default().system_uuid = uuid.into();
        }
    }

    /// Sets the `InternalIP` the Node's kubelet reports.
    pub fn internal_ip(&self, name: &str, ip: &str) {
        if let Some(node) = self.lock().nodes.get_mut(name) {
            let status = node.status.get_or_insert_default();
            status.addresses = Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]);
        }
    }

    /// Sets the boot id the Node's kubelet reports.
    pub fn boot(&self, name: &str, boot_id: &str) {
        if let Some(node) = self.lock().nodes.get_mut(name) {
            let status = node.status.get_or_insert_default();
            status
                .node_info
                .get_or_insert_with(NodeSystemInfo::default)
                .boot_id = boot_id.into();
        }
    }

    /// `name` turns Ready between the decision and the taint write.
    pub fn ready_before_taint(&self, name: &str) {
        self.lock().ready_before_taint = Some(name.into());
    }

    /// `name` is deleted between the decision and the taint write, as
    /// Karpenter or EKS node auto repair may delete a Node.
    pub fn gone_before_taint(&self, name: &str) {
        self.lock().gone_before_taint = Some(name.into());
    }

    /// Removes the VolumeAttachment of `volume`, as the attach/detach
    /// controller does once the volume is detached.
    pub fn remove_attachment(&self, volume: &VolumeId) {
        let pv = format!("pv-{volume}");
        self.lock()
            .attachments
            .retain(|a| a.pv_name.as_deref() != Some(pv.as_str()));
    }

    /// Adds the CSI VolumeAttachment of `volume` to `node` under the name
    /// Kubernetes gives it, and records the volume on the Node, as the
    /// attach/detach controller does.
    pub fn recorded_attachment(&self, node: &str, volume: &VolumeId) {
        use crate::core::rules::volumes::attachment_name;
        self.attachment(node, volume);
        let csi = CsiVolume {
            driver: driver_of(volume).into(),
            handle: volume.to_string(),
        };
        let mut state = self.lock();
        let listed = format!("csi-{volume}");
        if let Some(va) = state.attachments.iter_mut().find(|a| a.name == listed) {
            va.name = attachment_name(&csi, node);
        }
        if let Some(n) = state.nodes.get_mut(node) {
            n.metadata.annotations.get_or_insert_default().insert(
                kube_read::ANNOTATION_CONTROLLER_MANAGED.into(),
                "true".into(),
            );
            n.status
                .get_or_insert_default()
                .volumes_attached
                .get_or_insert_default()
                .push(AttachedVolume {
                    name: kube_read::csi_unique_name(&csi),
                    device_path: String::new(),
                });
        }
    }

    /// Adds a CSI VolumeAttachment of `volume` (through a PV) to `node`.
    pub fn attachment(&self, node: &str, volume: &VolumeId) {
        let mut state = self.lock();
        let pv = format!("pv-{volume}");
        state.attachments.push(AttachmentFacts {
            name: format!("csi-{volume}"),
            uid: format!("uid-csi-{volume}"),
            attacher: driver_of(volume).into(),
            node_name: node.into(),
            pv_name: Some(pv.clone()),
            inline_volume: None,
        });
        state.pvs.push(PvFacts {
            name: pv,
            volume: Some(volume.clone()),
            claim: Some(("default".into(), format!("claim-{volume}"))),
            csi: Some(CsiVolume {
                driver: driver_of(volume).into(),
                handle: volume.to_string(),
            }),
            shared: false,
        });
    }

    /// Adds a VolumeAttachment of another CSI driver to `node`, through a
    /// PV `pv` with no EBS volume behind it, bound to the claim `claim-<pv>`.
    pub fn driver_attachment(&self, node: &str, driver: &str, pv: &str) {
        let mut state = self.lock();
        state.attachments.push(AttachmentFacts {
            name: format!("va-{pv}"),
            uid: format!("uid-va-{pv}"),
            attacher: driver.into(),
            node_name: node.into(),
            pv_name: Some(pv.into()),
            inline_volume: None,
        });
        state.pvs.push(PvFacts {
            name: pv.into(),
            volume: None,
            claim: Some(("default".into(), format!("claim-{pv}"))),
            csi: Some(CsiVolume {
                driver: driver.into(),
                handle: format!("handle-{pv}"),
            }),
            shared: false,
        });
    }

    /// Adds a VolumeAttachment of `volume` named inline, without a PV (an
    /// in-tree inline volume migrated to CSI), and a pod that stays on
    /// `node` naming it.
    pub fn inline_attachment_of_staying_pod(&self, node: &str, volume: &VolumeId, pod: &str) {
        self.pod_with_claim(node, pod, true, None);
        let mut state = self.lock();
        state.attachments.push(AttachmentFacts {
            name: format!("csi-inline-{volume}"),
            uid: format!("uid-csi-inline-{volume}"),
            attacher: EBS_CSI_DRIVER.into(),
            node_name: node.into(),
            pv_name: None,
            inline_volume: Some(volume.clone()),
        });
        if let Some(p) = state.pods.get_mut(node).and_then(|pods| pods.last_mut()) {
            p.inline.push(volume.as_str().into());
        }
    }

    /// Binds a pod to `node`.
    pub fn pod(&self, node: &str, name: &str) {
        self.staying_pod(node, name, false, None);
    }

    /// Binds a pod to `node` that mounts the claim of `volume` (see
    /// [`Self::attachment`]) and, when `stays`, tolerates the out-of-service
    /// taint for good.
    pub fn staying_pod(&self, node: &str, name: &str, stays: bool, volume: Option<&VolumeId>) {
        let claim = volume.map(|v| format!("claim-{v}"));
        self.pod_with_claim(node, name, stays, claim.as_deref());
    }

    /// Binds a pod to `node` that tolerates the out-of-service taint for a
    /// while (`tolerationSeconds`): neither staying nor evicted at once.
    pub fn patient_pod(&self, node: &str, name: &str) {
        self.pod_with_claim(node, name, false, None);
        if let Some(p) = self
            .lock()
            .pods
            .get_mut(node)
            .and_then(|pods| pods.last_mut())
        {
            p.leaves_now = false;
        }
    }

    /// Binds a pod to `node` that mounts `claim` and, when `stays`,
    /// tolerates the out-of-service taint for good.
    pub fn pod_with_claim(&self, node: &str, name: &str, stays: bool, claim: Option<&str>) {
        self.lock()
            .pods
            .entry(node.into())
            .or_default()
            .push(PodRef {
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                stays,
                leaves_now: !stays,
                claims: claim.map(str::to_owned).into_iter().collect(),
                inline: vec![],
                finished: false,
            });
    }

    /// From its `nth` read from now on (1-based), the kill switch reads `k`.
    pub fn kill_switch_from_read(&self, nth: usize, k: KillSwitch) {
        let mut state = self.lock();
        state.switch_at = Some((state.switch_reads + nth, k));
    }

    /// From the `nth` renewal on (1-based), another invocation holds the
    /// Lease (it expired for it meanwhile, as far as the fake cares).
    pub fn lease_taken_at_renewal(&self, nth: usize) {
        self.lock().lease_taken_at = Some(nth);
    }

    /// The next Lease is taken only after waiting `pause` for another holder.
    pub fn lease_held_for(&self, pause: Duration) {
        self.lock().lease_held_for = Some(pause);
    }

    /// The next Lease is taken only after waiting for another holder.
    pub fn lease_held_once(&self) {
        self.lock().lease_held = true;
    }

    /// Sets the kill switch.
    pub fn set_version(&self, major: u32, minor: u32) {
        self.lock().version = ServerVersion { major, minor };
    }

    pub fn set_kill_switch(&self, k: KillSwitch) {
        self.lock().kill_switch = k;
    }

    /// The Node's taints.
    pub fn taints(&self, name: &str) -> Vec<Taint> {
        self.lock()
            .nodes
            .get(name)
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
    }

    /// The Node as the pipeline reads it.
    pub fn facts(&self, name: &str) -> Option<NodeFacts> {
        let state = self.lock();
        state.nodes.get(name).and_then(|n| state.facts_of(n))
    }

    /// The reasons of the Events recorded on `node`, in order.
    pub fn events(&self, node: &str) -> Vec<&'static str> {
        self.lock()
            .events
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|(_, _, e)| e.reason.as_str())
            .collect()
    }

    /// The notes of the Events recorded on `node`, in order.
    pub fn event_notes(&self, node: &str) -> Vec<String> {
        self.lock()
            .events
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|(_, _, e)| e.note.clone())
            .collect()
    }

    /// The VolumeAttachments left.
    pub fn attachments(&self) -> Vec<String> {
        self.lock()
            .attachments
            .iter()
            .map(|a| a.name.clone())
            .collect()
    }

    /// The pods left on `node`.
    pub fn pods(&self, node: &str) -> usize {
        self.lock().pods.get(node).map_or(0, Vec::len)
    }

    /// Sets what the Node's kubelet Lease holds, written when the kubelet
    /// says (its clock true), on the default cadence; each read is timed
    /// by the wall clock, as the apiserver's `Date`.
    pub fn kubelet_lease(&self, node: &str, lease: KubeletLease) {
        let written_at = match lease {
            KubeletLease::RenewedAt(at) => Some(at),
            _ => None,
        };
        self.kubelet_lease_read(
            node,
            LeaseRead {
                lease,
                version: Some("1".into()),
                written_at,
                server_now: None,
                renew_every_secs: 10,
            },
        );
    }

    /// Sets the Node's kubelet Lease as read, in full (`server_now` None:
    /// the wall clock at each read).
    pub fn kubelet_lease_read(&self, node: &str, read: LeaseRead) {
        self.lock().kubelet_leases.insert(node.into(), read);
    }

    /// From the `nth` read of `node`'s kubelet Lease on, it reads renewed
    /// at `at`, a new version: the kubelet is heard between two reads.
    pub fn kubelet_renews_at_read(&self, node: &str, nth: usize, at: i64) {
        self.lock().renews_at_read = Some((node.into(), nth, at));
    }

    /// Right after the `nth` read of `node`'s kubelet Lease, its kubelet
    /// writes the Node's status (a new resourceVersion) and renews its
    /// Lease at `at`: a kubelet starting between the proof and the mark.
    pub fn kubelet_writes_after_read(&self, node: &str, nth: usize, at: i64) {
        self.lock().writes_after_read = Some((node.into(), nth, at));
    }

    /// The next `nodes/status` write of `node` meets a conflicting writer.
    pub fn status_conflict_once(&self, node: &str) {
        self.lock().status_conflict = Some(node.into());
    }

    /// The Node's `Ready` condition: status, reason, message.
    pub fn ready_condition(&self, name: &str) -> Option<(String, Option<String>, Option<String>)> {
        self.lock()
            .nodes
            .get(name)
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    /// The Node's `status.volumesInUse`, as its kubelet last wrote it.
    pub fn volumes_in_use(&self, name: &str) -> Vec<String> {
        self.lock()
            .nodes
            .get(name)
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.volumes_in_use.clone())
            .unwrap_or_default()
    }

    /// Plays the kubelet: the Node reports `names` mounted.
    pub fn report_in_use(&self, name: &str, names: &[&str]) {
        if let Some(n) = self.lock().nodes.get_mut(name) {
            n.status.get_or_insert_default().volumes_in_use =
                Some(names.iter().map(|v| (*v).to_owned()).collect());
        }
    }

    /// Whoever holds the Lease.
    pub fn lease(&self) -> Option<String> {
        self.lock().lease.clone()
    }

    /// Applies a merge patch to a Node, as the apiserver would.
    /// Counts a read of the Nodes (a list, or a read by name) and turns the
    /// Node set by [`Self::not_ready_from_list`] (or [`Self::ready_from_list`])
    /// from its n-th on.
    async fn turn_on_read(&self) {
        let (turning, hang) = {
            let mut state = self.lock();
            state.lists += 1;
            let turning = state
                .turns_at
                .clone()
                .filter(|(_, nth, _)| state.lists >= *nth);
            let hang = state
                .reads_hang_from
                .filter(|(nth, _)| state.lists >= *nth)
                .map(|(_, pause)| pause);
            (turning, hang)
        };
        if let Some(pause) = hang {
            tokio::time::sleep(pause).await;
        }
        if let Some((node, _, ready)) = turning {
            self.set_ready(&node, ready);
        }
    }

    /// Puts the out-of-service taint on `name` as an operator would: no
    /// label, no annotation of node-fencer's.
    pub fn taint_by_hand(&self, name: &str) {
        let taint = serde_json::json!({"spec": {"taints": [{
            "key": OUT_OF_SERVICE_KEY, "value": "by-hand", "effect": "NoExecute"
        }]}});
        let _ = self.patch(name, &taint);
    }

    /// Leaves a census as a sweep would.
    pub fn census(&self, census: Census) {
        self.lock().census = Some(census);
    }

    /// The census Lease's count, as last written.
    pub fn census_written(&self) -> Option<Census> {
        self.lock().census.clone()
    }

    fn patch(&self, name: &str, patch: &Value) -> Result<(), ClusterError> {
        let mut state = self.lock();
        state.writes += 1;
        let rv = (state.writes + 1).to_string();
        let Some(node) = state.nodes.get_mut(name) else {
            return Ok(());
        };
        let mut value = serde_json::to_value(&*node)
            .map_err(|_| ClusterError::UnsafeWrite { node: name.into() })?;
        merge(&mut value, patch);
        value["metadata"]["resourceVersion"] = Value::String(rv);
        *node = serde_json::from_value(value)
            .map_err(|_| ClusterError::UnsafeWrite { node: name.into() })?;
        Ok(())
    }
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(object) = target {
        for (key, value) in fields {
            if value.is_null() {
                object.remove(key);
            } else {
                merge(object.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[async_trait]
impl ClusterReads for FakeCluster {
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        if self.calls.call("ListNodes".into()) {
            return Err(ClusterError::ListNodes(injected()));
        }
        self.turn_on_read().await;
        let state = self.lock();
        Ok(state
            .nodes
            .values()
            .filter_map(|n| state.facts_of(n))
            .collect())
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError> {
        if self.calls.call(format!("GetNode {name}")) {
            return Err(ClusterError::GetNode {
                node: name.into(),
                source: injected(),
            });
        }
        self.turn_on_read().await;
        let state = self.lock();
        Ok(state.nodes.get(name).and_then(|n| state.facts_of(n)))
    }

    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        if self.calls.call("ListFencedNodes".into()) {
            return Err(ClusterError::ListNodes(injected()));
        }
        let labelled = |n: &&Node| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(kube_read::LABEL_FENCED))
                .is_some_and(|v| v == "true")
        };
        Ok(self
            .lock()
            .nodes
            .values()
            .filter(labelled)
            .filter_map(kube_read::node_facts)
            .collect())
    }

    async fn count_nodes(&self) -> Result<usize, ClusterError> {
        if self.calls.call("CountNodes".into()) {
            return Err(ClusterError::ListNodes(injected()));
        }
        Ok(self.lock().nodes.len())
    }

    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        if self.calls.call("ListVolumeAttachments".into()) {
            return Err(ClusterError::ListVolumeAttachments(injected()));
        }
        Ok(self.lock().attachments.clone())
    }

    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        if self.calls.call("ListPersistentVolumes".into()) {
            return Err(ClusterError::ListPersistentVolumes(injected()));
        }
        Ok(self.lock().pvs.clone())
    }

    async fn get_volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<AttachmentFacts>, ClusterError> {
        if self.calls.call(format!("GetVolumeAttachment {name}")) {
            return Err(ClusterError::GetVolume {
                kind: "volumeattachment",
                name: name.into(),
                source: injected(),
            });
        }
        Ok(self
            .lock()
            .attachments
            .iter()
            .find(|va| va.name == name)
            .cloned())
    }

    async fn get_persistent_volume(&self, name: &str) -> Result<Option<PvFacts>, ClusterError> {
        if self.calls.call(format!("GetPersistentVolume {name}")) {
            return Err(ClusterError::GetVolume {
                kind: "persistentvolume",
                name: name.into(),
                source: injected(),
            });
        }
        Ok(self.lock().pvs.iter().find(|pv| pv.name == name).cloned())
    }

    async fn server_version(&self) -> Result<ServerVersion, ClusterError> {
        if self.calls.call("GetVersion".into()) {
            return Err(ClusterError::Version("injected fault".into()));
        }
        Ok(self.lock().version)
    }

    async fn node_lease(&self, node: &str, _uid: Option<&str>) -> Result<LeaseRead, ClusterError> {
        if self.calls.call(format!("GetNodeLease {node}")) {
            return Err(ClusterError::GetNodeLease {
                node: node.into(),
                source: injected(),
            });
        }
        let mut state = self.lock();
        state.kubelet_lease_reads += 1;
        let reads = state.kubelet_lease_reads;
        let renewal = state
            .renews_at_read
            .clone()
            .filter(|(n, nth, _)| n == node && reads >= *nth);
        if let Some((_, nth, at)) = renewal
            && let Some(read) = state.kubelet_leases.get_mut(node)
        {
            read.lease = KubeletLease::RenewedAt(at);
            read.written_at = read.written_at.map(|_| at);
            read.version = Some(format!("renewed-{nth}"));
        }
        let mut read = state
            .kubelet_leases
            .get(node)
            .cloned()
            .unwrap_or_else(LeaseRead::missing);
        read.server_now = read
            .server_now
            .or_else(|| Some(k8s_openapi::jiff::Timestamp::now().as_second()));
        if let Some((_, nth, at)) = state
            .writes_after_read
            .clone()
            .filter(|(n, nth, _)| n == node && reads == *nth)
        {
            state.renews_at_read = Some((node.into(), nth + 1, at));
            state.writes += 1;
            let rv = (state.writes + 1).to_string();
            if let Some(n) = state.nodes.get_mut(node) {
                n.metadata.resource_version = Some(rv);
            }
        }
        Ok(read)
    }

    async fn pods_on_node(
        &self,
        node: &str,
        _out_of_service: &[String],
    ) -> Result<Vec<PodRef>, ClusterError> {
        if self.calls.call(format!("ListPods {node}")) {
            return Err(ClusterError::Version("injected fault".into()));
        }
        let mut state = self.lock();
        if let Some((name, nth)) = state.reregistered_listing_pods.as_mut()
            && name == node
        {
            *nth -= 1;
            if *nth == 0 {
                state.reregistered_listing_pods = None;
                if let Some(n) = state.nodes.get_mut(node) {
                    n.metadata.uid = Some(format!("uid-{node}-again"));
                }
            }
        }
        let ready = match state.ready_listing_pods.as_mut() {
            Some((name, nth)) if name == node => {
                *nth -= 1;
                *nth == 0
            }
            _ => false,
        };
        let pods = state.pods.get(node).cloned().unwrap_or_default();
        drop(state);
        if ready {
            self.lock().ready_listing_pods = None;
            self.set_ready(node, "True");
        }
        Ok(pods)
    }
}

#[async_trait]
impl FencingWrites for FakeCluster {
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        if self.calls.call(format!("TaintNode {node}")) {
            return Err(ClusterError::PatchConflict { node: node.into() });
        }
        let turning = self.lock().ready_before_taint.take();
        if turning.as_deref() == Some(node) {
            self.set_ready(node, "True");
        }
        let deleting = self.lock().gone_before_taint.take();
        if deleting.as_deref() == Some(node) {
            self.lock().nodes.remove(node);
        }
        {
            let mut state = self.lock();
            if state.reregistered_before_taint.as_deref() == Some(node) {
                state.reregistered_before_taint = None;
                if let Some(n) = state.nodes.get_mut(node) {
                    n.metadata.uid = Some(format!("uid-{node}-again"));
                }
            }
        }
        let current = self.lock().nodes.get(node).cloned();
        let Some(current) = current else {
            return Ok(TaintOutcome::NodeGone);
        };
        let judged = JudgedNode {
            name: node,
            uid: stamp.node_uid.as_deref(),
            machine: &stamp.instance,
            version: None,
        };
        let now = self.lock().facts_of(&current);
        if !judged.is_same_object(now.as_ref()) {
            return Ok(TaintOutcome::AnotherNode);
        }
        match kube_patch::taint_patch(&current, stamp) {
            TaintPatch::AnotherNode => Ok(TaintOutcome::AnotherNode),
            TaintPatch::Apply(patch) => {
                self.patch(node, &patch)?;
                Ok(TaintOutcome::Applied)
            }
            TaintPatch::AlreadyPresent => Ok(TaintOutcome::AlreadyPresent),
            TaintPatch::AppliedByThisRun => Ok(TaintOutcome::Applied),
            TaintPatch::NodeReady => Ok(TaintOutcome::NodeReady),
            TaintPatch::NoResourceVersion | TaintPatch::Unrepresentable => {
                Err(ClusterError::UnsafeWrite { node: node.into() })
            }
        }
    }

    async fn mark_not_ready(
        &self,
        judged: &JudgedNode<'_>,
        message: &str,
    ) -> Result<MarkOutcome, ClusterError> {
        let node = judged.name;
        if self.calls.call(format!("MarkNotReady {node}")) {
            return Err(ClusterError::PatchNodeStatus {
                node: node.into(),
                source: injected(),
            });
        }
        {
            let mut state = self.lock();
            if state.reregistered_before_mark.as_deref() == Some(node) {
                state.reregistered_before_mark = None;
                if let Some(n) = state.nodes.get_mut(node) {
                    n.metadata.uid = Some(format!("uid-{node}-again"));
                }
            }
        }
        let current = self.lock().nodes.get(node).cloned();
        let Some(current) = current else {
            return Ok(MarkOutcome::NodeGone);
        };
        let now = self.lock().facts_of(&current);
        if !judged.is(now.as_ref()) {
            return Ok(MarkOutcome::AnotherNode);
        }
        if !judged.unchanged(now.as_ref()) {
            return Ok(MarkOutcome::Conflict);
        }
        let Some(patch) = mark_patch_now(node, &current, message)? else {
            return Ok(MarkOutcome::AlreadyNotReady);
        };
        let mut state = self.lock();
        if state.status_conflict.as_deref() == Some(node) {
            state.status_conflict = None;
            return Ok(MarkOutcome::Conflict);
        }
        state.writes += 1;
        let rv = (state.writes + 1).to_string();
        let Some(node) = state.nodes.get_mut(node) else {
            return Ok(MarkOutcome::NodeGone);
        };
        // The strategic merge the apiserver does: the Ready condition's
        // fields given replace its own, the rest of it stays.
        let given = &patch["status"]["conditions"][0];
        let text = |key: &str| given[key].as_str().map(str::to_owned);
        if let Some(c) = node
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
        {
            c.status = text("status").unwrap_or_default();
            c.reason = text("reason");
            c.message = text("message");
            c.last_transition_time = text("lastTransitionTime")
                .and_then(|t| t.parse().ok())
                .map(Time);
        }
        node.metadata.resource_version = Some(rv);
        Ok(MarkOutcome::Marked)
    }

    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError> {
        if self.calls.call(format!("CreateEvent {node}")) {
            return Err(ClusterError::CreateEvent {
                node: node.into(),
                source: injected(),
            });
        }
        let mut state = self.lock();
        if !state.events.iter().any(|(_, n, _)| n == name) {
            state.events.push((node.into(), name.into(), event.clone()));
        }
        Ok(())
    }

    async fn untaint_node(
        &self,
        node: &str,
        ending: &Ending<'_>,
    ) -> Result<UntaintOutcome, ClusterError> {
        if self.calls.call(format!("UntaintNode {node}")) {
            return Err(ClusterError::PatchConflict { node: node.into() });
        }
        let current = self.lock().nodes.get(node).cloned();
        let Some(current) = current else {
            return Ok(UntaintOutcome::NodeGone);
        };
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        match kube_patch::untaint_patch(&current, ending, now) {
            UntaintPatch::Apply {
                patch,
                removes_taint,
            } => {
                self.patch(node, &patch)?;
                Ok(UntaintOutcome::Ended {
                    taint_removed: removes_taint,
                })
            }
            UntaintPatch::NotOurs => Ok(UntaintOutcome::NotOurs),
            UntaintPatch::NodeNotReady => Ok(UntaintOutcome::NodeNotReady),
            UntaintPatch::NotSettled { remaining_secs } => {
                Ok(UntaintOutcome::NotSettled { remaining_secs })
            }
            UntaintPatch::NotConfirmed => Ok(UntaintOutcome::NotConfirmed),
            UntaintPatch::NoResourceVersion | UntaintPatch::Unrepresentable => {
                Err(ClusterError::UnsafeWrite { node: node.into() })
            }
        }
    }

    async fn confirm_recovery(
        &self,
        node: &str,
        fenced_at: Option<&str>,
    ) -> Result<ConfirmOutcome, ClusterError> {
        if self.calls.call(format!("ConfirmRecovery {node}")) {
            return Err(ClusterError::PatchConflict { node: node.into() });
        }
        let current = self.lock().nodes.get(node).cloned();
        let Some(current) = current else {
            return Ok(ConfirmOutcome::NodeGone);
        };
        match kube_patch::confirm_patch(&current, fenced_at) {
            ConfirmPatch::Apply(patch) => {
                self.patch(node, &patch)?;
                Ok(ConfirmOutcome::Confirmed)
            }
            ConfirmPatch::Already => Ok(ConfirmOutcome::Confirmed),
            ConfirmPatch::NotFenced => Ok(ConfirmOutcome::NotFenced),
            ConfirmPatch::AnotherFencing => Ok(ConfirmOutcome::AnotherFencing),
            ConfirmPatch::NoResourceVersion => Err(ClusterError::UnsafeWrite { node: node.into() }),
        }
    }

    async fn note_machine_off(
        &self,
        judged: &JudgedNode<'_>,
        note: &SeenOff,
    ) -> Result<bool, ClusterError> {
        let node = judged.name;
        if self.calls.call(format!("NoteMachineOff {node}")) {
            return Err(ClusterError::PatchConflict { node: node.into() });
        }
        let uid = self.lock().nodes.get(node).map(|n| n.metadata.uid.clone());
        match uid {
            Some(uid) if judged.uid.is_none_or(|j| uid.as_deref() == Some(j)) => {
                self.patch(node, &kube_patch::seen_off_patch(judged.uid, note))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError> {
        if self.calls.call(format!("MarkPoweredOff {node}")) {
            return Err(ClusterError::PatchConflict { node: node.into() });
        }
        let pause = self.lock().mark_pause;
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        if !self.lock().nodes.contains_key(node) {
            return Ok(false);
        }
        self.patch(node, &kube_patch::power_mark_patch(stamp))?;
        Ok(true)
    }

    async fn clear_power_mark(&self, node: &str) -> Result<(), ClusterError> {
        if self.calls.call(format!("ClearPowerMark {node}")) {
            return Err(ClusterError::PatchConflict { node: node.into() });
        }
        let current = self.lock().nodes.get(node).cloned();
        if let Some(current) = current {
            self.patch(node, &kube_patch::power_unmark_patch(&current))?;
        }
        Ok(())
    }

    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        if self.calls.call(format!("DeletePod {}", pod.name)) {
            return Err(ClusterError::Version("injected fault".into()));
        }
        for pods in self.lock().pods.values_mut() {
            pods.retain(|p| p != pod);
        }
        Ok(())
    }

    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError> {
        if self.calls.call(format!("DeleteVolumeAttachment {name}")) {
            return Err(ClusterError::DeleteVolumeAttachment {
                name: name.into(),
                source: injected(),
            });
        }
        self.lock()
            .attachments
            .retain(|a| a.name != name || a.uid != uid);
        Ok(())
    }

    async fn release_volumes_in_use(
        &self,
        node: &str,
        uid: Option<&str>,
        names: &[String],
    ) -> Result<ReleaseOutcome, ClusterError> {
        if self.calls.call(format!("ReleaseVolumesInUse {node}")) {
            return Err(ClusterError::PatchNode {
                node: node.into(),
                source: injected(),
            });
        }
        let mut state = self.lock();
        if state.reregistered_before_release.as_deref() == Some(node) {
            state.reregistered_before_release = None;
            if let Some(n) = state.nodes.get_mut(node) {
                n.metadata.uid = Some(format!("uid-{node}-again"));
            }
        }
        let Some(current) = state.nodes.get_mut(node) else {
            return Ok(ReleaseOutcome::NodeGone);
        };
        if uid.is_some_and(|uid| current.metadata.uid.as_deref() != Some(uid)) {
            return Ok(ReleaseOutcome::NodeGone);
        }
        match in_use::release_patch(current, names) {
            ReleasePatch::Apply(patch, n) => {
                current.status.get_or_insert_default().volumes_in_use =
                    serde_json::from_value(patch["status"]["volumesInUse"].clone()).ok();
                Ok(ReleaseOutcome::Released(n))
            }
            ReleasePatch::NoneListed => Ok(ReleaseOutcome::NoneListed),
            ReleasePatch::NoResourceVersion => Err(ClusterError::UnsafeWrite { node: node.into() }),
        }
    }
}

#[async_trait]
impl Coordination for FakeCluster {
    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError> {
        if self.calls.call("GetCensus".into()) {
            return Err(ClusterError::Lease {
                namespace: namespace.into(),
                source: injected(),
            });
        }
        Ok(self.lock().census.clone())
    }

    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        _holder: &str,
    ) -> Result<(), ClusterError> {
        if self.calls.call("WriteCensus".into()) {
            return Err(ClusterError::Lease {
                namespace: namespace.into(),
                source: injected(),
            });
        }
        self.lock().census = Some(census.clone());
        Ok(())
    }

    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError> {
        if self.calls.call("GetKillSwitch".into()) {
            return Err(ClusterError::KillSwitch {
                namespace: namespace.into(),
                source: injected(),
            });
        }
        let mut state = self.lock();
        state.switch_reads += 1;
        if let Some((nth, k)) = state.switch_at.clone()
            && state.switch_reads >= nth
        {
            state.kill_switch = k;
        }
        Ok(state.kill_switch.clone())
    }

    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
        until: Option<std::time::Instant>,
    ) -> Result<LeaseTaken, ClusterError> {
        if self.calls.call("AcquireLease".into()) {
            return Err(ClusterError::Lease {
                namespace: namespace.into(),
                source: injected(),
            });
        }
        // A Lease another holder took in a test's set-up counts as expired
        // (after the wait `lease_held_once` or `lease_held_for` asks for);
        // one an invocation at work holds is waited for, below.
        let pause = self.lock().lease_held_for.take();
        if let Some(pause) = pause {
            // As the shell: a holder that keeps it past the request's end
            // is waited for until then, not longer.
            if let Some(until) = until.filter(|u| *u < std::time::Instant::now() + pause) {
                tokio::time::sleep_until(until.into()).await;
                return Err(ClusterError::LeaseBusy {
                    holder: "another invocation".into(),
                });
            }
            tokio::time::sleep(pause).await;
        }
        let held = self.wait_for_live_holder(namespace, holder, until).await?;
        let mut state = self.lock();
        state.lease = Some(holder.into());
        state.lease_live = true;
        if let Some((node, machine)) = state.placed_on_lease.take() {
            state.placed.insert(node, machine);
        }
        let waited = std::mem::take(&mut state.lease_held) || pause.is_some() || held;
        Ok(LeaseTaken {
            waited,
            stamped: std::time::Instant::now(),
        })
    }

    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError> {
        if self.calls.call("RenewLease".into()) {
            return Err(ClusterError::Lease {
                namespace: namespace.into(),
                source: injected(),
            });
        }
        let mut state = self.lock();
        state.renewals += 1;
        if state.lease_taken_at.is_some_and(|n| state.renewals >= n) {
            state.lease = Some("another invocation".into());
            state.lease_live = false;
        }
        Ok(state.lease.as_deref() == Some(holder))
    }

    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError> {
        if self.calls.call("ReleaseLease".into()) {
            return Err(ClusterError::Lease {
                namespace: namespace.into(),
                source: injected(),
            });
        }
        let mut state = self.lock();
        if state.lease.as_deref() == Some(holder) {
            state.lease = None;
            state.lease_live = false;
        }
        Ok(())
    }
}

impl FakeCluster {
    /// Waits while another invocation at work holds the Lease, as the
    /// shell does, up to `until`; for at most [`LIVE_HOLDER_FOR`], after
    /// which it counts as expired. True when it waited.
    async fn wait_for_live_holder(
        &self,
        namespace: &str,
        holder: &str,
        until: Option<std::time::Instant>,
    ) -> Result<bool, ClusterError> {
        let give_up = std::time::Instant::now() + LIVE_HOLDER_FOR;
        let mut waited = false;
        loop {
            let busy = {
                let state = self.lock();
                state.lease_live && state.lease.as_deref().is_some_and(|h| h != holder)
            };
            let now = std::time::Instant::now();
            if !busy || now >= give_up {
                return Ok(waited);
            }
            if until.is_some_and(|u| now >= u) {
                return Err(ClusterError::LeaseBusy {
                    holder: format!("another invocation in {namespace}"),
                });
            }
            waited = true;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// How long a Lease held by an invocation at work keeps others waiting
/// in the fakes: one that never lets go (a test's failure) holds no other
/// test up for long.
const LIVE_HOLDER_FOR: Duration = Duration::from_secs(2);

/// The CSI driver that attaches `volume`: EBS's or Persistent Disk's.
fn driver_of(volume: &VolumeId) -> &'static str {
    match volume.provider() {
        Provider::Aws | Provider::Redfish => EBS_CSI_DRIVER,
        Provider::Gce => crate::core::model::gce::PD_CSI_DRIVER,
    }
}
