//! The notifications of one invocation: one message per fencing, refusal,
//! power-off and recovery, drawn from its report, in a versioned schema
//! (`docs/notifications.md`). Sent to an SNS or a Pub/Sub topic by the
//! shell; what is sent is decided here.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::core::inbound::suspect::Origin;
use crate::core::model::instance::{InstanceId, InstanceState, Provider, VolumeId};
use crate::core::model::values;
use crate::core::outbound::report::{
    NodeReport, Outcome, RecoveryOutcome, RecoveryReport, Report, VolumeOutcome, WitnessChange,
};
use crate::core::rules::decide::Skip;
use crate::core::rules::power::{PowerOutcome, PowerReport, Refusal};

/// The schema every message names. A field added keeps the version; a field
/// removed, renamed or changed in meaning makes the next one.
pub const SCHEMA: &str = "node-fencer.io/notice/v1";

/// What a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A Node fenced (or, in a dry run, that would be), or a fencing that
    /// failed midway.
    Fencing,
    /// A guard kept node-fencer from a fencing or a power-off it was asked
    /// for: the opt-out label, the selector, the cap, a shared machine, a
    /// hibernated instance, the partition guard, a control-plane Node.
    Refusal,
    /// A hung machine powered off (or, in a dry run, that would be).
    PowerOff,
    /// A fencing ended: the Node is back in service.
    Recovery,
    /// The witness of a Node's machine started failing (node-fencer could
    /// not fence the Node if it died now) or answers again.
    Witness,
}

impl Kind {
    /// The name in the message and its attributes.
    pub fn code(self) -> &'static str {
        match self {
            Self::Fencing => "fencing",
            Self::Refusal => "refusal",
            Self::PowerOff => "power_off",
            Self::Recovery => "recovery",
            Self::Witness => "witness",
        }
    }
}

/// The machine behind the Node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// `aws` or `gce`.
    pub cloud: Provider,
    /// The EC2 instance id, or the VM's provider id (`gce://P/Z/N`).
    pub id: InstanceId,
    /// Its state as the cloud reported it when decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<InstanceState>,
}

/// Why, twice: a stable code to filter on and the words for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// The code (the metrics' `Reason`).
    pub code: String,
    /// The report's words.
    pub text: String,
}

/// What this invocation changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Done {
    /// The out-of-service taint (legacy mode: the mark) was applied.
    pub taint_applied: bool,
    /// The out-of-service taint was removed (recovery).
    pub taint_removed: bool,
    /// The volumes detached from the machine.
    pub volumes_detached: Vec<VolumeId>,
    /// VolumeAttachments deleted (legacy mode).
    pub attachments_deleted: usize,
    /// Pods force-deleted (legacy mode).
    pub pods_deleted: usize,
    /// The machine was powered off and reported stopped.
    pub powered_off: bool,
}

/// What the decision rested on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// The triggers that named the Node.
    pub triggers: Vec<Origin>,
    /// The power-off decision: how long NotReady, the status checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_off: Option<PowerReport>,
    /// The fencing the Node carries, by the time on its mark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fenced_at: Option<String>,
    /// The errors met on the way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// One message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Notice {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// What it is about.
    pub kind: Kind,
    /// How it ended: the report's outcome code.
    pub outcome: &'static str,
    /// Why.
    pub reason: Reason,
    /// The Node.
    pub node: String,
    /// Its machine, when one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// A witness change told once for many Nodes: then `node` says how
    /// many, and this names them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<Group>,
    /// The cluster, when its name is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Nothing was changed: a dry run, or the kill switch.
    pub dry_run: bool,
    /// What was changed.
    pub done: Done,
    /// What the decision rested on.
    pub evidence: Evidence,
    /// The invocation's correlation id, as in its logs and report.
    pub correlation_id: String,
    /// When the message was written (RFC 3339, UTC).
    pub at: String,
}

/// The Nodes one witness notice is about, when the same change (outcome
/// and reason) came to more than [`WITNESS_EACH_MAX`] Nodes in one round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// How many Nodes.
    pub count: usize,
    /// The first [`GROUP_NAMES_MAX`] of them by name; each has its Event.
    pub nodes: Vec<String>,
}

/// How many Nodes a witness change (the same outcome and reason, in one
/// round) is told to one notice each. Past it, one notice tells it for
/// them all: a role that lost a permission fails every Node's witness at
/// once, and a notice per Node would bury the channel, and spend the
/// notifications' time budget long before the last.
pub const WITNESS_EACH_MAX: usize = 10;

/// How many Nodes a grouped notice names: SNS takes 256 KiB a message.
pub const GROUP_NAMES_MAX: usize = 50;

impl Notice {
    /// The message's JSON body.
    pub fn body(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The attributes a subscription filters on (SNS message attributes,
    /// Pub/Sub attributes): the schema, the kind, the outcome, the reason's
    /// code, and the cluster when known.
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("schema", SCHEMA.to_owned()),
            ("kind", self.kind.code().to_owned()),
            ("outcome", self.outcome.to_owned()),
            ("reason", self.reason.code.clone()),
        ];
        if let Some(cluster) = &self.cluster {
            out.push(("cluster", cluster.clone()));
        }
        out
    }

    /// A one-line subject for e-mail subscribers.
    pub fn subject(&self) -> String {
        let planned = if self.dry_run { " (dry run)" } else { "" };
        let cluster = self
            .cluster
            .as_deref()
            .map(|c| format!(" in {c}"))
            .unwrap_or_default();
        let what = match (self.kind, self.outcome) {
            (Kind::Fencing, "failed") => "fencing failed",
            (Kind::Fencing, _) => "fenced",
            (Kind::Refusal, _) => "fencing refused",
            (Kind::PowerOff, "failed") => "power-off failed",
            (Kind::PowerOff, _) => "powered off",
            (Kind::Recovery, "failed") => "recovery failed",
            (Kind::Recovery, _) => "recovered",
            (Kind::Witness, "restored") => "can be fenced again",
            (Kind::Witness, _) => "could not be fenced now",
        };
        // SNS subjects stop at 100 characters.
        let subject = format!("node-fencer: {} {what}{planned}{cluster}", self.node);
        subject.chars().take(100).collect()
    }
}

/// The invocation's messages, in the report's order: the nodes decided
/// over, then the recoveries. `cluster` names the cluster in each;
/// `now_secs` is the Unix time written in `at`.
pub fn notices(report: &Report, cluster: Option<&str>, now_secs: i64) -> Vec<Notice> {
    let at = values::rfc3339(now_secs);
    let dry_run = report.dry_run || report.kill_switch;
    let message = |kind, outcome, reason: Reason, node: &str, machine, done, evidence| Notice {
        schema: SCHEMA,
        kind,
        outcome,
        reason,
        node: node.to_owned(),
        machine,
        group: None,
        cluster: cluster.map(str::to_owned),
        dry_run,
        done,
        evidence,
        correlation_id: report.correlation_id.clone(),
        at: at.clone(),
    };
    let mut out = Vec::new();
    for r in &report.results {
        let node = r.node.as_deref().unwrap_or(&r.target);
        let machine = machine(r.instance_id.as_ref(), r.instance_state.as_ref());
        if let Some((kind, outcome, reason)) = of_decision(r) {
            out.push(message(
                kind,
                outcome,
                reason,
                node,
                machine.clone(),
                done(r),
                evidence(r),
            ));
        }
        if let Some((kind, outcome, reason)) = r.power_off.as_ref().and_then(of_power_off) {
            out.push(message(
                kind,
                outcome,
                reason,
                node,
                machine,
                done(r),
                evidence(r),
            ));
        }
    }
    for r in &report.recoveries {
        let Some(outcome) = of_recovery(r) else {
            continue;
        };
        let (reason, done, evidence) = recovery_told(r, outcome);
        let machine = machine(r.instance_id.as_ref(), r.instance_state.as_ref());
        out.push(message(
            Kind::Recovery,
            outcome,
            reason,
            &r.node,
            machine,
            done,
            evidence,
        ));
    }
    // The witness's changes, each told once (the sweep's round keeps what
    // it told): nothing was done, the sweep named the Node.
    let changes: Vec<&WitnessChange> = report.witness.iter().flat_map(|w| &w.changes).collect();
    out.extend(witness_notices(&changes, message));
    out
}

/// The notices of a witness round's `changes`, each written by `message`:
/// one per Node, but one for all the Nodes of a change (the same outcome
/// and reason) that came to more than [`WITNESS_EACH_MAX`] at once.
fn witness_notices<F>(changes: &[&WitnessChange], message: F) -> Vec<Notice>
where
    F: Fn(Kind, &'static str, Reason, &str, Option<Machine>, Done, Evidence) -> Notice,
{
    let mut groups: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for change in changes {
        groups
            .entry((change.outcome, change.reason))
            .or_default()
            .push(&change.node);
    }
    let mut out = Vec::new();
    let mut grouped = BTreeSet::new();
    for change in changes {
        let key = (change.outcome, change.reason);
        let nodes = groups.get(&key).map_or(&[][..], Vec::as_slice);
        let as_group = nodes.len() > WITNESS_EACH_MAX;
        if as_group && !grouped.insert(key) {
            continue;
        }
        let (reason, id, evidence) = of_witness(change);
        let (node, machine) = if as_group {
            (format!("{} Nodes", nodes.len()), None)
        } else {
            (change.node.clone(), machine(id.as_ref(), None))
        };
        let mut notice = message(
            Kind::Witness,
            change.outcome,
            reason,
            &node,
            machine,
            Done::default(),
            evidence,
        );
        notice.group = as_group.then(|| group_of(nodes));
        out.push(notice);
    }
    out
}

/// The group a notice names: how many, and the first by name.
fn group_of(nodes: &[&str]) -> Group {
    let mut names: Vec<&str> = nodes.to_vec();
    names.sort_unstable();
    Group {
        count: nodes.len(),
        nodes: names
            .into_iter()
            .take(GROUP_NAMES_MAX)
            .map(str::to_owned)
            .collect(),
    }
}

/// An ended recovery: why, what it changed, what it rested on.
fn recovery_told(r: &RecoveryReport, outcome: &str) -> (Reason, Done, Evidence) {
    let reason = Reason {
        code: outcome.to_owned(),
        text: r.reason.clone(),
    };
    let done = Done {
        taint_removed: r.taint_removed,
        ..Done::default()
    };
    let evidence = Evidence {
        triggers: r.origins.clone(),
        errors: r.errors.clone(),
        ..Evidence::default()
    };
    (reason, done, evidence)
}

/// A witness's change: why, its machine, and the sweep that saw it.
fn of_witness(change: &WitnessChange) -> (Reason, Option<InstanceId>, Evidence) {
    let reason = Reason {
        code: change.reason.to_owned(),
        text: change.text.clone(),
    };
    let evidence = Evidence {
        triggers: vec![Origin::Sweep],
        ..Evidence::default()
    };
    (reason, InstanceId::parse(&change.machine), evidence)
}

fn machine(id: Option<&InstanceId>, state: Option<&InstanceState>) -> Option<Machine> {
    id.map(|id| Machine {
        cloud: id.provider(),
        id: id.clone(),
        state: state.cloned(),
    })
}

/// A node's decision worth a message: a fencing done, planned or failed,
/// or a guard's refusal. Skips that are the normal course (a machine that
/// runs, a Node Ready, another cluster's instance) and waits a retry ends
/// (a lookup failed, too little time) are not.
fn of_decision(r: &NodeReport) -> Option<(Kind, &'static str, Reason)> {
    let reason = |code: &str| Reason {
        code: code.to_owned(),
        text: r.reason.clone(),
    };
    match (r.outcome, &r.skip) {
        (Outcome::Fenced | Outcome::Planned | Outcome::Failed, _) => {
            let code = r.outcome.code();
            Some((Kind::Fencing, code, reason(code)))
        }
        (Outcome::Skipped, Some(skip)) if skip_is_refusal(skip) => {
            Some((Kind::Refusal, "refused", reason(skip.code())))
        }
        (Outcome::Skipped | Outcome::AlreadyFenced, _) => None,
    }
}

fn skip_is_refusal(skip: &Skip) -> bool {
    match skip {
        Skip::Exempt(_)
        | Skip::CapReached { .. }
        | Skip::SharedMachine { .. }
        | Skip::KubeletElsewhere { .. }
        | Skip::NameTaken { .. }
        | Skip::AddressTaken { .. }
        | Skip::DiskHeld { .. }
        | Skip::Hibernated => true,
        Skip::NotInCluster
        | Skip::OtherCluster { .. }
        | Skip::OtherVpc { .. }
        | Skip::NoInstance
        | Skip::InstanceNotOff { .. }
        | Skip::InstanceNotFound
        | Skip::LookupFailed { .. }
        | Skip::NodeReady
        | Skip::RecoveryRequest
        | Skip::OutOfTime { .. } => false,
    }
}

/// A power-off worth a message: done, planned or failed, or refused by a
/// guard. The refusals that only say "not yet" or "not hung" (the wait not
/// over, the kubelet reporting, the machine not running) come with every
/// look at a sick node and are left out.
fn of_power_off(p: &PowerReport) -> Option<(Kind, &'static str, Reason)> {
    let reason = |code: &str| Reason {
        code: code.to_owned(),
        text: p.reason.clone(),
    };
    match (p.outcome, &p.refusal) {
        (PowerOutcome::Refused, Some(refusal)) if refusal_is_notable(refusal) => {
            Some((Kind::Refusal, "refused", reason(refusal.code())))
        }
        (PowerOutcome::Refused, _) => None,
        (outcome @ (PowerOutcome::Stopped | PowerOutcome::Planned | PowerOutcome::Failed), _) => {
            Some((Kind::PowerOff, outcome.code(), reason(outcome.code())))
        }
        // Stopped but not yet seen off: the retry that sees it off tells.
        // Found off: nothing was powered off; the fencing that follows tells.
        (PowerOutcome::StopPending | PowerOutcome::FoundOff | PowerOutcome::Deleted, _) => None,
    }
}

fn refusal_is_notable(refusal: &Refusal) -> bool {
    match refusal {
        Refusal::Exempt(_)
        | Refusal::ControlPlane
        | Refusal::SharedMachine { .. }
        | Refusal::Partition { .. }
        | Refusal::ZoneDark { .. }
        | Refusal::PoweredOffBefore { .. }
        | Refusal::MachineReplaced { .. }
        | Refusal::CapReached { .. } => true,
        Refusal::Disabled
        | Refusal::NodeReady
        | Refusal::KubeletReporting
        | Refusal::NodeGone
        | Refusal::NotItsOwnMachine
        | Refusal::LookupFailed
        | Refusal::NotRunning { .. }
        | Refusal::NotReadyTooShort { .. }
        | Refusal::NothingStuck
        | Refusal::PodsUnread => false,
    }
}

fn of_recovery(r: &RecoveryReport) -> Option<&'static str> {
    match r.outcome {
        RecoveryOutcome::Recovered | RecoveryOutcome::Planned | RecoveryOutcome::Failed => {
            Some(r.outcome.code())
        }
        RecoveryOutcome::Waiting | RecoveryOutcome::Kept => None,
    }
}

fn done(r: &NodeReport) -> Done {
    Done {
        taint_applied: r.taint_applied,
        taint_removed: false,
        volumes_detached: r
            .volumes
            .iter()
            .filter(|v| v.outcome == VolumeOutcome::Detached)
            .map(|v| v.volume.clone())
            .collect(),
        attachments_deleted: r.attachments_deleted,
        pods_deleted: r.pods_deleted,
        powered_off: r
            .power_off
            .as_ref()
            .is_some_and(|p| p.outcome == PowerOutcome::Stopped),
    }
}

fn evidence(r: &NodeReport) -> Evidence {
    Evidence {
        triggers: r.origins.clone(),
        power_off: r.power_off.clone(),
        fenced_at: r.fenced_at.clone(),
        errors: r.errors.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::core::outbound::report::VolumeReport;
    use crate::core::rules::reach::Exemption;

    fn fenced() -> NodeReport {
        NodeReport {
            instance_id: InstanceId::parse("i-0123456789abcdef0"),
            instance_state: Some(InstanceState::Stopped),
            reason: "EC2 confirmed the instance stopped".into(),
            volumes: vec![
                volume("vol-0000000000000000a", VolumeOutcome::Detached),
                volume("vol-0000000000000000b", VolumeOutcome::Kept),
            ],
            origins: vec![Origin::Sweep],
            ..NodeReport::of("n1", Outcome::Fenced)
        }
    }

    fn volume(id: &str, outcome: VolumeOutcome) -> VolumeReport {
        VolumeReport {
            volume: VolumeId::parse(id).expect("a volume id"),
            pv: None,
            outcome,
            detail: None,
        }
    }

    fn skipped(skip: Skip) -> NodeReport {
        NodeReport {
            reason: skip.to_string(),
            skip: Some(skip),
            ..NodeReport::of("n2", Outcome::Skipped)
        }
    }

    fn powered(report: PowerReport) -> NodeReport {
        NodeReport {
            power_off: Some(report),
            ..skipped(Skip::InstanceNotOff {
                state: InstanceState::Running,
            })
        }
    }

    fn recovery(outcome: RecoveryOutcome) -> RecoveryReport {
        RecoveryReport {
            node: "n3".into(),
            instance_id: InstanceId::parse("i-0123456789abcdef1"),
            instance_state: Some(InstanceState::Running),
            outcome,
            reason: "Ready again".into(),
            hold: None,
            taint_removed: outcome == RecoveryOutcome::Recovered,
            requested: false,
            errors: Vec::new(),
            origins: Vec::new(),
        }
    }

    /// What each message tells, in order: its kind, outcome and reason.
    fn told(out: &[Notice]) -> Vec<(Kind, &'static str, &str)> {
        out.iter()
            .map(|n| (n.kind, n.outcome, n.reason.code.as_str()))
            .collect()
    }

    fn json_of(n: &Notice) -> Value {
        serde_json::to_value(n).expect("a notice serialises")
    }

    #[test]
    fn a_fencing_says_what_was_done_to_which_machine_and_why() {
        let report = Report::of("corr-1", vec![fenced()]);
        let out = notices(&report, Some("prod"), 1_767_225_600);
        assert_eq!(out.len(), 1);
        assert_eq!(
            json_of(&out[0]),
            json!({
                "schema": "node-fencer.io/notice/v1",
                "kind": "fencing",
                "outcome": "fenced",
                "reason": {"code": "fenced", "text": "EC2 confirmed the instance stopped"},
                "node": "n1",
                "machine": {"cloud": "aws", "id": "i-0123456789abcdef0", "state": "stopped"},
                "cluster": "prod",
                "dry_run": false,
                "done": {
                    "taint_applied": true,
                    "taint_removed": false,
                    "volumes_detached": ["vol-0000000000000000a"],
                    "attachments_deleted": 0,
                    "pods_deleted": 0,
                    "powered_off": false,
                },
                "evidence": {"triggers": [{"kind": "sweep"}]},
                "correlation_id": "corr-1",
                "at": "2026-01-01T00:00:00Z",
            })
        );
        let attributes = out[0].attributes();
        assert!(attributes.contains(&("kind", "fencing".into())));
        assert!(attributes.contains(&("cluster", "prod".into())));
        assert_eq!(out[0].subject(), "node-fencer: n1 fenced in prod");
    }

    #[test]
    fn only_the_guards_refusals_are_told_not_the_normal_course() {
        let exempt = Skip::Exempt(Exemption::OptedOut);
        let cap = Skip::CapReached {
            limit: 1,
            out_of_service: 1,
        };
        let report = Report::of(
            "c",
            vec![
                skipped(exempt),
                skipped(cap),
                skipped(Skip::NodeReady),
                skipped(Skip::InstanceNotOff {
                    state: InstanceState::Running,
                }),
                skipped(Skip::LookupFailed { error: "x".into() }),
                NodeReport::of("n9", Outcome::AlreadyFenced),
            ],
        );
        let out = notices(&report, None, 0);
        assert_eq!(
            told(&out),
            [
                (Kind::Refusal, "refused", "opted_out"),
                (Kind::Refusal, "refused", "cap_reached"),
            ]
        );
        assert!(out[0].attributes().iter().all(|(k, _)| *k != "cluster"));
    }

    #[test]
    fn a_power_off_is_told_and_its_waits_are_not() {
        let stopped = PowerReport::new(PowerOutcome::Stopped, "hung 600 s", Some(600), None);
        let partition = PowerReport::refused(
            Refusal::Partition {
                dark: 5,
                nodes: 10,
                percent: 30,
            },
            Some(600),
            None,
        );
        let too_short = PowerReport::refused(
            Refusal::NotReadyTooShort {
                for_seconds: Some(30),
                needed: 300,
            },
            Some(30),
            None,
        );
        let report = Report::of(
            "c",
            vec![powered(stopped), powered(partition), powered(too_short)],
        );
        let out = notices(&report, None, 0);
        assert_eq!(
            told(&out),
            [
                (Kind::PowerOff, "stopped", "stopped"),
                (Kind::Refusal, "refused", "partition"),
            ]
        );
        assert!(out[0].done.powered_off);
        assert_eq!(
            json_of(&out[0])["evidence"]["power_off"]["not_ready_for"],
            600
        );
    }

    #[test]
    fn a_recovery_is_told_once_it_ends_and_a_dry_run_says_so() {
        let mut report = Report::of("c", vec![NodeReport::of("n4", Outcome::Planned)]);
        report.dry_run = true;
        report.recoveries = vec![
            recovery(RecoveryOutcome::Recovered),
            recovery(RecoveryOutcome::Waiting),
            recovery(RecoveryOutcome::Kept),
        ];
        let out = notices(&report, None, 0);
        let told: Vec<(Kind, &str)> = out.iter().map(|n| (n.kind, n.outcome)).collect();
        assert_eq!(
            told,
            [(Kind::Fencing, "planned"), (Kind::Recovery, "recovered")]
        );
        assert!(out.iter().all(|n| n.dry_run));
        assert!(out[1].done.taint_removed);
        assert_eq!(out[0].subject(), "node-fencer: n4 fenced (dry run)");
    }

    #[test]
    fn the_kill_switch_marks_every_message_as_changing_nothing() {
        let mut report = Report::of("c", vec![NodeReport::of("n5", Outcome::Planned)]);
        report.kill_switch = true;
        assert!(notices(&report, None, 0)[0].dry_run);
    }

    #[test]
    fn each_change_of_a_witness_is_told_with_what_mends_it() {
        use crate::core::outbound::report::{WitnessChange, WitnessSummary};
        use crate::core::rules::witness::{Failing, Reason as Class, Witnessed};
        let vm = "gce://proj-fencer/europe-west1-b/gke-1";
        let failing = Witnessed {
            node: "gke-1".into(),
            machine: vm.into(),
            verdict: Err(Failing {
                reason: Class::Forbidden,
                detail: "compute.instances.detachDisk denied".into(),
                fix: "grant the custom role",
            }),
        };
        let restored = Witnessed {
            node: "ip-10-0-0-1".into(),
            machine: "i-0123456789abcdef0".into(),
            verdict: Ok(()),
        };
        let mut report = Report::of("c", Vec::new());
        report.witness = Some(WitnessSummary::of(
            &[failing.clone(), restored.clone()],
            vec![WitnessChange::of(&failing), WitnessChange::of(&restored)],
        ));
        let out = notices(&report, Some("prod"), 0);
        assert_eq!(
            told(&out),
            [
                (Kind::Witness, "failing", "forbidden"),
                (Kind::Witness, "restored", "restored")
            ]
        );
        let first = json_of(&out[0]);
        assert_eq!(first["kind"], "witness");
        assert_eq!(first["machine"], json!({"cloud": "gce", "id": vm}));
        assert_eq!(
            first["reason"]["text"],
            "compute.instances.detachDisk denied; grant the custom role"
        );
        assert_eq!(first["done"]["taint_applied"], false);
        assert_eq!(
            out[0].subject(),
            "node-fencer: gke-1 could not be fenced now in prod"
        );
        assert_eq!(
            out[1].subject(),
            "node-fencer: ip-10-0-0-1 can be fenced again in prod"
        );
        // A round whose witnesses changed not: nothing to tell.
        report.witness = Some(WitnessSummary::of(&[failing], Vec::new()));
        assert!(notices(&report, None, 0).is_empty());
    }

    #[test]
    fn a_witness_change_on_many_nodes_is_one_notice() {
        use crate::core::outbound::report::{WitnessChange, WitnessSummary};
        use crate::core::rules::witness::{Failing, Reason as Class, Witnessed};
        let denied = |i: usize| Witnessed {
            node: format!("ip-10-0-{}-{}", i / 256, i % 256),
            machine: format!("i-{i:017x}"),
            verdict: Err(Failing {
                reason: Class::Forbidden,
                detail: "ec2:DetachVolume is denied (dry run)".into(),
                fix: "the manifest's aws_actions",
            }),
        };
        let gone = Witnessed {
            node: "stale".into(),
            machine: "i-0000000000000dead".into(),
            verdict: Err(Failing {
                reason: Class::NotFound,
                detail: "the provider does not know this machine".into(),
                fix: "delete the stale Node",
            }),
        };
        let mut round: Vec<Witnessed> = (0..5_000).rev().map(denied).collect();
        round.push(gone);
        let mut report = Report::of("c", Vec::new());
        let changes = round.iter().map(WitnessChange::of).collect();
        report.witness = Some(WitnessSummary::of(&round, changes));
        let out = notices(&report, Some("prod"), 0);
        assert_eq!(
            told(&out),
            [
                (Kind::Witness, "failing", "forbidden"),
                (Kind::Witness, "failing", "not_found")
            ]
        );
        let group = out[0].group.as_ref().expect("a group");
        assert_eq!(group.count, 5_000);
        assert_eq!(group.nodes.len(), GROUP_NAMES_MAX);
        assert_eq!(group.nodes[0], "ip-10-0-0-0", "by name");
        assert_eq!(out[0].node, "5000 Nodes");
        assert!(out[0].machine.is_none());
        assert!(out[0].body().len() < 16 * 1024, "{}", out[0].body().len());
        assert_eq!(
            out[0].subject(),
            "node-fencer: 5000 Nodes could not be fenced now in prod"
        );
        assert_eq!(out[1].node, "stale");
        assert!(out[1].group.is_none());
        assert!(
            !json_of(&out[1])
                .as_object()
                .expect("an object")
                .contains_key("group")
        );

        // At the bound, one notice per Node still.
        let few: Vec<Witnessed> = (0..WITNESS_EACH_MAX).map(denied).collect();
        let changes = few.iter().map(WitnessChange::of).collect();
        report.witness = Some(WitnessSummary::of(&few, changes));
        let out = notices(&report, None, 0);
        assert_eq!(out.len(), WITNESS_EACH_MAX);
        assert!(out.iter().all(|n| n.group.is_none()));
    }

    #[test]
    fn a_subject_fits_sns_at_any_node_name_length() {
        let long = "n".repeat(253);
        let report = Report::of("c", vec![NodeReport::of(&long, Outcome::Fenced)]);
        let subject = notices(&report, Some("prod"), 0)[0].subject();
        assert_eq!(subject.chars().count(), 100);
    }
}
