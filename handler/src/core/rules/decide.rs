//! The decision: from plain facts to a verdict per node. Pure, so every
//! safety invariant can be checked over every combination of inputs.

use std::collections::HashMap;

use serde::Serialize;

use crate::core::inbound::suspect::Intent;
use crate::core::model::facts::{Confirmation, NodeFacts, Readiness};
use crate::core::model::instance::{InstanceId, InstanceState};
use crate::core::model::values;
use crate::core::rules::cap;
use crate::core::rules::reach::{Exemption, Reach};

/// The settings the decision depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings<'a> {
    /// Plan only, change nothing.
    pub dry_run: bool,
    /// How many Nodes may carry the out-of-service taint at once.
    pub max_out_of_service: usize,
    /// Take a hibernated instance for off (it resumes from RAM when started).
    pub fence_hibernated: bool,
    /// The Nodes node-fencer may act on.
    pub reach: &'a Reach,
}

/// Everything known about one node when deciding.
#[derive(Clone, Copy, Debug)]
pub struct Case<'a> {
    /// What the trigger asked.
    pub intent: Intent,
    /// The Node, if the suspect matched one.
    pub node: Option<&'a NodeFacts>,
    /// EC2's answer about its instance, if it has one.
    pub confirmation: Option<&'a Confirmation>,
    /// The other Nodes that name the same machine, as far as the view shows.
    pub(crate) shared_with: &'a [String],
}

/// What to do with one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
pub enum Verdict {
    /// Fence it: taint (unless already tainted) and detach its volumes.
    Fence {
        /// False when the node already carries the taint: only the volumes are left.
        add_taint: bool,
        /// Plan only.
        dry_run: bool,
    },
    /// Leave it alone.
    Skip {
        /// Why.
        reason: Skip,
    },
}

/// Why a node is left alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Skip {
    /// The suspect matches no Node of this cluster.
    NotInCluster,
    /// The Node is outside node-fencer's reach (`NODE_SELECTOR`, the
    /// opt-out label).
    Exempt(Exemption),
    /// EC2 shows the instance tagged for other clusters only: not looked
    /// up in Kubernetes at all.
    OtherCluster {
        /// The first cluster its tags name.
        cluster: String,
    },
    /// EC2 shows the instance in another VPC than the cluster's: not looked
    /// up in Kubernetes at all.
    OtherVpc {
        /// Its VPC.
        vpc: String,
    },
    /// The Node has no AWS or GCE provider id, so no cloud can be asked about it.
    NoInstance,
    /// Other Nodes name the same machine: which of them runs on it is a
    /// question for a person.
    SharedMachine {
        /// The other Nodes.
        others: Vec<String>,
    },
    /// EC2 says the instance is in a state where it may still write.
    InstanceNotOff {
        /// The state EC2 reported.
        state: InstanceState,
    },
    /// EC2 says `stopped`, but the stop was a hibernation: started again, the
    /// instance resumes from RAM as if it had never stopped.
    Hibernated,
    /// The cloud does not know the Node's machine.
    InstanceNotFound,
    /// The kubelet's Lease was written after node-fencer saw the Node's
    /// machine off, which has not started since: the kubelet runs on another
    /// machine, one that adopted the Node's name
    /// ([`crate::core::rules::silence::elsewhere`]).
    KubeletElsewhere {
        /// The machine the Node names.
        machine: String,
        /// When node-fencer saw it off (Unix seconds).
        seen_off_at: i64,
        /// The apiserver's time of the Lease's last write (Unix seconds).
        written_at: i64,
    },
    /// Another machine that may run carries the Node's name: its kubelet
    /// may have adopted the Node ([`crate::core::rules::namesake`]).
    NameTaken {
        /// The machine the Node names.
        machine: String,
        /// The machine that carries its name.
        by: super::namesake::Namesake,
    },
    /// Another machine that may run holds an address the Node reports: its
    /// kubelet may serve the Node under a name of its own choosing
    /// ([`crate::core::rules::namesake`]).
    AddressTaken {
        /// The machine the Node names.
        machine: String,
        /// The machine that holds the address, and the address.
        by: super::namesake::Holder,
    },
    /// Another machine that may run holds one of the Node's disks: a
    /// kubelet there may serve the Node, and the pods it started write the
    /// disk ([`crate::core::rules::held_disks`]).
    DiskHeld {
        /// The machine the Node names.
        machine: String,
        /// The machine that holds the disk, and the disk.
        by: super::held_disks::DiskHolder,
    },
    /// EC2 could not be asked; nothing is known, so nothing is done.
    LookupFailed {
        /// The error.
        error: String,
    },
    /// The Node is Ready: its kubelet reports in.
    NodeReady,
    /// Fencing it would put more Nodes out of service than allowed.
    CapReached {
        /// The configured limit.
        limit: usize,
        /// Nodes out of service, including those fenced earlier in this batch.
        out_of_service: usize,
    },
    /// The trigger asks for recovery, which the recovery check handles.
    RecoveryRequest,
    /// Too little of the request's time is left to carry the step out (a
    /// Cloud Run request, a Lambda invocation, ends at its deadline): left
    /// for the retry the unfinished request brings.
    OutOfTime {
        /// Seconds left.
        left_secs: u64,
        /// Seconds the step may take.
        needs_secs: u64,
    },
}

impl Skip {
    /// True when the skip leaves work that a retry may complete, so the
    /// invocation must fail and let Lambda retry (and the DLQ catch it).
    pub(crate) fn leaves_work(&self) -> bool {
        match self {
            // NodeReady is only reached once EC2 confirmed the instance off:
            // Kubernetes has not noticed yet (node-monitor-grace-period), and
            // Lambda's retries after 1 and 2 minutes will find it NotReady.
            Self::LookupFailed { .. }
            | Self::CapReached { .. }
            | Self::NodeReady
            | Self::OutOfTime { .. } => true,
            // On its way off: EC2's state lags its own event by seconds, and
            // a retry after a minute finds it off.
            Self::InstanceNotOff { state } => state.is_stopping(),
            Self::NotInCluster
            | Self::OtherCluster { .. }
            | Self::OtherVpc { .. }
            | Self::NoInstance
            | Self::Exempt(_)
            | Self::SharedMachine { .. }
            | Self::Hibernated
            | Self::InstanceNotFound
            | Self::KubeletElsewhere { .. }
            | Self::NameTaken { .. }
            | Self::AddressTaken { .. }
            | Self::DiskHeld { .. }
            | Self::RecoveryRequest => false,
        }
    }

    /// A short, stable name for logs, events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotInCluster => "not_in_cluster",
            Self::Exempt(e) => e.code(),
            Self::OtherCluster { .. } => "other_cluster",
            Self::OtherVpc { .. } => "other_vpc",
            Self::NoInstance => "no_instance",
            Self::SharedMachine { .. } => "shared_machine",
            Self::InstanceNotOff { .. } => "instance_not_off",
            Self::Hibernated => "hibernated",
            Self::InstanceNotFound => "instance_not_found",
            Self::KubeletElsewhere { .. } => "kubelet_elsewhere",
            Self::NameTaken { .. } => "name_taken",
            Self::AddressTaken { .. } => "address_taken",
            Self::DiskHeld { .. } => "disk_held",
            Self::LookupFailed { .. } => "lookup_failed",
            Self::NodeReady => "node_ready",
            Self::CapReached { .. } => "cap_reached",
            Self::RecoveryRequest => "recovery_request",
            Self::OutOfTime { .. } => "out_of_time",
        }
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotInCluster => f.write_str("no node of this cluster matches"),
            Self::Exempt(e) => e.fmt(f),
            Self::OtherCluster { cluster } => write!(
                f,
                "EC2 shows the instance tagged for cluster {cluster}, not this one"
            ),
            Self::OtherVpc { vpc } => write!(
                f,
                "EC2 shows the instance in {vpc}, not in the cluster's VPC"
            ),
            Self::NoInstance => f.write_str(
                "the node has no AWS or GCE provider id, so nothing names its machine; without a cloud provider, set CLUSTER_VPC_ID (and CLUSTER_TAG) so an EC2 event's instance is matched to it by InternalIP within the cluster's VPC",
            ),
            Self::SharedMachine { others } => write!(
                f,
                "other Nodes name the same machine ({}): which of them runs on it is a question for a person, so none is fenced",
                others.join(", ")
            ),
            Self::InstanceNotOff { state } => {
                write!(
                    f,
                    "the cloud reports the machine `{state}`, not off (stopped, terminated)"
                )
            }
            Self::Hibernated => f.write_str(
                "EC2 reports the instance stopped by hibernation: it resumes from RAM when started; FENCE_HIBERNATED=true fences it anyway",
            ),
            Self::InstanceNotFound => f.write_str(
                "the cloud does not know the Node's machine (gone, or another machine now carries its name)",
            ),
            Self::KubeletElsewhere {
                machine,
                seen_off_at,
                written_at,
            } => write!(
                f,
                "the Node's kubelet wrote its Lease at {}, after node-fencer saw the Node's machine {machine} off at {}, and the machine has not started since: the kubelet runs on another machine, which took over the Node's name, and may still run its pods; none is fenced. Delete the Node so that its kubelet registers it again with its own machine",
                values::rfc3339(*written_at),
                values::rfc3339(*seen_off_at),
            ),
            Self::NameTaken { machine, by } => write!(
                f,
                "another machine, {} (`{}`), carries the Node's name, while the machine the Node names, {machine}, is off: that machine's kubelet may have taken the Node over and may still run its pods; none is fenced. If it serves this Node, delete the Node so that its kubelet registers it again with its own machine",
                by.machine, by.state
            ),
            Self::AddressTaken { machine, by } => write!(
                f,
                "another machine, {} (`{}`), holds the Node's address {}, while the machine the Node names, {machine}, is off: that machine's kubelet may serve the Node under an override of its name and may still run its pods; none is fenced. If it serves this Node, delete the Node so that its kubelet registers it again with its own machine",
                by.by.machine, by.by.state, by.address
            ),
            Self::DiskHeld { machine, by } => write!(
                f,
                "another machine, {} (`{}`), holds the Node's disk {}, while the machine the Node names, {machine}, is off: a kubelet there may serve the Node under an override of its name, and the pods it started may still write the disk; none is fenced. If that machine serves this Node, delete the Node so that its kubelet registers it again with its own machine",
                by.by.machine, by.by.state, by.volume
            ),
            Self::LookupFailed { error } => write!(f, "the cloud lookup failed: {error}"),
            Self::NodeReady => f.write_str(
                "the node is still Ready although its instance is off; retrying once Kubernetes notices",
            ),
            Self::CapReached {
                limit,
                out_of_service,
            } => write!(
                f,
                "refused: {out_of_service} node(s) already out of service, the limit is {limit}"
            ),
            Self::RecoveryRequest => f.write_str("asks for recovery, not fencing"),
            Self::OutOfTime {
                left_secs,
                needs_secs,
            } => write!(
                f,
                "{left_secs} s of the request's time are left, and the step may take {needs_secs} s: left for the retry"
            ),
        }
    }
}

/// The cap in force: the configured count, and the configured share of
/// `nodes` (rounded down, at least one) when a percentage is set.
pub(crate) fn effective_cap(count: usize, percent: Option<u8>, nodes: usize) -> usize {
    match percent {
        None => count,
        Some(p) => count.min((nodes * usize::from(p) / 100).max(1)),
    }
}

/// Where a node about to be tainted stands under the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not out of service, and taking no room.
    In,
    /// Its own power-off in flight takes room already
    /// ([`cap::holds_room`]): the taint takes that room over.
    HoldsRoom,
    /// Another invocation fenced it meanwhile.
    Out,
}

/// A new taint, recounted under the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recount {
    /// Admitted: it counts against the cap.
    New,
    /// Another invocation fenced the node meanwhile: no new taint.
    AlreadyOut,
    /// The cap is reached now.
    Refused(Skip),
}

/// Recounts the new taints of an invocation against the Nodes as they are
/// under the Lease: `standing[k]` tells where the k-th node stands by now,
/// `out_of_service` how many Nodes take room.
pub fn recount(standing: &[Standing], out_of_service: usize, limit: usize) -> Vec<Recount> {
    let mut count = out_of_service;
    standing
        .iter()
        .map(|&standing| {
            if standing == Standing::Out {
                Recount::AlreadyOut
            } else if standing == Standing::HoldsRoom {
                Recount::New
            } else if count >= limit {
                Recount::Refused(Skip::CapReached {
                    limit,
                    out_of_service: count,
                })
            } else {
                count += 1;
                Recount::New
            }
        })
        .collect()
}

/// Why EC2's answer does not confirm the instance off; `None` when it does.
/// The same rule serves the decision and every confirmation after it; a
/// hibernated instance counts as off only with `fence_hibernated`.
pub fn not_confirmed(confirmation: &Confirmation, fence_hibernated: bool) -> Option<Skip> {
    match confirmation {
        Confirmation::Seen(facts) if facts.state == InstanceState::Hibernated => {
            (!fence_hibernated).then_some(Skip::Hibernated)
        }
        Confirmation::NotFound => Some(Skip::InstanceNotFound),
        Confirmation::LookupFailed { error } => Some(Skip::LookupFailed {
            error: error.clone(),
        }),
        Confirmation::Seen(facts) if !facts.state.is_off() => Some(Skip::InstanceNotOff {
            state: facts.state.clone(),
        }),
        Confirmation::Seen(_) => None,
    }
}

/// Decides one node, without the cluster-wide cap.
pub fn decide_one(case: &Case<'_>, settings: &Settings) -> Verdict {
    let skip = |reason| Verdict::Skip { reason };
    match case.intent {
        Intent::Recover | Intent::Confirm => return skip(Skip::RecoveryRequest),
        // Targets carry a power-off as a fence (plan::targets).
        Intent::Fence | Intent::Check | Intent::PowerOff => {}
    }
    let Some(node) = case.node else {
        return skip(Skip::NotInCluster);
    };
    // Before the machine is weighed: outside the reach, its state is no
    // reason to act.
    if let Some(exemption) = settings.reach.exemption(&node.labels) {
        return skip(Skip::Exempt(exemption));
    }
    let Some(confirmation) = case.confirmation else {
        return skip(Skip::NoInstance);
    };
    if let Some(reason) = not_confirmed(confirmation, settings.fence_hibernated) {
        return skip(reason);
    }
    // A machine that runs is left alone for that reason already (and active
    // fencing, which looks at it next, refuses it for this one).
    if !case.shared_with.is_empty() {
        return skip(Skip::SharedMachine {
            others: case.shared_with.to_vec(),
        });
    }
    match node.readiness {
        Readiness::Ready => return skip(Skip::NodeReady),
        Readiness::NotReady | Readiness::Unknown => {}
    }
    Verdict::Fence {
        add_taint: !node.is_out_of_service(),
        dry_run: settings.dry_run || case.intent == Intent::Check,
    }
}

/// Decides a batch of distinct nodes in order, enforcing the cap across the
/// batch: `already_out_of_service` counts the Nodes of the cluster that take
/// room now (with what the cloud said, `known`), and each new taint planned
/// here counts against the rest, but for a Node whose own power-off in
/// flight holds its room already ([`cap::holds_room`]).
pub fn decide_batch(
    cases: &[Case<'_>],
    settings: &Settings,
    (already_out_of_service, known): (usize, &HashMap<InstanceId, Confirmation>),
) -> Vec<Verdict> {
    let mut out_of_service = already_out_of_service;
    let holds = |case: &Case<'_>| case.node.is_some_and(|n| cap::holds_room(n, known));
    cases
        .iter()
        .map(|case| match decide_one(case, settings) {
            // Its power-off took the room its taint takes over.
            verdict @ Verdict::Fence {
                add_taint: true, ..
            } if holds(case) => verdict,
            // A check reports whether the cap would refuse it, and takes no
            // room from the fences beside it.
            Verdict::Fence {
                add_taint: true, ..
            } if case.intent == Intent::Check && out_of_service >= settings.max_out_of_service => {
                Verdict::Skip {
                    reason: Skip::CapReached {
                        limit: settings.max_out_of_service,
                        out_of_service,
                    },
                }
            }
            verdict @ Verdict::Fence { .. } if case.intent == Intent::Check => verdict,
            Verdict::Fence {
                add_taint: true, ..
            } if out_of_service >= settings.max_out_of_service => Verdict::Skip {
                reason: Skip::CapReached {
                    limit: settings.max_out_of_service,
                    out_of_service,
                },
            },
            verdict @ Verdict::Fence {
                add_taint: true, ..
            } => {
                out_of_service += 1;
                verdict
            }
            verdict => verdict,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::{InstanceFacts, OUT_OF_SERVICE_KEY, TaintFacts};
    use proptest::prelude::*;

    fn node(readiness: Readiness, taints: Vec<TaintFacts>) -> NodeFacts {
        NodeFacts {
            seen_off: None,
            version: None,
            labels: Default::default(),
            uid: None,
            attached: None,
            machine: Default::default(),
            power: Default::default(),
            name: "worker-2".into(),
            instance: InstanceId::parse("i-0123456789abcdef0"),
            readiness,
            internal_ips: vec![],
            host_names: vec![],
            taints,
            ready_since: None,
            fenced: None,
        }
    }

    /// Everywhere, no dry run, hibernation not fenced, this cap.
    fn capped(max_out_of_service: usize) -> Settings<'static> {
        Settings {
            reach: &Reach::EVERYWHERE,
            dry_run: false,
            max_out_of_service,
            fence_hibernated: false,
        }
    }

    fn seen(state: InstanceState) -> Confirmation {
        Confirmation::Seen(InstanceFacts::bare(
            InstanceId::parse("i-0123456789abcdef0").unwrap(),
            state,
        ))
    }

    fn taint(key: &str, effect: &str) -> TaintFacts {
        TaintFacts {
            key: key.into(),
            value: Some("nodeshutdown".into()),
            effect: effect.into(),
        }
    }

    fn confirmations() -> Vec<Confirmation> {
        let mut all: Vec<_> = InstanceState::ALL.into_iter().map(seen).collect();
        all.push(Confirmation::NotFound);
        all.push(Confirmation::LookupFailed {
            error: "RequestLimitExceeded".into(),
        });
        all
    }

    fn taint_sets() -> Vec<Vec<TaintFacts>> {
        vec![
            vec![],
            vec![taint("node.kubernetes.io/unreachable", "NoExecute")],
            vec![taint(OUT_OF_SERVICE_KEY, "NoExecute")],
            vec![taint(OUT_OF_SERVICE_KEY, "NoSchedule")],
        ]
    }

    /// `NODE_SELECTOR` and the opt-out label: a Node outside the reach is
    /// never fenced, whatever its machine, readiness and taints, and the
    /// verdict names why; a recovery request is not theirs to judge.
    #[test]
    fn a_node_outside_the_reach_is_never_fenced() {
        use crate::core::model::selector::LabelSelector;
        use crate::core::rules::reach::OPT_OUT_LABEL;
        let stateful = Reach {
            selector: Some(LabelSelector::parse("pool=stateful").unwrap()),
        };
        let mut web = node(Readiness::NotReady, vec![]);
        web.labels.insert("pool".into(), "web".into());
        let mut opted = node(Readiness::NotReady, vec![]);
        opted.labels.insert("pool".into(), "stateful".into());
        opted.labels.insert(OPT_OUT_LABEL.into(), "true".into());
        let out = Exemption::OutOfScope {
            selector: "pool=stateful".into(),
        };
        for (reach, base, why) in [
            (&stateful, &web, out),
            (&Reach::EVERYWHERE, &opted, Exemption::OptedOut),
            (&stateful, &opted, Exemption::OptedOut),
        ] {
            for confirmation in confirmations() {
                for readiness in [Readiness::Ready, Readiness::NotReady, Readiness::Unknown] {
                    for taints in taint_sets() {
                        for intent in [
                            Intent::Fence,
                            Intent::Check,
                            Intent::PowerOff,
                            Intent::Recover,
                        ] {
                            let n = NodeFacts {
                                readiness,
                                taints: taints.clone(),
                                ..base.clone()
                            };
                            let settings = Settings {
                                reach,
                                dry_run: false,
                                max_out_of_service: 3,
                                fence_hibernated: true,
                            };
                            let case = Case {
                                intent,
                                node: Some(&n),
                                confirmation: Some(&confirmation),
                                shared_with: &[],
                            };
                            let want = if intent == Intent::Recover {
                                Skip::RecoveryRequest
                            } else {
                                Skip::Exempt(why.clone())
                            };
                            assert_eq!(
                                decide_one(&case, &settings),
                                Verdict::Skip { reason: want },
                                "{confirmation:?} {readiness:?} {intent:?}"
                            );
                        }
                    }
                }
            }
        }
        // In reach, the same Node is fenced as before.
        let mut stateful_node = node(Readiness::NotReady, vec![]);
        stateful_node
            .labels
            .insert("pool".into(), "stateful".into());
        let off = seen(InstanceState::Stopped);
        let case = Case {
            intent: Intent::Fence,
            node: Some(&stateful_node),
            confirmation: Some(&off),
            shared_with: &[],
        };
        let settings = Settings {
            reach: &stateful,
            dry_run: false,
            max_out_of_service: 3,
            fence_hibernated: false,
        };
        assert!(matches!(
            decide_one(&case, &settings),
            Verdict::Fence { .. }
        ));
        let skip = Skip::Exempt(Exemption::OptedOut);
        assert!(!skip.leaves_work(), "no retry for a veto");
        assert_eq!(skip.code(), "opted_out");
        let shown = serde_json::to_value(&skip).unwrap();
        assert_eq!(shown["reason"], "exempt");
        assert_eq!(shown["exempt"], "opted_out");
    }

    /// The table over every combination of instance state × node condition ×
    /// existing taints × intent × dry-run × cap room.
    #[test]
    fn every_combination() {
        let intents = [Intent::Fence, Intent::Check, Intent::Recover];
        let readinesses = [Readiness::Ready, Readiness::NotReady, Readiness::Unknown];
        let mut fenced = 0;
        for confirmation in confirmations() {
            for readiness in readinesses {
                for taints in taint_sets() {
                    for intent in intents {
                        for (dry_run, hibernated) in [(false, false), (true, false), (false, true)]
                        {
                            for (cap, already) in [(3, 0), (3, 3), (1, 2)] {
                                let n = node(readiness, taints.clone());
                                let settings = Settings {
                                    reach: &Reach::EVERYWHERE,
                                    dry_run,
                                    max_out_of_service: cap,
                                    fence_hibernated: hibernated,
                                };
                                let case = Case {
                                    intent,
                                    node: Some(&n),
                                    confirmation: Some(&confirmation),
                                    shared_with: &[],
                                };
                                let verdict =
                                    decide_batch(&[case], &settings, (already, &HashMap::new()))
                                        .pop()
                                        .unwrap();
                                let expected = expected(
                                    &n,
                                    &confirmation,
                                    intent,
                                    (dry_run, hibernated),
                                    cap,
                                    already,
                                );
                                assert_eq!(
                                    verdict, expected,
                                    "{confirmation:?} {readiness:?} {taints:?} {intent:?} dry_run={dry_run} fence_hibernated={hibernated} cap={cap}/{already}"
                                );
                                fenced += usize::from(matches!(verdict, Verdict::Fence { .. }));
                            }
                        }
                    }
                }
            }
        }
        assert!(fenced > 0, "the table must exercise fencing too");
    }

    /// The expected verdict, written independently as a rule list.
    fn expected(
        n: &NodeFacts,
        c: &Confirmation,
        intent: Intent,
        (dry_run, fence_hibernated): (bool, bool),
        cap: usize,
        already: usize,
    ) -> Verdict {
        let skip = |reason| Verdict::Skip { reason };
        if intent == Intent::Recover {
            return skip(Skip::RecoveryRequest);
        }
        let state = match c {
            Confirmation::NotFound => return skip(Skip::InstanceNotFound),
            Confirmation::LookupFailed { error } => {
                return skip(Skip::LookupFailed {
                    error: error.clone(),
                });
            }
            Confirmation::Seen(f) => f.state.clone(),
        };
        if state == InstanceState::Hibernated && !fence_hibernated {
            return skip(Skip::Hibernated);
        }
        let off = [
            InstanceState::Stopped,
            InstanceState::Terminated,
            InstanceState::Hibernated,
        ];
        if !off.contains(&state) {
            return skip(Skip::InstanceNotOff { state });
        }
        if n.readiness == Readiness::Ready {
            return skip(Skip::NodeReady);
        }
        let tainted = n
            .taints
            .iter()
            .any(|t| t.key == OUT_OF_SERVICE_KEY && t.effect == "NoExecute");
        if !tainted && already >= cap {
            return skip(Skip::CapReached {
                limit: cap,
                out_of_service: already,
            });
        }
        Verdict::Fence {
            add_taint: !tainted,
            dry_run: dry_run || intent == Intent::Check,
        }
    }

    #[test]
    fn the_percentage_cap_rounds_down_but_allows_one() {
        assert_eq!(effective_cap(3, None, 100), 3);
        assert_eq!(effective_cap(10, Some(20), 30), 6);
        assert_eq!(effective_cap(3, Some(20), 30), 3);
        assert_eq!(effective_cap(10, Some(10), 5), 1);
        assert_eq!(effective_cap(10, Some(100), 0), 1);
    }

    #[test]
    fn the_recount_admits_only_up_to_the_cap() {
        use Standing::{HoldsRoom, In, Out};
        let r = recount(&[In, Out, In, In], 1, 3);
        assert_eq!(r[0], Recount::New);
        assert_eq!(r[1], Recount::AlreadyOut);
        assert_eq!(r[2], Recount::New);
        assert!(matches!(
            r[3],
            Recount::Refused(Skip::CapReached {
                limit: 3,
                out_of_service: 3
            })
        ));
        assert!(
            recount(&[In], 5, 3)
                .iter()
                .all(|r| matches!(r, Recount::Refused(_)))
        );
        // A node whose own power-off holds room is admitted into that room,
        // full cap or not, and takes none from the next.
        assert_eq!(
            recount(&[HoldsRoom, In], 2, 3),
            [Recount::New, Recount::New]
        );
        assert_eq!(recount(&[HoldsRoom], 3, 3), [Recount::New]);
    }

    #[test]
    fn missing_node_or_instance_is_skipped() {
        let settings = capped(3);
        let c = seen(InstanceState::Stopped);
        let case = Case {
            intent: Intent::Fence,
            node: None,
            confirmation: Some(&c),
            shared_with: &[],
        };
        assert_eq!(
            decide_one(&case, &settings),
            Verdict::Skip {
                reason: Skip::NotInCluster
            }
        );
        let n = node(Readiness::Unknown, vec![]);
        let case = Case {
            intent: Intent::Fence,
            node: Some(&n),
            confirmation: None,
            shared_with: &[],
        };
        assert_eq!(
            decide_one(&case, &settings),
            Verdict::Skip {
                reason: Skip::NoInstance
            }
        );
    }

    /// Issue 12, item 15: a dry-run check beside a live fence used to take
    /// the room the fence needed.
    #[test]
    fn a_check_takes_no_cap_room_from_a_fence_beside_it() {
        let settings = capped(1);
        let c = seen(InstanceState::Stopped);
        let n = node(Readiness::Unknown, vec![]);
        let case = |intent| Case {
            intent,
            node: Some(&n),
            confirmation: Some(&c),
            shared_with: &[],
        };
        let verdicts = decide_batch(
            &[case(Intent::Check), case(Intent::Fence)],
            &settings,
            (0, &HashMap::new()),
        );
        assert_eq!(
            verdicts,
            [
                Verdict::Fence {
                    add_taint: true,
                    dry_run: true
                },
                Verdict::Fence {
                    add_taint: true,
                    dry_run: false
                }
            ]
        );
        // At the cap, a check says the cap would refuse it.
        let verdicts = decide_batch(&[case(Intent::Check)], &settings, (1, &HashMap::new()));
        assert!(matches!(
            verdicts[0],
            Verdict::Skip {
                reason: Skip::CapReached { .. }
            }
        ));
    }

    #[test]
    fn the_cap_counts_new_taints_across_the_batch() {
        let settings = capped(2);
        let c = seen(InstanceState::Stopped);
        let fresh = node(Readiness::Unknown, vec![]);
        let tainted = node(
            Readiness::Unknown,
            vec![taint(OUT_OF_SERVICE_KEY, "NoExecute")],
        );
        let case = |n| Case {
            intent: Intent::Fence,
            node: Some(n),
            confirmation: Some(&c),
            shared_with: &[],
        };
        let verdicts = decide_batch(
            &[case(&fresh), case(&tainted), case(&fresh), case(&fresh)],
            &settings,
            (1, &HashMap::new()),
        );
        let fences: Vec<bool> = verdicts
            .iter()
            .map(|v| matches!(v, Verdict::Fence { .. }))
            .collect();
        assert_eq!(fences, [true, true, false, false]);
        assert!(matches!(
            &verdicts[2],
            Verdict::Skip {
                reason: Skip::CapReached {
                    limit: 2,
                    out_of_service: 2
                }
            }
        ));
    }

    /// A Node node-fencer powered off takes room under the cap by its mark
    /// until its taint takes that room over: with the cap full by that mark
    /// alone, it is fenced all the same, and another Node is not.
    #[test]
    fn a_node_powered_off_is_fenced_in_the_room_its_power_off_took() {
        let settings = capped(1);
        let c = seen(InstanceState::Stopped);
        let mut powered_off = node(Readiness::Unknown, vec![]);
        powered_off.power.powered_off = Some(crate::core::model::facts::PowerMark {
            at: "2026-12-07T00:00:00Z".into(),
            boot_id: Some("boot-1".into()),
        });
        let other = node(Readiness::Unknown, vec![]);
        let case = |n| Case {
            intent: Intent::Fence,
            node: Some(n),
            confirmation: Some(&c),
            shared_with: &[],
        };
        let known = HashMap::new();
        assert!(cap::holds_room(&powered_off, &known));
        let verdicts = decide_batch(&[case(&powered_off), case(&other)], &settings, (1, &known));
        assert!(
            matches!(
                verdicts[0],
                Verdict::Fence {
                    add_taint: true,
                    ..
                }
            ),
            "{verdicts:?}"
        );
        assert!(
            matches!(
                verdicts[1],
                Verdict::Skip {
                    reason: Skip::CapReached { .. }
                }
            ),
            "{verdicts:?}"
        );
    }

    fn arb_state() -> impl Strategy<Value = InstanceState> {
        prop::sample::select(InstanceState::ALL.to_vec())
    }

    fn arb_confirmation() -> impl Strategy<Value = Option<Confirmation>> {
        prop_oneof![
            Just(None),
            Just(Some(Confirmation::NotFound)),
            Just(Some(Confirmation::LookupFailed { error: "x".into() })),
            arb_state().prop_map(|s| Some(seen(s))),
        ]
    }

    fn arb_node() -> impl Strategy<Value = Option<NodeFacts>> {
        let readiness = prop::sample::select(vec![
            Readiness::Ready,
            Readiness::NotReady,
            Readiness::Unknown,
        ]);
        let taints = prop::sample::select(taint_sets());
        prop::option::of((readiness, taints).prop_map(|(r, t)| node(r, t)))
    }

    fn arb_intent() -> impl Strategy<Value = Intent> {
        prop::sample::select(vec![Intent::Fence, Intent::Check, Intent::Recover])
    }

    proptest! {
        /// No plan holds a taint or a detach unless EC2 confirmed the instance
        /// off and the node is not Ready; the cap is never exceeded; a dry run
        /// never yields an action that is not marked dry.
        #[test]
        fn invariants_hold_for_any_batch(
            cases in prop::collection::vec((arb_intent(), arb_node(), arb_confirmation()), 0..12),
            dry_run in any::<bool>(),
            cap in 0usize..6,
            already in 0usize..6,
        ) {
            let settings = Settings { dry_run, max_out_of_service: cap, fence_hibernated: false, reach: &Reach::EVERYWHERE };
            let batch: Vec<Case<'_>> = cases
                .iter()
                .map(|(intent, node, c)| Case { intent: *intent, node: node.as_ref(), confirmation: c.as_ref() , shared_with: &[]})
                .collect();
            let verdicts = decide_batch(&batch, &settings, (already, &HashMap::new()));
            prop_assert_eq!(verdicts.len(), batch.len());
            let mut new_taints = 0;
            for (case, verdict) in batch.iter().zip(&verdicts) {
                if let Verdict::Fence { add_taint, dry_run: plan_dry } = verdict {
                    prop_assert!(case.confirmation.is_some_and(Confirmation::confirms_off));
                    let node = case.node.expect("fenced without a node");
                    prop_assert_ne!(node.readiness, Readiness::Ready);
                    prop_assert!(matches!(case.intent, Intent::Fence | Intent::Check));
                    if dry_run || case.intent == Intent::Check {
                        prop_assert!(*plan_dry);
                    }
                    // A check takes no room under the cap.
                    if *add_taint && case.intent != Intent::Check {
                        new_taints += 1;
                    }
                }
            }
            prop_assert!(new_taints == 0 || already + new_taints <= cap);
        }
    }
}
