//! When a fenced node may be given back: the recovery decision. Pure: the
//! shell gathers the facts (the Node, EC2's answer, the VolumeAttachments)
//! and carries out the verdict.
//!
//! Only a fencing node-fencer recorded is ever ended, and only once its
//! instance runs, the Node is Ready again, no VolumeAttachment of a volume
//! node-fencer detached still points at the Node, and the Node has been
//! Ready for the settle delay: the attach/detach controller acts on a cached
//! Node, so a taint removed too early can still force-detach from a node
//! that is back. With manual recovery an operator's confirmation of that
//! very fencing is needed as well: storage systems whose operators want to
//! check a node before it takes their data again ask for exactly that.

use serde::Serialize;

use crate::core::model::facts::{Confirmation, FenceMark, NodeFacts, Readiness};
use crate::core::model::instance::{InstanceId, InstanceState, VolumeId};

/// Who ends a fencing once the node is back and the rules allow it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecoveryPolicy {
    /// node-fencer, as soon as the rules allow.
    #[default]
    Auto,
    /// node-fencer, once the rules allow and an operator confirmed the node
    /// healthy (`node-fencer recover --confirm NODE`, or the annotation
    /// `node-fencer.io/recovery-confirmed` set to the fencing's `fenced-at`).
    Manual,
}

impl RecoveryPolicy {
    /// The setting's value: `auto` or `manual`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "auto" => Some(Self::Auto),
            "manual" => Some(Self::Manual),
            _ => None,
        }
    }
}

/// Everything one recovery decision looks at.
#[derive(Clone, Debug)]
pub struct RecoveryCase<'a> {
    /// The Node as listed now.
    pub node: &'a NodeFacts,
    /// EC2's answer for the Node's instance (its provider id).
    pub current: Option<&'a Confirmation>,
    /// EC2's answer for the instance node-fencer fenced, when the Node now
    /// names another one (the instance was replaced under the same name).
    pub fenced: Option<&'a Confirmation>,
    /// The volumes node-fencer detached that a VolumeAttachment still ties
    /// to this Node; `None` while the attachments are not known (not listed
    /// yet, or the list failed).
    pub attached: Option<&'a [VolumeId]>,
    /// Now, in Unix seconds.
    pub now: i64,
    /// When the Node was first seen Ready, if its condition does not say.
    pub seen_ready_at: i64,
    /// How long the Node must have been Ready, in seconds.
    pub settle_secs: i64,
    /// Who ends the fencing.
    pub policy: RecoveryPolicy,
}

/// Why a fenced node is kept fenced for now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "code")]
pub enum Hold {
    /// node-fencer did not fence this Node (or the fencing is cleared).
    NotFenced,
    /// The Node has no AWS provider id.
    NoInstance,
    /// The instance does not run (yet).
    InstanceNotRunning {
        /// What EC2 said.
        state: InstanceState,
    },
    /// EC2 does not know the instance any more.
    InstanceNotFound,
    /// EC2 could not be asked.
    LookupFailed {
        /// The error.
        error: String,
    },
    /// The Node now names another instance, and the one fenced runs again.
    FencedInstanceRuns {
        /// The fenced instance.
        instance: InstanceId,
    },
    /// The Node is not Ready yet.
    NodeNotReady,
    /// A VolumeAttachment of a detached volume still points at the Node.
    AttachmentsRemain {
        /// The volumes.
        volumes: Vec<VolumeId>,
    },
    /// The VolumeAttachments could not be listed.
    AttachmentsUnknown,
    /// Ready, but not for the settle delay yet.
    Settling {
        /// Seconds to go.
        remaining_secs: i64,
    },
    /// The fencing applied the `NoSchedule` taint too, and nothing proves
    /// the machine went through a power cycle since: EC2 did not record it
    /// off when it was fenced, and the kubelet reports the same boot.
    AwaitingPowerCycle,
    /// Recovery is manual: everything else allows it, and an operator has
    /// not confirmed the node healthy yet.
    AwaitingConfirmation {
        /// The fencing to confirm, by its `fenced-at`.
        fenced_at: String,
    },
}

impl Hold {
    /// True when the node is on its way back, so waiting (or a retry) is
    /// expected to end the fencing; false when it stays fenced (the instance
    /// is stopped or gone) or was never fenced.
    pub fn pending(&self) -> bool {
        match self {
            Self::InstanceNotRunning { state } => {
                matches!(state, InstanceState::Pending | InstanceState::Running)
            }
            Self::LookupFailed { .. }
            | Self::NodeNotReady
            | Self::AttachmentsRemain { .. }
            | Self::AttachmentsUnknown
            | Self::Settling { .. } => true,
            // Nothing but a person ends the wait: no retry.
            Self::NotFenced
            | Self::NoInstance
            | Self::InstanceNotFound
            | Self::FencedInstanceRuns { .. }
            | Self::AwaitingPowerCycle
            | Self::AwaitingConfirmation { .. } => false,
        }
    }

    /// A short, stable name for logs, events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFenced => "not_fenced",
            Self::NoInstance => "no_instance",
            Self::InstanceNotRunning { .. } => "instance_not_running",
            Self::InstanceNotFound => "instance_not_found",
            Self::LookupFailed { .. } => "lookup_failed",
            Self::FencedInstanceRuns { .. } => "fenced_instance_runs",
            Self::NodeNotReady => "node_not_ready",
            Self::AttachmentsRemain { .. } => "attachments_remain",
            Self::AttachmentsUnknown => "attachments_unknown",
            Self::Settling { .. } => "settling",
            Self::AwaitingPowerCycle => "awaiting_power_cycle",
            Self::AwaitingConfirmation { .. } => "awaiting_confirmation",
        }
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFenced => f.write_str("node-fencer has not fenced this node"),
            Self::NoInstance => f.write_str("the node has no AWS or GCE provider id"),
            Self::InstanceNotRunning { state } if state.is_off() => write!(
                f,
                "EC2 reports the instance `{state}`: the node stays out of service \
                 (a terminated node's Node object is deleted by the cloud controller)"
            ),
            Self::InstanceNotRunning { state } => {
                write!(f, "EC2 reports the instance `{state}`, not running")
            }
            Self::InstanceNotFound => f.write_str(
                "EC2 does not know the instance: the node stays out of service until its Node object is deleted",
            ),
            Self::LookupFailed { error } => write!(f, "EC2 lookup failed: {error}"),
            Self::FencedInstanceRuns { instance } => write!(
                f,
                "the node now names another instance, and the fenced {instance} runs again: \
                 left for a person to sort out"
            ),
            Self::NodeNotReady => f.write_str("waiting for the node to be Ready"),
            Self::AttachmentsRemain { volumes } => {
                let ids: Vec<&str> = volumes.iter().map(VolumeId::as_str).collect();
                write!(
                    f,
                    "VolumeAttachment(s) of {} still point at the node",
                    ids.join(", ")
                )
            }
            Self::AttachmentsUnknown => {
                f.write_str("the VolumeAttachments could not be listed; retrying later")
            }
            Self::Settling { remaining_secs } => write!(
                f,
                "Ready again; waiting {remaining_secs}s more for the settle delay"
            ),
            Self::AwaitingPowerCycle => f.write_str(
                "the fencing applied the NoSchedule taint too, and nothing proves a power cycle \
                 since (EC2 recorded no stop at fencing, and the node reports the same boot id): \
                 reboot the machine, or remove the taints by hand",
            ),
            Self::AwaitingConfirmation { fenced_at } => write!(
                f,
                "back and safe to recover, and recovery is manual: waiting for an operator \
                 to confirm the node healthy (`node-fencer recover --confirm NODE`, or the \
                 annotation node-fencer.io/recovery-confirmed={fenced_at})"
            ),
        }
    }
}

/// The recovery decision for one Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryVerdict {
    /// End the fencing recorded at this time: remove node-fencer's taint
    /// and annotations.
    Recover {
        /// The mark's `fenced-at`, so a newer fencing is never cleared.
        fenced_at: String,
    },
    /// Keep it fenced, for this reason.
    Hold(Hold),
}

/// Decides whether the fencing of one Node may end now.
pub fn decide(case: &RecoveryCase<'_>) -> RecoveryVerdict {
    let hold = RecoveryVerdict::Hold;
    let Some(mark) = &case.node.fenced else {
        return hold(Hold::NotFenced);
    };
    let Some(current) = case.current else {
        return hold(Hold::NoInstance);
    };
    match running(current) {
        Ok(()) => {}
        Err(h) => return hold(h),
    }
    if let (Some(fenced), Some(now)) = (&mark.instance, &case.node.instance)
        && fenced != now
    {
        // The Node belongs to a new instance; the one fenced must stay off,
        // or its disks could have two writers once the taint is gone.
        match case.fenced {
            Some(Confirmation::Seen(f)) if f.state.is_off() => {}
            Some(Confirmation::NotFound) => {}
            Some(Confirmation::LookupFailed { error }) => {
                return hold(Hold::LookupFailed {
                    error: error.clone(),
                });
            }
            Some(Confirmation::Seen(_)) | None => {
                return hold(Hold::FencedInstanceRuns {
                    instance: fenced.clone(),
                });
            }
        }
    }
    if case.node.readiness != Readiness::Ready {
        return hold(Hold::NodeNotReady);
    }
    match case.attached {
        None => return hold(Hold::AttachmentsUnknown),
        Some(volumes) if !volumes.is_empty() => {
            return hold(Hold::AttachmentsRemain {
                volumes: volumes.to_vec(),
            });
        }
        Some(_) => {}
    }
    let since = case.node.ready_since.unwrap_or(case.seen_ready_at);
    let remaining = case.settle_secs - (case.now - since);
    if remaining > 0 {
        return hold(Hold::Settling {
            remaining_secs: remaining,
        });
    }
    if mark.no_schedule && !power_cycled(mark, case.node) {
        return hold(Hold::AwaitingPowerCycle);
    }
    if case.policy == RecoveryPolicy::Manual && !mark.confirmed {
        return hold(Hold::AwaitingConfirmation {
            fenced_at: mark.at.clone(),
        });
    }
    RecoveryVerdict::Recover {
        fenced_at: mark.at.clone(),
    }
}

/// Proof that the machine went through a power cycle since it was fenced:
/// EC2 reported it off when it was fenced (and it runs now, which the
/// decision requires first), or its kubelet reports another boot than then.
fn power_cycled(mark: &FenceMark, node: &NodeFacts) -> bool {
    let seen_off = mark.state.as_ref().is_some_and(InstanceState::is_off);
    seen_off || node.power.booted_since(mark.boot_id.as_deref())
}

fn running(c: &Confirmation) -> Result<(), Hold> {
    match c {
        Confirmation::Seen(f) if f.state == InstanceState::Running => Ok(()),
        Confirmation::Seen(f) => Err(Hold::InstanceNotRunning {
            state: f.state.clone(),
        }),
        Confirmation::NotFound => Err(Hold::InstanceNotFound),
        Confirmation::LookupFailed { error } => Err(Hold::LookupFailed {
            error: error.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::{FenceMark, FenceMode, InstanceFacts};
    use proptest::prelude::*;

    const FENCED: &str = "i-0123456789abcdef0";
    const OTHER: &str = "i-0fedcba9876543210";

    fn node(instance: &str, readiness: Readiness, ready_since: Option<i64>) -> NodeFacts {
        NodeFacts {
            seen_off: None,
            version: None,
            labels: Default::default(),
            uid: None,
            attached: None,
            machine: Default::default(),
            power: Default::default(),
            name: "worker-2".into(),
            instance: InstanceId::parse(instance),
            readiness,
            internal_ips: vec![],
            host_names: vec![],
            taints: vec![],
            ready_since,
            fenced: Some(FenceMark {
                no_schedule: false,
                boot_id: None,
                confirmed: false,
                mode: FenceMode::Taint,
                instance: InstanceId::parse(FENCED),
                state: Some(InstanceState::Stopped),
                volumes: vec![],
                at: "2026-11-22T10:00:00Z".into(),
                correlation_id: None,
            }),
        }
    }

    fn seen(id: &str, state: InstanceState) -> Confirmation {
        Confirmation::Seen(InstanceFacts::bare(InstanceId::parse(id).unwrap(), state))
    }

    fn case<'a>(n: &'a NodeFacts, current: &'a Confirmation) -> RecoveryCase<'a> {
        RecoveryCase {
            node: n,
            current: Some(current),
            fenced: None,
            attached: Some(&[]),
            now: 1_000,
            seen_ready_at: 1_000,
            settle_secs: 30,
            policy: RecoveryPolicy::Auto,
        }
    }

    #[test]
    fn manual_recovery_also_waits_for_an_operator() {
        let mut n = node(FENCED, Readiness::Ready, Some(0));
        let running = seen(FENCED, InstanceState::Running);
        let mut c = case(&n, &running);
        c.policy = RecoveryPolicy::Manual;
        let held = decide(&c);
        assert_eq!(
            held,
            RecoveryVerdict::Hold(Hold::AwaitingConfirmation {
                fenced_at: "2026-11-22T10:00:00Z".into()
            })
        );
        // Nothing but a person ends it: not a wait a retry would end.
        assert!(matches!(&held, RecoveryVerdict::Hold(h) if !h.pending()));
        if let Some(m) = n.fenced.as_mut() {
            m.confirmed = true;
        }
        let mut c = case(&n, &running);
        c.policy = RecoveryPolicy::Manual;
        assert!(matches!(decide(&c), RecoveryVerdict::Recover { .. }));
        // A confirmation overrides none of the other rules.
        let stopped = seen(FENCED, InstanceState::Stopped);
        let mut c = case(&n, &stopped);
        c.policy = RecoveryPolicy::Manual;
        assert!(matches!(
            decide(&c),
            RecoveryVerdict::Hold(Hold::InstanceNotRunning { .. })
        ));
        assert_eq!(
            RecoveryPolicy::parse("manual"),
            Some(RecoveryPolicy::Manual)
        );
        assert_eq!(RecoveryPolicy::parse("Manual"), None);
        assert_eq!(RecoveryPolicy::parse("auto"), Some(RecoveryPolicy::Auto));
    }

    /// What a held recovery tells the operator: a machine off for good
    /// stays out of service, one on its way is only not running yet.
    #[test]
    fn a_hold_for_the_machine_says_whether_it_is_off() {
        let off = Hold::InstanceNotRunning {
            state: InstanceState::Stopped,
        };
        let on_its_way = Hold::InstanceNotRunning {
            state: InstanceState::Pending,
        };
        assert!(off.to_string().contains("stays out of service"), "{off}");
        assert_eq!(
            on_its_way.to_string(),
            "EC2 reports the instance `pending`, not running"
        );
    }

    /// Rook/Ceph's pair ends only after a power cycle: EC2 recorded the
    /// machine off when it was fenced, or the kubelet reports another boot.
    #[test]
    fn the_no_schedule_pair_needs_proof_of_a_power_cycle() {
        let running = seen(FENCED, InstanceState::Running);
        let mut n = node(FENCED, Readiness::Ready, Some(0));
        n.power.boot_id = Some("boot-1".into());
        if let Some(m) = n.fenced.as_mut() {
            m.no_schedule = true;
            m.state = None;
            m.boot_id = Some("boot-1".into());
        }
        let held = decide(&case(&n, &running));
        assert_eq!(held, RecoveryVerdict::Hold(Hold::AwaitingPowerCycle));
        assert!(matches!(&held, RecoveryVerdict::Hold(h) if !h.pending()));
        let mut rebooted = n.clone();
        rebooted.power.boot_id = Some("boot-2".into());
        assert!(matches!(
            decide(&case(&rebooted, &running)),
            RecoveryVerdict::Recover { .. }
        ));
        let mut seen_off = n.clone();
        if let Some(m) = seen_off.fenced.as_mut() {
            m.state = Some(InstanceState::Stopped);
        }
        assert!(matches!(
            decide(&case(&seen_off, &running)),
            RecoveryVerdict::Recover { .. }
        ));
        // Without the pair, the boot is not looked at.
        let mut single = n.clone();
        if let Some(m) = single.fenced.as_mut() {
            m.no_schedule = false;
        }
        assert!(matches!(
            decide(&case(&single, &running)),
            RecoveryVerdict::Recover { .. }
        ));
    }

    #[test]
    fn recovers_a_settled_ready_node_whose_instance_runs() {
        let n = node(FENCED, Readiness::Ready, Some(900));
        let c = seen(FENCED, InstanceState::Running);
        assert_eq!(
            decide(&case(&n, &c)),
            RecoveryVerdict::Recover {
                fenced_at: "2026-11-22T10:00:00Z".into()
            }
        );
    }

    #[test]
    fn holds_until_running_ready_detached_and_settled() {
        let ready = node(FENCED, Readiness::Ready, Some(990));
        let running = seen(FENCED, InstanceState::Running);
        assert_eq!(
            decide(&case(&ready, &running)),
            RecoveryVerdict::Hold(Hold::Settling { remaining_secs: 20 })
        );
        // No transition time: the settle delay runs from the first sighting.
        let unknown_since = node(FENCED, Readiness::Ready, None);
        let mut c = case(&unknown_since, &running);
        c.seen_ready_at = 980;
        assert_eq!(
            decide(&c),
            RecoveryVerdict::Hold(Hold::Settling { remaining_secs: 10 })
        );
        let vol = [VolumeId::parse("vol-0123456789abcdef0").unwrap()];
        let settled = node(FENCED, Readiness::Ready, Some(0));
        let mut c = case(&settled, &running);
        c.attached = Some(&vol);
        assert!(matches!(
            decide(&c),
            RecoveryVerdict::Hold(Hold::AttachmentsRemain { .. })
        ));
        c.attached = None;
        assert_eq!(decide(&c), RecoveryVerdict::Hold(Hold::AttachmentsUnknown));
        let down = node(FENCED, Readiness::Unknown, None);
        assert_eq!(
            decide(&case(&down, &running)),
            RecoveryVerdict::Hold(Hold::NodeNotReady)
        );
        let pending = seen(FENCED, InstanceState::Pending);
        let held = decide(&case(&settled, &pending));
        assert!(matches!(&held, RecoveryVerdict::Hold(h) if h.pending()));
        let stopped = seen(FENCED, InstanceState::Stopped);
        let held = decide(&case(&settled, &stopped));
        assert!(
            matches!(&held, RecoveryVerdict::Hold(h) if !h.pending()),
            "{held:?}"
        );
    }

    #[test]
    fn a_replaced_instance_needs_the_fenced_one_off() {
        let n = node(OTHER, Readiness::Ready, Some(0));
        let running = seen(OTHER, InstanceState::Running);
        let mut c = case(&n, &running);
        let old_runs = seen(FENCED, InstanceState::Running);
        c.fenced = Some(&old_runs);
        assert!(matches!(
            decide(&c),
            RecoveryVerdict::Hold(Hold::FencedInstanceRuns { .. })
        ));
        c.fenced = None;
        assert!(matches!(
            decide(&c),
            RecoveryVerdict::Hold(Hold::FencedInstanceRuns { .. })
        ));
        let old_gone = seen(FENCED, InstanceState::Terminated);
        c.fenced = Some(&old_gone);
        assert!(matches!(decide(&c), RecoveryVerdict::Recover { .. }));
    }

    #[test]
    fn never_recovers_what_it_did_not_fence() {
        let mut n = node(FENCED, Readiness::Ready, Some(0));
        n.fenced = None;
        let running = seen(FENCED, InstanceState::Running);
        assert_eq!(
            decide(&case(&n, &running)),
            RecoveryVerdict::Hold(Hold::NotFenced)
        );
    }

    fn arb_confirmation(id: &'static str) -> impl Strategy<Value = Option<Confirmation>> {
        prop_oneof![
            Just(None),
            Just(Some(Confirmation::NotFound)),
            Just(Some(Confirmation::LookupFailed { error: "x".into() })),
            prop::sample::select(InstanceState::ALL.to_vec()).prop_map(move |s| Some(seen(id, s))),
        ]
    }

    proptest! {
        /// The invariant: a fencing is ended only when node-fencer recorded
        /// it, EC2 said in this lookup that the Node's instance runs, the
        /// Node is Ready and settled, no attachment of ours remains, and a
        /// replaced instance's predecessor is not running; with manual
        /// recovery, also only once an operator confirmed this fencing.
        #[test]
        fn recovery_only_when_safe(
            marked in any::<bool>(),
            replaced in any::<bool>(),
            readiness in prop::sample::select(vec![Readiness::Ready, Readiness::NotReady, Readiness::Unknown]),
            ready_since in prop::option::of(0i64..2_000),
            current in arb_confirmation(OTHER),
            fenced in arb_confirmation(FENCED),
            attached in 0usize..3,
            settle in 0i64..120,
            manual in any::<bool>(),
            confirmed in any::<bool>(),
            pair in any::<bool>(),
            recorded_off in any::<bool>(),
            rebooted in any::<bool>(),
        ) {
            let mut n = node(if replaced { OTHER } else { FENCED }, readiness, ready_since);
            if !marked {
                n.fenced = None;
            }
            if let Some(m) = n.fenced.as_mut() {
                m.confirmed = confirmed;
                m.no_schedule = pair;
                m.state = recorded_off.then_some(InstanceState::Stopped);
                m.boot_id = Some("boot-1".into());
            }
            n.power.boot_id = Some(if rebooted { "boot-2" } else { "boot-1" }.into());
            let vol = [VolumeId::parse("vol-0123456789abcdef0").unwrap()];
            let c = RecoveryCase {
                node: &n,
                current: current.as_ref(),
                fenced: fenced.as_ref(),
                // Unknown, none left, one left.
                attached: [None, Some(&[][..]), Some(&vol[..])][attached],
                now: 1_000,
                seen_ready_at: 990,
                settle_secs: settle,
                policy: if manual { RecoveryPolicy::Manual } else { RecoveryPolicy::Auto },
            };
            if let RecoveryVerdict::Recover { .. } = decide(&c) {
                prop_assert!(marked);
                prop_assert!(!manual || confirmed);
                prop_assert!(!pair || recorded_off || rebooted, "the pair ends only after a power cycle");
                prop_assert!(matches!(current, Some(Confirmation::Seen(ref f)) if f.state == InstanceState::Running));
                prop_assert_eq!(readiness, Readiness::Ready);
                prop_assert_eq!(attached, 1);
                prop_assert!(1_000 - ready_since.unwrap_or(990) >= settle);
                if replaced {
                    prop_assert!(matches!(fenced, Some(Confirmation::NotFound))
                        || matches!(fenced, Some(Confirmation::Seen(ref f)) if f.state.is_off()));
                }
            }
        }
    }
}
