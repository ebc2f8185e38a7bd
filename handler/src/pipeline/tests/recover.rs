//! The recovery check: automatic, with the NoSchedule pair, and manual.

use super::*;

#[tokio::test]
async fn a_fenced_node_back_up_is_recovered_and_its_taint_removed() {
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 1);
    w.back_up();
    w.assert_recovered(&w.recover(&policy(), Intent::Recover).await);
    assert_eq!(
        w.cluster.events(NODE).last(),
        Some(&"OutOfServiceTaintRemoved")
    );
}

/// Issue 15: Rook/Ceph's pair goes on together and comes off together,
/// once the machine EC2 saw stopped runs again.
#[tokio::test]
async fn the_no_schedule_pair_is_applied_and_removed_together() {
    let w = World::stopped();
    w.cluster.boot(NODE, "boot-1");
    let pair = Policy {
        no_schedule_too: true,
        ..policy()
    };
    w.fence(&pair).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 2);
    let mark = w.cluster.facts(NODE).unwrap().fenced.unwrap();
    assert!(mark.no_schedule);
    assert_eq!(mark.boot_id.as_deref(), Some("boot-1"));
    w.back_up();
    // The same boot id: EC2's `stopped` at fencing is the proof.
    w.assert_recovered(&w.recover(&policy(), Intent::Recover).await);
}

/// Issue 15: with manual recovery a node back up stays fenced until an
/// operator confirms it healthy; a confirmation given early waits for the
/// other rules, and ends that fencing once they allow it.
#[tokio::test]
async fn manual_recovery_waits_for_an_operators_confirmation() {
    let manual = Policy {
        recovery: RecoveryPolicy::Manual,
        ..policy()
    };
    let w = World::stopped();
    w.fence(&manual).await.unwrap();
    w.back_up();
    let report = w.recover(&manual, Intent::Recover).await;
    let r = &report.recoveries[0];
    assert_eq!(r.outcome, RecoveryOutcome::Kept, "{report:#?}");
    assert!(
        matches!(r.hold, Some(Hold::AwaitingConfirmation { .. })),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints(NODE), 1);

    w.assert_recovered(&w.recover(&manual, Intent::Confirm).await);
    assert!(w.cluster.events(NODE).contains(&"RecoveryConfirmed"));

    // Confirmed while the instance is still stopped: held by the other
    // rules, then ended by a routine look once they allow it.
    let w = World::stopped();
    w.fence(&manual).await.unwrap();
    let report = w.recover(&manual, Intent::Confirm).await;
    assert!(
        matches!(
            report.recoveries[0].hold,
            Some(Hold::InstanceNotRunning { .. })
        ),
        "{report:#?}"
    );
    assert!(w.cluster.facts(NODE).unwrap().fenced.unwrap().confirmed);
    assert_eq!(w.out_of_service_taints(NODE), 1);
    w.back_up();
    w.assert_recovered(&w.recover(&manual, Intent::Recover).await);
}

/// Issue 33, item 16: `recover --confirm NODE` confirmed whatever fencing
/// was current, not the one the operator looked at. A confirmation that
/// names another fencing (an earlier one, the node fenced anew since)
/// confirms nothing and says so; one that names the node's own ends it.
#[tokio::test]
async fn a_confirmation_of_another_fencing_confirms_nothing() {
    let manual = Policy {
        recovery: RecoveryPolicy::Manual,
        ..policy()
    };
    let w = World::stopped();
    let report = w.fence(&manual).await.unwrap();
    let at = report.results[0]
        .fenced_at
        .clone()
        .expect("check shows the fencing");
    w.back_up();
    let confirm = |fenced_at: &str| Batch {
        fenced_at: Some(fenced_at.to_owned()),
        ..batch(Intent::Confirm, &[instance(1)])
    };
    let earlier = "2020-01-01T00:00:00Z";
    let report = w.run(&manual, confirm(earlier)).await.unwrap();
    let r = &report.recoveries[0];
    assert_eq!(r.outcome, RecoveryOutcome::Kept, "{report:#?}");
    assert!(r.errors[0].contains("another one"), "{report:#?}");
    assert!(report.incomplete());
    assert!(!w.cluster.facts(NODE).unwrap().fenced.unwrap().confirmed);
    assert_eq!(w.out_of_service_taints(NODE), 1);
    w.assert_recovered(&w.run(&manual, confirm(&at)).await.unwrap());
}
