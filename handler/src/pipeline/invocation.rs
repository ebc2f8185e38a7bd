//! One invocation's home: everything a run learns and decides, owned in one
//! place and handed from stage to stage. The stages read and move it; the
//! report is built from it once, at the end.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::inbound::suspect::{Batch, Ignored, Intent, Suspect};
use crate::core::model::facts::FenceMode;
use crate::core::outbound::report::{NodeReport, RecoveryReport, Report};
use crate::core::rules::control::Switch;
use crate::core::rules::decide::Verdict;
use crate::core::rules::plan::{NodeRun, Target};
use crate::core::rules::power::PowerReport;
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::looks::Looks;
use crate::pipeline::stages::hasten::Pending;

/// What one run learnt and decided, and how far each node got.
pub(crate) struct Invocation<'p> {
    /// The settings, as configured (the run's own dry run is the switch's).
    pub policy: &'p Policy,
    /// Whether the run may still write: it only ever turns on.
    pub switch: Switch,
    /// What the cloud said of each machine.
    pub looks: Looks,
    /// Also look for NotReady Nodes no event named.
    pub sweep: bool,
    /// The suspects still to decide (fence, check, power off).
    pub suspects: Vec<Suspect>,
    /// The suspects that ask for a recovery (or an operator's confirmation).
    pub requested: Vec<Suspect>,
    /// The Nodes decided over, once read.
    pub view: Option<NodeView>,
    /// The nodes the suspects name, merged, and the verdict on each.
    pub decision: Decision,
    /// The fencing mode, once chosen (only when some node is to be fenced).
    pub mode: Option<FenceMode>,
    /// One per decided target, from the plan on.
    pub runs: Vec<NodeRun>,
    /// The Nodes `FAST_NOT_READY` proved dead, marked at admission.
    pub pending: Option<Pending>,
    /// The recovery check's reports.
    pub recoveries: Vec<RecoveryReport>,
    /// The fencing an operator's confirmation names, when it names one.
    pub confirming: Option<String>,
    /// When the request that carries the run ends (a Cloud Run request's
    /// timeout, a Lambda invocation's deadline); `None`: no bound but the
    /// stages' own.
    pub deadline: Option<Instant>,
    /// Reports settled before the decision (other clusters' machines).
    settled: Vec<NodeReport>,
    ignored: Vec<Ignored>,
}

/// What is kept of a request's time for the report and the answer.
pub(crate) const ANSWER_RESERVE: Duration = Duration::from_secs(5);

/// The decision over the suspects: one target per node, its verdict, and
/// active fencing's report where it judged one.
#[derive(Default)]
pub(crate) struct Decision {
    /// The nodes (or unmatched suspects), in the order first named.
    pub targets: Vec<Target>,
    /// The verdict for each target.
    pub verdicts: Vec<Verdict>,
    /// Active fencing's report, by target index.
    pub power: HashMap<usize, PowerReport>,
}

impl<'p> Invocation<'p> {
    /// A run over `batch` under `policy`, before anything is asked.
    pub(crate) fn new(policy: &'p Policy, batch: Batch) -> Self {
        Self {
            policy,
            switch: Switch::new(policy.dry_run),
            looks: Looks::default(),
            sweep: batch.sweep,
            suspects: batch.suspects,
            requested: Vec::new(),
            view: None,
            decision: Decision::default(),
            mode: None,
            runs: Vec::new(),
            pending: None,
            recoveries: Vec::new(),
            confirming: batch.fenced_at,
            deadline: None,
            settled: Vec::new(),
            ignored: batch.ignored,
        }
    }

    /// How much of the request's time is left for work (its answer's
    /// reserve kept); `None` without a deadline.
    pub(crate) fn left(&self) -> Option<Duration> {
        self.deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .saturating_sub(ANSWER_RESERVE)
        })
    }

    /// `own`, or sooner when the request ends sooner: a wait never outlasts
    /// the request.
    pub(crate) fn until(&self, own: Instant) -> Instant {
        match self.left() {
            Some(left) => own.min(Instant::now() + left),
            None => own,
        }
    }

    /// Reports a run finished before the decision (the screen's).
    pub(crate) fn settle(&mut self, runs: Vec<NodeRun>) {
        let detach_wait = self.policy.detach_wait;
        self.settled
            .extend(runs.into_iter().map(|r| r.into_report(None, detach_wait)));
    }

    /// True when the screen let every suspect go and nothing else was asked:
    /// the cluster need not be asked anything.
    pub(crate) fn nothing_for_this_cluster(&self) -> bool {
        self.suspects.is_empty() && !self.sweep && !self.settled.is_empty()
    }

    /// Splits the suspects into those to decide and the recovery requests.
    pub(crate) fn set_aside_recoveries(&mut self) {
        let (fencing, recovering) = std::mem::take(&mut self.suspects)
            .into_iter()
            .partition(|s| matches!(s.intent, Intent::Fence | Intent::Check | Intent::PowerOff));
        self.suspects = fencing;
        self.requested = recovering;
    }

    /// True when some run is still on its way to fencing.
    pub(crate) fn fencing(&self) -> bool {
        self.runs.iter().any(|r| r.fencing().is_some())
    }

    /// The report, from what the run got to.
    pub(crate) fn into_report(self, correlation_id: &str) -> Report {
        let (mode, detach_wait) = (self.mode, self.policy.detach_wait);
        let mut results = self.settled;
        results.extend(
            self.runs
                .into_iter()
                .map(|r| r.into_report(mode, detach_wait)),
        );
        Report {
            correlation_id: correlation_id.to_owned(),
            dry_run: self.switch.is_on(),
            kill_switch: self.switch.by_kill_switch(),
            mode,
            results,
            recoveries: self.recoveries,
            ignored: self.ignored,
            errors: self.switch.errors().to_vec(),
            witness: None,
        }
    }
}
