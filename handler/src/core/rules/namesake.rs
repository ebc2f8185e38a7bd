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
//! no machine by a Node's name. Pure.

use serde::Serialize;

use crate::core::model::facts::{Confirmation, InstanceFacts};
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
}
