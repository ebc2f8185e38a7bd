//! The simulated world and its ground truth: the machines and their power,
//! the kubelets that run on them (the Node name each serves, how often it
//! renews, how far its clock is off, alive, hung or dead), the disks and
//! which machine writes each; what the apiserver holds (Nodes, the
//! kubelets' Leases, pods, PersistentVolumes, VolumeAttachments, the
//! fencing Lease, the census, the kill switch); and the controllers that
//! act on them: the node controller's grace period, the taint manager and
//! the pod garbage collector, the attach/detach controller, a StatefulSet
//! and the scheduler.
//!
//! Time is simulated milliseconds since the start ([`Ms`]). The world moves
//! only through [`World::advance_to`], which carries out everything
//! scheduled up to then, in order; the shells call it before every answer,
//! so the pipeline reads the world as it is at that moment. Nothing here
//! decides anything about fencing: the checks ([`crate::invariants`]) hold
//! the pipeline's writes to this truth, never to what the pipeline believed.
//!
//! An adversary move is a method of [`World`] that changes the truth and
//! says so in the story (the `// Moves` block below), and an entry in
//! [`crate::adversary`] that picks when.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    AttachedVolume, CSIPersistentVolumeSource, Container as PodContainer, Node, NodeAddress,
    NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, ObjectReference, PersistentVolume,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Taint, Toleration,
    Volume as PodVolume,
};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, MicroTime, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use node_fencer::core::model::facts::{
    CsiVolume, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE,
};
use node_fencer::core::model::instance::{EBS_CSI_DRIVER, InstanceId, InstanceState, VolumeId};
use node_fencer::core::model::kube_read;
use node_fencer::core::rules::view::Census;
use node_fencer::core::rules::volumes;
use serde_json::{Value, json};

/// Simulated time: milliseconds since the simulation started.
pub type Ms = i64;

/// The wall time the simulation starts at (Unix milliseconds).
pub const EPOCH_MS: i64 = 1_795_000_000_000;
/// The node controller's `nodeMonitorGracePeriod` (50 s from 1.32).
pub const GRACE: Ms = 50_000;
/// How often the node controller looks (`nodeMonitorPeriod`).
const MONITOR_EVERY: u64 = 5;
/// How often a kubelet renews its Lease by default (a quarter of 40 s).
pub const RENEW_EVERY: Ms = 10_000;
/// The default `tolerationSeconds` of `unreachable:NoExecute`.
const TOLERATION: Ms = 300_000;
/// The controllers' cadence.
const TICK: Ms = 1_000;
/// The unreachable taint the node controller puts on a silent Node.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// The namespace of the kubelets' Leases.
const NODE_LEASES: &str = "kube-node-lease";
/// The zone every machine is in.
const ZONE: &str = "us-east-1a";

/// The wall time at `t`.
pub fn timestamp(t: Ms) -> Timestamp {
    Timestamp::from_millisecond(EPOCH_MS + t).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The Unix second `t` falls in.
pub fn unix_secs(t: Ms) -> i64 {
    (EPOCH_MS + t).div_euclid(1000)
}

/// `t` as the story prints it.
pub fn secs(t: Ms) -> String {
    format!("{:.1} s", t as f64 / 1000.0)
}

/// A machine's power, as the truth knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Power {
    /// Booting: it may already write to its disks.
    Pending,
    /// Running.
    Running,
    /// Shutting down after a stop: the guest may still write.
    Stopping,
    /// Off.
    Stopped,
    /// Shutting down before termination.
    ShuttingDown,
    /// Gone for good.
    Terminated,
}

impl Power {
    /// True while anything on the machine may still write.
    pub fn is_on(self) -> bool {
        !matches!(self, Self::Stopped | Self::Terminated)
    }

    /// EC2's state for it.
    pub fn state(self) -> InstanceState {
        match self {
            Self::Pending => InstanceState::Pending,
            Self::Running => InstanceState::Running,
            Self::Stopping => InstanceState::Stopping,
            Self::Stopped => InstanceState::Stopped,
            Self::ShuttingDown => InstanceState::ShuttingDown,
            Self::Terminated => InstanceState::Terminated,
        }
    }

    /// True while the guest, and a kubelet on it, can run.
    fn guest_up(self) -> bool {
        matches!(self, Self::Running | Self::Stopping | Self::ShuttingDown)
    }
}

/// What the cloud recorded of a machine at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its power.
    pub power: Power,
    /// Its last start (EC2's `LaunchTime`).
    pub started_at: Ms,
    /// When its stop was asked for (EC2's `StateTransitionReason`), while
    /// it is stopping or stopped.
    pub stop_asked_at: Option<Ms>,
}

/// One machine (an EC2 instance).
#[derive(Clone, Debug)]
pub struct Machine {
    /// Its id.
    pub id: InstanceId,
    /// Its private DNS name.
    pub host: String,
    /// Its private address.
    pub ip: String,
    /// Its power, now.
    pub power: Power,
    /// How many times it booted.
    pub boots: u32,
    /// How late the cloud reports it off (never on again late: see
    /// [`Machine::seen_at`]).
    pub lag: Ms,
    /// What the cloud recorded, in order.
    history: Vec<(Ms, Seen)>,
    /// Counts its transitions: a transition scheduled before a later one
    /// is void.
    epoch: u64,
}

impl Machine {
    fn now(&self) -> Seen {
        self.history.last().map_or(
            Seen {
                power: self.power,
                started_at: 0,
                stop_asked_at: None,
            },
            |(_, s)| *s,
        )
    }

    /// What the cloud answers about it at `t`: what it had recorded `lag`
    /// earlier. A machine that is on again is never reported off: the
    /// fencing rests on the cloud's word that a machine is off, and a cloud
    /// that calls a running machine stopped is beyond what node-fencer can
    /// be safe against; lagging the other way (still running, still
    /// stopping) is EC2's documented eventual consistency.
    pub fn seen_at(&self, t: Ms) -> Seen {
        let now = self.now();
        let stale = self
            .history
            .iter()
            .rev()
            .find(|(at, _)| *at <= t - self.lag)
            .map_or(now, |(_, s)| *s);
        if now.power.is_on() && !stale.power.is_on() {
            now
        } else {
            stale
        }
    }
}

/// A kubelet's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// It renews its Lease and runs its pods.
    Alive,
    /// It renews nothing; the containers it started keep running.
    Hung,
    /// Its process is gone; the containers it started keep running.
    Dead,
}

/// One kubelet: the Node name it serves, on one machine.
#[derive(Clone, Debug)]
pub struct Kubelet {
    /// The Node name it serves.
    pub node: String,
    /// The machine it runs on.
    pub machine: InstanceId,
    /// Its process.
    pub process: Process,
    /// How far its clock is off the true time.
    pub skew: Ms,
    /// How often it renews its Lease.
    pub renew_every: Ms,
    /// The boot it reports.
    pub boot_id: String,
    /// The adversary touched it: its renewals are told in the story.
    pub noted: bool,
    /// It has renewed on its machine's current boot: it serves the Node
    /// (a kubelet still booting has written nothing and runs nothing).
    pub serving: bool,
    /// Another machine's kubelet took its Node name over: it never runs
    /// again, whatever its machine does.
    pub retired: bool,
    /// Since when it has been alive and serving: revived, or serving its
    /// machine's boot.
    pub alive_since: Ms,
    renewals: u64,
    epoch: u64,
}

/// A process writing to a disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// The Node whose kubelet started it.
    pub node: String,
    /// The pod it runs for.
    pub pod: String,
    /// That pod's uid.
    pub pod_uid: String,
    /// The disk it writes.
    pub volume: VolumeId,
    /// The machine it runs on.
    pub machine: InstanceId,
}

/// An EBS volume's attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// Being attached.
    Attaching,
    /// Attached.
    Attached,
    /// Being detached.
    Detaching,
}

/// An EBS volume.
#[derive(Clone, Debug)]
pub struct Disk {
    /// Its id.
    pub id: VolumeId,
    /// The machine it is attached to, and how far.
    pub attachment: Option<(InstanceId, Attach)>,
    epoch: u64,
}

/// One pod of the StatefulSet, with its claim and disk.
#[derive(Clone, Debug)]
pub struct Member {
    /// The pod's name.
    pub pod: String,
    /// Its PersistentVolumeClaim.
    pub claim: String,
    /// The PersistentVolume bound to the claim.
    pub pv: String,
    /// The disk behind it.
    pub volume: VolumeId,
    /// It tolerates the out-of-service taint for good: no taint evicts it.
    pub stays: bool,
}

/// The fencing Lease (`kube-system/node-fencer`).
#[derive(Clone, Debug, Default)]
pub struct FencingLease {
    /// Its holder; `None` when released.
    pub holder: Option<String>,
    /// Its last renewal.
    pub renewed: Ms,
    /// Its version: every write changes it.
    pub version: u64,
}

/// A state change EventBridge tells of.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// When the machine got there.
    pub t: Ms,
    /// The machine.
    pub instance: InstanceId,
    /// `stopped`, `terminated` or `running`.
    pub state: &'static str,
}

/// A write that broke an invariant, found against the truth.
#[derive(Clone, Debug)]
pub struct Violation {
    /// When.
    pub t: Ms,
    /// What, in words.
    pub what: String,
}

/// The lines a person reads: what happened, when.
#[derive(Clone, Debug, Default)]
pub struct Story {
    lines: Vec<(Ms, String)>,
}

impl Story {
    /// Tells `text` at `t`.
    pub fn say(&mut self, t: Ms, text: impl Into<String>) {
        self.lines.push((t, text.into()));
    }

    /// Every line, one a line: `t=63.2 s  EC2 stops i-a0000001`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (t, text) in &self.lines {
            out.push_str(&format!("t={:>7}  {text}\n", secs(*t)));
        }
        out
    }

    /// How many lines.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// True when nothing was told.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// What the world does on its own, at a set time.
#[derive(Clone, Debug)]
enum Happening {
    /// The controllers' round.
    Controllers,
    /// A kubelet's renewal.
    Renew { k: usize, epoch: u64 },
    /// A kubelet stopped by its guest's shutdown.
    KubeletStops { k: usize, epoch: u64 },
    /// A machine reaches `to`.
    Power {
        id: InstanceId,
        to: Power,
        epoch: u64,
    },
    /// An attach or detach completes.
    Disk { id: VolumeId, epoch: u64 },
    /// The garbage collector deletes the Lease of a Node gone.
    LeaseGc { node: String, owner: String },
}

/// The world: the truth, and the apiserver's objects.
pub struct World {
    /// Now.
    pub t: Ms,
    /// The machines, by id.
    pub machines: BTreeMap<InstanceId, Machine>,
    /// The kubelets.
    pub kubelets: Vec<Kubelet>,
    /// The Nodes, by name.
    pub nodes: BTreeMap<String, Node>,
    /// The kubelets' Leases, by Node name.
    pub leases: BTreeMap<String, Lease>,
    /// The pods (all in `default`), by name.
    pub pods: BTreeMap<String, Pod>,
    /// The PersistentVolumes.
    pub pvs: Vec<PersistentVolume>,
    /// The VolumeAttachments, by name.
    pub vas: BTreeMap<String, VolumeAttachment>,
    /// The disks, by id.
    pub disks: BTreeMap<VolumeId, Disk>,
    /// The StatefulSet's pods.
    pub members: Vec<Member>,
    /// Who writes what: the processes running on the machines.
    pub containers: Vec<Container>,
    /// The kill switch (`dry-run: true` in the ConfigMap).
    pub kill_switch: bool,
    /// The fencing Lease.
    pub fencing_lease: FencingLease,
    /// The census a sweep left.
    pub census: Option<Census>,
    /// The Events recorded, by name.
    pub events: BTreeSet<String>,
    /// The state changes EventBridge has yet to deliver.
    pub emitted: Vec<Emitted>,
    /// What the story tells.
    pub story: Story,
    /// The invariants broken.
    pub violations: Vec<Violation>,
    /// When the node controller last heard of each Node name (a Lease
    /// renewal or a status update, on its own clock).
    heard: BTreeMap<String, Ms>,
    /// Each Node name's CSINode: the machine whose node plugin registered
    /// last under that name, its driver's node id. It outlives the machine
    /// and goes with the Node object.
    csi_nodes: BTreeMap<String, InstanceId>,
    /// The disks two machines were seen writing, told once each.
    told_writers: BTreeSet<String>,
    agenda: BTreeMap<(Ms, u64), Happening>,
    rng: fastrand::Rng,
    rv: u64,
    seq: u64,
    uids: u64,
    launched: u32,
    ticks: u64,
}

impl World {
    /// A cluster of `pods.len()` Nodes, each on its machine, each with its
    /// pods' disks attached and written; the world's own randomness (renewal
    /// jitter, shutdown lengths) from `seed`.
    pub fn new(seed: u64, pods: &[usize], staying: bool) -> Self {
        let mut w = Self {
            t: 0,
            machines: BTreeMap::new(),
            kubelets: Vec::new(),
            nodes: BTreeMap::new(),
            leases: BTreeMap::new(),
            pods: BTreeMap::new(),
            pvs: Vec::new(),
            vas: BTreeMap::new(),
            disks: BTreeMap::new(),
            members: Vec::new(),
            containers: Vec::new(),
            kill_switch: false,
            fencing_lease: FencingLease::default(),
            census: None,
            events: BTreeSet::new(),
            emitted: Vec::new(),
            story: Story::default(),
            violations: Vec::new(),
            heard: BTreeMap::new(),
            csi_nodes: BTreeMap::new(),
            told_writers: BTreeSet::new(),
            agenda: BTreeMap::new(),
            rng: fastrand::Rng::with_seed(seed),
            rv: 100,
            seq: 0,
            uids: 0,
            launched: 0,
            ticks: 0,
        };
        for (i, count) in pods.iter().enumerate() {
            let name = format!("worker-{}", i + 1);
            let machine = w.launch(&name, -3_600_000);
            let k = w.kubelets.len();
            w.kubelets.push(Kubelet {
                node: name.clone(),
                machine: machine.clone(),
                process: Process::Alive,
                skew: 0,
                renew_every: RENEW_EVERY,
                boot_id: format!("boot-{machine}-1"),
                noted: false,
                serving: true,
                retired: false,
                alive_since: 0,
                renewals: 0,
                epoch: 0,
            });
            w.csi_nodes.insert(name.clone(), machine.clone());
            w.register(k);
            w.write_lease(k);
            let phase = w.rng.i64(0..RENEW_EVERY);
            w.schedule(phase, Happening::Renew { k, epoch: 0 });
            for _ in 0..*count {
                let stays = staying && w.members.is_empty();
                w.add_member(&name, &machine, stays);
            }
        }
        w.schedule(TICK, Happening::Controllers);
        w
    }

    /// The truth about the machine `id`.
    pub fn machine(&self, id: &InstanceId) -> Option<&Machine> {
        self.machines.get(id)
    }

    /// The kubelets that serve the Node name `node`.
    pub fn kubelets_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Kubelet> + 'a {
        self.kubelets.iter().filter(move |k| k.node == node)
    }

    /// The machine a Node object's provider id names.
    pub fn named_machine(&self, node: &str) -> Option<InstanceId> {
        let n = self.nodes.get(node)?;
        kube_read::node_facts(n)?.instance
    }

    /// True when the Node object `node` names a machine other than the one
    /// its kubelet runs on: a kubelet on another machine adopted it.
    pub fn is_stale(&self, node: &str) -> bool {
        let Some(named) = self.named_machine(node) else {
            return false;
        };
        self.kubelets_of(node)
            .filter(|k| !k.retired)
            .any(|k| k.machine != named)
    }

    /// True when a machine that is on carries the name `node` (EC2's
    /// private DNS name), whether or not it serves that Node.
    pub fn runs_under_name(&self, node: &str) -> bool {
        self.machines
            .values()
            .any(|m| m.host == node && m.power.is_on())
    }

    /// Every machine that is on and still serves the Node `node` since it
    /// was last off: each one a kubelet of that name has renewed from on
    /// its current boot (alive, hung or dead since, unless another
    /// machine's kubelet took the name over from a dead one, which never
    /// runs again), and each one running containers a kubelet of that name
    /// started. A machine that was off and is booting again runs nothing of
    /// the Node's until its kubelet serves again; no fencing can see a
    /// start that follows its last look.
    pub fn live_machines_of(&self, node: &str) -> Vec<InstanceId> {
        let mut ids: Vec<InstanceId> = self
            .kubelets_of(node)
            .filter(|k| k.serving && !(k.retired && k.process == Process::Dead))
            .map(|k| k.machine.clone())
            .chain(
                self.containers
                    .iter()
                    .filter(|c| c.node == node)
                    .map(|c| c.machine.clone()),
            )
            .filter(|id| self.machines.get(id).is_some_and(|m| m.power.is_on()))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The machine the attach/detach controller attaches the Node `node`'s
    /// disks to: the CSI driver's node id in the Node's CSINode, which the
    /// node plugin of the kubelet that last started serving that name
    /// registered, whether its machine still runs or not; else the machine
    /// the Node object names.
    pub fn attach_machine(&self, node: &str) -> Option<InstanceId> {
        self.csi_nodes
            .get(node)
            .cloned()
            .or_else(|| self.named_machine(node))
    }

    /// True when `machine` is on and still in use since it was last off:
    /// a kubelet on it has served on this boot, or a container runs there.
    pub fn in_use(&self, machine: &InstanceId) -> bool {
        self.machines.get(machine).is_some_and(|m| m.power.is_on())
            && (self
                .kubelets
                .iter()
                .any(|k| &k.machine == machine && k.serving)
                || self.containers.iter().any(|c| &c.machine == machine))
    }

    /// The machines on that write to `volume`.
    pub fn writers(&self, volume: &VolumeId) -> Vec<InstanceId> {
        let mut ids: Vec<InstanceId> = self
            .containers
            .iter()
            .filter(|c| &c.volume == volume)
            .filter(|c| {
                self.machines
                    .get(&c.machine)
                    .is_some_and(|m| m.power.is_on())
            })
            .map(|c| c.machine.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// Records a broken invariant, in the story too.
    pub fn violate(&mut self, what: String) {
        self.story.say(self.t, format!("VIOLATION: {what}"));
        self.violations.push(Violation { t: self.t, what });
    }

    /// A new resourceVersion.
    pub fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn uid(&mut self, of: &str) -> String {
        self.uids += 1;
        format!("uid-{of}-{}", self.uids)
    }

    fn schedule(&mut self, at: Ms, what: Happening) {
        self.seq += 1;
        self.agenda.insert((at.max(self.t), self.seq), what);
    }

    /// Carries out everything scheduled up to `now`, in order.
    pub fn advance_to(&mut self, now: Ms) {
        while let Some(entry) = self.agenda.first_entry() {
            let at = entry.key().0;
            if at > now {
                break;
            }
            let what = entry.remove();
            self.t = at;
            self.happen(what);
            self.check_writers();
        }
        self.t = self.t.max(now);
    }

    fn happen(&mut self, what: Happening) {
        match what {
            Happening::Controllers => self.controllers(),
            Happening::Renew { k, epoch } => self.renew(k, epoch),
            Happening::KubeletStops { k, epoch } => {
                if self.kubelets[k].epoch == epoch && self.kubelets[k].process == Process::Alive {
                    self.kubelets[k].process = Process::Dead;
                    let node = self.kubelets[k].node.clone();
                    self.story
                        .say(self.t, format!("kubelet of {node} stops (guest shutdown)"));
                }
            }
            Happening::Power { id, to, epoch } => self.power_reached(&id, to, epoch),
            Happening::Disk { id, epoch } => self.disk_done(&id, epoch),
            Happening::LeaseGc { node, owner } => {
                let owned = self.leases.get(&node).is_some_and(|l| {
                    l.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == owner)
                });
                if owned {
                    self.leases.remove(&node);
                    self.story.say(
                        self.t,
                        format!("garbage collector deletes the Lease of the Node {node} gone"),
                    );
                }
            }
        }
    }

    /// Two machines that are on writing one disk: told once per disk and pair.
    fn check_writers(&mut self) {
        let ids: Vec<VolumeId> = self.disks.keys().cloned().collect();
        for id in ids {
            let writers = self.writers(&id);
            if writers.len() < 2 {
                continue;
            }
            let names: Vec<&str> = writers.iter().map(InstanceId::as_str).collect();
            let key = format!("{id} {}", names.join(" "));
            if self.told_writers.insert(key) {
                self.violate(format!(
                    "{id} is written by two machines that are on: {}",
                    names.join(" and ")
                ));
            }
        }
    }

    // The machines.

    fn launch(&mut self, host: &str, started_at: Ms) -> InstanceId {
        self.launched += 1;
        let n = self.launched;
        let id = InstanceId::parse(&format!("i-{:08x}", 0xa000_0000_u32 + n))
            .unwrap_or_else(|| unreachable!("a well-formed instance id"));
        let seen = Seen {
            power: Power::Running,
            started_at,
            stop_asked_at: None,
        };
        self.machines.insert(
            id.clone(),
            Machine {
                id: id.clone(),
                host: host.to_owned(),
                ip: format!("10.0.0.{}", 10 + n),
                power: Power::Running,
                boots: 1,
                lag: 0,
                history: vec![(self.t.min(started_at), seen)],
                epoch: 0,
            },
        );
        id
    }

    fn record(&mut self, id: &InstanceId, power: Power, started: Option<Ms>, stop: Option<Ms>) {
        let t = self.t;
        let Some(m) = self.machines.get_mut(id) else {
            return;
        };
        let before = m.now();
        m.power = power;
        m.epoch += 1;
        let seen = Seen {
            power,
            started_at: started.unwrap_or(before.started_at),
            stop_asked_at: match power {
                Power::Pending | Power::Running => None,
                _ => stop.or(before.stop_asked_at),
            },
        };
        m.history.push((t, seen));
    }

    fn power_reached(&mut self, id: &InstanceId, to: Power, epoch: u64) {
        let Some(m) = self.machines.get(id) else {
            return;
        };
        if m.epoch != epoch {
            return;
        }
        let host = m.host.clone();
        self.record(id, to, None, None);
        let t = self.t;
        self.story
            .say(t, format!("EC2: {id} ({host}) is {}", to.state().name()));
        match to {
            Power::Stopped | Power::Terminated => self.machine_off(id, to),
            Power::Running => self.booted(id),
            _ => {}
        }
    }

    /// Whatever ran on `id` stops; a terminated machine's disks come free.
    fn machine_off(&mut self, id: &InstanceId, to: Power) {
        for k in self.kubelets.iter_mut().filter(|k| &k.machine == id) {
            k.serving = false;
        }
        let gone: Vec<Container> = self
            .containers
            .iter()
            .filter(|c| &c.machine == id)
            .cloned()
            .collect();
        self.containers.retain(|c| &c.machine != id);
        for c in gone {
            self.story.say(
                self.t,
                format!("{} stops writing {} ({id} is off)", c.pod, c.volume),
            );
        }
        if to == Power::Terminated {
            for disk in self.disks.values_mut() {
                if disk.attachment.as_ref().is_some_and(|(m, _)| m == id) {
                    disk.attachment = None;
                    disk.epoch += 1;
                }
            }
        }
        let state = if to == Power::Terminated {
            "terminated"
        } else {
            "stopped"
        };
        self.emitted.push(Emitted {
            t: self.t,
            instance: id.clone(),
            state,
        });
    }

    /// A machine up again: its kubelets start, with a new boot.
    fn booted(&mut self, id: &InstanceId) {
        let boots = self.machines.get_mut(id).map_or(1, |m| {
            m.boots += 1;
            m.boots
        });
        let ks: Vec<usize> = (0..self.kubelets.len())
            .filter(|k| &self.kubelets[*k].machine == id && !self.kubelets[*k].retired)
            .collect();
        for k in ks {
            let kubelet = &mut self.kubelets[k];
            kubelet.process = Process::Alive;
            kubelet.serving = false;
            kubelet.boot_id = format!("boot-{id}-{boots}");
            kubelet.epoch += 1;
            let epoch = kubelet.epoch;
            let after = self.rng.i64(1_000..5_000);
            self.schedule(self.t + after, Happening::Renew { k, epoch });
        }
        self.emitted.push(Emitted {
            t: self.t,
            instance: id.clone(),
            state: "running",
        });
    }

    // The kubelets.

    fn kubelet_runs(&self, k: usize) -> bool {
        let kubelet = &self.kubelets[k];
        kubelet.process == Process::Alive
            && self
                .machines
                .get(&kubelet.machine)
                .is_some_and(|m| m.power.guest_up())
    }

    /// Registers the kubelet's Node: a new object, a new uid.
    fn register(&mut self, k: usize) {
        let kubelet = self.kubelets[k].clone();
        let Some(machine) = self.machines.get(&kubelet.machine).cloned() else {
            return;
        };
        let uid = self.uid(&kubelet.node);
        let rv = self.next_rv();
        let clock = self.t + kubelet.skew;
        let labels = [
            (kube_read::LABEL_ZONE.to_owned(), ZONE.to_owned()),
            ("kubernetes.io/hostname".to_owned(), kubelet.node.clone()),
        ];
        let node = Node {
            metadata: ObjectMeta {
                name: Some(kubelet.node.clone()),
                uid: Some(uid.clone()),
                resource_version: Some(rv),
                creation_timestamp: Some(Time(timestamp(self.t))),
                labels: Some(labels.into_iter().collect()),
                annotations: Some(
                    [(
                        kube_read::ANNOTATION_CONTROLLER_MANAGED.to_owned(),
                        "true".to_owned(),
                    )]
                    .into_iter()
                    .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///{ZONE}/{}", machine.id)),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![ready("True", "KubeletReady", clock)]),
                node_info: Some(NodeSystemInfo {
                    boot_id: kubelet.boot_id.clone(),
                    ..NodeSystemInfo::default()
                }),
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: machine.ip.clone(),
                    },
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: kubelet.node.clone(),
                    },
                ]),
                ..NodeStatus::default()
            }),
        };
        self.nodes.insert(kubelet.node.clone(), node);
        self.heard.insert(kubelet.node.clone(), self.t);
        self.story.say(
            self.t,
            format!(
                "kubelet on {} registers the Node {} (uid {uid})",
                machine.id, kubelet.node
            ),
        );
    }

    /// The kubelet writes its Lease: `renewTime` on its own clock, the
    /// apiserver's time of the write in the managed fields, a new version.
    fn write_lease(&mut self, k: usize) {
        let kubelet = self.kubelets[k].clone();
        let node = kubelet.node.clone();
        let owner = self.nodes.get(&node).and_then(|n| n.metadata.uid.clone());
        let rv = self.next_rv();
        let written = self.t - self.t.rem_euclid(1000);
        let lease = self.leases.entry(node.clone()).or_insert_with(|| Lease {
            metadata: ObjectMeta {
                name: Some(node.clone()),
                namespace: Some(NODE_LEASES.into()),
                owner_references: owner.map(|uid| {
                    vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.clone(),
                        uid,
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(node.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(kubelet.renew_every / 250).unwrap_or(40),
                ),
                ..LeaseSpec::default()
            }),
        });
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(timestamp(self.t + kubelet.skew)));
        }
        lease.metadata.resource_version = Some(rv);
        lease.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubelet".into()),
            operation: Some("Update".into()),
            api_version: Some("coordination.k8s.io/v1".into()),
            time: Some(Time(timestamp(written))),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(
                json!({"f:spec": {"f:renewTime": {}, "f:holderIdentity": {}}}),
            )),
            subresource: None,
        }]);
        self.heard.insert(node, self.t);
    }

    fn renew(&mut self, k: usize, epoch: u64) {
        if self.kubelets[k].epoch != epoch || !self.kubelet_runs(k) {
            return;
        }
        let node = self.kubelets[k].node.clone();
        if !self.nodes.contains_key(&node) {
            self.register(k);
        }
        self.write_lease(k);
        self.kubelet_status(k);
        if !self.kubelets[k].serving || !self.csi_nodes.contains_key(&node) {
            // The node plugin registers as the kubelet starts serving, and
            // again into the CSINode of a Node registered anew.
            let machine = self.kubelets[k].machine.clone();
            self.csi_nodes.insert(node.clone(), machine);
        }
        self.kubelet_sync(k);
        let kubelet = &mut self.kubelets[k];
        kubelet.renewals += 1;
        if !kubelet.serving {
            kubelet.alive_since = self.t;
        }
        kubelet.serving = true;
        let (every, skew, noted) = (kubelet.renew_every, kubelet.skew, kubelet.noted);
        let machine = kubelet.machine.clone();
        let running = self
            .machines
            .get(&machine)
            .is_some_and(|m| m.power == Power::Running);
        if noted || !running || skew != 0 {
            self.story.say(
                self.t,
                format!(
                    "kubelet of {node} on {machine} renews its Lease (its clock says {})",
                    secs(self.t + skew)
                ),
            );
        }
        let jitter = self.rng.i64(0..=every / 25);
        let request = self.rng.i64(5..50);
        self.schedule(
            self.t + every + jitter + request,
            Happening::Renew { k, epoch },
        );
    }

    /// The kubelet's status update: Ready again after a silence, the boot
    /// it runs, and a heartbeat now and then.
    fn kubelet_status(&mut self, k: usize) {
        let kubelet = self.kubelets[k].clone();
        let clock = self.t + kubelet.skew;
        let Some(node) = self.nodes.get(&kubelet.node) else {
            return;
        };
        let was_ready = ready_status(node) == Some("True");
        let address = self
            .machines
            .get(&kubelet.machine)
            .map(|m| m.ip.clone())
            .unwrap_or_default();
        let booted = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .is_some_and(|i| i.boot_id != kubelet.boot_id);
        if was_ready && !booted && kubelet.renewals % 6 != 5 {
            return;
        }
        let rv = self.next_rv();
        let Some(node) = self.nodes.get_mut(&kubelet.node) else {
            return;
        };
        let status = node.status.get_or_insert_default();
        status.node_info.get_or_insert_default().boot_id = kubelet.boot_id.clone();
        // No cloud controller writes the addresses: the kubelet reports its
        // own machine's (one serving the Node by an override, too).
        status.addresses = Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: address.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: kubelet.node.clone(),
            },
        ]);
        let conditions = status.conditions.get_or_insert_default();
        match conditions.iter_mut().find(|c| c.type_ == "Ready") {
            Some(c) if was_ready => c.last_heartbeat_time = Some(Time(timestamp(clock))),
            _ => {
                conditions.retain(|c| c.type_ != "Ready");
                conditions.push(ready("True", "KubeletReady", clock));
            }
        }
        node.metadata.resource_version = Some(rv);
        if !was_ready {
            self.story.say(
                self.t,
                format!("kubelet of {} reports its Node Ready", kubelet.node),
            );
        }
    }

    /// The kubelet runs its pods: a container for each pod bound to its
    /// Node whose disk is attached to its machine; none for a pod gone or
    /// being deleted (which it then deletes for good).
    fn kubelet_sync(&mut self, k: usize) {
        let kubelet = self.kubelets[k].clone();
        let machine = kubelet.machine.clone();
        let bound: Vec<Pod> = self
            .pods
            .values()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(kubelet.node.as_str())
            })
            .cloned()
            .collect();
        for pod in bound {
            let (name, uid) = pod_ids(&pod);
            if pod.metadata.deletion_timestamp.is_some() {
                self.kill_container(&uid, &machine);
                self.pods.remove(&name);
                self.story.say(
                    self.t,
                    format!("kubelet of {} finishes deleting {name}", kubelet.node),
                );
                continue;
            }
            let Some(member) = self.members.iter().find(|m| m.pod == name).cloned() else {
                continue;
            };
            let attached = self.disks.get(&member.volume).is_some_and(|d| {
                d.attachment.as_ref() == Some(&(machine.clone(), Attach::Attached))
            });
            let running = self.containers.iter().any(|c| c.pod_uid == uid);
            if attached && !running {
                self.containers.push(Container {
                    node: kubelet.node.clone(),
                    pod: name.clone(),
                    pod_uid: uid,
                    volume: member.volume.clone(),
                    machine: machine.clone(),
                });
                self.story.say(
                    self.t,
                    format!(
                        "{name} starts on {machine} ({}), writing {}",
                        kubelet.node, member.volume
                    ),
                );
            }
        }
        let orphans: Vec<Container> = self
            .containers
            .iter()
            .filter(|c| c.machine == machine)
            .filter(|c| {
                !self
                    .pods
                    .values()
                    .any(|p| p.metadata.uid.as_deref() == Some(c.pod_uid.as_str()))
            })
            .cloned()
            .collect();
        for c in orphans {
            self.kill_container(&c.pod_uid, &machine);
            self.story.say(
                self.t,
                format!(
                    "kubelet of {} stops {} (its pod is gone)",
                    kubelet.node, c.pod
                ),
            );
        }
    }

    fn kill_container(&mut self, uid: &str, machine: &InstanceId) {
        self.containers
            .retain(|c| !(c.pod_uid == uid && &c.machine == machine));
    }

    // The controllers.

    fn controllers(&mut self) {
        self.ticks += 1;
        if self.ticks.is_multiple_of(MONITOR_EVERY) {
            self.node_monitor();
        }
        self.taint_manager();
        self.pod_gc();
        self.detach_unused();
        self.statefulset();
        self.scheduler();
        self.attach_needed();
        self.schedule(self.t + TICK, Happening::Controllers);
    }

    /// The node controller: a Node not heard from for the grace period is
    /// `Ready=Unknown`, on its own clock; a Node not Ready is tainted
    /// unreachable, and the taint goes once it is Ready again.
    fn node_monitor(&mut self) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            let heard = self.heard.get(&name).copied().unwrap_or(0);
            let Some(status) = self.nodes.get(&name).map(ready_status) else {
                continue;
            };
            let status = status.map(str::to_owned);
            if status.as_deref() == Some("True") && self.t - heard >= GRACE {
                let t = self.t;
                self.patch_ready(&name, "Unknown", "NodeStatusUnknown", t);
                self.story.say(
                    t,
                    format!(
                        "node controller: {name} not heard from for {}: Ready=Unknown",
                        secs(t - heard)
                    ),
                );
            }
            let ready = self.nodes.get(&name).map(ready_status) == Some(Some("True"));
            let tainted = self
                .nodes
                .get(&name)
                .is_some_and(|n| has_taint(n, UNREACHABLE));
            if !ready && !tainted {
                self.add_unreachable(&name);
            } else if ready && tainted {
                self.remove_taint(&name, UNREACHABLE);
            }
        }
    }

    fn patch_ready(&mut self, name: &str, status: &str, reason: &str, at: Ms) {
        let rv = self.next_rv();
        let Some(node) = self.nodes.get_mut(name) else {
            return;
        };
        let conditions = node
            .status
            .get_or_insert_default()
            .conditions
            .get_or_insert_default();
        let heartbeat = conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.last_heartbeat_time.clone());
        conditions.retain(|c| c.type_ != "Ready");
        let mut condition = ready(status, reason, at);
        condition.last_heartbeat_time = heartbeat;
        conditions.push(condition);
        node.metadata.resource_version = Some(rv);
    }

    fn add_unreachable(&mut self, name: &str) {
        let rv = self.next_rv();
        let at = Time(timestamp(self.t));
        let Some(node) = self.nodes.get_mut(name) else {
            return;
        };
        let taints = node
            .spec
            .get_or_insert_default()
            .taints
            .get_or_insert_default();
        for effect in ["NoSchedule", "NoExecute"] {
            taints.push(Taint {
                key: UNREACHABLE.into(),
                effect: effect.into(),
                time_added: (effect == "NoExecute").then(|| at.clone()),
                value: None,
            });
        }
        node.metadata.resource_version = Some(rv);
        self.story
            .say(self.t, format!("node controller taints {name} unreachable"));
    }

    fn remove_taint(&mut self, name: &str, key: &str) {
        let rv = self.next_rv();
        if let Some(node) = self.nodes.get_mut(name) {
            if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                taints.retain(|t| t.key != key);
            }
            node.metadata.resource_version = Some(rv);
        }
    }

    /// The taint manager: a pod that does not tolerate a `NoExecute` taint
    /// of its Node is deleted (gracefully: it stays until its kubelet, or
    /// the pod garbage collector, finishes it).
    fn taint_manager(&mut self) {
        let names: Vec<String> = self.pods.keys().cloned().collect();
        for name in names {
            let Some(pod) = self.pods.get(&name) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(node) = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .and_then(|n| self.nodes.get(n))
            else {
                continue;
            };
            let stays = self.members.iter().any(|m| m.pod == name && m.stays);
            let out_of_service = has_taint(node, OUT_OF_SERVICE_KEY) && !stays;
            let unreachable = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .filter(|t| t.key == UNREACHABLE && t.effect == "NoExecute")
                .filter_map(|t| t.time_added.as_ref())
                .any(|added| self.t - (added.0.as_millisecond() - EPOCH_MS) >= TOLERATION);
            if out_of_service || (unreachable && !stays) {
                let node_name = node.metadata.name.clone().unwrap_or_default();
                if let Some(pod) = self.pods.get_mut(&name) {
                    pod.metadata.deletion_timestamp = Some(Time(timestamp(self.t)));
                }
                self.story.say(
                    self.t,
                    format!("taint manager evicts {name} from {node_name}"),
                );
            }
        }
    }

    /// The pod garbage collector: a pod being deleted on a Node that is
    /// not Ready and carries the out-of-service taint is deleted for good.
    fn pod_gc(&mut self) {
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.metadata.deletion_timestamp.is_some())
            .filter(|(_, p)| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .and_then(|n| self.nodes.get(n))
                    .is_some_and(|n| {
                        has_taint(n, OUT_OF_SERVICE_KEY) && ready_status(n) != Some("True")
                    })
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            self.pods.remove(&name);
            self.story.say(
                self.t,
                format!("pod garbage collector force-deletes {name} (out-of-service Node)"),
            );
        }
    }

    /// The attach/detach controller frees a disk no pod of its Node uses:
    /// at once on an out-of-service Node, or once its kubelet unmounted it
    /// on a Ready one; never on a silent Node without the taint (the
    /// six-minute force-detach is taken as switched off).
    fn detach_unused(&mut self) {
        let names: Vec<String> = self.vas.keys().cloned().collect();
        for name in names {
            let Some(va) = self.vas.get(&name) else {
                continue;
            };
            let node = va.spec.node_name.clone();
            let pv = va
                .spec
                .source
                .persistent_volume_name
                .clone()
                .unwrap_or_default();
            let Some(member) = self.members.iter().find(|m| m.pv == pv).cloned() else {
                continue;
            };
            let used = self.pods.values().any(|p| {
                pod_ids(p).0 == member.pod
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
            });
            if used {
                continue;
            }
            // The attachment this VolumeAttachment stands for: the disk's,
            // wherever it is attached.
            let disk = self
                .disks
                .get(&member.volume)
                .and_then(|d| d.attachment.clone());
            let fenced = self
                .nodes
                .get(&node)
                .is_some_and(|n| has_taint(n, OUT_OF_SERVICE_KEY));
            let ready = self.nodes.get(&node).map(ready_status) == Some(Some("True"));
            let mounted = disk.as_ref().is_some_and(|(on, _)| {
                self.containers
                    .iter()
                    .any(|c| c.volume == member.volume && &c.machine == on)
            });
            if !(fenced || (ready && !mounted)) {
                continue;
            }
            match disk {
                Some((on, Attach::Attached | Attach::Attaching)) => {
                    self.story.say(
                        self.t,
                        format!(
                            "attach/detach controller detaches {} from {on} ({node})",
                            member.volume
                        ),
                    );
                    self.start_detach(&member.volume);
                }
                Some((_, Attach::Detaching)) => {}
                _ => {
                    self.remove_attachment(&name);
                }
            }
        }
    }

    /// Starts detaching `volume` (completes in a second or two).
    pub fn start_detach(&mut self, volume: &VolumeId) {
        let after = self.rng.i64(500..2_500);
        let Some(disk) = self.disks.get_mut(volume) else {
            return;
        };
        if let Some((_, phase)) = disk.attachment.as_mut() {
            *phase = Attach::Detaching;
        }
        disk.epoch += 1;
        let epoch = disk.epoch;
        self.schedule(
            self.t + after,
            Happening::Disk {
                id: volume.clone(),
                epoch,
            },
        );
    }

    fn disk_done(&mut self, id: &VolumeId, epoch: u64) {
        let Some(disk) = self.disks.get_mut(id) else {
            return;
        };
        if disk.epoch != epoch {
            return;
        }
        match disk.attachment.clone() {
            Some((machine, Attach::Detaching)) => {
                disk.attachment = None;
                self.story
                    .say(self.t, format!("EC2: {id} detached from {machine}"));
                let vas: Vec<String> = self
                    .vas
                    .iter()
                    .filter(|(_, va)| self.va_volume(va).as_ref() == Some(id))
                    .map(|(n, _)| n.clone())
                    .collect();
                for va in vas {
                    self.remove_attachment(&va);
                }
            }
            Some((machine, Attach::Attaching)) => {
                disk.attachment = Some((machine.clone(), Attach::Attached));
                self.story
                    .say(self.t, format!("EC2: {id} attached to {machine}"));
                let vas: Vec<String> = self
                    .vas
                    .iter()
                    .filter(|(_, va)| self.va_volume(va).as_ref() == Some(id))
                    .map(|(n, _)| n.clone())
                    .collect();
                for va in vas {
                    self.attachment_done(&va);
                }
            }
            _ => {}
        }
    }

    fn va_volume(&self, va: &VolumeAttachment) -> Option<VolumeId> {
        let pv = va.spec.source.persistent_volume_name.as_deref()?;
        self.members
            .iter()
            .find(|m| m.pv == pv)
            .map(|m| m.volume.clone())
    }

    fn attachment_done(&mut self, name: &str) {
        let Some(va) = self.vas.get_mut(name) else {
            return;
        };
        va.status = Some(VolumeAttachmentStatus {
            attached: true,
            ..VolumeAttachmentStatus::default()
        });
        let node = va.spec.node_name.clone();
        let Some(volume) = self.vas.get(name).and_then(|va| self.va_volume(va)) else {
            return;
        };
        let unique = kube_read::csi_unique_name(&csi(&volume));
        let rv = self.next_rv();
        if let Some(n) = self.nodes.get_mut(&node) {
            let attached = n
                .status
                .get_or_insert_default()
                .volumes_attached
                .get_or_insert_default();
            if !attached.iter().any(|a| a.name == unique) {
                attached.push(AttachedVolume {
                    name: unique,
                    device_path: String::new(),
                });
            }
            n.metadata.resource_version = Some(rv);
        }
    }

    /// Deletes the VolumeAttachment `name`, and its record on the Node.
    pub fn remove_attachment(&mut self, name: &str) {
        let Some(va) = self.vas.remove(name) else {
            return;
        };
        let node = va.spec.node_name.clone();
        if let Some(volume) = self.va_volume(&va) {
            let unique = kube_read::csi_unique_name(&csi(&volume));
            let rv = self.next_rv();
            if let Some(n) = self.nodes.get_mut(&node) {
                if let Some(attached) = n.status.as_mut().and_then(|s| s.volumes_attached.as_mut())
                {
                    attached.retain(|a| a.name != unique);
                }
                n.metadata.resource_version = Some(rv);
            }
        }
        self.story
            .say(self.t, format!("VolumeAttachment of {node} deleted"));
    }

    /// The StatefulSet recreates each of its pods that is gone, under the
    /// same name, as another object.
    fn statefulset(&mut self) {
        let missing: Vec<Member> = self
            .members
            .iter()
            .filter(|m| !self.pods.contains_key(&m.pod))
            .cloned()
            .collect();
        for member in missing {
            let uid = self.uid(&member.pod);
            let pod = pod_object(&member, &uid, None);
            self.pods.insert(member.pod.clone(), pod);
            self.story.say(
                self.t,
                format!("StatefulSet creates {} again (uid {uid})", member.pod),
            );
        }
    }

    /// The scheduler binds each pod not bound yet to the first Node that is
    /// Ready and untainted.
    fn scheduler(&mut self) {
        let waiting: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
            .map(|(n, _)| n.clone())
            .collect();
        for name in waiting {
            let target = self
                .nodes
                .iter()
                .find(|(_, n)| {
                    ready_status(n) == Some("True")
                        && n.spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_none_or(|t| t.iter().all(|t| t.effect == "PreferNoSchedule"))
                })
                .map(|(n, _)| n.clone());
            let Some(node) = target else {
                continue;
            };
            if let Some(spec) = self.pods.get_mut(&name).and_then(|p| p.spec.as_mut()) {
                spec.node_name = Some(node.clone());
            }
            self.story
                .say(self.t, format!("scheduler binds {name} to {node}"));
        }
    }

    /// The attach/detach controller attaches the disk of each pod bound to
    /// a Node whose machine runs, once the disk is free.
    fn attach_needed(&mut self) {
        let bound: Vec<(String, String)> = self
            .pods
            .iter()
            .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
            .filter_map(|(name, p)| Some((name.clone(), p.spec.as_ref()?.node_name.clone()?)))
            .collect();
        for (pod, node) in bound {
            let Some(member) = self.members.iter().find(|m| m.pod == pod).cloned() else {
                continue;
            };
            let Some(machine) = self.attach_machine(&node) else {
                continue;
            };
            let runs = self
                .machines
                .get(&machine)
                .is_some_and(|m| m.power == Power::Running);
            let free = self
                .disks
                .get(&member.volume)
                .is_some_and(|d| d.attachment.is_none());
            if !(runs && free) {
                continue;
            }
            self.attach(&member, &node, &machine);
        }
    }

    fn attach(&mut self, member: &Member, node: &str, machine: &InstanceId) {
        let name = volumes::attachment_name(&csi(&member.volume), node);
        let uid = self.uid("va");
        self.vas
            .insert(name.clone(), va_object(&name, &uid, node, &member.pv));
        let after = self.rng.i64(500..2_500);
        if let Some(disk) = self.disks.get_mut(&member.volume) {
            disk.attachment = Some((machine.clone(), Attach::Attaching));
            disk.epoch += 1;
            let epoch = disk.epoch;
            self.schedule(
                self.t + after,
                Happening::Disk {
                    id: member.volume.clone(),
                    epoch,
                },
            );
        }
        self.story.say(
            self.t,
            format!(
                "attach/detach controller attaches {} to {machine} ({node})",
                member.volume
            ),
        );
    }

    fn add_member(&mut self, node: &str, machine: &InstanceId, stays: bool) {
        let n = self.members.len();
        let volume = VolumeId::parse(&format!("vol-{:08x}", 0xb000_0000_u32 + n as u32))
            .unwrap_or_else(|| unreachable!("a well-formed volume id"));
        let member = Member {
            pod: format!("db-{n}"),
            claim: format!("data-db-{n}"),
            pv: format!("pv-db-{n}"),
            volume: volume.clone(),
            stays,
        };
        self.pvs.push(pv_object(&member));
        self.disks.insert(
            volume.clone(),
            Disk {
                id: volume.clone(),
                attachment: Some((machine.clone(), Attach::Attached)),
                epoch: 0,
            },
        );
        let uid = self.uid(&member.pod);
        self.pods
            .insert(member.pod.clone(), pod_object(&member, &uid, Some(node)));
        let name = volumes::attachment_name(&csi(&volume), node);
        let va_uid = self.uid("va");
        self.vas
            .insert(name.clone(), va_object(&name, &va_uid, node, &member.pv));
        self.members.push(member.clone());
        self.attachment_done(&name);
        self.containers.push(Container {
            node: node.to_owned(),
            pod: member.pod.clone(),
            pod_uid: uid,
            volume,
            machine: machine.clone(),
        });
    }

    // Moves: what the adversary changes, each told in the story.

    /// A stop asked for: `stopping` now (the stop's time recorded), the
    /// guest's shutdown stops its kubelets after `kubelet_after`, and the
    /// machine is `stopped` after `shutdown`.
    pub fn stop(&mut self, id: &InstanceId, shutdown: Ms, kubelet_after: Ms) {
        self.shut_down(
            id,
            Power::Stopping,
            Power::Stopped,
            (shutdown, kubelet_after),
        );
    }

    /// A termination asked for: as a stop, through `shutting-down` to
    /// `terminated`.
    pub fn terminate(&mut self, id: &InstanceId, shutdown: Ms, kubelet_after: Ms) {
        self.shut_down(
            id,
            Power::ShuttingDown,
            Power::Terminated,
            (shutdown, kubelet_after),
        );
    }

    fn shut_down(
        &mut self,
        id: &InstanceId,
        via: Power,
        to: Power,
        (shutdown, kubelet_after): (Ms, Ms),
    ) {
        let t = self.t;
        if !self
            .machines
            .get(id)
            .is_some_and(|m| m.power.guest_up() || m.power == Power::Pending)
        {
            return;
        }
        self.record(id, via, None, Some(t));
        let epoch = self.machines.get(id).map_or(0, |m| m.epoch);
        self.schedule(
            t + shutdown,
            Happening::Power {
                id: id.clone(),
                to,
                epoch,
            },
        );
        let ks: Vec<usize> = (0..self.kubelets.len())
            .filter(|k| &self.kubelets[*k].machine == id)
            .collect();
        for k in ks {
            let kgen = self.kubelets[k].epoch;
            self.schedule(
                t + kubelet_after.min(shutdown),
                Happening::KubeletStops { k, epoch: kgen },
            );
        }
        self.story.say(
            t,
            format!(
                "adversary: EC2 {} {id} (shutdown {}, its kubelet stops after {})",
                if to == Power::Terminated {
                    "terminates"
                } else {
                    "stops"
                },
                secs(shutdown),
                secs(kubelet_after.min(shutdown))
            ),
        );
    }

    /// Power lost at once (a host failure): `stopped` now, nothing more
    /// written or renewed.
    pub fn crash(&mut self, id: &InstanceId) {
        if !self.machines.get(id).is_some_and(|m| m.power.is_on()) {
            return;
        }
        let t = self.t;
        self.record(id, Power::Stopped, None, Some(t));
        self.story
            .say(t, format!("adversary: {id} loses power: stopped at once"));
        self.machine_off(id, Power::Stopped);
    }

    /// A stopped machine started: `pending`, then `running` after `boot`.
    pub fn start(&mut self, id: &InstanceId, boot: Ms) {
        if self
            .machines
            .get(id)
            .is_none_or(|m| m.power != Power::Stopped)
        {
            return;
        }
        let t = self.t;
        self.record(id, Power::Pending, Some(t), None);
        let epoch = self.machines.get(id).map_or(0, |m| m.epoch);
        self.schedule(
            t + boot,
            Happening::Power {
                id: id.clone(),
                to: Power::Running,
                epoch,
            },
        );
        self.story.say(
            t,
            format!("adversary: EC2 starts {id} (boots in {})", secs(boot)),
        );
    }

    /// Another machine launched, whose kubelet serves the Node name `node`
    /// in place of the one that did, as `how` says.
    pub fn replace(&mut self, node: &str, how: Replacement) {
        let Some(k) = self.kubelets.iter().rposition(|k| k.node == node) else {
            return;
        };
        let old = self.kubelets[k].machine.clone();
        self.kubelets[k].retired = true;
        if how == Replacement::OldRuns {
            self.kubelets[k].epoch += 1;
            self.kubelets[k].process = Process::Dead;
        } else if self
            .machines
            .get(&old)
            .is_some_and(|m| m.power == Power::Stopped)
        {
            // A stopped machine terminated: it never comes back.
            self.record(&old, Power::Terminated, None, None);
            self.story
                .say(self.t, format!("adversary: EC2 terminates {old}, stopped"));
            self.machine_off(&old, Power::Terminated);
        } else {
            self.terminate(&old, 1_000, 0);
        }
        let reregister = how == Replacement::Registered;
        // EC2 gives a private DNS name to one machine at a time: it follows
        // the address, which a machine keeps while it runs. A replacement
        // launched while another machine runs under the Node's name gets a
        // name of its own, and its kubelet serves the Node's by an override.
        let taken = self.machines.values().any(|m| {
            m.host == node && m.power.is_on() && (how == Replacement::OldRuns || m.id != old)
        });
        let new = self.launch(node, self.t);
        if taken && let Some(m) = self.machines.get_mut(&new) {
            m.host = format!("ip-{}", m.ip.replace('.', "-"));
        }
        let kubelet = Kubelet {
            node: node.to_owned(),
            machine: new.clone(),
            process: Process::Alive,
            skew: self.kubelets[k].skew,
            renew_every: RENEW_EVERY,
            boot_id: format!("boot-{new}-1"),
            noted: true,
            serving: false,
            retired: false,
            alive_since: self.t,
            renewals: 0,
            epoch: 0,
        };
        self.kubelets.push(kubelet);
        let k2 = self.kubelets.len() - 1;
        let words = match how {
            Replacement::Registered => "the Node registered again",
            Replacement::Adopted => "adopting the old Node object",
            Replacement::OldRuns => {
                "adopting the old Node object; the old machine runs on, its kubelet stopped"
            }
        };
        self.story.say(
            self.t,
            format!(
                "adversary: {new} launched in place of {old}; its kubelet serves {node}{}, {words}",
                if taken {
                    " by an override (a machine runs under the name)"
                } else {
                    ""
                }
            ),
        );
        if reregister {
            self.delete_node(node);
        }
        let boot = self.rng.i64(5_000..30_000);
        self.schedule(self.t + boot, Happening::Renew { k: k2, epoch: 0 });
    }

    /// The Node object `node` deleted; its kubelet, when it runs,
    /// registers it again as another object at its next renewal.
    pub fn delete_node(&mut self, node: &str) {
        let Some(gone) = self.nodes.remove(node) else {
            return;
        };
        let owner = gone.metadata.uid.clone().unwrap_or_default();
        // Its CSINode, owned by it, goes with it.
        self.csi_nodes.remove(node);
        self.story
            .say(self.t, format!("the Node {node} (uid {owner}) is deleted"));
        self.schedule(
            self.t + 2_000,
            Happening::LeaseGc {
                node: node.to_owned(),
                owner,
            },
        );
    }

    /// The kubelet `k` hangs, dies or revives.
    pub fn set_process(&mut self, k: usize, process: Process) {
        let kubelet = &mut self.kubelets[k];
        if kubelet.process == process {
            return;
        }
        kubelet.process = process;
        kubelet.noted = true;
        kubelet.epoch += 1;
        if process == Process::Alive {
            kubelet.alive_since = self.t;
        }
        let (node, machine, epoch) = (kubelet.node.clone(), kubelet.machine.clone(), kubelet.epoch);
        let word = match process {
            Process::Alive => "revives",
            Process::Hung => "hangs",
            Process::Dead => "dies",
        };
        self.story.say(
            self.t,
            format!("adversary: kubelet of {node} on {machine} {word}"),
        );
        if process == Process::Alive {
            let after = self.rng.i64(100..2_000);
            self.schedule(self.t + after, Happening::Renew { k, epoch });
        }
    }

    /// The kubelet `k`'s clock set `skew` off the true time.
    pub fn set_skew(&mut self, k: usize, skew: Ms) {
        let kubelet = &mut self.kubelets[k];
        kubelet.skew = skew;
        kubelet.noted = true;
        let node = kubelet.node.clone();
        self.story.say(
            self.t,
            format!(
                "adversary: the clock of {node}'s kubelet is {} off",
                secs(skew)
            ),
        );
    }

    /// The cloud reports `id` off `lag` late.
    pub fn set_lag(&mut self, id: &InstanceId, lag: Ms) {
        if let Some(m) = self.machines.get_mut(id) {
            m.lag = lag;
            self.story.say(
                self.t,
                format!("adversary: EC2's answers about {id} lag {}", secs(lag)),
            );
        }
    }

    /// The kill switch turned on or off.
    pub fn set_kill_switch(&mut self, on: bool) {
        if self.kill_switch != on {
            self.kill_switch = on;
            self.story.say(
                self.t,
                format!("adversary: kill switch {}", if on { "on" } else { "off" }),
            );
        }
    }

    /// An operator's taint on `node`: `key:effect` (another writer's, for
    /// node-fencer to keep).
    pub fn operator_taint(&mut self, node: &str, key: &str, value: Option<&str>, effect: &str) {
        let rv = self.next_rv();
        let at = Time(timestamp(self.t));
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        let taints = n
            .spec
            .get_or_insert_default()
            .taints
            .get_or_insert_default();
        if taints.iter().any(|t| t.key == key && t.effect == effect) {
            return;
        }
        taints.push(Taint {
            key: key.into(),
            value: value.map(str::to_owned),
            effect: effect.into(),
            time_added: Some(at),
        });
        n.metadata.resource_version = Some(rv);
        self.story.say(
            self.t,
            format!(
                "adversary: an operator taints {node} {key}={}:{effect}",
                value.unwrap_or("")
            ),
        );
    }
}

/// How a machine is replaced under a Node name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replacement {
    /// The old machine terminated; the Node deleted and registered again
    /// (a new uid, the new machine's provider id).
    Registered,
    /// The old machine terminated; the Node object kept as it was (still
    /// naming the old machine) and adopted by the new kubelet.
    Adopted,
    /// As [`Self::Adopted`], the old machine running on without its
    /// kubelet: a stale Node naming a machine a later stop may take down.
    OldRuns,
}

/// The `Ready` condition, at `at` on the writer's clock.
fn ready(status: &str, reason: &str, at: Ms) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        last_heartbeat_time: Some(Time(timestamp(at))),
        last_transition_time: Some(Time(timestamp(at))),
        message: None,
    }
}

/// The Node's `Ready` status.
pub fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

/// True when the Node carries a taint with `key` whose effect evicts
/// (`NoExecute`).
pub fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == key && t.effect == OUT_OF_SERVICE_EFFECT)
        })
}

/// True when `taint` is node-fencer's out-of-service taint (either effect).
pub fn is_fencers(taint: &Taint) -> bool {
    taint.key == OUT_OF_SERVICE_KEY && taint.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
}

/// A pod's name and uid.
pub fn pod_ids(pod: &Pod) -> (String, String) {
    (
        pod.metadata.name.clone().unwrap_or_default(),
        pod.metadata.uid.clone().unwrap_or_default(),
    )
}

fn csi(volume: &VolumeId) -> CsiVolume {
    CsiVolume {
        driver: EBS_CSI_DRIVER.into(),
        handle: volume.to_string(),
    }
}

fn pod_object(member: &Member, uid: &str, node: Option<&str>) -> Pod {
    let mut tolerations: Vec<Toleration> = ["not-ready", "unreachable"]
        .iter()
        .map(|what| Toleration {
            key: Some(format!("node.kubernetes.io/{what}")),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(300),
            value: None,
        })
        .collect();
    if member.stays {
        tolerations.push(Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        });
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(member.pod.clone()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_owned),
            containers: vec![PodContainer {
                name: "db".into(),
                ..PodContainer::default()
            }],
            volumes: Some(vec![PodVolume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: member.claim.clone(),
                    read_only: None,
                }),
                ..PodVolume::default()
            }]),
            tolerations: Some(tolerations),
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn pv_object(member: &Member) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(member.pv.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: EBS_CSI_DRIVER.into(),
                volume_handle: member.volume.to_string(),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: Some(ObjectReference {
                namespace: Some("default".into()),
                name: Some(member.claim.clone()),
                ..ObjectReference::default()
            }),
            // An EBS volume: one node at a time.
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

fn va_object(name: &str, uid: &str, node: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: EBS_CSI_DRIVER.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..VolumeAttachmentSource::default()
            },
        },
        status: None,
    }
}

/// RFC 7386 JSON merge patch, as the apiserver applies one.
pub fn merge(target: &mut Value, patch: &Value) {
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
