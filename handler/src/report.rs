//! The structured result of one invocation: what was decided for each node,
//! why, and what was done.

use std::fmt::Write as _;

use serde::Serialize;

use crate::decide::Skip;
use crate::instance::{InstanceId, InstanceState, VolumeId};
use crate::suspect::{Ignored, Origin};

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
    /// Detached and now `available`.
    Detached,
    /// Detach sent but not yet `available` within the wait.
    Stuck,
    /// Was not attached to the instance any more.
    AlreadyDetached,
    /// Never detached (root device, unknown to EC2).
    Refused,
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
    /// Whether this invocation added the taint.
    pub taint_applied: bool,
    /// The node's volumes.
    pub volumes: Vec<VolumeReport>,
    /// Errors met on the way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// The triggers that named this node.
    pub origins: Vec<Origin>,
}

impl NodeReport {
    /// True when a retry could still have something to do.
    pub fn leaves_work(&self) -> bool {
        match self.outcome {
            Outcome::Failed => true,
            Outcome::Skipped => self.skip.as_ref().is_some_and(Skip::leaves_work),
            Outcome::Fenced | Outcome::AlreadyFenced | Outcome::Planned => false,
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
    /// One entry per node or unmatched suspect.
    pub results: Vec<NodeReport>,
    /// Parts of the trigger that named no node.
    pub ignored: Vec<Ignored>,
}

impl Report {
    /// True when some work is left undone: the invocation must fail so that
    /// Lambda retries it and the dead-letter queue catches it in the end.
    pub fn incomplete(&self) -> bool {
        self.results.iter().any(NodeReport::leaves_work)
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
            let _ = writeln!(out, "{who}{inst}: {outcome}: {}", r.reason);
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
        for i in &self.ignored {
            let _ = writeln!(out, "ignored: {}", i.reason);
        }
        if self.results.is_empty() && self.ignored.is_empty() {
            out.push_str("nothing to do\n");
        }
        out
    }
}
