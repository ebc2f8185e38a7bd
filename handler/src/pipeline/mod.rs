//! The fencing pipeline: [`screen`] (another cluster's instance goes no
//! further) → kill switch → resolve → [`confirm`] → decide → [`power`]
//! (active fencing: a hung node's machine powered off, then decided
//! again) → [`discover`] → [`admit`] (second confirmation, Lease, recount) →
//! [`taint`] → [`detach`] (a third confirmation, then [`legacy`] in that
//! mode, then the detaches) → [`verify`] →
//! report, then the recovery check ([`recover`]). Each stage is a file that
//! gathers facts through the [`Cloud`] and [`Cluster`] traits, hands them to
//! the core, and carries out what the core says. Every node's progress is a
//! [`NodeRun`]; the report is built once, from the final states.

mod admit;
mod confirm;
mod detach;
mod discover;
#[cfg(test)]
mod fakes;
mod legacy;
mod nodes;
mod pods;
mod power;
mod recover;
mod screen;
mod taint;
#[cfg(test)]
mod tests;
mod verify;

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use tracing::{info, warn};

use crate::core::cap;
use crate::core::control::KillSwitch;
use crate::core::decide::{self, Case, Verdict};
use crate::core::events::{self, NodeEvent};
use crate::core::facts::{Confirmation, FenceMode};
use crate::core::instance::InstanceId;
use crate::core::metrics::{Dependency, Meter};
use crate::core::mode::{self, ModeSetting};
use crate::core::plan::{self, NodeRun};
use crate::core::policy::Policy;
use crate::core::report::{NodeReport, Report};
use crate::core::resolve::{self, Resolution};
use crate::core::suspect::{Batch, Intent, Suspect};
use crate::core::sweep;
use crate::core::view::NodeView;
use crate::shell::cloud::Cloud;
use crate::shell::cluster::{Cluster, ClusterError};

/// How many nodes are worked on at once within one invocation.
const PARALLEL_NODES: usize = 8;

/// The handles one invocation works with.
pub struct Ctx<'a> {
    /// The cloud.
    pub cloud: &'a dyn Cloud,
    /// Kubernetes.
    pub cluster: &'a dyn Cluster,
    /// Where stage latencies and failed calls are counted.
    pub meter: &'a Meter,
    /// Names this invocation in logs, Events and the Node's annotations.
    pub correlation_id: String,
}

impl Ctx<'_> {
    /// Reads the kill switch; one that cannot be read counts as on (it may
    /// be). Returns the switch and, when the read failed, the error.
    async fn kill_switch(&self, namespace: &str) -> (KillSwitch, Option<String>) {
        match self.cluster.kill_switch(namespace).await {
            Ok(KillSwitch::Unreadable(value)) => {
                warn!(
                    value,
                    "the kill switch holds neither true nor false; acting as if it were on"
                );
                (KillSwitch::Unreadable(value), None)
            }
            Ok(k) => {
                if k.engaged() {
                    warn!("kill switch on: every action is a dry run");
                }
                (k, None)
            }
            Err(e) => {
                // Fail closed: an unreadable switch may be an engaged one.
                self.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "kill switch unreadable; acting as if it were on");
                (KillSwitch::Unreadable(e.to_string()), Some(e.to_string()))
            }
        }
    }

    /// The kill switch read again after a wait, right before the first write
    /// after it: on (or unreadable) now, and the read's error if it failed.
    async fn switched_off_since(&self, namespace: &str) -> Switched {
        let (now, error) = self.kill_switch(namespace).await;
        Switched {
            on: now.engaged(),
            error: error.map(|e| format!("{e}; what followed the wait was a dry run")),
        }
    }

    /// Lets the fencing Lease go; one that cannot be released expires on
    /// its own, so the next holder waits at most that long.
    async fn release_lease(&self, namespace: &str) {
        if let Err(e) = self
            .cluster
            .release_lease(namespace, &self.correlation_id)
            .await
        {
            self.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "could not release the fencing lease");
        }
    }

    /// Records an Event on a Node, once per occasion (the fencing it ends,
    /// else this invocation); a failure to record is logged, never fatal to
    /// fencing.
    async fn record(&self, node: &str, event: NodeEvent) {
        let occasion = event.occasion.as_deref().unwrap_or(&self.correlation_id);
        let name = events::event_name(node, event.reason, occasion);
        if let Err(e) = self.cluster.node_event(node, &event, &name).await {
            self.meter.error(Dependency::Kubernetes);
            warn!(error = %e, reason = event.reason.as_str(), "could not record the event");
        }
    }
}

/// The kill switch as read again after a wait.
#[derive(Debug, Default)]
struct Switched {
    /// On, or unreadable: what follows the wait is a plan.
    on: bool,
    /// The failed read, for the report (the invocation is then retried).
    error: Option<String>,
}

impl Switched {
    fn or(self, other: Switched) -> Switched {
        Switched {
            on: self.on || other.on,
            error: self.error.or(other.error),
        }
    }
}

/// A failure that stops the whole invocation before any decision.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The node list (or the Lease, or the server version) could not be
    /// read, so nothing can be decided.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// Runs the pipeline over one batch under `policy`.
pub async fn run(ctx: &Ctx<'_>, policy: &Policy, batch: Batch) -> Result<Report, PipelineError> {
    let screened = screen::screen(ctx, policy, batch.suspects).await;
    let mut results = finish(screened.foreign, None, policy);
    if screened.suspects.is_empty() && !batch.sweep && !results.is_empty() {
        // Only other clusters' instances: nothing to ask Kubernetes.
        return Ok(Report {
            correlation_id: ctx.correlation_id.clone(),
            dry_run: policy.dry_run,
            kill_switch: false,
            mode: None,
            results,
            recoveries: Vec::new(),
            ignored: batch.ignored,
            errors: Vec::new(),
        });
    }
    let mut errors = Vec::new();
    let (kill_switch, unreadable) = ctx.kill_switch(&policy.control_namespace).await;
    if let Some(e) = unreadable {
        errors.push(format!("{e}; every action was a dry run"));
    }
    let dry_run = policy.dry_run || kill_switch.engaged();
    let known = screened.confirmations;
    let view = if batch.sweep {
        nodes::full(ctx).await?
    } else {
        nodes::view(ctx, policy, &screened.suspects, &known).await?
    };
    let mut suspects = screened.suspects;
    if batch.sweep {
        let swept = sweep::suspects(&view.nodes);
        info!(
            nodes = view.nodes.len(),
            swept = swept.len(),
            "sweeping for nodes no event named"
        );
        suspects.extend(swept);
        if !dry_run {
            nodes::take_census(ctx, policy, &view.nodes, &known).await;
        }
    }
    let (fencing, recovering): (Vec<Suspect>, Vec<Suspect>) = suspects
        .into_iter()
        .partition(|s| matches!(s.intent, Intent::Fence | Intent::Check | Intent::PowerOff));
    let (fenced, mode, fence_switched) = if fencing.is_empty() {
        (Vec::new(), None, Switched::default())
    } else {
        fence(ctx, policy, dry_run, fencing, &view, known.clone()).await?
    };
    results.extend(fenced);
    let (recoveries, recover_switched) =
        recover::run(ctx, policy, dry_run, recovering, &view.nodes, &known).await;
    // Turned on during a wait: what was left became a plan.
    let switched = fence_switched.or(recover_switched);
    errors.extend(switched.error);
    let switched = switched.on;
    Ok(Report {
        correlation_id: ctx.correlation_id.clone(),
        dry_run: dry_run || switched,
        kill_switch: kill_switch.engaged() || switched,
        mode,
        results,
        recoveries,
        ignored: batch.ignored,
        errors,
    })
}

/// Decides every suspect of the batch and fences those the core says to;
/// also says whether the kill switch turned on during a wait. `confirmations`
/// holds what the screen already learnt of the instances.
async fn fence(
    ctx: &Ctx<'_>,
    policy: &Policy,
    dry_run: bool,
    suspects: Vec<Suspect>,
    view: &NodeView,
    mut confirmations: HashMap<InstanceId, Confirmation>,
) -> Result<(Vec<NodeReport>, Option<FenceMode>, Switched), PipelineError> {
    let mut view: Cow<'_, NodeView> = Cow::Borrowed(view);
    let deadline = Instant::now() + policy.not_ready_wait;
    let (targets, verdicts) = loop {
        let (targets, verdicts) =
            decide_suspects(ctx, policy, dry_run, &suspects, &view, &mut confirmations).await;
        // A partial view only admits: a refusal by the cap is decided again
        // over the whole cluster, as it always was.
        if view.is_partial() && verdicts.iter().any(by_cap) {
            info!("the cap would refuse: deciding again over every Node");
            view = Cow::Owned(nodes::full(ctx).await?);
            continue;
        }
        let nodes = &view.nodes;
        // EC2's `stopped` comes before the node controller's grace period
        // is over: rather than fail and wait for Lambda's retries (1 and 2
        // minutes later), look again until Kubernetes notices.
        let ready: Vec<&str> = targets
            .iter()
            .zip(&verdicts)
            .filter(|(t, v)| {
                t.intent == Intent::Fence
                    && matches!(
                        v,
                        Verdict::Skip {
                            reason: decide::Skip::NodeReady
                        }
                    )
            })
            .filter_map(|(t, _)| t.node.map(|i| nodes[i].name.as_str()))
            .collect();
        if dry_run || ready.is_empty() || Instant::now() >= deadline {
            break (targets, verdicts);
        }
        info!(
            nodes = ready.join(","),
            "instance off, Node still Ready: waiting for Kubernetes to notice"
        );
        tokio::time::sleep(policy.poll_interval.min(deadline - Instant::now())).await;
        view = Cow::Owned(nodes::refresh(ctx, policy, &view).await?);
    };
    let (verdicts, powered) = if targets.iter().any(|t| t.power_off) {
        let powered = power::step(
            ctx,
            policy,
            dry_run,
            &targets,
            &verdicts,
            &view,
            &mut confirmations,
        )
        .await?;
        // A machine powered off is decided again, as if EC2 had reported it
        // stopped on its own.
        let verdicts = if powered.sent {
            let settings = policy.decision(dry_run, view.cluster_size());
            decide_all(&targets, &view, &confirmations, &settings)
        } else {
            verdicts
        };
        (verdicts, powered.reports)
    } else {
        (verdicts, HashMap::new())
    };
    let nodes = &view.nodes;
    let mut runs = plan::plan(&targets, &verdicts, nodes, &confirmations);
    for (k, report) in powered {
        runs[k].power_off = Some(report);
    }

    for ((run, verdict), target) in runs.iter().zip(&verdicts).zip(&targets) {
        info!(
            suspect = %run.reference, node = run.node.as_deref().unwrap_or("-"),
            instance = run.instance_id.as_ref().map_or("-", |i| i.as_str()),
            state = run.instance_state.as_ref().map_or("-", |s| s.name()),
            verdict = match verdict { Verdict::Fence { .. } => "fence", Verdict::Skip { reason } => reason.code() },
            "decided"
        );
        // A dry run changes nothing, not even the Node's Events.
        let live = !dry_run && target.intent == Intent::Fence;
        if let (Verdict::Skip { reason }, Some(node)) = (verdict, &run.node)
            && matches!(reason, decide::Skip::CapReached { .. })
            && live
        {
            refused(ctx, node, reason).await;
        }
    }
    if runs.iter().all(|r| r.fencing().is_none()) {
        return Ok((finish(runs, None, policy), None, Switched::default()));
    }
    let mode = fence_mode(ctx, policy).await?;
    discover::volumes(ctx, mode, &mut runs).await;
    let switched = admit::admit(ctx, policy, mode, &confirmations, &view, &mut runs).await?;
    detach::act(ctx, policy, mode, &mut runs).await;
    verify::volumes(ctx, policy, &mut runs).await;
    Ok((finish(runs, Some(mode), policy), Some(mode), switched))
}

/// Resolves, confirms (asking the cloud only about instances not asked
/// about yet) and decides every suspect against `nodes`.
async fn decide_suspects(
    ctx: &Ctx<'_>,
    policy: &Policy,
    dry_run: bool,
    suspects: &[Suspect],
    view: &NodeView,
    confirmations: &mut HashMap<InstanceId, Confirmation>,
) -> (Vec<plan::Target>, Vec<Verdict>) {
    let nodes = &view.nodes;
    let resolutions: Vec<Resolution> = suspects
        .iter()
        .map(|s| resolve::resolve(&s.target, nodes))
        .collect();
    // Out of band, one batched call for every instance of the invocation.
    let ids: Vec<InstanceId> = plan::instances_to_confirm(&resolutions, nodes)
        .into_iter()
        .filter(|id| !confirmations.contains_key(id))
        .collect();
    if !ids.is_empty() {
        confirmations.extend(confirm::instances(ctx, &ids).await);
    }
    plan::disown_replaced(nodes, confirmations);
    let targets = plan::targets(
        suspects.to_vec(),
        resolutions,
        nodes,
        confirmations,
        policy.scope.as_ref(),
    );
    let settings = policy.decision(dry_run, view.cluster_size());
    let mut verdicts = decide_all(&targets, view, confirmations, &settings);
    // Before refusing, ask whether the Nodes filling the cap are dead for
    // good (terminated or gone): those take no room. A partial view does not
    // hold them all: the caller decides again over every Node.
    if verdicts.iter().any(by_cap) && !view.is_partial() {
        let ids = cap::worth_asking(nodes, confirmations);
        if !ids.is_empty() {
            confirmations.extend(confirm::instances(ctx, &ids).await);
            plan::disown_replaced(nodes, confirmations);
            verdicts = decide_all(&targets, view, confirmations, &settings);
        }
    }
    (targets, verdicts)
}

/// True for a refusal by the cap.
fn by_cap(verdict: &Verdict) -> bool {
    matches!(
        verdict,
        Verdict::Skip {
            reason: decide::Skip::CapReached { .. }
        }
    )
}

/// The verdict for every target, against the room the cap has left.
fn decide_all(
    targets: &[plan::Target],
    view: &NodeView,
    confirmations: &HashMap<InstanceId, Confirmation>,
    settings: &decide::Settings,
) -> Vec<Verdict> {
    let nodes = &view.nodes;
    let cases: Vec<Case<'_>> = targets
        .iter()
        .map(|t| Case {
            intent: t.intent,
            node: t.node.map(|i| &nodes[i]),
            confirmation: t.instance.as_ref().and_then(|id| confirmations.get(id)),
        })
        .collect();
    decide::decide_batch(&cases, settings, view.taken(confirmations))
}

/// The reports, one per run, in the order of the suspects.
fn finish(runs: Vec<NodeRun>, mode: Option<FenceMode>, policy: &Policy) -> Vec<NodeReport> {
    runs.into_iter()
        .map(|r| r.into_report(mode, policy.detach_wait))
        .collect()
}

/// The mode in force: configured, or by the server's version.
async fn fence_mode(ctx: &Ctx<'_>, policy: &Policy) -> Result<FenceMode, PipelineError> {
    Ok(match policy.mode {
        ModeSetting::Taint => FenceMode::Taint,
        ModeSetting::Legacy => FenceMode::Legacy,
        ModeSetting::Auto => {
            let version = ctx
                .cluster
                .server_version()
                .await
                .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
            let chosen = mode::choose(ModeSetting::Auto, version);
            info!(%version, mode = chosen.name(), "fencing mode chosen by server version");
            chosen
        }
    })
}

/// Logs and records a refusal by the cap.
async fn refused(ctx: &Ctx<'_>, node: &str, reason: &decide::Skip) {
    warn!(node, "{reason}");
    ctx.record(node, NodeEvent::refused(reason)).await;
}
