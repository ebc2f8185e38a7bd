//! The survey: the kill switch read at the start, the Nodes decided over
//! (read by name when a fresh census vouches for the rest, every Node
//! otherwise; always every Node for the sweep), the sweep's own suspects and
//! its census, and the recovery requests set aside for the recovery check.

use tracing::{info, warn};

use crate::core::inbound::sweep;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::compat;
use crate::core::rules::control::KillSwitch;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::nodes;

/// Refuses a cluster older than any node-fencer supports; reads the switch
/// and the Nodes; adds the sweep's suspects.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    // Before anything is read or written: an older server may not serve
    // what the rest asks for. The version is asked once per environment.
    let version = ctx
        .reads
        .server_version()
        .await
        .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
    compat::supported(version)?;
    read_switch(ctx, inv).await;
    let view = if inv.sweep {
        nodes::full(ctx).await?
    } else {
        nodes::view(ctx, inv.policy, &inv.suspects, inv.looks.answers()).await?
    };
    if inv.sweep {
        let swept = sweep::suspects(&view.nodes);
        info!(
            nodes = view.nodes.len(),
            swept = swept.len(),
            "sweeping for nodes no event named"
        );
        inv.suspects.extend(swept);
        if !inv.switch.is_on() {
            nodes::take_census(ctx, inv.policy, &view.nodes, inv.looks.answers()).await;
        }
    }
    inv.view = Some(view);
    inv.set_aside_recoveries();
    Ok(())
}

/// The kill switch at the start; one that cannot be read counts as on (it
/// may be), and its error is reported so the invocation is retried.
async fn read_switch(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) {
    let read = ctx.control.kill_switch(&inv.policy.control_namespace).await;
    match &read {
        Ok(KillSwitch::Unreadable(value)) => warn!(
            value,
            "the kill switch holds neither true nor false; acting as if it were on"
        ),
        Ok(KillSwitch::On) => warn!("kill switch on: every action is a dry run"),
        Ok(KillSwitch::Off) => {}
        Err(e) => {
            // Fail closed: an unreadable switch may be an engaged one.
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "kill switch unreadable; acting as if it were on");
        }
    }
    inv.switch.read(read.map_err(|e| e.to_string()), None);
}
