//! The Kubernetes Events node-fencer records on a Node: one constructor per
//! reason, so the reason, its action and its type are never typed twice.

use crate::core::decide::Skip;
use crate::core::instance::{InstanceId, InstanceState};
use crate::core::recovery::Hold;

/// Why an Event is recorded (its `reason`, CamelCase as Kubernetes spells them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The out-of-service taint was applied.
    OutOfServiceTaintApplied,
    /// Fenced the legacy way (no taint on this cluster).
    FencedLegacy,
    /// EBS volumes were force-detached.
    VolumesForceDetached,
    /// Legacy mode: the node's pods were force-deleted.
    PodsForceDeleted,
    /// Legacy mode: the node's VolumeAttachments were deleted.
    VolumeAttachmentsDeleted,
    /// Fencing was refused by the cap.
    FencingRefused,
    /// A requested recovery waits for something.
    RecoveryWaiting,
    /// Recovery removed the out-of-service taint.
    OutOfServiceTaintRemoved,
    /// Recovery ended a fencing that had no taint left to remove.
    FencingEnded,
}

impl Reason {
    /// The Event's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutOfServiceTaintApplied => "OutOfServiceTaintApplied",
            Self::FencedLegacy => "FencedLegacy",
            Self::VolumesForceDetached => "VolumesForceDetached",
            Self::PodsForceDeleted => "PodsForceDeleted",
            Self::VolumeAttachmentsDeleted => "VolumeAttachmentsDeleted",
            Self::FencingRefused => "FencingRefused",
            Self::RecoveryWaiting => "RecoveryWaiting",
            Self::OutOfServiceTaintRemoved => "OutOfServiceTaintRemoved",
            Self::FencingEnded => "FencingEnded",
        }
    }

    /// The Event's `action`: which part of the lifecycle it belongs to.
    pub fn action(self) -> &'static str {
        match self {
            Self::OutOfServiceTaintApplied
            | Self::FencedLegacy
            | Self::PodsForceDeleted
            | Self::VolumeAttachmentsDeleted
            | Self::FencingRefused => "Fence",
            Self::VolumesForceDetached => "Detach",
            Self::RecoveryWaiting | Self::OutOfServiceTaintRemoved | Self::FencingEnded => {
                "Recover"
            }
        }
    }

    /// True for a `Warning` Event, false for `Normal`: only a refusal asks
    /// a person to look.
    pub fn warning(self) -> bool {
        matches!(self, Self::FencingRefused)
    }
}

/// An Event to record on a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// Why.
    pub reason: Reason,
    /// What a person reads (`note`).
    pub note: String,
}

impl NodeEvent {
    fn new(reason: Reason, note: String) -> Self {
        Self { reason, note }
    }

    /// The taint is on: EC2 confirmed the instance off.
    pub fn taint_applied(instance: &InstanceId, state: &InstanceState) -> Self {
        Self::new(
            Reason::OutOfServiceTaintApplied,
            format!(
                "EC2 reports {instance} `{state}`: applied node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
            ),
        )
    }

    /// The legacy mark is on: the pods and VolumeAttachments go next.
    pub fn fenced_legacy(instance: &InstanceId, state: &InstanceState) -> Self {
        Self::new(
            Reason::FencedLegacy,
            format!(
                "EC2 reports {instance} `{state}`: force-deleting the node's pods and VolumeAttachments (no out-of-service taint on this cluster)"
            ),
        )
    }

    /// Force-detaches were sent for these volumes.
    pub fn volumes_detached(volumes: &[String], instance: &InstanceId) -> Self {
        Self::new(
            Reason::VolumesForceDetached,
            format!(
                "force-detached EBS volume(s) {} from {instance}",
                volumes.join(", ")
            ),
        )
    }

    /// Legacy mode: pods bound to the node were force-deleted.
    pub fn pods_deleted(count: usize) -> Self {
        Self::new(
            Reason::PodsForceDeleted,
            format!("force-deleted {count} pod(s) bound to the node (grace period 0)"),
        )
    }

    /// Legacy mode: the node's VolumeAttachments were deleted.
    pub fn attachments_deleted(count: usize) -> Self {
        Self::new(
            Reason::VolumeAttachmentsDeleted,
            format!("deleted {count} VolumeAttachment(s) of the node"),
        )
    }

    /// Fencing was refused (the cap).
    pub fn refused(reason: &Skip) -> Self {
        Self::new(Reason::FencingRefused, reason.to_string())
    }

    /// A requested recovery waits.
    pub fn recovery_waiting(hold: &Hold) -> Self {
        Self::new(Reason::RecoveryWaiting, hold.to_string())
    }

    /// A fencing ended; `taint_removed` and `legacy` say how.
    pub fn fencing_ended(taint_removed: bool, legacy: bool) -> Self {
        let (reason, note) = if taint_removed {
            (
                Reason::OutOfServiceTaintRemoved,
                "the instance runs and the node is Ready again: removed node.kubernetes.io/out-of-service",
            )
        } else if legacy {
            (
                Reason::FencingEnded,
                "the instance runs and the node is Ready again: cleared node-fencer's legacy fencing",
            )
        } else {
            (
                Reason::FencingEnded,
                "the instance runs and the node is Ready again; the out-of-service taint was already gone",
            )
        };
        Self::new(reason, note.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_is_a_warning_and_each_reason_has_its_action() {
        let all = [
            Reason::OutOfServiceTaintApplied,
            Reason::FencedLegacy,
            Reason::VolumesForceDetached,
            Reason::PodsForceDeleted,
            Reason::VolumeAttachmentsDeleted,
            Reason::FencingRefused,
            Reason::RecoveryWaiting,
            Reason::OutOfServiceTaintRemoved,
            Reason::FencingEnded,
        ];
        let warnings: Vec<_> = all.iter().filter(|r| r.warning()).collect();
        assert_eq!(warnings, [&Reason::FencingRefused]);
        for r in all {
            assert!(
                ["Fence", "Detach", "Recover"].contains(&r.action()),
                "{r:?}"
            );
            assert!(r.as_str().chars().all(|c| c.is_ascii_alphabetic()), "{r:?}");
        }
    }

    #[test]
    fn a_fencing_that_removed_the_taint_says_so() {
        assert_eq!(
            NodeEvent::fencing_ended(true, false).reason,
            Reason::OutOfServiceTaintRemoved
        );
        assert_eq!(
            NodeEvent::fencing_ended(false, true).reason,
            Reason::FencingEnded
        );
        assert!(
            NodeEvent::fencing_ended(false, true)
                .note
                .contains("legacy")
        );
    }
}
