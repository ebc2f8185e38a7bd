//! Active fencing: whether a Node that is dead while the cloud still calls
//! its machine running may be powered off, so that it can then be fenced as
//! a stopped one. Pure: the shell gathers the Nodes, the cloud's answer and
//! the status checks, and carries the verdict out.
//!
//! A power-off is the one act that does not wait for the cloud to say the
//! machine is off: it makes it so. Everything that argues the node might
//! still be alive, or that the control plane's view might be wrong, refuses
//! it: a Ready node, a NotReady spell shorter than the set time, a node this
//! invocation cannot tie to its own machine, many nodes going dark at once
//! (a partition or a zone outage looks like that from the control plane),
//! the cap, and a node powered off before that never came back since.

use std::time::Duration;

use serde::Serialize;

use crate::core::inbound::suspect::{Intent, Origin, Suspect};
use crate::core::model::facts::{Confirmation, InstanceFacts, NodeFacts, Readiness, StatusChecks};
use crate::core::model::instance::InstanceState;
use crate::core::rules::reach::{Exemption, Reach};
use crate::core::rules::stuck::Stranding;

/// The alert whose firing makes its node a candidate (kube-prometheus'
/// name for a Node NotReady for 15 minutes).
const NOT_READY_ALERT: &str = "KubeNodeNotReady";

/// The active fencing settings, present only when it is switched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveFencing {
    /// How long a Node must have been NotReady before it may be powered off.
    pub after: Duration,
    /// How long, within the invocation, to wait for the cloud to report a
    /// powered-off machine stopped.
    pub wait: Duration,
    /// The partition guard: refuse when more than this share of the Nodes
    /// (in percent) are dark at once.
    pub partition_percent: u8,
    /// Control-plane Nodes may be powered off too (`POWER_OFF_CONTROL_PLANE`).
    pub control_plane: bool,
    /// Which hung Nodes: those holding a volume stuck on them, or any.
    pub scope: Scope,
}

/// Which hung Nodes active fencing powers off (`ACTIVE_FENCING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `stuck`: only a Node holding a volume Kubernetes does not free on
    /// its own ([`crate::core::rules::stuck`]); the rest are left to
    /// Kubernetes, which evicts and replaces their pods.
    Stuck,
    /// `on`: any hung Node.
    AnyHung,
}

impl Default for ActiveFencing {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(120),
            wait: Duration::from_secs(120),
            partition_percent: 30,
            control_plane: false,
            scope: Scope::AnyHung,
        }
    }
}

/// True for the suspects whose node may be powered off when the rules allow
/// it: the sweep's, a firing `KubeNodeNotReady`, and an operator's
/// `fence --power-off`. An EC2 event or a Compute Engine audit log entry
/// never is: it reports a machine that stops on its own, and a stale one
/// may describe a machine started again.
pub(crate) fn is_candidate(suspect: &Suspect) -> bool {
    suspect.intent == Intent::PowerOff
        || (suspect.intent == Intent::Fence
            && match &suspect.origin {
                Origin::Sweep => true,
                Origin::Alert { alertname, .. } => alertname.as_deref() == Some(NOT_READY_ALERT),
                Origin::Ec2StateChange { .. } | Origin::AuditLog(_) | Origin::Direct => false,
            })
}

/// Why a node is not powered off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Refusal {
    /// Active fencing is off.
    Disabled,
    /// The Node is outside node-fencer's reach (`NODE_SELECTOR`, the
    /// opt-out label).
    Exempt(Exemption),
    /// The Node is Ready.
    NodeReady,
    /// The kubelet reports the Node `Ready=False`: it is alive and talking
    /// (a CNI not ready, a full disk), which is no hang.
    KubeletReporting,
    /// The Node carries the control-plane role: its machine may hold an
    /// etcd member (`POWER_OFF_CONTROL_PLANE=true` allows it).
    ControlPlane,
    /// Other Nodes name the same machine: which of them runs on it is a
    /// question for a person.
    SharedMachine {
        /// The other Nodes.
        others: Vec<String>,
    },
    /// The Node is gone.
    NodeGone,
    /// The Node's machine is not known from its own provider id.
    NotItsOwnMachine,
    /// The machine under the Node's name is not the one judged: recreated
    /// under the same name, or the Node remapped to another machine, since
    /// the first look.
    MachineReplaced {
        /// The machine judged.
        judged: String,
    },
    /// The cloud could not be asked about the machine: a retry asks again.
    LookupFailed,
    /// The cloud does not report the machine `running`.
    NotRunning {
        /// What it reports.
        state: Option<InstanceState>,
    },
    /// The Node has not been NotReady long enough (or says not since when).
    NotReadyTooShort {
        /// Seconds NotReady, when known.
        for_seconds: Option<u64>,
        /// Seconds needed.
        needed: u64,
    },
    /// More Nodes are dark than a single failure explains.
    Partition {
        /// Nodes NotReady and not fenced.
        dark: usize,
        /// All Nodes.
        nodes: usize,
        /// The configured share.
        percent: u8,
    },
    /// Every Node of the node's zone is dark.
    ZoneDark {
        /// The zone.
        zone: String,
        /// Its Nodes.
        nodes: usize,
    },
    /// node-fencer powered it off before and it has not booted and reported
    /// since.
    PoweredOffBefore {
        /// When.
        at: String,
    },
    /// Nothing is stuck on the Node (`ACTIVE_FENCING=stuck`): no pod of it
    /// holds a volume only one node may attach, so Kubernetes frees it.
    NothingStuck,
    /// The Node's volumes or pods could not be read, so whether something
    /// is stuck on it is unknown (`ACTIVE_FENCING=stuck`): a retry reads
    /// them again.
    PodsUnread,
    /// Powering it off would take the cap past its limit.
    CapReached {
        /// The limit.
        limit: usize,
        /// Nodes out of service or being powered off.
        taken: usize,
    },
}

impl Refusal {
    /// A short, stable name for logs, Events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Exempt(e) => e.code(),
            Self::NodeReady => "node_ready",
            Self::KubeletReporting => "kubelet_reporting",
            Self::ControlPlane => "control_plane",
            Self::SharedMachine { .. } => "shared_machine",
            Self::NodeGone => "node_gone",
            Self::NotItsOwnMachine => "not_its_own_machine",
            Self::MachineReplaced { .. } => "machine_replaced",
            Self::LookupFailed => "lookup_failed",
            Self::NotRunning { .. } => "not_running",
            Self::NotReadyTooShort { .. } => "not_ready_too_short",
            Self::Partition { .. } => "partition",
            Self::ZoneDark { .. } => "zone_dark",
            Self::PoweredOffBefore { .. } => "powered_off_before",
            Self::NothingStuck => "nothing_stuck",
            Self::PodsUnread => "pods_unread",
            Self::CapReached { .. } => "cap_reached",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disabled => f.write_str("active fencing is off (ACTIVE_FENCING=stuck or on enables it)"),
            Self::NodeReady => f.write_str("the node is Ready"),
            Self::KubeletReporting => f.write_str(
                "the kubelet reports the node Ready=False: it is alive and talking, so its machine is not hung; only a node whose kubelet went silent (Ready=Unknown) is powered off",
            ),
            Self::ControlPlane => f.write_str(
                "the node carries the control-plane role: its machine may hold an etcd member (POWER_OFF_CONTROL_PLANE=true allows it)",
            ),
            Self::SharedMachine { others } => write!(
                f,
                "other Nodes name the same machine ({}): which of them runs on it is a question for a person",
                others.join(", ")
            ),
            Self::NodeGone => f.write_str("the Node is gone"),
            Self::Exempt(e) => e.fmt(f),
            Self::NotItsOwnMachine => f.write_str(
                "the node names no machine of its own (no provider id of EC2 or Compute Engine): only a node's own machine is powered off",
            ),
            Self::MachineReplaced { judged } => write!(
                f,
                "the machine under the Node's name is no longer {judged}, the one judged (recreated under the same name, or the Node mapped to another machine since): the new one is never powered off for the old one's hang"
            ),
            Self::LookupFailed => f.write_str("the cloud could not be asked about the machine"),
            Self::NotRunning { state } => match state {
                Some(s) => write!(f, "the cloud reports the machine `{s}`, not running"),
                None => f.write_str("the cloud does not know the machine"),
            },
            Self::NotReadyTooShort {
                for_seconds: Some(s),
                needed,
            } => write!(
                f,
                "NotReady for {s} s, not yet the {needed} s of POWER_OFF_AFTER_SECONDS"
            ),
            Self::NotReadyTooShort {
                for_seconds: None,
                needed,
            } => write!(
                f,
                "the node does not say since when it is NotReady, so {needed} s cannot be shown"
            ),
            Self::Partition {
                dark,
                nodes,
                percent,
            } => write!(
                f,
                "{dark} of {nodes} nodes are NotReady, more than PARTITION_PERCENT={percent}: the control plane may be cut off from them (a partition or a zone outage), so none is powered off"
            ),
            Self::ZoneDark { zone, nodes } => write!(
                f,
                "all {nodes} nodes of zone {zone} are NotReady: more likely the zone or its network than this node; none is powered off"
            ),
            Self::PoweredOffBefore { at } => write!(
                f,
                "node-fencer powered it off at {at} and it has not booted and reported since; it is not powered off twice"
            ),
            Self::NothingStuck => f.write_str(
                "nothing is stuck on the node: no pod of it holds a volume only one node may attach, so Kubernetes evicts and replaces its pods by itself (ACTIVE_FENCING=stuck; =on powers off any hung node)",
            ),
            Self::PodsUnread => f.write_str(
                "the node's VolumeAttachments, PersistentVolumes or pods could not be read, so whether something is stuck on it is unknown; a retry reads them again",
            ),
            Self::CapReached { limit, taken } => write!(
                f,
                "refused: {taken} node(s) already out of service or being powered off, the limit is {limit}"
            ),
        }
    }
}

/// One candidate as the judge sees it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// The Node.
    pub node: &'a NodeFacts,
    /// The cloud's answer about the Node's own instance.
    pub confirmation: Option<&'a Confirmation>,
    /// What is stuck on the Node, when read (`ACTIVE_FENCING=stuck`). Not
    /// read yet, the Node is judged as if something were: the shell reads
    /// the Nodes allowed so and judges again, until every Node allowed has
    /// been read, so that nothing is read for a Node another guard refuses.
    pub stranding: Option<&'a Stranding>,
}

/// The cluster around the candidates.
#[derive(Clone, Copy, Debug)]
pub struct Surroundings<'a> {
    /// Every Node (a full view: the partition guard counts them all, and
    /// only a full view shows every Node that names a machine).
    pub nodes: &'a [NodeFacts],
    /// Nodes taking room under the cap, power-offs in flight included
    /// ([`crate::core::rules::cap::counts`]).
    pub out_of_service: usize,
    /// The cap in force.
    pub limit: usize,
    /// Now, in Unix seconds.
    pub now: i64,
    /// The Nodes node-fencer may act on.
    pub reach: &'a Reach,
}

/// The verdict on one candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
pub enum PowerVerdict {
    /// Power it off.
    PowerOff {
        /// How long it has been NotReady, in seconds.
        not_ready_for: u64,
        /// The time of node-fencer's earlier power-off mark that never
        /// took effect ([`mark_lapsed`]), when there was one.
        #[serde(skip_serializing_if = "Option::is_none")]
        lapsed: Option<String>,
    },
    /// Leave it running.
    Refuse {
        /// Why.
        refusal: Refusal,
    },
}

/// Seconds the Node has been NotReady, when it says since when.
pub fn not_ready_for(node: &NodeFacts, now: i64) -> Option<u64> {
    if node.readiness == Readiness::Ready {
        return None;
    }
    let since = node.power.not_ready_since?;
    u64::try_from(now.saturating_sub(since)).ok()
}

/// How long after node-fencer fenced or powered off a Node it still counts
/// as dark for the partition guards: a zone that goes dark node by node, one
/// sweep at a time, is one outage, not several.
const RECENTLY_SECS: i64 = 30 * 60;

/// Whether a Node counts as dark for the partition guards (`Some(true)`),
/// as lit (`Some(false)`), or not at all (`None`: fenced long ago, it is
/// out of the picture).
fn dark(node: &NodeFacts, now: i64) -> Option<bool> {
    let recent = |at: Option<&str>| {
        at.and_then(crate::core::model::values::unix_seconds)
            .is_some_and(|t| now.saturating_sub(t) < RECENTLY_SECS)
    };
    let acted_recently = recent(node.fenced.as_ref().map(|m| m.at.as_str()))
        || recent(node.power.powered_off.as_ref().map(|m| m.at.as_str()));
    if node.readiness == Readiness::Ready {
        return Some(false);
    }
    if node.is_out_of_service() && !acted_recently {
        return None;
    }
    Some(true)
}

/// The partition guard over the whole cluster, for a candidate in `zone`.
pub fn partition(
    nodes: &[NodeFacts],
    zone: Option<&str>,
    percent: u8,
    now: i64,
) -> Option<Refusal> {
    let dark_count = nodes.iter().filter(|n| dark(n, now) == Some(true)).count();
    // One dark node is what a single failure looks like, whatever the size.
    if dark_count > 1 && dark_count * 100 > nodes.len() * usize::from(percent) {
        return Some(Refusal::Partition {
            dark: dark_count,
            nodes: nodes.len(),
            percent,
        });
    }
    let zone = zone?;
    let in_zone: Vec<bool> = nodes
        .iter()
        .filter(|n| n.power.zone.as_deref() == Some(zone))
        .filter_map(|n| dark(n, now))
        .collect();
    (in_zone.len() > 1 && in_zone.iter().all(|d| *d)).then(|| Refusal::ZoneDark {
        zone: zone.to_owned(),
        nodes: in_zone.len(),
    })
}

/// The other Nodes that name `node`'s machine (a re-registration under a
/// new name, a changed hostname override, a restore).
pub fn others_naming<'a>(node: &NodeFacts, nodes: &'a [NodeFacts]) -> Vec<&'a str> {
    let Some(own) = node.instance.as_ref() else {
        return Vec::new();
    };
    nodes
        .iter()
        .filter(|n| n.name != node.name && n.instance.as_ref() == Some(own))
        .map(|n| n.name.as_str())
        .collect()
}

/// Judges every candidate in turn; each one powered off takes room under the
/// cap from those after it.
pub fn judge(
    candidates: &[Candidate<'_>],
    around: &Surroundings<'_>,
    settings: Option<&ActiveFencing>,
) -> Vec<PowerVerdict> {
    let mut taken = around.out_of_service;
    candidates
        .iter()
        .map(|c| {
            let verdict = judge_one(c, around, settings, taken);
            // A lapsed mark counted its Node already; its new power-off
            // takes the same room.
            if matches!(verdict, PowerVerdict::PowerOff { lapsed: None, .. }) {
                taken += 1;
            }
            verdict
        })
        .collect()
}

fn judge_one(
    c: &Candidate<'_>,
    around: &Surroundings<'_>,
    settings: Option<&ActiveFencing>,
    taken: usize,
) -> PowerVerdict {
    let refuse = |refusal| PowerVerdict::Refuse { refusal };
    let Some(settings) = settings else {
        return refuse(Refusal::Disabled);
    };
    let node = c.node;
    if let Some(exemption) = around.reach.exemption(&node.labels) {
        return refuse(Refusal::Exempt(exemption));
    }
    match node.readiness {
        Readiness::Ready => return refuse(Refusal::NodeReady),
        Readiness::NotReady => return refuse(Refusal::KubeletReporting),
        Readiness::Unknown => {}
    }
    let Some(own) = node.instance.as_ref() else {
        return refuse(Refusal::NotItsOwnMachine);
    };
    if node.power.control_plane && !settings.control_plane {
        return refuse(Refusal::ControlPlane);
    }
    let others = others_naming(node, around.nodes);
    if !others.is_empty() {
        let others = others.into_iter().map(str::to_owned).collect();
        return refuse(Refusal::SharedMachine { others });
    }
    if let Some(refusal) = machine_refusal(c.confirmation, own) {
        return refuse(refusal);
    }
    let needed = settings.after.as_secs();
    let for_seconds = not_ready_for(node, around.now);
    let Some(not_ready_for) = for_seconds.filter(|s| *s >= needed) else {
        return refuse(Refusal::NotReadyTooShort {
            for_seconds,
            needed,
        });
    };
    if let Some(refusal) = stuck_refusal(settings.scope, c.stranding) {
        return refuse(refusal);
    }
    // A mark whose stop never came no longer holds the machine back.
    let lapsed = match node.powered_off_before() {
        None => None,
        Some(at) if !mark_lapsed(node, c.confirmation, around.now, settings.wait) => {
            return refuse(Refusal::PoweredOffBefore { at: at.to_owned() });
        }
        Some(at) => Some(at.to_owned()),
    };
    // Its own mark counted it as a power-off in flight already.
    let taken = if lapsed.is_some() && !node.is_out_of_service() {
        taken.saturating_sub(1)
    } else {
        taken
    };
    let zone = node.power.zone.as_deref();
    if let Some(refusal) = partition(around.nodes, zone, settings.partition_percent, around.now) {
        return refuse(refusal);
    }
    if taken >= around.limit {
        return refuse(Refusal::CapReached {
            limit: around.limit,
            taken,
        });
    }
    PowerVerdict::PowerOff {
        not_ready_for,
        lapsed,
    }
}

/// Why what is stuck on the Node refuses its power-off under `scope`:
/// nothing is, or it could not be read. Not read yet, nothing refuses it.
fn stuck_refusal(scope: Scope, stranding: Option<&Stranding>) -> Option<Refusal> {
    match (scope, stranding) {
        (Scope::AnyHung, _) | (Scope::Stuck, None) => None,
        (Scope::Stuck, Some(Stranding::Unread)) => Some(Refusal::PodsUnread),
        (Scope::Stuck, Some(Stranding::Read(stuck))) => {
            stuck.is_empty().then_some(Refusal::NothingStuck)
        }
    }
}

/// True when node-fencer's power-off mark on `node` never took effect (a
/// process that died between the mark and the stop, or a stop never
/// taken): `wait` (`POWER_OFF_WAIT`) has passed since the mark, the cloud
/// reports the Node's own machine running on the boot the mark recorded,
/// and its last start, as the cloud records it, came before the mark, so
/// it has not been off since. Where the cloud records no start (a BMC),
/// the mark stands: a machine powered off and started again by a person,
/// whose kubelet never reported, is never powered off a second time.
pub fn mark_lapsed(
    node: &NodeFacts,
    confirmation: Option<&Confirmation>,
    now: i64,
    wait: Duration,
) -> bool {
    let wait = i64::try_from(wait.as_secs()).unwrap_or(i64::MAX);
    node.running_since_before_power_off(confirmation)
        .is_some_and(|at| now.saturating_sub(at) > wait)
}

/// Whether the Node and its machine, read again under the Lease, are still
/// the ones judged: the Node still names `judged` as its own machine, and
/// the look under the Lease (`again`) found that very machine (`replaced`:
/// a look since the first found another one under the name). `None` when
/// they are; otherwise the refusal.
pub fn held_to_judged(
    judged: &InstanceFacts,
    node: Option<&NodeFacts>,
    again: Option<&Confirmation>,
    replaced: bool,
) -> Option<Refusal> {
    let Some(node) = node else {
        return Some(Refusal::NodeGone);
    };
    let another = || Refusal::MachineReplaced {
        judged: judged.id.to_string(),
    };
    if node.instance.as_ref() != Some(&judged.id) || replaced {
        return Some(another());
    }
    match again {
        Some(Confirmation::Seen(now))
            if now.id != judged.id
                || !judged.identity.may_be_same_as(&now.identity)
                || !now.identity.may_be_machine_of(&node.machine) =>
        {
            Some(another())
        }
        _ => None,
    }
}

/// Why what the cloud said of the machine refuses a power-off: not its own
/// machine, not asked, or not `running`.
fn machine_refusal(
    confirmation: Option<&Confirmation>,
    own: &crate::core::model::instance::InstanceId,
) -> Option<Refusal> {
    let state = match confirmation {
        Some(Confirmation::Seen(facts)) if &facts.id == own => Some(facts.state.clone()),
        Some(Confirmation::Seen(_)) => return Some(Refusal::NotItsOwnMachine),
        Some(Confirmation::LookupFailed { .. }) | None => return Some(Refusal::LookupFailed),
        Some(Confirmation::NotFound) => None,
    };
    (state != Some(InstanceState::Running)).then_some(Refusal::NotRunning { state })
}

/// What became of a power-off, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerOutcome {
    /// Refused: the machine was left running.
    Refused,
    /// Dry run: it would be powered off.
    Planned,
    /// Powered off, and the cloud reports it stopped.
    Stopped,
    /// Powered off, but not reported stopped within the wait: no taint; a
    /// retry looks again.
    StopPending,
    /// The stop request failed.
    Failed,
    /// The machine was off already when the power-off was to be sent:
    /// nothing was sent, and the fencing goes on as for a stopped machine.
    FoundOff,
    /// The machine was deleted when the power-off was to be sent: nothing
    /// was sent, the power-off mark is taken back, and the fencing goes on
    /// as for a deleted machine.
    Deleted,
}

impl PowerOutcome {
    /// A short, stable name for metrics.
    pub fn code(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Planned => "planned",
            Self::Stopped => "stopped",
            Self::StopPending => "stop_pending",
            Self::Failed => "failed",
            Self::FoundOff => "found_off",
            Self::Deleted => "deleted",
        }
    }
}

/// One power-off decision and what came of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerReport {
    /// What became of it.
    pub outcome: PowerOutcome,
    /// Why, in words.
    pub reason: String,
    /// The refusal, machine-readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
    /// Seconds NotReady when decided, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) not_ready_for: Option<u64>,
    /// The cloud's status checks when decided (EC2's; Compute Engine has
    /// none): recorded, not required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_checks: Option<StatusChecks>,
}

impl PowerReport {
    /// What became of a power-off that no guard refused.
    pub fn new(
        outcome: PowerOutcome,
        reason: impl Into<String>,
        not_ready_for: Option<u64>,
        status_checks: Option<StatusChecks>,
    ) -> Self {
        Self {
            outcome,
            reason: reason.into(),
            refusal: None,
            not_ready_for,
            status_checks,
        }
    }

    /// A power-off refused, and why.
    pub fn refused(
        refusal: Refusal,
        not_ready_for: Option<u64>,
        status_checks: Option<StatusChecks>,
    ) -> Self {
        Self {
            refusal: Some(refusal.clone()),
            ..Self::new(
                PowerOutcome::Refused,
                refusal.to_string(),
                not_ready_for,
                status_checks,
            )
        }
    }

    /// True when a retry could still have something to do: a stop that
    /// failed or has not completed, or the cloud not answering.
    pub(crate) fn leaves_work(&self) -> bool {
        matches!(
            self.outcome,
            PowerOutcome::StopPending | PowerOutcome::Failed
        ) || self.refusal == Some(Refusal::LookupFailed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::inbound::suspect::NodeRef;
    use crate::core::model::instance::InstanceId;
    use crate::core::model::names::NodeName;

    fn ec2(n: u8) -> InstanceId {
        InstanceId::parse(&format!("i-{n:017x}")).expect("an instance id")
    }

    fn gce(n: u8) -> InstanceId {
        InstanceId::parse(&format!("gce://proj-fencer/us-central1-a/node-{n}")).expect("a VM")
    }

    /// Issue 45, item 1: under the Lease the Node must still name the
    /// machine judged, and the look must be of that very machine.
    #[test]
    fn held_to_judged_refuses_another_machine_under_the_name() {
        use crate::core::model::redfish::SystemUuid;
        let judged = |id: InstanceId, uid: Option<u64>, uuid: Option<&str>| {
            let mut f = InstanceFacts::bare(id, InstanceState::Running);
            f.identity.uid = uid;
            f.identity.system_uuid =
                uuid.map_or(SystemUuid::Unread, |u| SystemUuid::parse(Some(u)));
            f
        };
        let node_on = |id: &InstanceId, uuid: Option<&str>| {
            let mut n = NodeFacts::bare("n", Readiness::Unknown);
            n.instance = Some(id.clone());
            n.machine.system_uuid = uuid.map_or(SystemUuid::Unread, |u| SystemUuid::parse(Some(u)));
            n
        };
        let replaced = |r: Option<Refusal>| matches!(r, Some(Refusal::MachineReplaced { .. }));

        // Compute Engine: the same name, another numeric id.
        let first = judged(gce(1), Some(111), None);
        let node = node_on(&gce(1), None);
        let same = Confirmation::Seen(judged(gce(1), Some(111), None));
        let other = Confirmation::Seen(judged(gce(1), Some(222), None));
        assert_eq!(
            held_to_judged(&first, Some(&node), Some(&same), false),
            None
        );
        assert!(replaced(held_to_judged(
            &first,
            Some(&node),
            Some(&other),
            false
        )));
        // A look the invocation already held to the first one.
        assert!(replaced(held_to_judged(
            &first,
            Some(&node),
            Some(&Confirmation::NotFound),
            true
        )));
        // The Node remapped to another machine (a BMC label moved).
        const U1: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef001";
        const U2: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef002";
        let m1 = InstanceId::parse("redfish://rack1-m1").expect("a machine");
        let m2 = InstanceId::parse("redfish://rack1-m2").expect("a machine");
        let first = judged(m1.clone(), None, Some(U1));
        let moved = node_on(&m2, Some(U1));
        let look = Confirmation::Seen(judged(m2, None, Some(U2)));
        assert!(replaced(held_to_judged(
            &first,
            Some(&moved),
            Some(&look),
            false
        )));
        // The same System, by its UUID.
        let stays = node_on(&m1, Some(U1));
        let again = Confirmation::Seen(judged(m1.clone(), None, Some(U1)));
        assert_eq!(
            held_to_judged(&first, Some(&stays), Some(&again), false),
            None
        );
        let swapped = Confirmation::Seen(judged(m1, None, Some(U2)));
        assert!(replaced(held_to_judged(
            &first,
            Some(&stays),
            Some(&swapped),
            false
        )));
        // The Node gone.
        assert_eq!(
            held_to_judged(&first, None, Some(&again), false),
            Some(Refusal::NodeGone)
        );
    }

    /// The guards know no cloud (issue 36): every test in the body runs
    /// once on EC2 instances and once on Compute Engine VMs, `id(n)` naming
    /// machine `n` of that cloud.
    macro_rules! on_each_cloud {
        ($($body:tt)*) => {
            mod on_ec2 {
                fn id(n: u8) -> super::InstanceId {
                    super::ec2(n)
                }
                $($body)*
            }
            mod on_gce {
                fn id(n: u8) -> super::InstanceId {
                    super::gce(n)
                }
                $($body)*
            }
        };
    }

    #[test]
    fn only_the_sweep_a_not_ready_alert_and_an_operator_make_candidates() {
        let suspect = |intent, origin| Suspect {
            target: NodeRef::Name(NodeName::parse("n0").expect("a name")),
            intent,
            origin,
        };
        let alert = |name: &str| Origin::Alert {
            alertname: Some(name.into()),
            fingerprint: None,
        };
        let ec2 = Origin::Ec2StateChange {
            event_id: None,
            reported_state: "stopped".into(),
            reported_at: None,
        };
        assert!(is_candidate(&suspect(Intent::Fence, Origin::Sweep)));
        assert!(is_candidate(&suspect(
            Intent::Fence,
            alert(NOT_READY_ALERT)
        )));
        assert!(is_candidate(&suspect(Intent::PowerOff, Origin::Direct)));
        assert!(!is_candidate(&suspect(Intent::Fence, alert("NodeDown"))));
        assert!(!is_candidate(&suspect(Intent::Fence, Origin::Direct)));
        assert!(!is_candidate(&suspect(Intent::Fence, ec2)));
        assert!(!is_candidate(&suspect(Intent::Check, Origin::Sweep)));
        assert!(!is_candidate(&suspect(
            Intent::Recover,
            alert(NOT_READY_ALERT)
        )));
    }

    on_each_cloud! {
        use super::super::*;
        use crate::core::model::facts::{InstanceFacts, PowerMark, TaintFacts};

        const NOW: i64 = 1_000_000;

        /// Node `n`, on instance `n`, in `zone`, NotReady for `dark_for`
        /// seconds (Ready when `None`).
        fn node(n: u8, zone: &str, dark_for: Option<i64>) -> NodeFacts {
            let readiness = if dark_for.is_some() {
                Readiness::Unknown
            } else {
                Readiness::Ready
            };
            let mut facts = NodeFacts::bare(&format!("n{n}"), readiness);
            facts.instance = Some(id(n));
            facts.power.zone = Some(zone.into());
            facts.power.not_ready_since = dark_for.map(|s| NOW - s);
            facts.power.boot_id = Some(format!("boot-{n}"));
            facts
        }

        fn running(n: u8) -> Confirmation {
            Confirmation::Seen(InstanceFacts::bare(id(n), InstanceState::Running))
        }

        fn settings() -> ActiveFencing {
            ActiveFencing::default()
        }

        /// Judges node 0 of `nodes` against `confirmation` under `settings`, cap 3.
        fn judge_first(
            nodes: &[NodeFacts],
            confirmation: &Confirmation,
            settings: Option<&ActiveFencing>,
        ) -> PowerVerdict {
            judge_within(nodes, confirmation, settings, &Reach::EVERYWHERE)
        }

        /// [`judge_first`] with the Nodes node-fencer may act on.
        fn judge_within(
            nodes: &[NodeFacts],
            confirmation: &Confirmation,
            settings: Option<&ActiveFencing>,
            reach: &Reach,
        ) -> PowerVerdict {
            let around = Surroundings {
                reach,
                nodes,
                out_of_service: 0,
                limit: 3,
                now: NOW,
            };
            let candidate = Candidate {
                node: &nodes[0],
                confirmation: Some(confirmation),
                stranding: None,
            };
            judge(&[candidate], &around, settings).remove(0)
        }

        fn verdict_with(nodes: &[NodeFacts], confirmation: &Confirmation) -> PowerVerdict {
            judge_first(nodes, confirmation, Some(&settings()))
        }

        fn verdict(nodes: &[NodeFacts]) -> PowerVerdict {
            verdict_with(nodes, &running(0))
        }

        fn refusal(v: PowerVerdict) -> Option<Refusal> {
            match v {
                PowerVerdict::Refuse { refusal } => Some(refusal),
                PowerVerdict::PowerOff { .. } => None,
            }
        }

        /// Six healthy Nodes in three zones, and the candidate `n0` dark for
        /// `dark_for` seconds.
        fn cluster(dark_for: i64) -> Vec<NodeFacts> {
            let mut nodes = vec![node(0, "a", Some(dark_for))];
            nodes.extend((1..6).map(|n| node(n, ["a", "b", "c"][usize::from(n) % 3], None)));
            nodes
        }

        /// `ACTIVE_FENCING=stuck`: a hung Node is powered off only once what
        /// is stuck on it is read and something is; `on` asks nothing of it.
        #[test]
        fn under_stuck_only_a_node_holding_a_stuck_volume_is_powered_off() {
            use crate::core::rules::stuck::Stranded;
            let nodes = cluster(600);
            let stuck = ActiveFencing {
                scope: Scope::Stuck,
                ..settings()
            };
            let held = Stranding::Read(vec![Stranded {
                volume: "pv-a".into(),
                pod: "db/db-0".into(),
            }]);
            let (none, unread) = (Stranding::Read(Vec::new()), Stranding::Unread);
            let around = Surroundings {
                reach: &Reach::EVERYWHERE,
                nodes: &nodes,
                out_of_service: 0,
                limit: 3,
                now: NOW,
            };
            let machine = running(0);
            let with = |stranding: Option<&Stranding>, settings: &ActiveFencing| {
                let candidate = Candidate {
                    node: &nodes[0],
                    confirmation: Some(&machine),
                    stranding,
                };
                refusal(judge(&[candidate], &around, Some(settings)).remove(0))
            };
            assert_eq!(with(Some(&held), &stuck), None);
            assert_eq!(with(Some(&none), &stuck), Some(Refusal::NothingStuck));
            assert_eq!(with(Some(&unread), &stuck), Some(Refusal::PodsUnread));
            // Not read yet: allowed so that the shell reads it, then judges again.
            assert_eq!(with(None, &stuck), None);
            for stranding in [Some(&none), Some(&unread), None] {
                assert_eq!(with(stranding, &settings()), None);
            }
            // A Node not dark long enough says so, whatever is stuck on it.
            let young = cluster(30);
            let candidate = Candidate {
                node: &young[0],
                confirmation: Some(&machine),
                stranding: Some(&none),
            };
            let around = Surroundings {
                nodes: &young,
                ..around
            };
            assert!(matches!(
                refusal(judge(&[candidate], &around, Some(&stuck)).remove(0)),
                Some(Refusal::NotReadyTooShort { .. })
            ));
        }

        /// `NODE_SELECTOR` and the opt-out label hold for the power-off as
        /// for the taint: a hung Node outside the reach is never powered off.
        #[test]
        fn a_node_outside_the_reach_is_never_powered_off() {
            use crate::core::model::selector::LabelSelector;
            use crate::core::rules::reach::OPT_OUT_LABEL;
            let stateful = Reach {
                selector: Some(LabelSelector::parse("pool=stateful").unwrap()),
            };
            let judged = |nodes: &[NodeFacts], reach: &Reach| {
                refusal(judge_within(nodes, &running(0), Some(&settings()), reach))
            };
            let mut nodes = cluster(600);
            assert_eq!(
                judged(&nodes, &stateful),
                Some(Refusal::Exempt(Exemption::OutOfScope {
                    selector: "pool=stateful".into()
                }))
            );
            nodes[0].labels.insert("pool".into(), "stateful".into());
            assert_eq!(judged(&nodes, &stateful), None, "selected: powered off");
            nodes[0].labels.insert(OPT_OUT_LABEL.into(), "true".into());
            for reach in [&stateful, &Reach::EVERYWHERE] {
                assert_eq!(
                    judged(&nodes, reach),
                    Some(Refusal::Exempt(Exemption::OptedOut))
                );
            }
        }

        #[test]
        fn a_node_dark_long_enough_on_a_running_machine_is_powered_off() {
            assert_eq!(
                verdict(&cluster(121)),
                PowerVerdict::PowerOff {
                    not_ready_for: 121,
                    lapsed: None
                }
            );
        }

        #[test]
        fn off_by_default() {
            assert_eq!(
                refusal(judge_first(&cluster(600), &running(0), None)),
                Some(Refusal::Disabled)
            );
        }

        #[test]
        fn a_ready_node_is_never_powered_off() {
            let mut nodes = cluster(600);
            nodes[0].readiness = Readiness::Ready;
            assert_eq!(refusal(verdict(&nodes)), Some(Refusal::NodeReady));
        }

        #[test]
        fn not_ready_for_less_than_the_set_time_or_for_an_unknown_time_waits() {
            assert_eq!(
                refusal(verdict(&cluster(119))),
                Some(Refusal::NotReadyTooShort {
                    for_seconds: Some(119),
                    needed: 120
                })
            );
            let mut nodes = cluster(600);
            nodes[0].power.not_ready_since = None;
            assert!(matches!(
                refusal(verdict(&nodes)),
                Some(Refusal::NotReadyTooShort {
                    for_seconds: None,
                    ..
                })
            ));
        }

        #[test]
        fn only_a_running_machine_that_is_the_nodes_own_is_powered_off() {
            let nodes = cluster(600);
            for state in [
                InstanceState::Pending,
                InstanceState::Stopping,
                InstanceState::Stopped,
                InstanceState::Unknown,
            ] {
                let c = Confirmation::Seen(InstanceFacts::bare(id(0), state.clone()));
                assert_eq!(
                    refusal(verdict_with(&nodes, &c)),
                    Some(Refusal::NotRunning { state: Some(state) })
                );
            }
            let failed = Confirmation::LookupFailed {
                error: "throttled".into(),
            };
            assert_eq!(
                refusal(verdict_with(&nodes, &failed)),
                Some(Refusal::LookupFailed)
            );
            assert_eq!(
                refusal(verdict_with(&nodes, &Confirmation::NotFound)),
                Some(Refusal::NotRunning { state: None })
            );
            // The cloud's answer about another machine proves nothing about this one.
            assert_eq!(
                refusal(verdict_with(&nodes, &running(9))),
                Some(Refusal::NotItsOwnMachine)
            );
            let mut unnamed = cluster(600);
            unnamed[0].instance = None;
            assert_eq!(refusal(verdict(&unnamed)), Some(Refusal::NotItsOwnMachine));
        }

        #[test]
        fn the_partition_guard_refuses_when_many_nodes_are_dark() {
            // Two of six dark is 33 %, above the default 30 %.
            let mut nodes = cluster(600);
            nodes[2] = node(2, "c", Some(30));
            assert!(matches!(
                refusal(verdict(&nodes)),
                Some(Refusal::Partition {
                    dark: 2,
                    nodes: 6,
                    percent: 30
                })
            ));
            // A dark node already fenced is accounted for, not a sign of a partition.
            nodes[2].taints = vec![TaintFacts::out_of_service()];
            assert_eq!(refusal(verdict(&nodes)), None);
        }

        #[test]
        fn one_dark_node_passes_the_partition_guard_in_any_cluster() {
            for size in 1..=4u8 {
                let mut nodes = vec![node(0, "a", Some(600))];
                nodes.extend((1..size).map(|n| node(n, "b", None)));
                assert_eq!(refusal(verdict(&nodes)), None, "{size} nodes");
            }
        }

        #[test]
        fn a_whole_zone_dark_is_refused_but_a_zone_of_one_is_not() {
            let mut nodes = cluster(600);
            // Zone a holds n0 and n3; n3 dark too is a zone outage (and 33 %).
            nodes[3] = node(3, "a", Some(600));
            let settings = ActiveFencing {
                partition_percent: 100,
                ..ActiveFencing::default()
            };
            assert_eq!(
                refusal(judge_first(&nodes, &running(0), Some(&settings))),
                Some(Refusal::ZoneDark {
                    zone: "a".into(),
                    nodes: 2
                })
            );
            assert_eq!(
                partition(&nodes[..1], Some("a"), 30, NOW),
                None,
                "a zone of one node"
            );
        }

        #[test]
        fn a_node_powered_off_before_is_not_powered_off_again_until_it_booted() {
            let mut nodes = cluster(600);
            nodes[0].power.powered_off = Some(PowerMark {
                at: "2026-11-25T10:00:00Z".into(),
                boot_id: Some("boot-0".into()),
            });
            assert_eq!(
                refusal(verdict(&nodes)),
                Some(Refusal::PoweredOffBefore {
                    at: "2026-11-25T10:00:00Z".into()
                })
            );
            // Unknown boot ids prove no reboot either.
            nodes[0].power.boot_id = None;
            assert!(refusal(verdict(&nodes)).is_some());
            // A new boot id: it came back and reported, then died again.
            nodes[0].power.boot_id = Some("boot-0-again".into());
            assert_eq!(refusal(verdict(&nodes)), None);
        }

        /// Issue 58, item 7: a mark whose stop never came (the process died
        /// between the two) lapses once `POWER_OFF_WAIT` has passed, the
        /// machine running the boot the mark recorded and started before
        /// it; not before the wait, not after a start since the mark, and
        /// not where the cloud records no start.
        #[test]
        fn a_power_off_mark_whose_stop_never_came_lapses_after_the_wait() {
            let wait = i64::try_from(settings().wait.as_secs()).expect("seconds");
            let stamp = |at: i64| {
                k8s_openapi::jiff::Timestamp::from_second(at)
                    .expect("a time")
                    .to_string()
            };
            let marked = |at: i64| {
                let mut nodes = cluster(600);
                nodes[0].power.powered_off = Some(PowerMark {
                    at: stamp(at),
                    boot_id: Some("boot-0".into()),
                });
                nodes
            };
            let started = |at: Option<i64>| {
                let mut facts = InstanceFacts::bare(id(0), InstanceState::Running);
                facts.started_at = at;
                Confirmation::Seen(facts)
            };
            let long_ago = NOW - 3 * wait;
            let lapsed = marked(NOW - wait - 1);
            assert_eq!(
                verdict_with(&lapsed, &started(Some(long_ago))),
                PowerVerdict::PowerOff {
                    not_ready_for: 600,
                    lapsed: Some(stamp(NOW - wait - 1)),
                }
            );
            let cases = [
                ("within the wait", marked(NOW - wait + 1), started(Some(long_ago))),
                ("started since", lapsed.clone(), started(Some(NOW - wait))),
                ("no start recorded", lapsed.clone(), started(None)),
            ];
            for (name, nodes, machine) in cases {
                assert!(
                    matches!(
                        refusal(verdict_with(&nodes, &machine)),
                        Some(Refusal::PoweredOffBefore { .. })
                    ),
                    "{name}"
                );
            }
            // Its room under the cap is its own: counted once, not twice.
            let around = Surroundings {
                reach: &Reach::EVERYWHERE,
                nodes: &lapsed,
                out_of_service: 3,
                limit: 3,
                now: NOW,
            };
            let machine = started(Some(long_ago));
            let candidate = Candidate {
                node: &lapsed[0],
                confirmation: Some(&machine),
                stranding: None,
            };
            let verdicts = judge(&[candidate], &around, Some(&settings()));
            assert!(
                matches!(verdicts[0], PowerVerdict::PowerOff { .. }),
                "{verdicts:?}"
            );
        }

        #[test]
        fn the_cap_counts_fenced_nodes_power_offs_in_flight_and_earlier_candidates() {
            let mut nodes = cluster(600);
            nodes[1] = node(1, "b", Some(600));
            // n2 was powered off by another run and is not fenced yet.
            nodes[2] = node(2, "c", Some(600));
            nodes[2].power.powered_off = Some(PowerMark {
                at: "t".into(),
                boot_id: Some("boot-2".into()),
            });
            let settings = ActiveFencing {
                partition_percent: 100,
                ..ActiveFencing::default()
            };
            // One fenced Node, and the power-off in flight, which the cap's own
            // count takes in (issue 33, item 10: the taint's count too).
            assert!(nodes[2].power_off_in_flight());
            assert!(crate::core::rules::cap::counts(
                &nodes[2],
                &Default::default()
            ));
            let around = Surroundings {
                reach: &Reach::EVERYWHERE,
                nodes: &nodes,
                out_of_service: 2,
                limit: 3,
                now: NOW,
            };
            let (c0, c1) = (running(0), running(1));
            let candidates = [
                Candidate {
                    node: &nodes[0],
                    confirmation: Some(&c0),
                    stranding: None,
                },
                Candidate {
                    node: &nodes[1],
                    confirmation: Some(&c1),
                    stranding: None,
                },
            ];
            let verdicts = judge(&candidates, &around, Some(&settings));
            assert_eq!(
                verdicts[0],
                PowerVerdict::PowerOff {
                    not_ready_for: 600,
                    lapsed: None
                }
            );
            assert_eq!(
                refusal(verdicts[1].clone()),
                Some(Refusal::CapReached { limit: 3, taken: 3 })
            );
        }

        /// Issue 33, item 1: a second Node naming the same machine (a
        /// re-registration under a new name) makes the machine a question for a
        /// person, whether that Node is Ready or not.
        #[test]
        fn a_machine_another_node_names_is_never_powered_off() {
            let mut nodes = cluster(600);
            let mut twin = node(9, "a", None);
            twin.name = "n0-reregistered".into();
            twin.instance = Some(id(0));
            nodes.push(twin);
            assert_eq!(
                refusal(verdict(&nodes)),
                Some(Refusal::SharedMachine {
                    others: vec!["n0-reregistered".into()]
                })
            );
            nodes[6].readiness = Readiness::Unknown;
            assert!(matches!(
                refusal(verdict(&nodes)),
                Some(Refusal::SharedMachine { .. })
            ));
            nodes.pop();
            assert_eq!(refusal(verdict(&nodes)), None);
        }

        /// Issue 33, item 7: a control-plane Node's machine may hold an etcd
        /// member; it is powered off only when the setting says so.
        #[test]
        fn a_control_plane_node_is_powered_off_only_when_configured() {
            let mut nodes = cluster(600);
            nodes[0].power.control_plane = true;
            assert_eq!(refusal(verdict(&nodes)), Some(Refusal::ControlPlane));
            let allowed = ActiveFencing {
                control_plane: true,
                ..settings()
            };
            assert_eq!(
                refusal(judge_first(&nodes, &running(0), Some(&allowed))),
                None
            );
        }

        /// Issue 33, design note: a kubelet that reports `Ready=False` (a CNI not
        /// ready, a full disk) is alive and talking: its machine is not hung.
        #[test]
        fn only_a_silent_kubelet_counts_toward_a_power_off() {
            let mut nodes = cluster(600);
            nodes[0].readiness = Readiness::NotReady;
            assert_eq!(refusal(verdict(&nodes)), Some(Refusal::KubeletReporting));
            nodes[0].readiness = Readiness::Unknown;
            assert_eq!(refusal(verdict(&nodes)), None);
        }

        /// Issue 33, item 6: Nodes node-fencer fenced or powered off within the
        /// window still count as dark, so a zone that goes dark node by node is
        /// refused at its last node, not powered off one sweep at a time; fenced
        /// long ago, they are out of the picture.
        #[test]
        fn a_zone_that_goes_dark_node_by_node_is_refused() {
            let at = |secs_ago: i64| {
                k8s_openapi::jiff::Timestamp::from_second(NOW - secs_ago)
                    .expect("a time")
                    .to_string()
            };
            // The share guard set aside: the zone guard alone.
            let zone_only = |nodes: &[NodeFacts]| {
                let settings = ActiveFencing {
                    partition_percent: 100,
                    ..settings()
                };
                judge_first(nodes, &running(0), Some(&settings))
            };
            // Zone "a": the candidate n0 and n3, fenced by node-fencer 10 minutes ago.
            let mut nodes = cluster(600);
            nodes[3] = node(3, "a", Some(900));
            nodes[3].taints = vec![TaintFacts::out_of_service()];
            nodes[3].fenced = Some(crate::core::model::facts::FenceMark {
                mode: crate::core::model::facts::FenceMode::Taint,
                instance: Some(id(3)),
                state: Some(InstanceState::Stopped),
                volumes: vec![],
                at: at(600),
                correlation_id: None,
                confirmed: false,
                no_schedule: false,
                boot_id: None,
            });
            assert_eq!(
                refusal(zone_only(&nodes)),
                Some(Refusal::ZoneDark {
                    zone: "a".into(),
                    nodes: 2
                })
            );
            // Fenced 40 minutes ago: another outage, long over.
            if let Some(mark) = nodes[3].fenced.as_mut() {
                mark.at = at(2400);
            }
            assert_eq!(refusal(zone_only(&nodes)), None);
            // Powered off (not fenced yet) 5 minutes ago: dark too.
            nodes[3].taints.clear();
            nodes[3].fenced = None;
            nodes[3].power.powered_off = Some(PowerMark {
                at: at(300),
                boot_id: Some("boot-3".into()),
            });
            assert!(matches!(
                refusal(zone_only(&nodes)),
                Some(Refusal::ZoneDark { .. })
            ));
            // The share guard counts them too: two of three dark.
            let three = vec![
                node(0, "a", Some(600)),
                nodes[3].clone(),
                node(1, "b", None),
            ];
            assert!(matches!(
                partition(&three, None, 50, NOW),
                Some(Refusal::Partition { dark: 2, .. })
            ));
        }
    }
}
