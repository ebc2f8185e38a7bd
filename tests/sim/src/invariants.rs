//! The invariants, held against the world's ground truth (never against
//! what the pipeline believed): at every write the shells receive
//! ([`at_write`], [`taints_kept`], [`cap_kept`]), and once the adversary has
//! stopped and enough time has passed ([`liveness`]). Two machines writing
//! one disk is checked by the world itself, after everything that happens
//! ([`crate::world::World::writers`]).

use k8s_openapi::api::core::v1::Node;
use node_fencer::core::model::facts::OUT_OF_SERVICE_KEY;
use node_fencer::core::model::instance::{InstanceId, VolumeId};
use node_fencer::core::settings::policy::Policy;

use crate::world::{Attach, Power, World, has_taint, is_fencers, ready_status};

/// How long a kubelet must have been alive and serving before a power-off
/// of its machine is a fault: three renewals, each reporting its Node
/// Ready, before the look under the Lease that precedes the stop.
const LIVE_FOR: crate::world::Ms = 30_000;

/// A write the pipeline sends, as the checks see it.
#[derive(Clone, Copy, Debug)]
pub enum Write<'a> {
    /// The out-of-service taint on a Node.
    Taint(&'a str),
    /// `Ready=Unknown` on a Node (`FAST_NOT_READY`).
    Mark(&'a str),
    /// A pod of a Node force-deleted.
    DeletePod {
        /// The Node it is bound to.
        node: &'a str,
        /// The pod.
        pod: &'a str,
        /// Its uid.
        uid: &'a str,
    },
    /// A VolumeAttachment of a Node deleted (legacy mode).
    DeleteAttachment(&'a str),
    /// A Node's `volumesInUse` released (legacy mode).
    ReleaseInUse(&'a str),
    /// A disk force-detached from a machine.
    Detach {
        /// The disk.
        volume: &'a VolumeId,
        /// The machine.
        machine: &'a InstanceId,
    },
    /// A machine powered off (active fencing).
    PowerOff(&'a InstanceId),
    /// A fencing ended, or confirmed, or a power-off marked or unmarked.
    Other(&'static str, &'a str),
    /// An Event, the fencing Lease, the census: writes only a dry run
    /// forbids.
    Bookkeeping(&'static str),
}

impl Write<'_> {
    /// What a fencing write does to a Node whose machine may still run.
    fn fences(&self) -> Option<(&str, String)> {
        match *self {
            Self::Taint(node) => Some((node, format!("tainted {node}"))),
            Self::Mark(node) => Some((node, format!("marked {node} Ready=Unknown"))),
            Self::DeletePod { node, pod, .. } => {
                Some((node, format!("force-deleted {pod} of {node}")))
            }
            Self::DeleteAttachment(node) => {
                Some((node, format!("deleted a VolumeAttachment of {node}")))
            }
            Self::ReleaseInUse(node) => {
                Some((node, format!("released the volumes in use of {node}")))
            }
            Self::Detach { .. } | Self::PowerOff(_) | Self::Other(..) | Self::Bookkeeping(_) => {
                None
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Taint(node) => format!("the taint of {node}"),
            Self::Mark(node) => format!("the mark of {node}"),
            Self::DeletePod { pod, .. } => format!("the deletion of {pod}"),
            Self::DeleteAttachment(node) => format!("a VolumeAttachment deletion on {node}"),
            Self::ReleaseInUse(node) => format!("the release of {node}'s volumes"),
            Self::Detach { volume, machine } => format!("the detach of {volume} from {machine}"),
            Self::PowerOff(machine) => format!("the power-off of {machine}"),
            Self::Other(what, node) => format!("{what} on {node}"),
            Self::Bookkeeping(what) => (*what).to_owned(),
        }
    }
}

/// What one invocation has read that its writes are held to.
#[derive(Clone, Debug, Default)]
pub struct Heard {
    /// The invocation's name (its correlation id).
    pub name: String,
    /// It read the kill switch on (or could not read it, which counts as
    /// on): nothing it writes after that may fence or unfence.
    pub switch_on: bool,
}

/// The invariants a write breaks, given the world as it is when the shell
/// receives it: nothing that fences (a taint, a mark, a pod deleted, an
/// attachment deleted) on a Node any of whose machines is on (the one its
/// object names, or one a kubelet serving its name runs on); no detach from
/// a machine that is on; no power-off of a machine a live kubelet serves
/// from; nothing in a dry run; nothing that fences or unfences once the
/// invocation read the kill switch on.
pub fn at_write(world: &World, policy: &Policy, heard: &Heard, write: &Write<'_>) -> Vec<String> {
    let who = &heard.name;
    let mut broken = Vec::new();
    if policy.dry_run {
        broken.push(format!("{who} wrote {} in a dry run", write.describe()));
    }
    if heard.switch_on && !matches!(write, Write::Bookkeeping(_)) {
        broken.push(format!(
            "{who} wrote {} after reading the kill switch on",
            write.describe()
        ));
    }
    if let Some((node, did)) = write.fences() {
        let live = world.live_machines_of(node);
        if !live.is_empty() {
            broken.push(format!(
                "{who} {did} while {}",
                on_words(world, node, &live)
            ));
        }
    }
    match write {
        Write::DeletePod { pod, uid, .. } => {
            let running: Vec<String> = world
                .containers
                .iter()
                .filter(|c| c.pod_uid == *uid)
                .filter(|c| world.machine(&c.machine).is_some_and(|m| m.power.is_on()))
                .map(|c| c.machine.to_string())
                .collect();
            if !running.is_empty() {
                broken.push(format!(
                    "{who} force-deleted {pod} while it still runs on {}",
                    running.join(", ")
                ));
            }
        }
        Write::Detach { volume, machine } if world.in_use(machine) => {
            let power = world.machine(machine).map_or(Power::Running, |m| m.power);
            let writes = world.writers(volume).contains(machine);
            broken.push(format!(
                "{who} detached {volume} from {machine}, which is {} and in use{}",
                power_word(power),
                if writes { ", writing it" } else { "" }
            ));
        }
        Write::PowerOff(machine) if policy.active_fencing.is_none() => {
            broken.push(format!(
                "{who} powered {machine} off with active fencing off"
            ));
        }
        Write::PowerOff(machine) => {
            // Only a hung or dead kubelet's machine is powered off. One that
            // has served a Node and renewed for a while is a live node,
            // whatever its Node said: its Node has been Ready since before
            // the last look under the Lease. (One revived a moment ago may
            // be powered off: no fencer can see a revival after its look.)
            let live: Vec<&str> = world
                .kubelets
                .iter()
                .filter(|k| k.machine == **machine && k.serving && !k.retired)
                .filter(|k| k.process == crate::world::Process::Alive)
                .filter(|k| world.t - k.alive_since > LIVE_FOR)
                .map(|k| k.node.as_str())
                .collect();
            if !live.is_empty() {
                broken.push(format!(
                    "{who} powered {machine} off while the kubelet of {} has run alive on it for over {} s",
                    live.join(", "),
                    LIVE_FOR / 1000
                ));
            }
        }
        _ => {}
    }
    broken
}

/// Says which machines of `node` are on, and whether a kubelet serving it
/// still runs there.
fn on_words(world: &World, node: &str, live: &[InstanceId]) -> String {
    let parts: Vec<String> = live
        .iter()
        .map(|id| {
            let power = world.machine(id).map_or(Power::Running, |m| m.power);
            let mut why: Vec<&str> = Vec::new();
            if world.named_machine(node).as_ref() == Some(id) {
                why.push("named by the Node");
            }
            for k in world
                .kubelets_of(node)
                .filter(|k| &k.machine == id && k.serving)
            {
                why.push(match k.process {
                    crate::world::Process::Alive => "its kubelet of that name alive",
                    crate::world::Process::Hung => "its kubelet of that name hung",
                    crate::world::Process::Dead => "its kubelet of that name dead",
                });
            }
            if world
                .containers
                .iter()
                .any(|c| c.node == node && &c.machine == id)
            {
                why.push("running the Node's containers");
            }
            format!("{id} ({}) is {}", why.join(", "), power_word(power))
        })
        .collect();
    parts.join("; ")
}

fn power_word(power: Power) -> &'static str {
    power.state().name()
}

/// Only node-fencer's own out-of-service taint may leave a Node through
/// node-fencer's writes: every other taint `before` had is still `after`.
pub fn taints_kept(who: &str, before: &Node, after: &Node) -> Option<String> {
    let taints = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
    };
    let after = taints(after);
    let lost: Vec<String> = taints(before)
        .into_iter()
        .filter(|t| !is_fencers(t))
        .filter(|t| {
            !after
                .iter()
                .any(|a| a.key == t.key && a.effect == t.effect && a.value == t.value)
        })
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect();
    let node = before.metadata.name.as_deref().unwrap_or("?");
    (!lost.is_empty()).then(|| {
        format!(
            "{who} removed {} from {node}, a taint not its own",
            lost.join(", ")
        )
    })
}

/// The cap after node-fencer added a taint: no more Nodes carrying its own
/// out-of-service taint than the cap allows, leaving out those whose
/// machine is terminated (dead for good, they take no room by design:
/// `core/rules/cap.rs`). Another writer's taint takes room at decision
/// time; one added while node-fencer held the Lease is a race it cannot
/// see, not counted here.
pub fn cap_kept(world: &World, policy: &Policy, who: &str) -> Option<String> {
    let cap = policy.cap(world.nodes.len());
    let out: Vec<&String> = world
        .nodes
        .iter()
        .filter(|(_, n)| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| is_fencers(t) && t.effect == "NoExecute"))
        })
        .filter(|(name, _)| {
            world
                .named_machine(name)
                .and_then(|id| world.machine(&id).map(|m| m.power))
                .is_none_or(|p| p != Power::Terminated)
        })
        .map(|(name, _)| name)
        .collect();
    (out.len() > cap).then(|| {
        let names: Vec<&str> = out.iter().map(|s| s.as_str()).collect();
        format!(
            "{who}'s taint makes {} Nodes out of service whose machine may come back, over the cap of {cap}: {}",
            out.len(),
            names.join(", ")
        )
    })
}

/// Liveness, once the adversary has stopped and the sweeps had their time:
/// every Node whose machines are all off and that holds a disk (one
/// attached to the machine it names, a VolumeAttachment, a pod bound to
/// it) carries an out-of-service taint, and the machine it names no longer
/// holds the disks of pods that do not tolerate it; unless the cap is
/// full, the run is a dry run, the Node is stale (its kubelet on another
/// machine than the one it names), or a machine that is on carries its name.
pub fn liveness(world: &World, policy: &Policy) -> Vec<String> {
    if policy.dry_run {
        return Vec::new();
    }
    let cap = policy.cap(world.nodes.len());
    let out = world
        .nodes
        .values()
        .filter(|n| has_taint(n, OUT_OF_SERVICE_KEY))
        .count();
    let mut broken = Vec::new();
    for (name, node) in &world.nodes {
        let Some(machine) = world.named_machine(name) else {
            continue;
        };
        let off = world.machine(&machine).is_some_and(|m| !m.power.is_on());
        if !off || !world.live_machines_of(name).is_empty() {
            continue;
        }
        // A Node whose kubelet ran on another machine than the one it names
        // is not judged by that machine: node-fencer refuses it once it
        // knows (`kubelet_elsewhere`), and mending it is a person's (the
        // Node deleted, to be registered again). No fencing is owed.
        if world.is_stale(name) {
            continue;
        }
        // Nor to a Node whose name a machine that is on carries (one a
        // replacement left running, or started again): for all the cloud
        // can tell it serves the Node, so node-fencer refuses it
        // (`name_taken`) until a person stops that machine.
        if world.runs_under_name(name) {
            continue;
        }
        let held = held_disks(world, &machine);
        let bound = world
            .pods
            .values()
            .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()));
        if held.is_empty() && !bound && !world.vas.values().any(|va| va.spec.node_name == *name) {
            continue;
        }
        let power = world
            .machine(&machine)
            .map_or(Power::Terminated, |m| m.power);
        if !has_taint(node, OUT_OF_SERVICE_KEY) {
            if out < cap {
                broken.push(format!(
                    "liveness: {name} is dead ({machine} {}, Ready={}) and holds {}, but was never fenced",
                    power_word(power),
                    ready_status(node).unwrap_or("?"),
                    if held.is_empty() { "pods".to_owned() } else { words(&held) },
                ));
            }
            continue;
        }
        let stuck: Vec<VolumeId> = held
            .into_iter()
            .filter(|v| !world.members.iter().any(|m| &m.volume == v && m.stays))
            .collect();
        if !stuck.is_empty() {
            broken.push(format!(
                "liveness: {name} is fenced, but {} still attached to its machine {machine} ({})",
                words(&stuck),
                power_word(power)
            ));
        }
    }
    broken
}

/// The disks attached to the machine the Node names: node-fencer frees a
/// Node's disks from its own machine only, never from another (a machine
/// it was replaced on holds its disks until someone else frees them).
fn held_disks(world: &World, machine: &InstanceId) -> Vec<VolumeId> {
    world
        .disks
        .values()
        .filter(|d| {
            d.attachment
                .as_ref()
                .is_some_and(|(m, phase)| m == machine && *phase != Attach::Detaching)
        })
        .map(|d| d.id.clone())
        .collect()
}

fn words(volumes: &[VolumeId]) -> String {
    volumes
        .iter()
        .map(VolumeId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}
