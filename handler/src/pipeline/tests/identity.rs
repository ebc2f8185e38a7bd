//! Issue 45: no fence without proof of the machine's identity at every
//! act. Every look after the first is held to the machine first judged (a
//! VM recreated under its name, a Node remapped to another BMC machine,
//! mid-invocation, gets neither a power-off nor a fencing); a UUID that
//! names no one machine (a placeholder, or one two Nodes report) ties a
//! Node to no machine; a power-off whose Lease ran out takes its mark back;
//! a machine found off is reported so.

use super::*;
use crate::core::model::redfish::SystemUuid;
use crate::core::rules::control::LeaseTiming;

/// The BMC machine `n` of an inventory.
fn machine(n: u8) -> InstanceId {
    InstanceId::parse(&format!("redfish://rack1-m{n}")).unwrap()
}

/// The UUID of BMC machine `n`.
fn uuid(n: u8) -> String {
    format!("27946b59-9e44-4fa7-8e91-f3527a1ef0{n:02x}")
}

impl World {
    /// Node `name` on BMC machine `m` (placed by the inventory), `Ready` as
    /// given, its kubelet reporting `node_uuid`; the machine in `state`,
    /// serving `machine_uuid`.
    fn on_bmc(
        self,
        name: &str,
        m: u8,
        (state, ready): (InstanceState, &str),
        (node_uuid, machine_uuid): (&str, &str),
    ) -> Self {
        self.bmc_machine(m, state, machine_uuid);
        self.cluster.node(name, &machine(m), ready);
        self.cluster.place(name, &machine(m));
        self.cluster.system_uuid(name, node_uuid);
        self.cluster.boot(name, &format!("boot-{name}"));
        self
    }

    /// BMC machine `m` in `state`, serving `uuid`.
    fn bmc_machine(&self, m: u8, state: InstanceState, uuid: &str) {
        self.cloud.instance(&machine(m), state);
        self.cloud.describe_as(&machine(m), |f| {
            f.root_device_name = None;
            f.identity.system_uuid = SystemUuid::parse(Some(uuid));
        });
    }

    /// A hung Node on BMC machine 1 and two healthy ones on 2 and 3.
    fn hung_on_bmcs() -> Self {
        let running = InstanceState::Running;
        Self::new()
            .on_bmc(NODE, 1, (running.clone(), "Unknown"), (&uuid(1), &uuid(1)))
            .on_bmc(
                "healthy-2",
                2,
                (running.clone(), "True"),
                (&uuid(2), &uuid(2)),
            )
            .on_bmc("healthy-3", 3, (running, "True"), (&uuid(3), &uuid(3)))
    }
}

/// Item 1, Compute Engine: the hung node's VM (id 111) is judged; while
/// the invocation waits for the Lease, the managed instance group
/// recreates it under the same name (id 222, RUNNING). The look under the
/// Lease is held to 111: the new VM is never stopped, and nothing is
/// fenced on it.
#[tokio::test]
async fn a_vm_recreated_while_waiting_for_the_lease_is_neither_stopped_nor_fenced() {
    let w = World::hung_on(On::Gce);
    w.cloud
        .describe_as(&w.instance(1), |f| f.identity.uid = Some(111));
    w.cloud.recreated_on_describe(2, &w.instance(1), 222);
    w.cluster.lease_held_for(Duration::from_millis(20));
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(w.stops(), 0, "{:?}", w.calls.log());
    assert!(w.cloud.power_offs().is_empty());
    assert!(
        matches!(
            World::power_report(&report).refusal,
            Some(Refusal::MachineReplaced { .. })
        ),
        "{report:#?}"
    );
    assert_eq!(
        w.cloud.instance_state(&w.instance(1)),
        Some(InstanceState::Running)
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.called("MarkPoweredOff"), "{:?}", w.calls.log());
    assert!(!w.called("DetachVolume"));
    assert_eq!(w.cluster.events(NODE), ["PowerOffRefused"]);
}

/// Item 1, on-premises: while the invocation waits for the Lease, the
/// Node's inventory label moves to another machine (running, its own
/// UUID). That machine was never judged: no ForceOff, no fencing.
#[tokio::test]
async fn a_node_remapped_while_waiting_for_the_lease_gets_no_power_off() {
    let w = World::hung_on_bmcs();
    w.bmc_machine(4, InstanceState::Running, &uuid(4));
    w.cluster.place_on_lease(NODE, &machine(4));
    w.cluster.lease_held_for(Duration::from_millis(20));
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(w.stops(), 0, "{:?}", w.calls.log());
    assert!(
        matches!(
            World::power_report(&report).refusal,
            Some(Refusal::MachineReplaced { .. })
        ),
        "{report:#?}"
    );
    for m in [1, 4] {
        assert_eq!(
            w.cloud.instance_state(&machine(m)),
            Some(InstanceState::Running)
        );
    }
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.called("MarkPoweredOff"));
}

/// The same hung Node, remapped to no other machine, is powered off and
/// fenced: the hold is on the machine, not on the BMC path.
#[tokio::test]
async fn a_hung_node_on_its_own_bmc_machine_is_powered_off_then_fenced() {
    let w = World::hung_on_bmcs();
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.cloud.power_offs().len(), 1);
    assert_eq!(w.out_of_service_taints(NODE), 1);
}

/// Item 2: a Node whose machine is off, tied to it by a UUID that is no
/// identity, is not fenced, and a Warning names why. Either another Node
/// reports the same UUID (cloned firmware; here its twin's machine runs,
/// and the inventory swapped the two), or the UUID is a BIOS placeholder.
#[tokio::test]
async fn a_uuid_that_names_no_one_machine_ties_a_node_to_none() {
    let stopped = InstanceState::Stopped;
    let running = InstanceState::Running;
    const PLACEHOLDER: &str = "03000200-0400-0500-0006-000700080009";
    for (uuid_of_node, twin) in [(uuid(9), true), (PLACEHOLDER.to_owned(), false)] {
        let mut w = World::new()
            .on_bmc(
                NODE,
                2,
                (stopped.clone(), "Unknown"),
                (&uuid_of_node, &uuid_of_node),
            )
            .on_bmc(
                "healthy-3",
                3,
                (running.clone(), "True"),
                (&uuid(3), &uuid(3)),
            );
        if twin {
            w = w.on_bmc(
                "twin",
                1,
                (running.clone(), "True"),
                (&uuid_of_node, &uuid_of_node),
            );
        }
        let report = w.fence_node().await;
        assert_ne!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
        assert_eq!(
            report.results[0].skip,
            Some(Skip::InstanceNotFound),
            "{report:#?}"
        );
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert_eq!(
            w.cluster.events(NODE),
            ["UnidentifiedMachine"],
            "twin {twin}"
        );
        let note = w.cluster.event_notes(NODE).join("\n");
        let why = if twin { "another Node" } else { "placeholder" };
        assert!(note.contains(why), "{note}");
        assert!(w.changes().is_empty(), "{:?}", w.changes());
    }
}

/// The same Node with a UUID of its own is fenced.
#[tokio::test]
async fn a_uuid_of_its_own_ties_a_node_to_its_machine() {
    let w = World::new()
        .on_bmc(
            NODE,
            2,
            (InstanceState::Stopped, "Unknown"),
            (&uuid(2), &uuid(2)),
        )
        .on_bmc(
            "twin",
            1,
            (InstanceState::Running, "True"),
            (&uuid(1), &uuid(1)),
        );
    let report = w.fence_node().await;
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(
        w.cluster
            .events(NODE)
            .iter()
            .all(|e| *e != "UnidentifiedMachine")
    );
}

/// Item 4: the Lease runs out between the power-off mark and the stop.
/// Nothing is sent, and the mark is taken back: the retry powers the
/// machine off, instead of refusing it as powered off before.
#[tokio::test]
async fn a_lease_lost_after_the_mark_takes_the_mark_back() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cluster.mark_takes(Duration::from_millis(120));
        let short = Policy {
            lease: LeaseTiming {
                renew_every: Duration::from_secs(60),
                valid_for: Duration::from_millis(60),
            },
            ..active()
        };
        let report = w.run(&short, power_off()).await.unwrap();
        assert_eq!(w.stops(), 0, "{:?}", w.calls.log());
        assert_eq!(
            World::power_report(&report).outcome,
            PowerOutcome::Failed,
            "{report:#?}"
        );
        assert!(report.incomplete(), "{report:#?}");
        assert!(
            w.cluster.facts(NODE).unwrap().power.powered_off.is_none(),
            "the mark of a power-off never sent is taken back"
        );

        w.cluster.mark_takes(Duration::ZERO);
        let retry = w.run(&active(), power_off()).await.unwrap();
        assert_eq!(w.stops(), 1, "{retry:#?}");
        assert_eq!(retry.results[0].outcome, Outcome::Fenced, "{retry:#?}");
    }
}

/// Item 8: a machine that turned off on its own between the look under
/// the Lease and the power-off is reported found off, not powered off;
/// the fencing follows as for any stopped machine.
#[tokio::test]
async fn a_machine_found_off_is_reported_so_and_fenced() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cloud.off_before_stop(&w.instance(1));
        let report = w.run(&active(), power_off()).await.unwrap();
        assert_eq!(
            World::power_report(&report).outcome,
            PowerOutcome::FoundOff,
            "{report:#?}"
        );
        assert!(w.cloud.power_offs().is_empty(), "nothing sent");
        assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
        let events = w.cluster.events(NODE);
        assert!(events.contains(&"MachineFoundOff"), "{events:?}");
        assert!(!events.contains(&"PoweredOff"), "{events:?}");
    }
}

/// Issue 58, item 11: a machine deleted between the look under the Lease
/// and the power-off is reported deleted, not found off, and its power-off
/// mark is taken back (nothing of node-fencer's was powered off); the
/// fencing follows as for any deleted machine.
#[tokio::test]
async fn a_machine_deleted_before_its_power_off_is_reported_so_and_its_mark_taken_back() {
    let w = World::hung_on(On::Gce);
    w.cloud.deleted_before_stop(&w.instance(1));
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(
        World::power_report(&report).outcome,
        PowerOutcome::Deleted,
        "{report:#?}"
    );
    assert!(w.cloud.power_offs().is_empty(), "nothing sent");
    assert!(
        w.called(&format!("ClearPowerMark {NODE}")),
        "{:?}",
        w.writes()
    );
    assert!(w.cluster.facts(NODE).unwrap().power.powered_off.is_none());
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let notes = w.cluster.event_notes(NODE);
    assert!(notes.iter().any(|n| n.contains("was deleted")), "{notes:?}");
}

impl World {
    /// The seed node named by an operator's `fence NODE`.
    async fn fence_node(&self) -> Report {
        let fence = Batch {
            suspects: vec![Suspect {
                target: NodeRef::Name(crate::core::model::names::NodeName::parse(NODE).unwrap()),
                intent: Intent::Fence,
                origin: Origin::Direct,
            }],
            ..Batch::default()
        };
        self.run(&policy(), fence).await.unwrap()
    }
}

/// Issue 58, item 3: the Node deleted and registered again under its name
/// (a new instance taking the IP-based name) between the decision and the
/// taint is another Node object: neither the taint nor a detach is written
/// for it, in either fencing mode.
#[tokio::test]
async fn a_node_registered_again_before_the_taint_gets_neither_taint_nor_detach() {
    for mode in [ModeSetting::Taint, ModeSetting::Legacy] {
        let w = World::stopped();
        w.cluster.reregistered_before_taint(NODE);
        let fencing = Policy { mode, ..policy() };
        let report = w.fence(&fencing).await.unwrap();
        assert_eq!(
            report.results[0].skip,
            Some(Skip::NotInCluster),
            "{mode:?}: {report:#?}"
        );
        assert_eq!(w.out_of_service_taints(NODE), 0, "{mode:?}");
        assert!(w.cluster.facts(NODE).unwrap().fenced.is_none(), "{mode:?}");
        assert!(!w.called("DetachVolume"), "{mode:?}: {:?}", w.writes());
        assert!(!w.called("DeletePod"), "{mode:?}: {:?}", w.writes());
    }
}

/// Issue 58, item 3: pods are bound by the Node's name. A Node registered
/// again under the name while the fenced Node's pods are listed holds pods
/// of a live machine: none is deleted, and the run says why.
#[tokio::test]
async fn a_node_registered_again_while_its_pods_are_listed_keeps_its_pods() {
    for mode in [ModeSetting::Taint, ModeSetting::Legacy] {
        let w = World::stopped();
        w.cluster.pod(NODE, "db-0");
        // The first list plans the fencing; the second comes at act time.
        w.cluster.reregistered_listing_pods(NODE, 2);
        let report = w.fence(&Policy { mode, ..policy() }).await.unwrap();
        assert!(!w.called("DeletePod"), "{mode:?}: {:?}", w.writes());
        assert_eq!(w.cluster.pods(NODE), 1, "{mode:?}");
        let errors = format!("{:?}", report.results[0].errors);
        assert!(errors.contains("registered again"), "{mode:?}: {report:#?}");
    }
}

/// A Node whose kubelet reports it Ready again while its pods are listed
/// (a kubelet on another machine adopting the Node, as the simulator found
/// with seed 3415 and its stale-Node moves; or this one back) runs those
/// pods: none is deleted, and the run says why.
#[tokio::test]
async fn a_node_ready_again_while_its_pods_are_listed_keeps_its_pods() {
    let w = World::stopped();
    w.cluster.pod(NODE, "db-0");
    // The first list plans the fencing; the second comes at act time.
    w.cluster.ready_listing_pods(NODE, 2);
    let report = w.fence(&policy()).await.unwrap();
    assert!(!w.called("DeletePod"), "{:?}", w.writes());
    assert_eq!(w.cluster.pods(NODE), 1);
    let errors = format!("{:?}", report.results[0].errors);
    assert!(errors.contains("reports Ready again"), "{report:#?}");
}
