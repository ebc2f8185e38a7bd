//! Another machine that carries the Node's name. A kubelet takes its Node's
//! name from its machine (on EC2 the private DNS name,
//! `ip-10-0-1-23.ec2.internal`, which follows the private address), and a
//! kubelet that registers under the name of a Node that exists adopts that
//! object, whose `providerID` cannot change. The address of a terminated
//! instance goes back to its subnet and may go to a new instance: that
//! instance's kubelet then serves the old Node, which still names the
//! terminated machine. That machine is off for good, and proves nothing of
//! the kubelet, which may hang with the Node's pods running.
//!
//! So before a Node on EC2 is fenced, the machines that carry its name are
//! asked for, in its VPC where that is known (other VPCs reuse the same
//! names); one that may run (any state but stopped and terminated) refuses
//! the fencing. Compute Engine needs no such question: a VM's name is its
//! Node's provider id, which names whichever VM carries it now. A BMC names
//! no machine by a Node's name.
//!
//! A kubelet can also serve a Node under another name than its machine's
//! (`--hostname-override`): no machine then carries the Node's name, but
//! the kubelet writes its own machine's address into the Node's
//! `InternalIP`. So an address the Node reports that its own machine is
//! not described holding is asked about too: a machine that may run and
//! holds it refuses the fencing, unless another Node that is Ready names
//! that machine (its kubelet serves that Node, and an address that went
//! back to the subnet is all the two share). Where a cloud controller
//! writes the Node's addresses from the machine its `providerID` names,
//! the kubelet's own address never shows, and nothing here can see the
//! override. Pure.

use std::net::IpAddr;

use serde::Serialize;

use crate::core::model::facts::{Confirmation, InstanceFacts, NodeFacts, Readiness};
use crate::core::model::instance::{InstanceId, Provider};

/// A machine other than the Node's own that carries its name and may run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Namesake {
    /// The machine.
    pub machine: String,
    /// The state the cloud describes it in.
    pub state: String,
}

/// Whether a Node on `machine` must be held to the machines that carry its
/// name before it is fenced: an EC2 machine.
pub fn must_ask(machine: &InstanceId) -> bool {
    machine.provider() == Provider::Aws
}

/// The VPC to look for the Node's namesakes in: the one the cloud described
/// its machine in, or the cluster's (`CLUSTER_VPC_ID`); `None` looks in
/// every VPC, which may refuse a Node for another VPC's machine of the same
/// name, never fence one whose namesake runs.
pub fn vpc<'a>(answer: Option<&'a Confirmation>, cluster_vpc: Option<&'a str>) -> Option<&'a str> {
    match answer {
        Some(Confirmation::Seen(facts)) => facts.vpc_id.as_deref().or(cluster_vpc),
        _ => cluster_vpc,
    }
}

/// The first of `named` (the machines the cloud found carrying the Node's
/// name) that is not `machine`, the Node's own, and is not off.
pub fn judge(machine: &InstanceId, named: &[InstanceFacts]) -> Option<Namesake> {
    named
        .iter()
        .find(|m| m.id != *machine && !m.state.is_off())
        .map(|m| Namesake {
            machine: m.id.as_str().to_owned(),
            state: m.state.name().to_owned(),
        })
}

/// The addresses of `node` to ask the cloud about: its `InternalIP`s that
/// its own machine (`own`, the cloud's answer about it) is not described
/// holding. A machine not described, or described without addresses (a
/// terminated instance loses them), holds none that is known.
pub fn addresses_to_ask(node: &NodeFacts, own: Option<&Confirmation>) -> Vec<IpAddr> {
    let held: &[IpAddr] = match own {
        Some(Confirmation::Seen(facts)) => &facts.private_ips,
        _ => &[],
    };
    node.internal_ips
        .iter()
        .filter(|ip| !held.contains(ip))
        .copied()
        .collect()
}

/// A machine other than the Node's own that holds one of its addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// The address.
    pub address: IpAddr,
    /// The machine, and its state.
    pub by: Namesake,
}

/// Whether a Node of `nodes` other than `node` that is Ready names
/// `machine`: that machine's kubelet serves that Node, so whatever it
/// shares with `node` (an address given again, a disk already moved) has
/// gone to that Node and does not speak for `node`.
pub fn serves_another_node(machine: &InstanceId, node: &str, nodes: &[NodeFacts]) -> bool {
    nodes.iter().any(|n| {
        n.name != node && n.readiness == Readiness::Ready && n.instance.as_ref() == Some(machine)
    })
}

/// The first of `holding` (the machines the cloud found holding one of
/// `asked`, the Node's addresses its machine does not hold) that is not
/// `machine`, the Node's own, is not off, and that no other Ready Node of
/// `nodes` names.
pub fn judge_addresses(
    (node, machine): (&NodeFacts, &InstanceId),
    asked: &[IpAddr],
    holding: &[InstanceFacts],
    nodes: &[NodeFacts],
) -> Option<Holder> {
    holding
        .iter()
        .filter(|m| {
            m.id != *machine && !m.state.is_off() && !serves_another_node(&m.id, &node.name, nodes)
        })
        .find_map(|m| {
            let address = asked.iter().find(|ip| m.private_ips.contains(ip))?;
            Some(Holder {
                address: *address,
                by: Namesake {
                    machine: m.id.as_str().to_owned(),
                    state: m.state.name().to_owned(),
                },
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::instance::InstanceState;

    fn id(s: &str) -> InstanceId {
        InstanceId::parse(s).expect("a valid id")
    }

    fn machine(s: &str, state: InstanceState, vpc: Option<&str>) -> InstanceFacts {
        InstanceFacts {
            vpc_id: vpc.map(str::to_owned),
            ..InstanceFacts::bare(id(s), state)
        }
    }

    #[test]
    fn another_machine_that_may_run_under_the_name_is_a_namesake() {
        let own = id("i-0000000000000000a");
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::ShuttingDown,
            InstanceState::Hibernated,
            InstanceState::Unknown,
        ] {
            let named = [machine("i-0000000000000000b", state.clone(), None)];
            assert_eq!(
                judge(&own, &named),
                Some(Namesake {
                    machine: "i-0000000000000000b".into(),
                    state: state.name().into(),
                }),
                "{state:?}"
            );
        }
    }

    #[test]
    fn the_nodes_own_machine_and_machines_off_are_none() {
        let own = id("i-0000000000000000a");
        let named = [
            machine("i-0000000000000000a", InstanceState::Running, None),
            machine("i-0000000000000000b", InstanceState::Stopped, None),
            machine("i-0000000000000000c", InstanceState::Terminated, None),
        ];
        assert_eq!(judge(&own, &named), None);
        assert_eq!(judge(&own, &[]), None);
    }

    #[test]
    fn only_ec2_machines_are_asked_about_in_the_vpc_known() {
        assert!(must_ask(&id("i-0000000000000000a")));
        assert!(!must_ask(&id("gce://proj-fencer/us-central1-a/node-1")));
        let seen = Confirmation::Seen(machine(
            "i-0000000000000000a",
            InstanceState::Terminated,
            Some("vpc-own"),
        ));
        assert_eq!(vpc(Some(&seen), Some("vpc-cluster")), Some("vpc-own"));
        let bare = Confirmation::Seen(machine(
            "i-0000000000000000a",
            InstanceState::Terminated,
            None,
        ));
        assert_eq!(vpc(Some(&bare), Some("vpc-cluster")), Some("vpc-cluster"));
        assert_eq!(vpc(Some(&Confirmation::NotFound), None), None);
        assert_eq!(vpc(None, Some("vpc-cluster")), Some("vpc-cluster"));
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    fn holding(s: &str, state: InstanceState, ips: &[&str]) -> InstanceFacts {
        InstanceFacts {
            private_ips: ips.iter().map(|a| ip(a)).collect(),
            ..machine(s, state, None)
        }
    }

    fn node_at(name: &str, on: &str, readiness: Readiness, ips: &[&str]) -> NodeFacts {
        NodeFacts {
            instance: Some(id(on)),
            internal_ips: ips.iter().map(|a| ip(a)).collect(),
            ..NodeFacts::bare(name, readiness)
        }
    }

    #[test]
    fn only_the_addresses_the_nodes_machine_does_not_hold_are_asked_about() {
        let node = node_at(
            "n",
            "i-0000000000000000a",
            Readiness::Unknown,
            &["10.0.0.1", "10.0.0.2"],
        );
        let own = |ips: &[&str]| {
            Confirmation::Seen(holding("i-0000000000000000a", InstanceState::Stopped, ips))
        };
        let asked = |c: Option<&Confirmation>| addresses_to_ask(&node, c);
        assert_eq!(
            asked(Some(&own(&["10.0.0.1", "10.0.0.2"]))),
            Vec::<IpAddr>::new()
        );
        assert_eq!(asked(Some(&own(&["10.0.0.1"]))), vec![ip("10.0.0.2")]);
        let all = vec![ip("10.0.0.1"), ip("10.0.0.2")];
        assert_eq!(asked(Some(&own(&[]))), all, "a terminated machine's");
        assert_eq!(asked(Some(&Confirmation::NotFound)), all);
        assert_eq!(asked(None), all);
    }

    #[test]
    fn a_machine_that_may_run_with_the_nodes_address_holds_it() {
        let own = id("i-0000000000000000a");
        let node = node_at("n", own.as_str(), Readiness::Unknown, &["10.0.0.7"]);
        let asked = [ip("10.0.0.7")];
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::Unknown,
        ] {
            let b = holding("i-0000000000000000b", state.clone(), &["10.0.0.7"]);
            assert_eq!(
                judge_addresses((&node, &own), &asked, &[b], &[]),
                Some(Holder {
                    address: ip("10.0.0.7"),
                    by: Namesake {
                        machine: "i-0000000000000000b".into(),
                        state: state.name().into(),
                    },
                }),
                "{state:?}"
            );
        }
    }

    #[test]
    fn the_own_machine_machines_off_and_other_addresses_hold_none() {
        let own = id("i-0000000000000000a");
        let node = node_at("n", own.as_str(), Readiness::Unknown, &["10.0.0.7"]);
        let asked = [ip("10.0.0.7")];
        let none = [
            holding(own.as_str(), InstanceState::Running, &["10.0.0.7"]),
            holding("i-0000000000000000b", InstanceState::Stopped, &["10.0.0.7"]),
            holding(
                "i-0000000000000000c",
                InstanceState::Terminated,
                &["10.0.0.7"],
            ),
            holding("i-0000000000000000d", InstanceState::Running, &["10.0.0.8"]),
        ];
        assert_eq!(judge_addresses((&node, &own), &asked, &none, &[]), None);
    }

    /// An address the subnet gave again to a machine whose kubelet serves
    /// a Node of its own, Ready, is all the two share.
    #[test]
    fn a_holder_that_a_ready_node_names_serves_that_node() {
        let own = id("i-0000000000000000a");
        let node = node_at("n", own.as_str(), Readiness::Unknown, &["10.0.0.7"]);
        let asked = [ip("10.0.0.7")];
        let b = [holding(
            "i-0000000000000000b",
            InstanceState::Running,
            &["10.0.0.7"],
        )];
        let other = |r| node_at("other", "i-0000000000000000b", r, &["10.0.0.7"]);
        let judged = |nodes: &[NodeFacts]| judge_addresses((&node, &own), &asked, &b, nodes);
        assert_eq!(judged(&[other(Readiness::Ready)]), None);
        assert!(judged(&[other(Readiness::Unknown)]).is_some());
        assert!(judged(&[other(Readiness::NotReady)]).is_some());
        let itself = node_at("n", "i-0000000000000000b", Readiness::Ready, &[]);
        assert!(judged(&[itself]).is_some(), "the Node itself is no other");
    }
}
