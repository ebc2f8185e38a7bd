//! The legacy recipe, for clusters without the out-of-service taint: it does
//! by hand what the taint makes Kubernetes do. The pods still bound to the
//! node are force-deleted (grace period 0) so their controllers replace
//! them, and the node's VolumeAttachments, of every CSI driver, are deleted
//! so that each driver's external-attacher unpublishes its volume instead of
//! the attach/detach controller waiting 6 minutes for an unmount. Before
//! those deletions the freed volumes are taken out of the Node's
//! `status.volumesInUse` ([`in_use`](crate::core::rules::in_use)): the controller then detaches them
//! itself at once, instead of noticing the deleted attachments on its
//! periodic sync (up to a minute). Pods that tolerate the taint for good
//! stay, and so do the attachments of their volumes and their entries. The
//! Node object stays (deleting it loses its labels, taints and history).

use tracing::{info, warn};

use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::outbound::report::AttachmentOutcome;
use crate::core::rules::in_use::ReleaseOutcome;
use crate::core::rules::plan::{NodeRun, attachment_reports};
use crate::core::rules::volumes::{AttachmentAction, per_driver};
use crate::pipeline::ctx::Ctx;
use crate::pipeline::stages::pods::{self, tally};

/// The recipe's first part for one node: the pods that do not stay.
pub(crate) async fn pods(ctx: &Ctx<'_>, node: &str, run: &mut NodeRun) {
    pods::force_delete(ctx, node, run, |p| !p.stays).await;
}

/// The recipe's second part, once the machine is confirmed off once more:
/// the freed volumes released from the Node's `volumesInUse`, then the
/// node's VolumeAttachments deleted (each driver's attacher then unpublishes
/// its volume); every failed deletion is an error on its run.
pub(crate) async fn attachments(ctx: &Ctx<'_>, node: &str, run: &mut NodeRun) {
    release(ctx, node, run).await;
    let actions = run
        .plan()
        .map(|p| p.attachments.clone())
        .unwrap_or_default();
    let mut reports = attachment_reports(&actions);
    let mut results = Vec::new();
    for (action, report) in actions.iter().zip(&mut reports) {
        let AttachmentAction::Delete {
            attachment, uid, ..
        } = action
        else {
            continue;
        };
        let result = ctx.writes.delete_volume_attachment(attachment, uid).await;
        (report.outcome, report.detail) = match &result {
            Ok(()) => (AttachmentOutcome::Deleted, None),
            Err(e) => (AttachmentOutcome::Failed, Some(e.to_string())),
        };
        results.push(result);
    }
    let deleted = tally(ctx, run, results);
    if deleted > 0 {
        let by_driver = per_driver(
            reports
                .iter()
                .filter(|r| r.outcome == AttachmentOutcome::Deleted)
                .map(|r| r.driver.as_str()),
        );
        info!(deleted, by_driver, "volumeattachments deleted");
        ctx.record(node, NodeEvent::attachments_deleted(deleted, &by_driver))
            .await;
    }
    run.attachments_done(reports, deleted);
}

/// Takes the freed volumes out of the Node's `status.volumesInUse`. A
/// failure costs speed, not the fencing: the attachments' deletion that
/// follows frees the volumes all the same, and the controller notices on
/// its next sync. So it is logged and counted (a Kubernetes dependency
/// error), not an error of the run.
async fn release(ctx: &Ctx<'_>, node: &str, run: &NodeRun) {
    let names = run
        .plan()
        .map(|p| p.release_in_use.clone())
        .unwrap_or_default();
    if names.is_empty() {
        return;
    }
    match ctx
        .writes
        .release_volumes_in_use(node, run.node_uid(), &names)
        .await
    {
        Ok(ReleaseOutcome::Released(n)) => {
            info!(
                released = n,
                "volumes released from the node's volumesInUse"
            );
            ctx.record(node, NodeEvent::volumes_in_use_released(n, &names))
                .await;
        }
        Ok(outcome @ (ReleaseOutcome::NoneListed | ReleaseOutcome::NodeGone)) => {
            info!(
                ?outcome,
                "no volume of the node's to release from volumesInUse"
            );
        }
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "releasing the node's volumes from volumesInUse failed; the attachments' deletion still frees them, later");
        }
    }
}
