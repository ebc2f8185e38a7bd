//! Admission: the last look before the first irreversible step. After the
//! optional delay, an invocation that is about to write new taints takes the
//! cluster's Lease, recounts the cap against the Nodes as they are now, asks
//! the cloud again, writes the taints, and lets the Lease go. While it holds
//! the Lease it renews it, and it writes a taint only while the last renewal
//! is fresh: a holder slowed past the Lease's duration stops writing before
//! another invocation may take over, so the cap holds. The Events wait until
//! the Lease is released. Dry runs take no Lease and no cap room.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Ctx, PipelineError, Switched, confirm, nodes, refused, taint};
use crate::core::control::LeaseTiming;
use crate::core::facts::{Confirmation, FenceMode};
use crate::core::instance::InstanceId;
use crate::core::metrics::Dependency;
use crate::core::plan::{self, NodePlan, NodeRun, Stage};
use crate::core::policy::Policy;
use crate::core::view::NodeView;

/// The right to write under the Lease: fresh while the last renewal is
/// younger than [`LeaseTiming::valid_for`], gone for good once a renewal
/// finds the Lease taken over.
pub(super) struct Hold {
    timing: LeaseTiming,
    renewed: Mutex<Instant>,
    lost: AtomicBool,
    renewals: AtomicUsize,
}

impl Hold {
    fn new(timing: LeaseTiming, taken: Instant) -> Self {
        Self {
            timing,
            renewed: Mutex::new(taken),
            lost: AtomicBool::new(false),
            renewals: AtomicUsize::new(0),
        }
    }

    /// How long this invocation may still write; `None` when it may not.
    pub(super) fn left(&self) -> Option<Duration> {
        if self.lost.load(Ordering::SeqCst) {
            return None;
        }
        let renewed = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        self.timing
            .valid_for
            .checked_sub(renewed.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// Renews the Lease every `renew_every` until it is lost or `done` is
    /// notified; a renewal under way is finished first, so the release that
    /// follows never races it. A renewal counts from when it was sent, and
    /// one that cannot be answered within the time left counts as not made.
    async fn keep(&self, ctx: &Ctx<'_>, namespace: &str, done: &Notify) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.timing.renew_every) => {}
                () = done.notified() => return,
            }
            let Some(left) = self.left() else {
                // Ran out unrenewed: whatever a late renewal says, the
                // writes under this hold are over.
                warn!(
                    "the fencing Lease could not be renewed in time; no further taint is written"
                );
                return;
            };
            let sent = Instant::now();
            let renew = ctx.cluster.renew_lease(namespace, &ctx.correlation_id);
            match tokio::time::timeout(left, renew).await {
                Ok(Ok(true)) => {
                    *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = sent;
                    self.renewals.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Ok(false)) => {
                    warn!("the fencing Lease was taken over; no further taint is written");
                    self.lost.store(true, Ordering::SeqCst);
                    return;
                }
                Ok(Err(e)) => {
                    ctx.meter.error(Dependency::Kubernetes);
                    warn!(error = %e, "could not renew the fencing Lease");
                }
                Err(_) => warn!("renewing the fencing Lease timed out"),
            }
        }
    }
}

/// Admits the runs still decided for fencing and taints them; a run that is
/// refused or not confirmed again is skipped with its reason. `known` is what
/// the invocation learnt of the machines (for the recount). Returns the kill
/// switch as read after the waits (on: the runs became plans).
pub(super) async fn admit(
    ctx: &Ctx<'_>,
    policy: &Policy,
    mode: FenceMode,
    known: &HashMap<InstanceId, Confirmation>,
    view: &NodeView,
    runs: &mut [NodeRun],
) -> Result<Switched, PipelineError> {
    let live = runs.iter().any(|r| r.fencing().is_some_and(|p| !p.dry_run));
    let new_taints = runs
        .iter()
        .any(|r| r.fencing().is_some_and(NodePlan::writes_new_taint));
    if live && !policy.confirm_again_after.is_zero() {
        info!(
            delay_s = policy.confirm_again_after.as_secs(),
            "waiting before the second confirmation"
        );
        tokio::time::sleep(policy.confirm_again_after).await;
    }
    let namespace = &policy.control_namespace;
    let taken = if new_taints {
        Some(
            ctx.cluster
                .acquire_lease(namespace, &ctx.correlation_id)
                .await
                .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?,
        )
    } else {
        None
    };
    let lease_waited = taken.is_some_and(|t| t.waited);
    // After a wait (the delay, or the Lease held by another invocation), the
    // kill switch is read again before the first write.
    let waited = lease_waited || (live && !policy.confirm_again_after.is_zero());
    let switched = if waited {
        ctx.switched_off_since(namespace).await
    } else {
        Switched::default()
    };
    if switched.on {
        warn!("the kill switch turned on while waiting: the rest is a plan");
        runs.iter_mut().for_each(NodeRun::plan_only);
    }
    let refused_now = if let Some(taken) = taken {
        // The Lease's duration counts from the time written into it.
        let taken = Instant::from_std(taken.stamped);
        let hold = Hold::new(policy.lease, taken);
        let done = Notify::new();
        let recount = (!switched.on).then_some(known);
        let work = async {
            let out = under_lease(ctx, policy, mode, recount, view, Some(&hold), runs).await;
            done.notify_one();
            out
        };
        let (refused_now, ()) = tokio::join!(work, hold.keep(ctx, namespace, &done));
        let held_for = taken.elapsed();
        info!(
            held_ms = held_for.as_millis() as u64,
            renewals = hold.renewals.load(Ordering::SeqCst),
            "releasing the fencing lease"
        );
        ctx.release_lease(namespace).await;
        refused_now
    } else {
        under_lease(ctx, policy, mode, None, view, None, runs).await
    };
    // Recorded once the Lease is free: Events are news, not part of the
    // count the Lease protects.
    for k in refused_now? {
        if let (Some(node), Stage::Skipped(reason)) = (&runs[k].node, &runs[k].stage) {
            refused(ctx, node, reason).await;
        }
    }
    taint::record(ctx, mode, runs).await;
    Ok(switched)
}

/// Recounts (when `recount` holds what the invocation knows of the
/// machines), confirms again and taints, writing only while `hold` says the
/// Lease is ours. Returns the runs the recount refused.
async fn under_lease(
    ctx: &Ctx<'_>,
    policy: &Policy,
    mode: FenceMode,
    recount: Option<&HashMap<InstanceId, Confirmation>>,
    view: &NodeView,
    hold: Option<&Hold>,
    runs: &mut [NodeRun],
) -> Result<Vec<usize>, PipelineError> {
    let mut refused_now = Vec::new();
    if let Some(known) = recount {
        let mut fresh = nodes::refresh(ctx, policy, view).await?;
        // As in the decision: a partial view only admits.
        if fresh.is_partial() {
            let mut trial = runs.to_vec();
            let limit = policy.cap(fresh.cluster_size());
            if !plan::recount(&mut trial, &fresh, known, limit).is_empty() {
                info!("the recount would refuse: counting every Node");
                fresh = nodes::full(ctx).await?;
            }
        }
        refused_now = plan::recount(runs, &fresh, known, policy.cap(fresh.cluster_size()));
    }

    // Asked again right before the first irreversible step.
    let live: Vec<InstanceId> = runs
        .iter()
        .filter_map(|r| r.fencing().filter(|p| !p.dry_run))
        .map(|p| p.instance.id.clone())
        .collect();
    let again = if live.is_empty() {
        HashMap::new()
    } else {
        confirm::instances(ctx, &live).await
    };
    for run in runs.iter_mut().filter(|r| r.stage == Stage::Decided) {
        let id = run.plan.as_ref().map(|p| p.instance.id.clone());
        run.confirm_again(id.and_then(|id| again.get(&id)), policy.fence_hibernated);
        if let Stage::Skipped(reason) = &run.stage {
            warn!(node = run.node.as_deref().unwrap_or("-"), %reason, "re-confirmation did not confirm; not fencing");
        }
    }
    taint::nodes(ctx, mode, policy.no_schedule_too, hold, runs).await;
    Ok(refused_now)
}
