//! The plan: one [`NodeRun`] per decided target, with active fencing's
//! report where it judged one; the cap's refusals recorded on their Nodes;
//! and, when some node is to be fenced, the fencing mode (configured, or by
//! the server's version), chosen once for the run.

use tracing::{info, warn};

use crate::core::inbound::suspect::Intent;
use crate::core::model::facts::FenceMode;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::decide::{self, Verdict};
use crate::core::rules::mode::{self, ModeSetting};
use crate::core::rules::neighbours;
use crate::core::rules::plan::{self, NodeRun};
use crate::core::rules::view::NodeView;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;

/// Turns the decision into runs and chooses the mode.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let Some(view) = inv.view.as_ref() else {
        return Ok(());
    };
    let decision = std::mem::take(&mut inv.decision);
    let mut runs = plan::plan(
        &decision.targets,
        &decision.verdicts,
        &view.nodes,
        inv.looks.answers(),
    );
    for (k, report) in decision.power {
        if let Some(run) = runs.get_mut(k) {
            run.power_off(report);
        }
    }
    let dry_run = inv.switch.is_on();
    for ((run, verdict), target) in runs.iter().zip(&decision.verdicts).zip(&decision.targets) {
        log_decided(run, verdict);
        // A dry run changes nothing, not even the Node's Events.
        let live = !dry_run && target.intent == Intent::Fence;
        if let (Verdict::Skip { reason }, Some(node)) = (verdict, run.node())
            && matches!(
                reason,
                decide::Skip::CapReached { .. }
                    | decide::Skip::SharedMachine { .. }
                    | decide::Skip::KubeletElsewhere { .. }
                    | decide::Skip::NameTaken { .. }
                    | decide::Skip::AddressTaken { .. }
                    | decide::Skip::Exempt(_)
            )
            && live
        {
            refused(ctx, node, reason).await;
        }
        if let (true, Some(name)) = (live, run.node()) {
            warn_others_taint(ctx, view, name, verdict).await;
        }
    }
    inv.runs = runs;
    if inv.fencing() {
        inv.mode = Some(fence_mode(ctx, inv.policy.mode).await?);
    }
    Ok(())
}

fn log_decided(run: &NodeRun, verdict: &Verdict) {
    info!(
        suspect = run.reference(),
        node = run.node().unwrap_or("-"),
        instance = run.instance_id().map_or("-", |i| i.as_str()),
        state = run.instance_state().map_or("-", |s| s.name()),
        verdict = match verdict {
            Verdict::Fence { .. } => "fence",
            Verdict::Skip { reason } => reason.code(),
        },
        "decided"
    );
}

/// The mode in force: configured, or by the server's version.
async fn fence_mode(ctx: &Ctx<'_>, setting: ModeSetting) -> Result<FenceMode, PipelineError> {
    Ok(match setting {
        ModeSetting::Taint => FenceMode::Taint,
        ModeSetting::Legacy => FenceMode::Legacy,
        ModeSetting::Auto => {
            let version = ctx
                .reads
                .server_version()
                .await
                .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
            let chosen = mode::choose(ModeSetting::Auto, version);
            info!(%version, mode = chosen.name(), "fencing mode chosen by server version");
            chosen
        }
    })
}

/// Says so when another writer's out-of-service taint is on a Node whose
/// machine may still write: node-fencer touches nothing there.
async fn warn_others_taint(ctx: &Ctx<'_>, view: &NodeView, node: &str, verdict: &Verdict) {
    let Some(facts) = view.nodes.iter().find(|n| n.name == node) else {
        return;
    };
    if let Some((taints, state)) = neighbours::on_live_machine(facts, verdict) {
        warn!(
            node,
            taints = taints.join(","),
            %state,
            "another writer's out-of-service taint on a machine that may still write"
        );
        ctx.record(
            node,
            NodeEvent::others_taint_on_live_machine(&taints, &state),
        )
        .await;
    }
}

/// Logs and records a refusal (the cap, a machine two Nodes name, a Node
/// outside node-fencer's reach).
pub(crate) async fn refused(ctx: &Ctx<'_>, node: &str, reason: &decide::Skip) {
    warn!(node, "{reason}");
    ctx.record(node, NodeEvent::refused(reason)).await;
}
