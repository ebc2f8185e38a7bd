//! Issue 37, neighbours: a Node another writer tainted out of service
//! (aws-node-termination-handler, medik8s FAR, a person) is freed by
//! node-fencer when its machine is confirmed off, without node-fencer
//! claiming the taint or ever removing it; on a machine that runs,
//! node-fencer touches nothing and says so. And the actors that delete or
//! replace Nodes and machines while node-fencer works (Karpenter's
//! interruption handling, EKS node auto repair): each run converges with
//! nothing stuck.

use super::*;

/// The seed Node, tainted out of service by another writer, its pod there.
fn tainted_by_another(state: InstanceState) -> World {
    let w = World::new().with_node(NODE, 1, state, "Unknown");
    w.cluster.taint_by_hand(NODE);
    w.cluster.pod(NODE, "db-0");
    w
}

/// Machine off: the volume force-detached and the pod deleted, the other
/// writer's taint kept as it is and no mark of node-fencer's written; once
/// the machine is back, node-fencer's recovery leaves that taint to its
/// writer.
#[tokio::test]
async fn a_node_another_writer_tainted_is_freed_without_claiming_the_taint() {
    let w = tainted_by_another(InstanceState::Stopped);
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    // Out of service already, by another hand: what is left is done.
    assert_eq!(r.outcome, Outcome::AlreadyFenced, "{report:#?}");
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available),
        "force-detached"
    );
    assert_eq!(w.cluster.pods(NODE), 0, "the pod deleted");
    let taints = w.cluster.taints(NODE);
    let values: Vec<Option<&str>> = taints
        .iter()
        .filter(|t| t.key == OUT_OF_SERVICE_KEY)
        .map(|t| t.value.as_deref())
        .collect();
    assert_eq!(values, [Some("by-hand")], "the other writer's taint, alone");
    assert!(w.cluster.facts(NODE).unwrap().fenced.is_none(), "no mark");
    assert!(
        !w.calls.log().iter().any(|c| c.starts_with("TaintNode")),
        "{:?}",
        w.calls.log()
    );

    w.back_up();
    let report = w.recover(&policy(), Intent::Recover).await;
    let r = &report.recoveries[0];
    assert_eq!(
        r.outcome,
        RecoveryOutcome::Kept,
        "not ours to end: {report:#?}"
    );
    assert_eq!(r.hold, Some(Hold::NotFenced));
    assert_eq!(w.out_of_service_taints(NODE), 1, "left to its writer");
}

/// Machine running: nothing written, and a Warning Event that names the
/// other writer's taint; on its way off (a drain's taint before the stop),
/// nothing to say.
#[tokio::test]
async fn another_writers_taint_on_a_running_machine_is_reported_and_left() {
    let w = tainted_by_another(InstanceState::Running);
    let report = w.fence(&policy()).await.unwrap();
    assert!(
        matches!(report.results[0].skip, Some(Skip::InstanceNotOff { .. })),
        "{report:#?}"
    );
    assert_eq!(w.changes(), Vec::<String>::new());
    assert_eq!(w.cluster.events(NODE), ["OutOfServiceTaintOnLiveMachine"]);
    // The same taint met again: its Warning is there already.
    w.fence(&policy()).await.unwrap();
    assert_eq!(w.cluster.events(NODE), ["OutOfServiceTaintOnLiveMachine"]);
    assert_eq!(w.cluster.pods(NODE), 1);
    assert_eq!(w.cloud.volume_state(&volume(1)), Some(VolumeState::InUse));

    let w = tainted_by_another(InstanceState::Stopping);
    w.fence(&policy()).await.unwrap();
    assert!(w.cluster.events(NODE).is_empty());
}

/// The Node is deleted between the decision and the taint (Karpenter, EKS
/// node auto repair): nothing is written, nothing detached, nothing left
/// for a retry; the event again finds no Node and asks nothing.
#[tokio::test]
async fn a_node_deleted_while_it_is_fenced_converges_with_nothing_stuck() {
    let w = World::stopped();
    w.cluster.gone_before_taint(NODE);
    let report = w.fence(&policy()).await.unwrap();
    assert!(!report.incomplete(), "{report:#?}");
    assert_ne!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let log = w.calls.log();
    assert!(
        !log.iter().any(|c| c.starts_with("DetachVolume")),
        "no Node, no fencing to detach for: {log:?}"
    );
    let again = w.fence(&policy()).await.unwrap();
    assert_eq!(
        again.results[0].skip,
        Some(Skip::NotInCluster),
        "{again:#?}"
    );
    assert!(!again.incomplete());
}

/// Another actor terminates the stopped instance while node-fencer fences
/// it: terminated is as off as stopped, so the fencing goes on and ends.
#[tokio::test]
async fn an_instance_terminated_by_another_actor_midway_is_still_fenced() {
    let w = World::stopped();
    w.cloud
        .on_describe(2, &instance(1), InstanceState::Terminated);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete());
    assert_eq!(w.out_of_service_taints(NODE), 1);
}
