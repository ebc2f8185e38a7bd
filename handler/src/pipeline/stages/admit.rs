//! Admission: the last look before the first irreversible step. After the
//! optional delay, an invocation about to write new taints takes the
//! cluster's Lease ([`crate::pipeline::lease`]), recounts the cap against
//! the Nodes as they are now, asks the cloud again, writes the taints
//! ([`super::taint`]), each Node `FAST_NOT_READY` proved dead marked
//! right before its taint ([`super::hasten`]), while its hold lasts, and
//! lets the Lease go. The Events wait until the Lease is released. Dry
//! runs take no Lease and no cap room.

use std::collections::HashMap;

use tracing::{info, warn};

use crate::core::model::facts::{Confirmation, FenceMode};
use crate::core::model::instance::InstanceId;
use crate::core::rules::decide::Skip;
use crate::core::rules::plan::{self, NodePlan, NodeRun, Stage};
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::lease::{self, Hold};
use crate::pipeline::stages::{plan::refused, taint};
use crate::pipeline::{nodes, wait};

/// What the Lease, the recount, the second look and the taints may take
/// after the delay.
const TAINT_BUDGET: std::time::Duration = std::time::Duration::from_secs(30);

/// Admits the runs still decided for fencing and taints them; a run that is
/// refused or not confirmed again is skipped with its reason.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let Some(mode) = inv.mode.filter(|_| inv.fencing()) else {
        return Ok(());
    };
    let delay = inv.policy.confirm_again_after;
    let live = inv
        .runs
        .iter()
        .any(|r| r.fencing().is_some_and(|p| !p.dry_run));
    if live
        && !delay.is_zero()
        && let Some(left) = inv.left()
        && left < delay + TAINT_BUDGET
    {
        // The delay may not be shortened: the second look waits it out or
        // is not made; the retry makes it.
        let needs = delay + TAINT_BUDGET;
        for run in inv.runs.iter_mut().filter(|r| *r.stage() == Stage::Decided) {
            run.skip(Skip::OutOfTime {
                left_secs: left.as_secs(),
                needs_secs: needs.as_secs(),
            });
        }
        warn!(
            left_s = left.as_secs(),
            "too little of the request's time left for the delay before the second confirmation"
        );
        return Ok(());
    }
    if live && !delay.is_zero() {
        info!(
            delay_s = delay.as_secs(),
            "waiting before the second confirmation"
        );
        let ns = &inv.policy.control_namespace;
        wait::pause(
            ctx,
            &mut inv.switch,
            ns,
            delay,
            "the delay before the second confirmation",
        )
        .await;
    }
    plan_only_if_switched(inv);
    let new_taints = inv
        .runs
        .iter()
        .any(|r| r.fencing().is_some_and(NodePlan::writes_new_taint));
    let refused_now = if new_taints {
        lease::under_lease(ctx, inv, async |hold, inv| {
            plan_only_if_switched(inv);
            let recount = !inv.switch.is_on();
            admit(ctx, inv, mode, recount, Some(hold)).await
        })
        .await??
    } else {
        admit(ctx, inv, mode, false, None).await?
    };
    // Recorded once the Lease is free: Events are news, not part of the
    // count the Lease protects.
    for k in refused_now {
        if let (Some(node), Stage::Skipped(reason)) = (inv.runs[k].node(), inv.runs[k].stage()) {
            refused(ctx, node, reason).await;
        }
    }
    if let Some(pending) = &inv.pending {
        pending.record(ctx).await;
    }
    taint::record(ctx, mode, &inv.runs).await;
    Ok(())
}

/// A switch turned on during a wait makes every run still decided a plan.
fn plan_only_if_switched(inv: &mut Invocation<'_>) {
    if inv.switch.is_on() {
        inv.runs.iter_mut().for_each(NodeRun::plan_only);
    }
}

/// Recounts (under the Lease), confirms again and taints, writing only while
/// `hold` says the Lease is ours. Returns the runs the recount refused.
async fn admit(
    ctx: &Ctx<'_>,
    inv: &mut Invocation<'_>,
    mode: FenceMode,
    recount: bool,
    hold: Option<&Hold>,
) -> Result<Vec<usize>, PipelineError> {
    let policy = inv.policy;
    let refused_now = match inv.view.as_ref() {
        Some(view) if recount => {
            recount_cap(ctx, policy, view, inv.looks.answers(), &mut inv.runs).await?
        }
        _ => Vec::new(),
    };
    // Asked again right before the first irreversible step.
    let live: Vec<InstanceId> = inv
        .runs
        .iter()
        .filter_map(|r| r.fencing().filter(|p| !p.dry_run))
        .map(|p| p.instance.id.clone())
        .collect();
    let again = if live.is_empty() {
        HashMap::new()
    } else {
        inv.looks.again(ctx, &live).await
    };
    for run in inv.runs.iter_mut().filter(|r| *r.stage() == Stage::Decided) {
        let id = run.plan().map(|p| p.instance.id.clone());
        run.confirm_again(id.and_then(|id| again.get(&id)), policy.fence_hibernated);
        if let Stage::Skipped(reason) = run.stage() {
            warn!(node = run.node().unwrap_or("-"), %reason, "re-confirmation did not confirm; not fencing");
        }
    }
    // `FAST_NOT_READY`'s marks, after the recount and right before the
    // taints: a Node refused is never marked.
    if let Some(pending) = inv.pending.as_mut() {
        let held = || hold.is_none_or(|h| h.left().is_some());
        pending.mark(ctx, &again, held, &mut inv.runs).await;
    }
    taint::nodes(ctx, mode, policy.no_schedule_too, hold, &mut inv.runs).await;
    Ok(refused_now)
}

/// The cap recounted against the Nodes as they are under the Lease; a
/// partial view only admits, as in the decision.
async fn recount_cap(
    ctx: &Ctx<'_>,
    policy: &Policy,
    view: &NodeView,
    known: &HashMap<InstanceId, Confirmation>,
    runs: &mut [NodeRun],
) -> Result<Vec<usize>, PipelineError> {
    let mut fresh = nodes::refresh(ctx, policy, view).await?;
    if fresh.is_partial() {
        let mut trial = runs.to_vec();
        let limit = policy.cap(fresh.cluster_size());
        if !plan::recount(&mut trial, &fresh, known, limit).is_empty() {
            info!("the recount would refuse: counting every Node");
            fresh = nodes::full(ctx).await?;
        }
    }
    Ok(plan::recount(
        runs,
        &fresh,
        known,
        policy.cap(fresh.cluster_size()),
    ))
}
