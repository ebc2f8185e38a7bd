//! A disk of the Node that another machine holds. The attach/detach
//! controller attaches a Node's disks to the machine its CSI node plugin
//! registered under the Node's name (the driver's node id in the Node's
//! CSINode), not to the machine the Node's `providerID` names: a kubelet
//! that serves the Node from another machine (`--hostname-override`) gets
//! the Node's disks on its own machine, and the pods it starts write them
//! there. Once that kubelet has died, and another has taken the name over
//! since and written its own address, nothing in the Node shows that
//! machine any more; the disks it holds still do.
//!
//! So each disk of the Node (one of its VolumeAttachments) that the cloud
//! describes attached to another machine is asked about, and a machine
//! that may run (any state but stopped and terminated, or not described at
//! all) that no other Ready Node names refuses the fencing: the taint would
//! free the disk from under whatever runs there. A machine a Ready Node
//! names serves that Node, which the disk has already moved to. Pure.

use serde::Serialize;

use crate::core::model::facts::{InstanceFacts, NodeFacts, VolumeFacts};
use crate::core::model::instance::{InstanceId, VolumeId};
use crate::core::rules::namesake::{Namesake, serves_another_node};
use crate::core::rules::volumes::NodeVolume;

/// A machine other than the Node's own that holds one of its disks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiskHolder {
    /// The disk.
    pub volume: String,
    /// The machine, and its state.
    pub by: Namesake,
}

/// Each of the Node's disks (`volumes`) that the cloud (`described`) shows
/// attached to a machine other than `machine`, the Node's own, with that
/// machine.
pub fn held_elsewhere(
    machine: &InstanceId,
    volumes: &[NodeVolume],
    described: &[VolumeFacts],
) -> Vec<(VolumeId, InstanceId)> {
    volumes
        .iter()
        .filter_map(|nv| described.iter().find(|f| f.id == nv.volume))
        .flat_map(|facts| {
            facts
                .attachments
                .iter()
                .filter(|a| a.instance != *machine && a.state.holds())
                .map(|a| (facts.id.clone(), a.instance.clone()))
        })
        .collect()
}

/// The first of `held` (the disks of the Node `node` other machines hold)
/// whose machine, as `holders` describes it, may run and is named by no
/// other Ready Node of `nodes`. A machine the cloud did not describe is
/// not known to be off.
pub fn judge(
    node: &str,
    held: &[(VolumeId, InstanceId)],
    holders: &[InstanceFacts],
    nodes: &[NodeFacts],
) -> Option<DiskHolder> {
    held.iter().find_map(|(volume, id)| {
        let state = match holders.iter().find(|m| m.id == *id) {
            Some(m) if m.state.is_off() => return None,
            Some(m) => m.state.name(),
            None => "not described",
        };
        if serves_another_node(id, node, nodes) {
            return None;
        }
        Some(DiskHolder {
            volume: volume.as_str().to_owned(),
            by: Namesake {
                machine: id.as_str().to_owned(),
                state: state.to_owned(),
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::{Readiness, VolumeAttachmentState};
    use crate::core::model::instance::{AttachmentState, InstanceState, VolumeState};

    fn id(s: &str) -> InstanceId {
        InstanceId::parse(s).expect("a valid id")
    }

    fn disk(s: &str) -> VolumeId {
        VolumeId::parse(s).expect("a valid disk")
    }

    const OWN: &str = "i-0000000000000000a";
    const OTHER: &str = "i-0000000000000000b";
    const VOL: &str = "vol-0000000000000000a";

    fn node_volume() -> NodeVolume {
        NodeVolume {
            volume: disk(VOL),
            pv: Some("pv-a".into()),
            attachment: "csi-a".into(),
            attachment_uid: "uid-a".into(),
        }
    }

    fn attached_to(machines: &[(&str, AttachmentState)]) -> VolumeFacts {
        VolumeFacts {
            id: disk(VOL),
            state: VolumeState::InUse,
            attachments: machines
                .iter()
                .map(|(m, state)| VolumeAttachmentState {
                    instance: id(m),
                    device: Some("/dev/xvdba".into()),
                    state: *state,
                })
                .collect(),
        }
    }

    fn node(name: &str, machine: &str, readiness: Readiness) -> NodeFacts {
        NodeFacts {
            instance: Some(id(machine)),
            ..NodeFacts::bare(name, readiness)
        }
    }

    #[test]
    fn only_the_disks_another_machine_holds_are_asked_about() {
        let own = id(OWN);
        let volumes = [node_volume()];
        let on_own = attached_to(&[(OWN, AttachmentState::Attached)]);
        assert_eq!(held_elsewhere(&own, &volumes, &[on_own]), []);
        let let_go = attached_to(&[(OTHER, AttachmentState::Detached)]);
        assert_eq!(held_elsewhere(&own, &volumes, &[let_go]), []);
        assert_eq!(held_elsewhere(&own, &volumes, &[]), [], "not described");
        for state in [
            AttachmentState::Attaching,
            AttachmentState::Attached,
            AttachmentState::Detaching,
            AttachmentState::Busy,
        ] {
            let elsewhere = attached_to(&[(OWN, AttachmentState::Detached), (OTHER, state)]);
            assert_eq!(
                held_elsewhere(&own, &volumes, &[elsewhere]),
                [(disk(VOL), id(OTHER))],
                "{state:?}"
            );
        }
    }

    #[test]
    fn a_holder_that_may_run_or_is_not_described_holds_it() {
        let stale = "worker-1";
        let held = [(disk(VOL), id(OTHER))];
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::ShuttingDown,
        ] {
            let holders = [InstanceFacts::bare(id(OTHER), state.clone())];
            let found = judge(stale, &held, &holders, &[]).map(|h| h.by.state);
            assert_eq!(found.as_deref(), Some(state.name()), "{state:?}");
        }
        let unknown = judge(stale, &held, &[], &[]);
        assert_eq!(
            unknown,
            Some(DiskHolder {
                volume: VOL.into(),
                by: Namesake {
                    machine: OTHER.into(),
                    state: "not described".into(),
                },
            })
        );
    }

    #[test]
    fn a_holder_that_is_off_or_serves_a_ready_node_holds_none() {
        let stale = "worker-1";
        let held = [(disk(VOL), id(OTHER))];
        for state in [InstanceState::Stopped, InstanceState::Terminated] {
            let holders = [InstanceFacts::bare(id(OTHER), state)];
            assert_eq!(judge(stale, &held, &holders, &[]), None);
        }
        let running = [InstanceFacts::bare(id(OTHER), InstanceState::Running)];
        let ready = node("worker-2", OTHER, Readiness::Ready);
        assert_eq!(judge(stale, &held, &running, &[ready]), None);
        let not_ready = node("worker-2", OTHER, Readiness::Unknown);
        assert!(judge(stale, &held, &running, &[not_ready]).is_some());
        let itself = node("worker-1", OTHER, Readiness::Ready);
        assert!(
            judge(stale, &held, &running, &[itself]).is_some(),
            "the Node itself is no other Node"
        );
    }
}
