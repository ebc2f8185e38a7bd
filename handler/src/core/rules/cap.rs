//! What counts against the cap on out-of-service Nodes. A Node whose machine
//! is terminated (or, fenced by node-fencer, gone from EC2) can never come back: its pods moved, and
//! it waits only for its Node object to be deleted, which no cloud
//! controller does on clusters without one. Counting it would let dead Nodes
//! fill the cap for ever and refuse every later fencing.

use std::collections::HashMap;

use crate::core::model::facts::{Confirmation, NodeFacts, Readiness};
use crate::core::model::instance::{InstanceId, InstanceState};

/// The machine an out-of-service Node stands for: the one node-fencer
/// fenced, else the Node's own.
fn machine(node: &NodeFacts) -> Option<&InstanceId> {
    node.fenced
        .as_ref()
        .and_then(|m| m.instance.as_ref())
        .or(node.instance.as_ref())
}

/// True when the Node's machine is known to be dead for good: node-fencer
/// recorded it `terminated` when it fenced it, or EC2 says so in this
/// invocation, or EC2 no longer knows the machine node-fencer fenced (EC2
/// forgets terminated instances after a while; node-fencer saw this one in
/// this account and region). An instance EC2 does not know that node-fencer
/// never saw proves nothing (another account or region): it counts.
fn dead(node: &NodeFacts, known: &HashMap<InstanceId, Confirmation>) -> bool {
    let mark = node.fenced.as_ref();
    let fenced_here = mark.is_some_and(|m| m.instance.is_some());
    match machine(node).and_then(|id| known.get(id)) {
        // A machine seen again under the name (a managed instance group
        // creates a deleted VM again) is not dead, whatever the mark says.
        Some(Confirmation::Seen(f)) => f.state == InstanceState::Terminated,
        Some(Confirmation::NotFound) => fenced_here,
        Some(Confirmation::LookupFailed { .. }) | None => {
            // Recorded terminated at fencing: dead, unless a kubelet reports
            // Ready on the Node again, which only a new machine under its
            // name can do; that one counts until the recovery ends the
            // fencing.
            mark.is_some_and(|m| m.state == Some(InstanceState::Terminated))
                && node.readiness != Readiness::Ready
        }
    }
}

/// True when the Node takes room under the cap: out of service, or
/// powered off by node-fencer and not fenced yet (a power-off in flight),
/// and not known dead. A lookup that failed proves nothing: the Node counts.
pub fn counts(node: &NodeFacts, known: &HashMap<InstanceId, Confirmation>) -> bool {
    let in_flight = node.power_off_in_flight() && !never_took_effect(node, known);
    (node.is_out_of_service() || in_flight) && !dead(node, known)
}

/// True for a power-off mark on a Node that reports Ready again on the
/// boot the mark recorded, whose machine the cloud reports running and
/// started before the mark: it has not been off since, so the power-off
/// never took effect (a process that died between the mark and the stop)
/// and takes no room. Without the cloud's record of the last start, it
/// counts.
fn never_took_effect(node: &NodeFacts, known: &HashMap<InstanceId, Confirmation>) -> bool {
    let machine = node.instance.as_ref().and_then(|id| known.get(id));
    node.readiness == Readiness::Ready && node.running_since_before_power_off(machine).is_some()
}

/// True when the Node takes room under the cap by its own power-off in
/// flight: its taint takes that room over, and needs no more. Counting it
/// again would refuse the fencing of every Node node-fencer powered off
/// while the cap was one short of full, that Node's own room taken by its
/// mark, and leave its machine off and its volumes held for good.
pub fn holds_room(node: &NodeFacts, known: &HashMap<InstanceId, Confirmation>) -> bool {
    node.power_off_in_flight() && counts(node, known)
}

/// How many Nodes take room under the cap.
pub fn taken(nodes: &[NodeFacts], known: &HashMap<InstanceId, Confirmation>) -> usize {
    nodes.iter().filter(|n| counts(n, known)).count()
}

/// The machines of the Nodes that take room, not asked about yet in this
/// invocation: asked only when the cap would refuse, so a cluster under its
/// cap costs no extra call.
pub fn worth_asking(
    nodes: &[NodeFacts],
    known: &HashMap<InstanceId, Confirmation>,
) -> Vec<InstanceId> {
    let mut ids: Vec<InstanceId> = nodes
        .iter()
        .filter(|n| counts(n, known))
        .filter_map(machine)
        .filter(|id| !known.contains_key(*id))
        .cloned()
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::{
        FenceMark, FenceMode, InstanceFacts, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, TaintFacts,
    };

    fn id(n: u8) -> InstanceId {
        InstanceId::parse(&format!("i-0123456789abcde{n:02x}")).unwrap()
    }

    /// A tainted Node on instance `n`; `mark` is the state node-fencer recorded.
    fn out(n: u8, mark: Option<InstanceState>) -> NodeFacts {
        NodeFacts {
            seen_off: None,
            version: None,
            labels: Default::default(),
            uid: None,
            attached: None,
            machine: Default::default(),
            power: Default::default(),
            name: format!("node-{n}"),
            instance: Some(id(n)),
            readiness: Readiness::Unknown,
            internal_ips: vec![],
            host_names: vec![],
            taints: vec![TaintFacts {
                key: OUT_OF_SERVICE_KEY.into(),
                value: Some("nodeshutdown".into()),
                effect: OUT_OF_SERVICE_EFFECT.into(),
            }],
            ready_since: None,
            fenced: mark.map(|state| FenceMark {
                no_schedule: false,
                boot_id: None,
                confirmed: false,
                mode: FenceMode::Taint,
                instance: Some(id(n)),
                state: Some(state),
                volumes: vec![],
                at: "2026-11-23T10:00:00Z".into(),
                correlation_id: None,
            }),
        }
    }

    fn seen(n: u8, state: InstanceState) -> (InstanceId, Confirmation) {
        (id(n), Confirmation::Seen(InstanceFacts::bare(id(n), state)))
    }

    #[test]
    fn only_nodes_whose_machine_may_come_back_take_room() {
        let nodes = [
            out(1, Some(InstanceState::Stopped)),
            out(2, Some(InstanceState::Terminated)),
            out(3, Some(InstanceState::Stopped)),
            out(4, None),
            out(5, Some(InstanceState::Stopped)),
            out(6, Some(InstanceState::Stopped)),
            out(7, Some(InstanceState::Stopped)),
        ];
        let nothing = HashMap::new();
        // Recorded terminated at fencing time: dead without asking.
        assert_eq!(taken(&nodes, &nothing), 6);
        assert_eq!(
            worth_asking(&nodes, &nothing),
            [id(1), id(3), id(4), id(5), id(6), id(7)]
        );
        let known: HashMap<_, _> = [
            seen(1, InstanceState::Stopped),
            seen(3, InstanceState::Terminated),
            (id(4), Confirmation::NotFound),
            (
                id(5),
                Confirmation::LookupFailed {
                    error: "throttled".into(),
                },
            ),
            (id(7), Confirmation::NotFound),
        ]
        .into_iter()
        .collect();
        // Stopped may start again; a failed lookup proves nothing; an
        // instance EC2 does not know proves nothing unless node-fencer
        // fenced it (7: gone since), not when someone else tainted it (4).
        assert_eq!(taken(&nodes, &known), 4);
        assert_eq!(worth_asking(&nodes, &known), [id(6)]);
        // A Node that is not out of service never counts.
        let mut ready = out(8, None);
        ready.taints.clear();
        assert!(!counts(&ready, &nothing));
    }

    /// Issue 33, item 17: a VM deleted at fencing is recorded terminated and
    /// takes no room; a managed instance group creates it again under the
    /// same name, and once a kubelet reports Ready on the Node again (or the
    /// cloud shows the name running) it takes room until its recovery.
    #[test]
    fn a_machine_created_again_under_a_terminated_nodes_name_takes_room() {
        let mut n = out(1, Some(InstanceState::Terminated));
        assert!(!counts(&n, &HashMap::new()));
        n.readiness = Readiness::Ready;
        assert!(counts(&n, &HashMap::new()), "a kubelet reports on it again");
        n.readiness = Readiness::Unknown;
        let running = Confirmation::Seen(InstanceFacts::bare(id(1), InstanceState::Running));
        assert!(counts(&n, &HashMap::from([(id(1), running)])));
    }

    /// Issue 33, item 10: a power-off in flight takes room in every count,
    /// the taint's included.
    #[test]
    fn a_power_off_in_flight_takes_room() {
        let mut n = NodeFacts::bare("n1", Readiness::Unknown);
        n.instance = Some(id(1));
        n.power.boot_id = Some("boot-1".into());
        assert!(!counts(&n, &HashMap::new()));
        n.power.powered_off = Some(crate::core::model::facts::PowerMark {
            at: "2026-11-26T10:00:00Z".into(),
            boot_id: Some("boot-1".into()),
        });
        assert!(counts(&n, &HashMap::new()));
        // Booted since: the power-off is over.
        n.power.boot_id = Some("boot-2".into());
        assert!(!counts(&n, &HashMap::new()));
    }

    /// Issue 58, item 7: a power-off mark on a Node Ready again on the boot
    /// it recorded, whose machine runs and started before the mark, never
    /// took effect and takes no room; without the cloud's record of the
    /// start, or on a Node still dark, it counts.
    #[test]
    fn a_power_off_that_never_took_effect_takes_no_room() {
        let mut n = NodeFacts::bare("n1", Readiness::Ready);
        n.instance = Some(id(1));
        n.power.boot_id = Some("boot-1".into());
        n.power.powered_off = Some(crate::core::model::facts::PowerMark {
            at: "2026-11-26T10:00:00Z".into(),
            boot_id: Some("boot-1".into()),
        });
        let marked = crate::core::model::values::unix_seconds("2026-11-26T10:00:00Z").unwrap();
        let machine = |started_at: Option<i64>| {
            let mut facts = InstanceFacts::bare(id(1), InstanceState::Running);
            facts.started_at = started_at;
            HashMap::from([(id(1), Confirmation::Seen(facts))])
        };
        assert!(!counts(&n, &machine(Some(marked - 600))));
        assert!(counts(&n, &machine(Some(marked + 60))), "started since");
        assert!(counts(&n, &machine(None)), "no start recorded");
        assert!(counts(&n, &HashMap::new()), "not asked");
        n.readiness = Readiness::Unknown;
        assert!(counts(&n, &machine(Some(marked - 600))), "still dark");
    }
}
