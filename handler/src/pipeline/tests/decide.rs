//! The decision: what is fenced, what is left alone, the cap, and the wait for a Node still Ready.

use super::*;

#[tokio::test]
async fn split_brain_a_silent_node_whose_instance_runs_is_left_alone() {
    let w = World::new().with_node(NODE, 1, InstanceState::Running, "Unknown");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(
        report.results[0].skip,
        Some(Skip::InstanceNotOff {
            state: InstanceState::Running
        })
    );
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

/// Issue 12, item 2: a hibernated instance resumes from RAM when started.
#[tokio::test]
async fn a_hibernated_instance_is_fenced_only_when_the_setting_says_so() {
    let w = World::new().with_node(NODE, 1, InstanceState::Hibernated, "Unknown");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::Hibernated));
    assert!(!report.incomplete());
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    let anyway = Policy {
        fence_hibernated: true,
        ..policy()
    };
    let report = w.fence(&anyway).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
}

#[tokio::test]
async fn a_ready_node_is_never_fenced_and_the_event_is_retried() {
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert!(report.incomplete(), "a retry may find it NotReady");
    assert!(w.writes().is_empty(), "{:?}", w.writes());
}

/// Issue 16: EC2's `stopped` comes before the node controller's grace
/// period is over. The invocation waits for the Node to turn NotReady
/// (bounded), asking EC2 nothing more meanwhile, and fences at once; a Node
/// that stays Ready past the wait fails the invocation for a retry, and a
/// dry run does not wait.
#[tokio::test]
async fn a_node_still_ready_when_its_instance_is_off_is_fenced_once_it_turns_not_ready() {
    let waiting = Policy {
        not_ready_wait: Duration::from_secs(30),
        ..policy()
    };
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    w.cluster.not_ready_from_list(NODE, 4);
    let report = w.fence(&waiting).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete());
    let log = w.calls.log();
    let leased = log.iter().position(|c| c == "AcquireLease").unwrap();
    let before: Vec<&str> = log[..leased]
        .iter()
        .map(String::as_str)
        .filter(|c| matches!(*c, "ListNodes" | "DescribeInstances"))
        .collect();
    assert_eq!(
        before,
        [
            "DescribeInstances",
            "ListNodes",
            "ListNodes",
            "ListNodes",
            "ListNodes"
        ],
        "EC2 is asked once; the Node is looked at until NotReady"
    );

    // Long enough for more than one look on a loaded machine (a look takes
    // well under a millisecond with the fakes), short for the suite.
    let short = Policy {
        not_ready_wait: Duration::from_millis(300),
        poll_interval: Duration::from_millis(10),
        ..policy()
    };
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    let report = w.fence(&short).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert!(report.incomplete(), "retried once the wait ran out");
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert!(w.calls.log().iter().filter(|c| *c == "ListNodes").count() > 2);

    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    let check = w
        .run(&waiting, batch(Intent::Check, &[instance(1)]))
        .await
        .unwrap();
    assert_eq!(check.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(
        w.calls.log().iter().filter(|c| *c == "ListNodes").count(),
        1,
        "a check does not wait"
    );
}

#[tokio::test]
async fn the_cap_refuses_the_second_node_and_records_why() {
    let w = World::stopped().with_node("other", 2, InstanceState::Terminated, "False");
    let p = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    let report = w
        .run(&p, batch(Intent::Fence, &[instance(1), instance(2)]))
        .await
        .unwrap();
    let outcomes: Vec<Outcome> = report.results.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Fenced, Outcome::Skipped]);
    assert!(matches!(
        report.results[1].skip,
        Some(Skip::CapReached { limit: 1, .. })
    ));
    assert_eq!(w.cluster.events("other"), ["FencingRefused"]);
    assert_eq!(w.out_of_service_taints("other"), 0);
    assert_eq!(
        w.cloud.volume_state(&volume(2)).as_ref(),
        Some(&VolumeState::InUse)
    );
    assert!(report.incomplete(), "a refused node is retried");
}

/// Issue 12, item 14: a fenced Node whose instance was terminated since can
/// never come back, so it takes no room under the cap; one whose instance is
/// only stopped does.
#[tokio::test]
async fn a_fenced_node_whose_instance_is_terminated_takes_no_room_under_the_cap() {
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 1);
    let w = w.with_node("other", 2, InstanceState::Stopped, "False");
    let p = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    let second = || batch(Intent::Fence, &[instance(2)]);
    let report = w.run(&p, second()).await.unwrap();
    assert!(
        matches!(report.results[0].skip, Some(Skip::CapReached { .. })),
        "{report:#?}"
    );
    // The machine of the first Node is terminated now (an Auto Scaling
    // group replaced it); its Node object stays, tainted.
    w.cloud.instance(&instance(1), InstanceState::Terminated);
    let report = w.run(&p, second()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.out_of_service_taints("other"), 1);
}

/// Issue 12, item 5: the sweep finds what no event named. One node list and
/// one batched lookup decide every NotReady Node: the one whose machine is
/// off is fenced, the hung one (machine running) left alone, the one still
/// stopping left for the retry, the Ready one not even looked at.
#[tokio::test]
async fn the_sweep_fences_what_no_event_named_with_one_lookup() {
    let w = World::stopped()
        .with_node("hung", 2, InstanceState::Running, "Unknown")
        .with_node("stopping", 3, InstanceState::Stopping, "False")
        .with_node("healthy", 4, InstanceState::Running, "True");
    let report = w
        .run(&policy(), crate::core::inbound::trigger::direct::sweep())
        .await
        .unwrap();
    let seen: Vec<(&str, Outcome)> = report
        .results
        .iter()
        .map(|r| (r.node.as_deref().unwrap_or("-"), r.outcome))
        .collect();
    assert_eq!(
        seen,
        [
            ("hung", Outcome::Skipped),
            (NODE, Outcome::Fenced),
            ("stopping", Outcome::Skipped)
        ],
        "{report:#?}"
    );
    assert!(report.results.iter().all(|r| r.origins == [Origin::Sweep]));
    assert_eq!(w.out_of_service_taints(NODE), 1);
    assert_eq!(w.out_of_service_taints("hung"), 0);
    assert_eq!(w.out_of_service_taints("stopping"), 0);
    let log = w.calls.log();
    let first_taint = log.iter().position(|c| c.starts_with("TaintNode")).unwrap();
    assert_eq!(
        log[..first_taint]
            .iter()
            .filter(|c| c.starts_with("ListNodes"))
            .count(),
        2,
        "the sweep's list, and the recount under the Lease: {log:?}"
    );
    assert_eq!(
        log[..first_taint]
            .iter()
            .filter(|c| *c == "DescribeInstances")
            .count(),
        2,
        "one lookup to decide, one to confirm again: {log:?}"
    );
    // A machine on its way off is retried, not dropped.
    assert!(report.incomplete(), "{report:#?}");
    assert!(report.results[2].leaves_work());
    assert!(!report.results[0].leaves_work());
}
