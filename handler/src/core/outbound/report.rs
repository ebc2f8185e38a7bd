//! The structured result of one invocation: what was decided for each node,
//! why, and what was done.

use std::fmt::Write as _;

use serde::Serialize;

use crate::core::inbound::suspect::{Ignored, Origin};
use crate::core::model::facts::FenceMode;
use crate::core::model::instance::{InstanceId, InstanceState, VolumeId};
use crate::core::rules::decide::Skip;
use crate::core::rules::power::PowerReport;
use crate::core::rules::recovery::Hold;

/// The end of the story for one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Tainted by this invocation (and its volumes detached).
    Fenced,
    /// Already tainted; any volumes still attached were detached.
    AlreadyFenced,
    /// Dry run: what would be done.
    Planned,
    /// Left alone, with a reason.
    Skipped,
    /// Something failed; the work is not complete.
    Failed,
}

impl Outcome {
    /// The name used in the report and the metrics.
    pub fn code(self) -> &'static str {
        match self {
            Self::Fenced => "fenced",
            Self::AlreadyFenced => "already_fenced",
            Self::Planned => "planned",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
        }
    }
}

/// What happened to one volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeOutcome {
    /// Would be detached (dry run).
    WouldDetach,
    /// Detached: the fenced instance no longer holds it (it is `available`,
    /// or already attached to another node).
    Detached,
    /// Detach sent, but the fenced instance still holds it after the wait.
    Stuck,
    /// Was not attached to the instance any more.
    AlreadyDetached,
    /// Never detached (root device, unknown to EC2).
    Refused,
    /// Left attached for a pod that stays on the node (it tolerates the
    /// out-of-service taint).
    Kept,
    /// The detach call failed.
    Failed,
}

/// One volume of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VolumeReport {
    /// The EBS volume.
    pub volume: VolumeId,
    /// The PersistentVolume it backs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pv: Option<String>,
    /// What happened.
    pub outcome: VolumeOutcome,
    /// Details (state, error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What happened to one of the node's VolumeAttachments (legacy mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentOutcome {
    /// Would be deleted (dry run).
    WouldDelete,
    /// Deleted (or already gone).
    Deleted,
    /// Left for a pod that stays on the node.
    Kept,
    /// The delete failed.
    Failed,
}

/// One VolumeAttachment of one node, whatever its CSI driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttachmentReport {
    /// The VolumeAttachment.
    pub attachment: String,
    /// Its CSI driver.
    pub driver: String,
    /// Its PersistentVolume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pv: Option<String>,
    /// What happened.
    pub outcome: AttachmentOutcome,
    /// Details (the pod that keeps it, the error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Everything about one node (or one suspect that matched no node).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeReport {
    /// How the trigger named it.
    pub target: String,
    /// The Node, if one matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The EC2 instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<InstanceId>,
    /// The state EC2 reported at decision time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_state: Option<InstanceState>,
    /// The outcome.
    pub outcome: Outcome,
    /// Why, in words.
    pub reason: String,
    /// The skip reason, machine-readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip: Option<Skip>,
    /// Whether this invocation added the taint (legacy mode: the mark).
    pub taint_applied: bool,
    /// Pods force-deleted (legacy mode).
    #[serde(skip_serializing_if = "is_zero")]
    pub pods_deleted: usize,
    /// VolumeAttachments deleted (legacy mode).
    #[serde(skip_serializing_if = "is_zero")]
    pub attachments_deleted: usize,
    /// The node's VolumeAttachments, every driver's (legacy mode).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentReport>,
    /// The node's volumes.
    pub volumes: Vec<VolumeReport>,
    /// Errors met on the way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// The triggers that named this node.
    pub origins: Vec<Origin>,
    /// Active fencing's decision, for a node whose machine still ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_off: Option<PowerReport>,
    /// The fencing the Node carries, node-fencer's, by the time on its
    /// mark: what `recover --confirm --fenced-at` names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fenced_at: Option<String>,
}

impl NodeReport {
    /// True when a retry could still have something to do.
    pub(crate) fn leaves_work(&self) -> bool {
        if self
            .power_off
            .as_ref()
            .is_some_and(PowerReport::leaves_work)
        {
            return true;
        }
        match self.outcome {
            Outcome::Failed => true,
            Outcome::Skipped => self.skip.as_ref().is_some_and(Skip::leaves_work),
            Outcome::Fenced | Outcome::AlreadyFenced | Outcome::Planned => false,
        }
    }
}

#[cfg(test)]
impl NodeReport {
    /// A report of Node `node` with `outcome`, and nothing else yet.
    pub(crate) fn of(node: &str, outcome: Outcome) -> Self {
        Self {
            target: format!("node {node}"),
            node: Some(node.into()),
            instance_id: None,
            instance_state: None,
            outcome,
            reason: String::new(),
            skip: None,
            taint_applied: outcome == Outcome::Fenced,
            pods_deleted: 0,
            attachments_deleted: 0,
            attachments: Vec::new(),
            volumes: Vec::new(),
            errors: Vec::new(),
            origins: Vec::new(),
            power_off: None,
            fenced_at: None,
        }
    }
}

#[cfg(test)]
impl VolumeReport {
    /// `n` volumes, each detached (`vol-00…0`, `vol-00…1`, …).
    pub(crate) fn detached(n: usize) -> Vec<Self> {
        (0..n)
            .filter_map(|i| VolumeId::parse(&format!("vol-{i:017x}")))
            .map(|volume| Self {
                volume,
                pv: None,
                outcome: VolumeOutcome::Detached,
                detail: None,
            })
            .collect()
    }
}

#[cfg(test)]
impl Report {
    /// A report of invocation `correlation_id` over `results`, acting.
    pub(crate) fn of(correlation_id: &str, results: Vec<NodeReport>) -> Self {
        Self {
            correlation_id: correlation_id.into(),
            dry_run: false,
            kill_switch: false,
            mode: None,
            results,
            recoveries: Vec::new(),
            ignored: Vec::new(),
            errors: Vec::new(),
            witness: None,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The end of a recovery check for one fenced node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryOutcome {
    /// The fencing is ended: node-fencer's taint (if any) and annotations are gone.
    Recovered,
    /// Dry run: it would be ended.
    Planned,
    /// On its way back; a later look will end it.
    Waiting,
    /// It stays fenced (the instance is off or gone), or was not node-fencer's.
    Kept,
    /// The recovery write failed.
    Failed,
}

impl RecoveryOutcome {
    /// The name used in the report and the metrics.
    pub fn code(self) -> &'static str {
        match self {
            Self::Recovered => "recovered",
            Self::Planned => "planned",
            Self::Waiting => "waiting",
            Self::Kept => "kept",
            Self::Failed => "failed",
        }
    }
}

/// One fenced node (or one node a trigger asked to recover).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// The Node, or how the trigger named it when no Node matched.
    pub node: String,
    /// The Node's instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<InstanceId>,
    /// Its state as EC2 reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_state: Option<InstanceState>,
    /// The outcome.
    pub outcome: RecoveryOutcome,
    /// Why, in words.
    pub reason: String,
    /// Why it is held, machine-readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Whether this invocation removed the out-of-service taint.
    pub taint_removed: bool,
    /// Whether a trigger asked for this node (else the routine re-check found it).
    pub requested: bool,
    /// Errors met on the way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// The triggers that named this node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<Origin>,
}

impl RecoveryReport {
    /// True when a retry could still have something to do: a failed write
    /// (an operator's confirmation that could not be recorded, or named
    /// another fencing, included), or a requested recovery that is on its
    /// way.
    pub(crate) fn leaves_work(&self) -> bool {
        if !self.errors.is_empty() {
            return true;
        }
        match self.outcome {
            RecoveryOutcome::Failed => true,
            RecoveryOutcome::Waiting => self.requested,
            RecoveryOutcome::Recovered | RecoveryOutcome::Planned | RecoveryOutcome::Kept => false,
        }
    }
}

/// The result of one invocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The invocation's correlation id (also in every log line).
    pub correlation_id: String,
    /// Whether dry-run was on for the whole invocation.
    pub dry_run: bool,
    /// Whether the kill switch turned this invocation into a dry run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kill_switch: bool,
    /// The fencing mode used, when anything was to be fenced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<FenceMode>,
    /// One entry per node or unmatched suspect.
    pub results: Vec<NodeReport>,
    /// Fenced nodes looked at for recovery, and nodes a trigger asked to recover.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recoveries: Vec<RecoveryReport>,
    /// Parts of the trigger that named no node.
    pub ignored: Vec<Ignored>,
    /// Failures that concern the whole invocation (e.g. an unreadable kill switch).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// The witness round that ends a sweep: whether node-fencer could act
    /// on each Node's machine if it died now. Never work left undone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witness: Option<WitnessSummary>,
}

/// What a witness round found (`core::rules::witness`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WitnessSummary {
    /// How many Nodes' machines were looked at.
    pub machines: usize,
    /// Those whose witness fails, with why and what mends it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<WitnessFailure>,
    /// The Nodes whose witness changed since the round before, each told
    /// as an Event on the Node and a notice (none in a dry run, which
    /// keeps nothing to tell changes against).
    pub changes: Vec<WitnessChange>,
    /// Changes seen but left for a later round: the record full (new
    /// failures past [`RECORD_MAX`](crate::core::rules::witness::RECORD_MAX)),
    /// or the invocation's time spent. `failing` lists them all the same.
    #[serde(skip_serializing_if = "is_zero")]
    pub untold: usize,
    /// The Kubernetes grants a fencing needs that the round found denied
    /// (`patch nodes`), each failing every Node's witness.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_denied: Vec<String>,
    /// Why the round could not run to its end (its Events unsent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One Node whose witness fails.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WitnessFailure {
    /// The Node.
    pub node: String,
    /// Its machine.
    pub machine: String,
    /// The class (`core::rules::witness::Reason`'s code).
    pub reason: &'static str,
    /// What was seen.
    pub detail: String,
    /// What mends it.
    pub fix: &'static str,
}

/// One Node whose witness changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WitnessChange {
    /// The Node.
    pub node: String,
    /// Its machine.
    pub machine: String,
    /// `failing` or `restored`.
    pub outcome: &'static str,
    /// The failure's class, or `restored`.
    pub reason: &'static str,
    /// What was seen and what mends it, for a person.
    pub text: String,
}

impl WitnessChange {
    /// The change `w` is.
    pub fn of(w: &crate::core::rules::witness::Witnessed) -> Self {
        let (outcome, reason, text) = match &w.verdict {
            Err(failing) => (
                "failing",
                failing.reason.code(),
                format!("{}; {}", failing.detail, failing.fix),
            ),
            Ok(()) => (
                "restored",
                "restored",
                format!(
                    "the witness of {} answers for this Node's machine again",
                    w.machine
                ),
            ),
        };
        Self {
            node: w.node.clone(),
            machine: w.machine.clone(),
            outcome,
            reason,
            text,
        }
    }
}

impl WitnessSummary {
    /// The lines of the command line's report.
    fn to_text(&self) -> String {
        let mut out = format!(
            "witness: {} machine(s), {} failing, {} change(s)\n",
            self.machines,
            self.failing.len(),
            self.changes.len()
        );
        for f in &self.failing {
            let _ = writeln!(
                out,
                "  {} ({}): {}: {}; {}",
                f.node, f.machine, f.reason, f.detail, f.fix
            );
        }
        if !self.kubernetes_denied.is_empty() {
            let _ = writeln!(
                out,
                "  Kubernetes denies: {}",
                self.kubernetes_denied.join(", ")
            );
        }
        if self.untold > 0 {
            let _ = writeln!(
                out,
                "  {} change(s) left for the next round (the record full, or the time spent)",
                self.untold
            );
        }
        if let Some(e) = &self.error {
            let _ = writeln!(out, "  witness error: {e}");
        }
        out
    }

    /// The summary of `round`, with the `changes` told.
    pub fn of(
        round: &[crate::core::rules::witness::Witnessed],
        changes: Vec<WitnessChange>,
    ) -> Self {
        let failing = round
            .iter()
            .filter_map(|w| {
                let failing = w.verdict.as_ref().err()?;
                Some(WitnessFailure {
                    node: w.node.clone(),
                    machine: w.machine.clone(),
                    reason: failing.reason.code(),
                    detail: failing.detail.clone(),
                    fix: failing.fix,
                })
            })
            .collect();
        Self {
            machines: round.len(),
            failing,
            changes,
            untold: 0,
            kubernetes_denied: Vec::new(),
            error: None,
        }
    }
}

impl Report {
    /// True when some work is left undone: the invocation must fail so that
    /// Lambda retries it and the dead-letter queue catches it in the end.
    pub fn incomplete(&self) -> bool {
        self.results.iter().any(NodeReport::leaves_work)
            || self.recoveries.iter().any(RecoveryReport::leaves_work)
            || !self.errors.is_empty()
    }

    /// A human-readable rendering for the command line.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for r in &self.results {
            let who = r.node.as_deref().unwrap_or(&r.target);
            let inst = r
                .instance_id
                .as_ref()
                .map(|i| match &r.instance_state {
                    Some(s) => format!(" ({i}, {s})"),
                    None => format!(" ({i})"),
                })
                .unwrap_or_default();
            let outcome = serde_json::to_value(r.outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let fenced = r
                .fenced_at
                .as_deref()
                .map(|at| format!(" [fenced at {at}]"))
                .unwrap_or_default();
            let _ = writeln!(out, "{who}{inst}{fenced}: {outcome}: {}", r.reason);
            for v in &r.volumes {
                let o = serde_json::to_value(v.outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let pv =
                    v.pv.as_deref()
                        .map(|p| format!(" (pv {p})"))
                        .unwrap_or_default();
                let detail = v
                    .detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                let _ = writeln!(out, "  volume {}{pv}: {o}{detail}", v.volume);
            }
            for e in &r.errors {
                let _ = writeln!(out, "  error: {e}");
            }
        }
        for r in &self.recoveries {
            let outcome = serde_json::to_value(r.outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let inst = r
                .instance_id
                .as_ref()
                .map(|i| format!(" ({i})"))
                .unwrap_or_default();
            let _ = writeln!(out, "{}{inst}: recovery {outcome}: {}", r.node, r.reason);
            for e in &r.errors {
                let _ = writeln!(out, "  error: {e}");
            }
        }
        for i in &self.ignored {
            let _ = writeln!(out, "ignored: {}", i.reason);
        }
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
        if self.kill_switch {
            out.push_str("kill switch on: every action was a dry run\n");
        }
        if let Some(w) = &self.witness {
            out.push_str(&w.to_text());
        }
        if self.results.is_empty() && self.ignored.is_empty() && self.recoveries.is_empty() {
            out.push_str("nothing to do\n");
        }
        out
    }
}
