//! The fencing pipeline: one [`Invocation`] handed through a list of stages
//! of one shape, `stage(ctx, &mut invocation)`. Each stage is a file that
//! gathers facts through the shell's traits, hands them to the core, and
//! carries out what the core says; what a run learns and decides lives in
//! the invocation, and the report is built from it once, at the end.
//!
//! Shared by the stages: [`ctx`] (the handles), [`looks`] (what the cloud
//! said, and the explicit look again), [`wait`] (every wait, and the kill
//! switch read after it), [`lease`] (the one guard for writes the cap
//! counts), [`nodes`] (reading the Nodes an invocation decides over).

pub mod ctx;
pub mod error;
pub(crate) mod invocation;
mod lease;
pub(crate) mod looks;
mod nodes;
mod recover;
mod stages;
mod wait;

#[cfg(test)]
mod fakes;
#[cfg(test)]
mod tests;

pub use ctx::Ctx;
pub use error::PipelineError;

use crate::core::inbound::suspect::Batch;
use crate::core::outbound::report::Report;
use crate::core::settings::policy::Policy;
use invocation::Invocation;
use stages::{act, admit, decide, discover, plan, power, screen, survey, verify};

/// Runs the pipeline over one batch under `policy`.
pub async fn run(ctx: &Ctx<'_>, policy: &Policy, batch: Batch) -> Result<Report, PipelineError> {
    run_until(ctx, policy, batch, None).await
}

/// [`run`] within a request that ends at `deadline`: no wait outlasts it,
/// and a step that may not finish in the time left is left for the retry
/// the unfinished request brings. A stage still running [`CUT_BEFORE_END`]
/// before the end (a dependency that hangs past its own bounds: a
/// Kubernetes read is retried for up to 20 s, each attempt up to 10 s) is
/// cut there, so that the request answers rather than being killed; what it
/// left undone is the retry's, as after a lost process.
pub async fn run_until(
    ctx: &Ctx<'_>,
    policy: &Policy,
    batch: Batch,
    deadline: Option<tokio::time::Instant>,
) -> Result<Report, PipelineError> {
    let at = Stage::default();
    let stages = stages(ctx, policy, batch, deadline, &at);
    let Some(cut) = deadline.map(|d| d.checked_sub(CUT_BEFORE_END).unwrap_or(d)) else {
        return stages.await;
    };
    match tokio::time::timeout_at(cut, stages).await {
        Ok(done) => done,
        Err(_) => Err(PipelineError::OutOfTime { during: at.get() }),
    }
}

/// How long before a request's end a stage still running is cut: the
/// last of the answer's reserve ([`invocation::ANSWER_RESERVE`], by which
/// every stage means to be done), kept for the answer alone.
pub(crate) const CUT_BEFORE_END: std::time::Duration = std::time::Duration::from_secs(2);

/// The stage an invocation is in, for the answer of one cut short.
#[derive(Default)]
struct Stage(std::sync::Mutex<&'static str>);

impl Stage {
    fn enter(&self, what: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = what;
    }

    fn get(&self) -> &'static str {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn stages(
    ctx: &Ctx<'_>,
    policy: &Policy,
    batch: Batch,
    deadline: Option<tokio::time::Instant>,
    at: &Stage,
) -> Result<Report, PipelineError> {
    let mut inv = Invocation::new(policy, batch);
    inv.deadline = deadline;
    // Another cluster's machine goes no further: nothing to ask Kubernetes.
    at.enter("screening the machines named");
    screen::run(ctx, &mut inv).await?;
    if inv.nothing_for_this_cluster() {
        return Ok(inv.into_report(&ctx.correlation_id));
    }
    // The kill switch, the Nodes, the sweep's own suspects.
    at.enter("reading the kill switch and the Nodes");
    survey::run(ctx, &mut inv).await?;
    // Resolve, confirm out of band, decide; wait for Kubernetes to notice.
    at.enter("deciding, or waiting for a Node to turn NotReady");
    decide::run(ctx, &mut inv).await?;
    // Active fencing: a hung node's machine powered off, then decided again.
    at.enter("powering off a hung node's machine");
    power::run(ctx, &mut inv).await?;
    // A run per node, the cap's refusals recorded, the mode chosen.
    at.enter("planning the fencings");
    plan::run(ctx, &mut inv).await?;
    // Each node's volumes and attachments, and what to do with each.
    at.enter("reading the nodes' volumes");
    discover::run(ctx, &mut inv).await?;
    // The second confirmation, the Lease, the recount, the taint.
    at.enter("confirming again and tainting, under the Lease");
    admit::run(ctx, &mut inv).await?;
    // A third confirmation; the legacy recipe or the pods; the detaches.
    at.enter("deleting the pods and detaching the volumes");
    act::run(ctx, &mut inv).await?;
    // The detached volumes seen free, within a bound.
    at.enter("waiting for the detached volumes to show free");
    verify::run(ctx, &mut inv).await?;
    // The fencings that may end, and the recoveries asked for.
    at.enter("ending fencings and recoveries");
    recover::run(ctx, &mut inv).await?;
    Ok(inv.into_report(&ctx.correlation_id))
}
