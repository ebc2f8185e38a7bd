//! Admission: the second look, the Lease, the kill switch after a wait, the taint.

use super::*;

#[tokio::test]
async fn an_instance_started_before_the_second_look_is_not_fenced() {
    let w = World::stopped();
    w.cloud.on_describe(2, &instance(1), InstanceState::Pending);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(
        report.results[0].skip,
        Some(Skip::InstanceNotOff {
            state: InstanceState::Pending
        })
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(
        !w.calls
            .log()
            .iter()
            .any(|c| c.starts_with("TaintNode") || c.starts_with("DetachVolume"))
    );
}

#[tokio::test]
async fn a_node_turned_ready_before_the_taint_is_left_alone() {
    let w = World::stopped();
    w.cluster.ready_before_taint(NODE);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));
}

#[tokio::test]
async fn a_dry_run_or_the_kill_switch_plans_and_writes_nothing() {
    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    let cases = [
        (dry, KillSwitch::Off),
        (policy(), KillSwitch::On),
        (policy(), KillSwitch::Unreadable("maybe".into())),
    ];
    for (p, switch) in cases {
        let w = World::stopped();
        w.cluster.set_kill_switch(switch.clone());
        let report = w.fence(&p).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Planned, "{switch:?}");
        assert_eq!(
            report.results[0].volumes[0].outcome,
            VolumeOutcome::WouldDetach
        );
        assert!(report.dry_run);
        assert!(w.writes().is_empty(), "{switch:?}: {:?}", w.writes());
    }
}

/// Issue 12, item 11: the kill switch is read again after every wait, before
/// the first write after it.
#[tokio::test]
async fn a_kill_switch_turned_on_during_a_wait_stops_what_comes_after_it() {
    // While the second confirmation waits, or another invocation holds the Lease.
    let delayed = Policy {
        confirm_again_after: Duration::from_millis(1),
        ..policy()
    };
    for (p, lease_held) in [(delayed, false), (policy(), true)] {
        let w = World::stopped();
        w.cluster.kill_switch_from_read(2, KillSwitch::On);
        if lease_held {
            w.cluster.lease_held_once();
        }
        let report = w.fence(&p).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Planned, "{report:#?}");
        assert!(report.kill_switch && report.dry_run);
        let log = w.calls.log();
        assert_eq!(log.iter().filter(|c| *c == "GetKillSwitch").count(), 2);
        for write in ["TaintNode", "DetachVolume", "CreateEvent"] {
            assert!(!log.iter().any(|c| c.starts_with(write)), "{log:?}");
        }
        assert!(w.cluster.lease().is_none(), "the Lease is let go");
    }

    // The second read fails: that counts as on, and the invocation is retried.
    let baseline = World::stopped();
    let delayed = Policy {
        confirm_again_after: Duration::from_millis(1),
        ..policy()
    };
    baseline.fence(&delayed).await.unwrap();
    let second_read = baseline
        .calls
        .log()
        .iter()
        .enumerate()
        .filter(|(_, c)| *c == "GetKillSwitch")
        .nth(1)
        .map(|(k, _)| k);
    let w = World::stopped();
    w.calls.fail_at(second_read);
    let report = w.fence(&delayed).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Planned, "{report:#?}");
    assert!(report.incomplete(), "an unreadable switch is retried");
    assert!(!w.calls.log().iter().any(|c| c.starts_with("TaintNode")));

    // While a requested recovery waits out the settle delay.
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    w.cloud.instance(&instance(1), InstanceState::Running);
    w.cluster.set_ready(NODE, "True");
    w.cluster.remove_attachment(&volume(1));
    w.cluster.kill_switch_from_read(2, KillSwitch::On);
    let settle = Policy {
        recovery_settle: Duration::from_secs(1),
        ..policy()
    };
    let report = w
        .run(&settle, batch(Intent::Recover, &[instance(1)]))
        .await
        .unwrap();
    assert_eq!(
        report.recoveries[0].outcome,
        RecoveryOutcome::Planned,
        "{report:#?}"
    );
    assert!(report.kill_switch);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("UntaintNode")));
    assert_eq!(w.out_of_service_taints(NODE), 1);
}

/// Issue 12, item 6: the holder renews the Lease while it works, so a
/// holder slowed past the time one renewal allows (EC2 throttled under the
/// Lease) still writes its taint; a holder whose Lease was taken over meanwhile
/// writes none, and the invocation is retried.
#[tokio::test]
async fn a_slow_holder_renews_its_lease_and_writes_nothing_once_it_is_lost() {
    let p = Policy {
        lease: crate::core::rules::control::LeaseTiming {
            renew_every: Duration::from_millis(10),
            valid_for: Duration::from_millis(40),
        },
        ..policy()
    };
    // The second DescribeInstances, under the Lease, answers after 150 ms:
    // several times what one renewal allows.
    let slow = Duration::from_millis(150);
    let w = World::stopped();
    w.cloud.slow_describe(2, slow);
    let report = w.fence(&p).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let renewals = w.calls.log().iter().filter(|c| *c == "RenewLease").count();
    assert!(renewals >= 3, "renewed while slow: {renewals}");

    // A long wait for another holder does not eat into the time to write:
    // the Lease's duration runs from when it was taken.
    let w = World::stopped();
    w.cluster.lease_held_for(Duration::from_millis(150));
    let report = w.fence(&p).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");

    let w = World::stopped();
    w.cloud.slow_describe(2, slow);
    w.cluster.lease_taken_at_renewal(2);
    let report = w.fence(&p).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert!(report.incomplete(), "retried");
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("TaintNode")));
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));
    assert_eq!(w.cloud.volume_state(&volume(1)), Some(VolumeState::InUse));
}
