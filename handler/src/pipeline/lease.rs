//! The one guard for every write that the cap counts (a new taint, a
//! power-off): [`under_lease`] takes the cluster's fencing Lease, reads the
//! kill switch again if it had to wait for it, renews it in the background
//! while the work runs, and lets it go. The work writes only while its
//! [`Hold`] says the last renewal is fresh: a holder slowed past the Lease's
//! duration stops writing before another invocation may take over, so the
//! cap holds.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::core::outbound::metrics::Dependency;
use crate::core::rules::control::LeaseTiming;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::wait;

/// The right to write under the Lease: fresh while the last renewal is
/// younger than [`LeaseTiming::valid_for`], gone for good once a renewal
/// finds the Lease taken over.
pub(crate) struct Hold {
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
    pub(crate) fn left(&self) -> Option<Duration> {
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
                warn!("the fencing Lease could not be renewed in time; nothing more is written");
                return;
            };
            let sent = Instant::now();
            let renew = ctx.control.renew_lease(namespace, &ctx.correlation_id);
            match tokio::time::timeout(left, renew).await {
                Ok(Ok(true)) => {
                    *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = sent;
                    self.renewals.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Ok(false)) => {
                    warn!("the fencing Lease was taken over; nothing more is written");
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

/// Runs `work` under the cluster's fencing Lease. A wait for the Lease is a
/// wait like any other: the kill switch is read again before `work` starts
/// (which then sees the switch on and only plans). The Lease is let go
/// however `work` ends; one that cannot be released expires on its own.
pub(crate) async fn under_lease<T>(
    ctx: &Ctx<'_>,
    inv: &mut Invocation<'_>,
    work: impl AsyncFnOnce(&Hold, &mut Invocation<'_>) -> T,
) -> Result<T, PipelineError> {
    let namespace = inv.policy.control_namespace.clone();
    // The wait for another holder ends before the request does.
    let until = inv.left().map(|left| std::time::Instant::now() + left);
    let taken = ctx
        .control
        .acquire_lease(&namespace, &ctx.correlation_id, until)
        .await
        .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
    if taken.waited {
        wait::after(ctx, &mut inv.switch, &namespace, "the wait for the Lease").await;
    }
    // The Lease's duration counts from the time written into it.
    let taken = Instant::from_std(taken.stamped);
    let hold = Hold::new(inv.policy.lease, taken);
    let done = Notify::new();
    let run = async {
        let out = work(&hold, inv).await;
        done.notify_one();
        out
    };
    let (out, ()) = tokio::join!(run, hold.keep(ctx, &namespace, &done));
    info!(
        held_ms = taken.elapsed().as_millis() as u64,
        renewals = hold.renewals.load(Ordering::SeqCst),
        "releasing the fencing lease"
    );
    if let Err(e) = ctx
        .control
        .release_lease(&namespace, &ctx.correlation_id)
        .await
    {
        ctx.meter.error(Dependency::Kubernetes);
        warn!(error = %e, "could not release the fencing lease");
    }
    Ok(out)
}
