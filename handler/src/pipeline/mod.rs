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
/// the unfinished request brings.
pub async fn run_until(
    ctx: &Ctx<'_>,
    policy: &Policy,
    batch: Batch,
    deadline: Option<tokio::time::Instant>,
) -> Result<Report, PipelineError> {
    let mut inv = Invocation::new(policy, batch);
    inv.deadline = deadline;
    // Another cluster's machine goes no further: nothing to ask Kubernetes.
    screen::run(ctx, &mut inv).await?;
    if inv.nothing_for_this_cluster() {
        return Ok(inv.into_report(&ctx.correlation_id));
    }
    // The kill switch, the Nodes, the sweep's own suspects.
    survey::run(ctx, &mut inv).await?;
    // Resolve, confirm out of band, decide; wait for Kubernetes to notice.
    decide::run(ctx, &mut inv).await?;
    // Active fencing: a hung node's machine powered off, then decided again.
    power::run(ctx, &mut inv).await?;
    // A run per node, the cap's refusals recorded, the mode chosen.
    plan::run(ctx, &mut inv).await?;
    // Each node's volumes and attachments, and what to do with each.
    discover::run(ctx, &mut inv).await?;
    // The second confirmation, the Lease, the recount, the taint.
    admit::run(ctx, &mut inv).await?;
    // A third confirmation; the legacy recipe or the pods; the detaches.
    act::run(ctx, &mut inv).await?;
    // The detached volumes seen free, within a bound.
    verify::run(ctx, &mut inv).await?;
    // The fencings that may end, and the recoveries asked for.
    recover::run(ctx, &mut inv).await?;
    Ok(inv.into_report(&ctx.correlation_id))
}
