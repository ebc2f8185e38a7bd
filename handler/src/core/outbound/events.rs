//! The Kubernetes Events node-fencer records on a Node: one constructor per
//! reason, so the reason, its action and its type are never typed twice.

use crate::core::model::instance::{InstanceId, InstanceState, Provider};
use crate::core::model::redfish::Doubt;
use crate::core::model::values;
use crate::core::rules::decide::Skip;
use crate::core::rules::power::Refusal;
use crate::core::rules::recovery::Hold;
use crate::core::rules::silence;
use crate::core::rules::witness::Failing;

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
    /// Legacy mode: the freed volumes were taken out of the Node's
    /// `status.volumesInUse`, the unmount its dead kubelet never reports.
    VolumesInUseReleased,
    /// Fencing was refused by the cap.
    FencingRefused,
    /// A requested recovery waits for something.
    RecoveryWaiting,
    /// An operator confirmed the node healthy (manual recovery).
    RecoveryConfirmed,
    /// Recovery removed the out-of-service taint.
    OutOfServiceTaintRemoved,
    /// Recovery ended a fencing that had no taint left to remove.
    FencingEnded,
    /// Active fencing powered the node's machine off.
    PoweredOff,
    /// Active fencing refused to power the node's machine off.
    PowerOffRefused,
    /// Active fencing found the node's machine off already: nothing sent.
    MachineFoundOff,
    /// An earlier power-off mark never took effect (its stop never came):
    /// it no longer holds the machine back.
    PowerOffLapsed,
    /// The UUID that ties the Node to its machine names no one machine (a
    /// placeholder, or shared): the machine counts as unidentified, and a
    /// person should look.
    UnidentifiedMachine,
    /// node-fencer set the Node's `Ready` condition to `Unknown` on the
    /// proof that its kubelet has been silent since the machine stopped.
    MarkedNotReady,
    /// The kubelet renewed its Lease after the machine's recorded stop:
    /// the Node is not marked, and the contradiction asks a person to look.
    KubeletHeardAfterStop,
    /// Another writer's out-of-service taint is on a Node whose machine the
    /// cloud reports running: node-fencer touches nothing, and a person
    /// should look, since the taint frees the volumes of a machine that may
    /// still write.
    OthersTaintOnLiveMachine,
    /// The witness of the Node's machine (its BMC) could not serve a
    /// fencing now: a person should mend it before the Node dies.
    WitnessFailing,
    /// The witness of the Node's machine serves again.
    WitnessRestored,
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
            Self::VolumesInUseReleased => "VolumesInUseReleased",
            Self::FencingRefused => "FencingRefused",
            Self::RecoveryWaiting => "RecoveryWaiting",
            Self::RecoveryConfirmed => "RecoveryConfirmed",
            Self::OutOfServiceTaintRemoved => "OutOfServiceTaintRemoved",
            Self::FencingEnded => "FencingEnded",
            Self::PoweredOff => "PoweredOff",
            Self::PowerOffRefused => "PowerOffRefused",
            Self::MachineFoundOff => "MachineFoundOff",
            Self::PowerOffLapsed => "PowerOffLapsed",
            Self::UnidentifiedMachine => "UnidentifiedMachine",
            Self::MarkedNotReady => "MarkedNotReady",
            Self::KubeletHeardAfterStop => "KubeletHeardAfterStop",
            Self::OthersTaintOnLiveMachine => "OutOfServiceTaintOnLiveMachine",
            Self::WitnessFailing => "WitnessFailing",
            Self::WitnessRestored => "WitnessRestored",
        }
    }

    /// The Event's `action`: which part of the lifecycle it belongs to.
    pub fn action(self) -> &'static str {
        match self {
            Self::OutOfServiceTaintApplied
            | Self::FencedLegacy
            | Self::PodsForceDeleted
            | Self::VolumeAttachmentsDeleted
            | Self::VolumesInUseReleased
            | Self::FencingRefused
            | Self::MarkedNotReady
            | Self::KubeletHeardAfterStop
            | Self::UnidentifiedMachine
            | Self::OthersTaintOnLiveMachine => "Fence",
            Self::PoweredOff
            | Self::PowerOffRefused
            | Self::MachineFoundOff
            | Self::PowerOffLapsed => "PowerOff",
            Self::VolumesForceDetached => "Detach",
            Self::RecoveryWaiting
            | Self::RecoveryConfirmed
            | Self::OutOfServiceTaintRemoved
            | Self::FencingEnded => "Recover",
            Self::WitnessFailing | Self::WitnessRestored => "Witness",
        }
    }

    /// True for a `Warning` Event, false for `Normal`: only a refusal, a
    /// contradiction between the cloud and the kubelet, or a witness that
    /// could not serve, asks a person to look.
    pub fn warning(self) -> bool {
        matches!(
            self,
            Self::FencingRefused
                | Self::PowerOffRefused
                | Self::PowerOffLapsed
                | Self::KubeletHeardAfterStop
                | Self::UnidentifiedMachine
                | Self::OthersTaintOnLiveMachine
                | Self::WitnessFailing
        )
    }
}

/// An Event to record on a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// Why.
    pub reason: Reason,
    /// What a person reads (`note`).
    pub note: String,
    /// What the Event is about, when that outlives the invocation: a
    /// fencing's `fenced-at`. Otherwise the invocation's correlation id
    /// names the occasion (see [`event_name`]).
    pub(crate) occasion: Option<String>,
}

/// What the provider reported of the machine, in its own words: a BMC's
/// `PowerState`, a cloud's state name.
fn reported(instance: &InstanceId, state: &InstanceState) -> String {
    match instance.provider() {
        Provider::Redfish => format!(
            "Redfish reports {instance} `PowerState: {}`",
            crate::core::model::system::power_state_name(state)
        ),
        Provider::Aws | Provider::Gce => {
            format!("{} reports {instance} `{state}`", instance.provider().api())
        }
    }
}

impl NodeEvent {
    fn new(reason: Reason, note: String) -> Self {
        Self {
            reason,
            note,
            occasion: None,
        }
    }

    /// The taint is on: the cloud confirmed the machine off.
    pub fn taint_applied(instance: &InstanceId, state: &InstanceState) -> Self {
        Self::new(
            Reason::OutOfServiceTaintApplied,
            format!(
                "{}: applied node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
                reported(instance, state)
            ),
        )
    }

    /// Active fencing powered the machine off; `why` says what it saw.
    pub fn powered_off(instance: &InstanceId, why: &str) -> Self {
        Self::new(
            Reason::PoweredOff,
            format!(
                "powered off {instance} (forced, no OS shutdown): {why}; fencing follows once the cloud reports it off"
            ),
        )
    }

    /// node-fencer's power-off marked at `at` never took effect: the
    /// machine runs the boot the mark recorded and has not started since.
    pub fn power_off_lapsed(at: &str) -> Self {
        Self::new(
            Reason::PowerOffLapsed,
            format!(
                "node-fencer's power-off marked at {at} never took effect: the machine still runs the boot it recorded and has not started since, so the mark no longer holds back a power-off"
            ),
        )
    }

    /// Active fencing found the machine off already and sent nothing.
    pub fn found_off(instance: &InstanceId) -> Self {
        Self::new(
            Reason::MachineFoundOff,
            format!(
                "{instance} was found off already when the power-off was to be sent: nothing sent; fencing follows as for a stopped machine"
            ),
        )
    }

    /// The machine was deleted when its power-off was to be sent.
    pub fn found_deleted(instance: &InstanceId) -> Self {
        Self::new(
            Reason::MachineFoundOff,
            format!(
                "{instance} was deleted when the power-off was to be sent: nothing sent, the power-off mark taken back; fencing follows as for a deleted machine"
            ),
        )
    }

    /// The UUID that ties the Node to its machine names no one machine.
    pub fn unidentified_machine(instance: &InstanceId, doubt: Doubt) -> Self {
        Self::new(
            Reason::UnidentifiedMachine,
            format!(
                "{instance} is not taken for this Node's machine: {doubt}; nothing is fenced nor powered off on it (see docs/onprem.md#the-machines-identity)"
            ),
        )
    }

    /// The Node was marked `Ready=Unknown`: its kubelet proved silent
    /// since the recorded stop and past a renewal it was due to make.
    pub fn marked_not_ready(instance: &InstanceId, proof: &silence::Proof) -> Self {
        Self::new(
            Reason::MarkedNotReady,
            format!(
                "set Ready=Unknown without waiting for the node controller: {} reports {instance} off since {}, the kubelet's Lease was last renewed at {}, and its renewal due every {} s has not come: unwritten for {} s {}",
                instance.provider().api(),
                values::rfc3339(proof.stopped_at),
                values::rfc3339(proof.renewed_at),
                proof.renew_every_secs,
                proof.quiet_secs,
                proof.clock.phrase(),
            ),
        )
    }

    /// The kubelet renewed its Lease after the machine's recorded stop.
    pub fn heard_after_stop(
        instance: &InstanceId,
        (stopped_at, renewed_at): (i64, i64),
        heard: silence::Heard,
    ) -> Self {
        let around = |at: i64| {
            if at > stopped_at {
                format!("{} s after the stop", at - stopped_at)
            } else {
                format!(
                    "{} s before the stop, within the {} s that clock skew may hide, so its silence since cannot be shown",
                    stopped_at - at,
                    silence::SKEW_MARGIN_SECS
                )
            }
        };
        let when = match heard {
            silence::Heard::RenewTime => format!(
                "the kubelet renewed its Lease at {} ({})",
                values::rfc3339(renewed_at),
                around(renewed_at)
            ),
            silence::Heard::Written { written_at } => format!(
                "the apiserver took a write of the kubelet's Lease at {} ({}), whatever its renewTime of {} says",
                values::rfc3339(written_at),
                around(written_at),
                values::rfc3339(renewed_at)
            ),
            silence::Heard::Seen => {
                "node-fencer saw the kubelet's Lease renewed while it looked".to_string()
            }
        };
        Self::new(
            Reason::KubeletHeardAfterStop,
            format!(
                "{} reports {instance} off since {}, but {when}: not marked NotReady; waiting for the node controller",
                instance.provider().api(),
                values::rfc3339(stopped_at),
            ),
        )
    }

    /// The witness of `machine` could not serve a fencing now.
    pub fn witness_failing(machine: &str, failing: &Failing) -> Self {
        Self::new(
            Reason::WitnessFailing,
            format!(
                "node-fencer could not fence this Node if it died now: the witness of {machine} fails ({}): {}; {}",
                failing.reason.code(),
                failing.detail,
                failing.fix
            ),
        )
    }

    /// The witness of `machine` serves again.
    pub fn witness_restored(machine: &str) -> Self {
        Self::new(
            Reason::WitnessRestored,
            format!("the witness of {machine} answers for this Node's machine again"),
        )
    }

    /// Active fencing refused a power-off by one of its guards.
    pub fn power_off_refused(refusal: &Refusal) -> Self {
        Self::new(
            Reason::PowerOffRefused,
            format!("power-off refused: {refusal}"),
        )
    }

    /// The legacy mark is on: the pods and VolumeAttachments go next.
    pub fn fenced_legacy(instance: &InstanceId, state: &InstanceState) -> Self {
        Self::new(
            Reason::FencedLegacy,
            format!(
                "{}: force-deleting the node's pods, releasing their volumes from the Node's volumesInUse and deleting its VolumeAttachments (no out-of-service taint on this cluster)",
                reported(instance, state)
            ),
        )
    }

    /// Force-detaches were sent for these volumes.
    pub fn volumes_detached(volumes: &[String], instance: &InstanceId) -> Self {
        Self::new(
            Reason::VolumesForceDetached,
            format!(
                "force-detached {} {} from {instance}",
                match instance.provider() {
                    Provider::Aws => "EBS volume(s)",
                    Provider::Gce => "Persistent Disk(s)",
                    Provider::Redfish => "volume(s)",
                },
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

    /// Legacy mode: the node's VolumeAttachments were deleted;
    /// `by_driver` counts them per CSI driver.
    pub fn attachments_deleted(count: usize, by_driver: &str) -> Self {
        Self::new(
            Reason::VolumeAttachmentsDeleted,
            format!(
                "deleted {count} VolumeAttachment(s) of the node ({by_driver}): each driver unpublishes its volume"
            ),
        )
    }

    /// `names` were taken out of the Node's `status.volumesInUse`, of
    /// which `listed` were there.
    pub fn volumes_in_use_released(listed: usize, names: &[String]) -> Self {
        Self::new(
            Reason::VolumesInUseReleased,
            format!(
                "released {listed} volume(s) from status.volumesInUse, the unmount the dead kubelet cannot report: the attach/detach controller detaches them now ({})",
                names.join(", ")
            ),
        )
    }

    /// Another writer's out-of-service taint on a machine that may write.
    /// Named by the taints, not the invocation: every event and sweep that
    /// meets the same taint finds the Event there and adds none (until the
    /// API server lets it expire, an hour by default).
    pub fn others_taint_on_live_machine(taints: &[String], state: &InstanceState) -> Self {
        Self {
            occasion: Some(format!("others-taint {}", taints.join(","))),
            ..Self::new(
                Reason::OthersTaintOnLiveMachine,
                format!(
                    "{} was not written by node-fencer, and the cloud reports the machine `{state}`: node-fencer touches nothing; Kubernetes deletes the pods and detaches the volumes of a machine that may still write",
                    taints.join(", ")
                ),
            )
        }
    }

    /// Fencing was refused (the cap, a machine two Nodes name, a Node out
    /// of reach). A Node out of reach is refused by every sweep while it is
    /// NotReady: its Event is named by the exemption, so that it is written
    /// once, not every ten minutes.
    pub fn refused(reason: &Skip) -> Self {
        let occasion = match reason {
            Skip::Exempt(e) => Some(format!("exempt {}", e.code())),
            _ => None,
        };
        Self {
            occasion,
            ..Self::new(Reason::FencingRefused, reason.to_string())
        }
    }

    /// A requested recovery waits.
    pub fn recovery_waiting(hold: &Hold) -> Self {
        Self::new(Reason::RecoveryWaiting, hold.to_string())
    }

    /// An operator confirmed the node healthy after the fencing recorded
    /// as `fenced_at`.
    pub fn recovery_confirmed(fenced_at: &str) -> Self {
        Self {
            occasion: Some(fenced_at.to_owned()),
            ..Self::new(
                Reason::RecoveryConfirmed,
                "an operator confirmed the node healthy: its fencing ends once the instance runs, \
                 the node is Ready and settled, and no attachment of ours remains"
                    .into(),
            )
        }
    }

    /// The fencing recorded as `fenced_at` ended; `taint_removed` and
    /// `legacy` say how.
    pub fn fencing_ended(fenced_at: &str, taint_removed: bool, legacy: bool) -> Self {
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
        Self {
            occasion: Some(fenced_at.to_owned()),
            ..Self::new(reason, note.into())
        }
    }
}

/// The Event's object name: `<node>.<16 hex digits>`, the kubelet's shape,
/// where the digits hash the Node, the reason and the occasion. The same
/// three always give the same name, so a write repeated after a lost answer,
/// or by a Lambda retry (which keeps the request id), meets AlreadyExists
/// instead of recording the Event twice.
pub fn event_name(node: &str, reason: Reason, occasion: &str) -> String {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [node, reason.as_str(), occasion] {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    // 253 characters in all; node names are ASCII, cut on a char boundary anyway.
    let mut end = node.len().min(253 - 1 - 16);
    while !node.is_char_boundary(end) {
        end -= 1;
    }
    // A cut may end a label on '.' or '-', which no name may hold before '.'.
    let node = node[..end].trim_end_matches(['.', '-']);
    format!("{node}.{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_are_warnings_and_each_reason_has_its_action() {
        let all = [
            Reason::OutOfServiceTaintApplied,
            Reason::FencedLegacy,
            Reason::VolumesForceDetached,
            Reason::PodsForceDeleted,
            Reason::VolumeAttachmentsDeleted,
            Reason::VolumesInUseReleased,
            Reason::FencingRefused,
            Reason::RecoveryWaiting,
            Reason::OutOfServiceTaintRemoved,
            Reason::FencingEnded,
            Reason::PoweredOff,
            Reason::PowerOffRefused,
            Reason::MarkedNotReady,
            Reason::KubeletHeardAfterStop,
            Reason::OthersTaintOnLiveMachine,
            Reason::MachineFoundOff,
            Reason::PowerOffLapsed,
            Reason::UnidentifiedMachine,
            Reason::WitnessFailing,
            Reason::WitnessRestored,
        ];
        let warnings: Vec<_> = all.iter().filter(|r| r.warning()).collect();
        assert_eq!(
            warnings,
            [
                &Reason::FencingRefused,
                &Reason::PowerOffRefused,
                &Reason::KubeletHeardAfterStop,
                &Reason::OthersTaintOnLiveMachine,
                &Reason::PowerOffLapsed,
                &Reason::UnidentifiedMachine,
                &Reason::WitnessFailing
            ]
        );
        for r in all {
            assert!(
                ["Fence", "Detach", "Recover", "PowerOff", "Witness"].contains(&r.action()),
                "{r:?}"
            );
            assert!(r.as_str().chars().all(|c| c.is_ascii_alphabetic()), "{r:?}");
        }
    }

    /// Issue 45, item 9: a renewal inside the margin before the stop is
    /// told as such, not as one after the stop.
    #[test]
    fn a_renewal_inside_the_margin_is_told_as_such() {
        let id = InstanceId::parse("i-0123456789abcdef0").expect("an id");
        const STOP: i64 = 1_795_000_000;
        let heard = silence::Heard::RenewTime;
        let before = NodeEvent::heard_after_stop(&id, (STOP, STOP - 3), heard).note;
        assert!(before.contains("3 s before the stop"), "{before}");
        assert!(before.contains("clock skew"), "{before}");
        let after = NodeEvent::heard_after_stop(&id, (STOP, STOP + 4), heard).note;
        assert!(after.contains("4 s after the stop"), "{after}");
        // Issue 58: a kubelet whose clock runs behind, heard by the
        // apiserver's clock, and one seen renewing.
        let written = silence::Heard::Written {
            written_at: STOP + 2,
        };
        let skewed = NodeEvent::heard_after_stop(&id, (STOP, STOP - 38), written).note;
        assert!(skewed.contains("apiserver took a write"), "{skewed}");
        assert!(skewed.contains("2 s after the stop"), "{skewed}");
        let seen = NodeEvent::heard_after_stop(&id, (STOP, STOP - 6), silence::Heard::Seen).note;
        assert!(seen.contains("saw the kubelet's Lease renewed"), "{seen}");
    }

    #[test]
    fn a_fencing_that_removed_the_taint_says_so() {
        const AT: &str = "2026-11-23T10:00:00Z";
        assert_eq!(
            NodeEvent::fencing_ended(AT, true, false).reason,
            Reason::OutOfServiceTaintRemoved
        );
        assert_eq!(
            NodeEvent::fencing_ended(AT, false, true).reason,
            Reason::FencingEnded
        );
        let legacy = NodeEvent::fencing_ended(AT, false, true);
        assert!(legacy.note.contains("legacy"));
        assert_eq!(legacy.occasion.as_deref(), Some(AT));
    }

    #[test]
    fn an_event_name_is_fixed_by_node_reason_and_occasion() {
        let name = event_name("worker-2", Reason::OutOfServiceTaintApplied, "req-1");
        assert_eq!(
            name,
            event_name("worker-2", Reason::OutOfServiceTaintApplied, "req-1")
        );
        assert!(name.starts_with("worker-2."), "{name}");
        assert_eq!(name.len(), "worker-2.".len() + 16);
        for other in [
            event_name("worker-3", Reason::OutOfServiceTaintApplied, "req-1"),
            event_name("worker-2", Reason::VolumesForceDetached, "req-1"),
            event_name("worker-2", Reason::OutOfServiceTaintApplied, "req-2"),
        ] {
            assert_ne!(name, other);
        }
        // Cut to 253 characters, never leaving a '.' or '-' before the suffix.
        for label in ["n".repeat(58), format!("{}n", "n-".repeat(29))] {
            let long = [label.as_str(); 5].join(".");
            let cut = event_name(&long, Reason::FencingEnded, "x");
            assert!(cut.len() <= 253, "{cut}");
            assert!(crate::core::model::names::is_dns_subdomain(&cut), "{cut}");
        }
    }
}
