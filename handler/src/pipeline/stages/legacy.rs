//! The legacy recipe, for clusters without the out-of-service taint: it does
//! by hand what the taint makes Kubernetes do. The pods still bound to the
//! node are force-deleted (grace period 0) so their controllers replace
//! them, and the node's VolumeAttachments, of every CSI driver, are deleted
//! so that each driver's external-attacher unpublishes its volume instead of
//! the attach/detach controller waiting 6 minutes for an unmount. Pods that
//! tolerate the taint for good stay, and so do the attachments of their
//! volumes. The Node object stays (deleting it loses its labels, taints and
//! history).

use tracing::info;

use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::report::AttachmentOutcome;
use crate::core::rules::plan::{NodeRun, attachment_reports};
use crate::core::rules::volumes::{AttachmentAction, per_driver};
use crate::pipeline::ctx::Ctx;
use crate::pipeline::stages::pods::{self, tally};

/// The recipe's first part for one node: the pods that do not stay.
pub(crate) async fn pods(ctx: &Ctx<'_>, node: &str, run: &mut NodeRun) {
    pods::force_delete(ctx, node, run, |p| !p.stays).await;
}

/// The recipe's second part, once the machine is confirmed off once more:
/// the node's VolumeAttachments (each driver's attacher then unpublishes
/// its volume); every failure is an error on its run.
pub(crate) async fn attachments(ctx: &Ctx<'_>, node: &str, run: &mut NodeRun) {
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
