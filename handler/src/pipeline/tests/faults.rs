//! Every call of a scenario failing in turn: a safe state, and a retry that converges.

use super::*;

/// Every call of the seed scenario failing in turn, one at a time: whatever
/// fails, no volume is freed from a Node without the taint, nothing is
/// written once a confirmation failed, the work left is reported (so Lambda
/// retries), and the retry (the same event under the same request id, as
/// Lambda retries it) converges to one taint, a free volume and exactly one
/// `OutOfServiceTaintApplied` Event: none lost, none twice (issue 12, item 12).
#[tokio::test]
async fn every_call_failing_in_turn_leaves_a_safe_state_and_the_retry_converges() {
    // Over every Node, and over the Node read by name with a census.
    let by_name = || {
        let w = World::stopped().named(1, NODE);
        w.cluster.census(census(0));
        w
    };
    for world in [World::stopped, by_name, World::stopped_recorded] {
        fail_each_call_in_turn(world).await;
    }
}

async fn fail_each_call_in_turn(world: fn() -> World) {
    let baseline = world();
    baseline.fence(&policy()).await.unwrap();
    let calls = baseline.calls.log();
    assert!(calls.len() > 10, "{calls:?}");
    for (k, failed) in calls.iter().enumerate() {
        let w = world();
        w.calls.fail_at(Some(k));
        let result = w.fence_as("request-1").await;
        let log = w.calls.log();
        assert_eq!(log.get(k), Some(failed), "the same path up to the fault");

        let freed = w.cloud.volume_state(&volume(1)) == Some(VolumeState::Available);
        assert!(
            !freed || w.out_of_service_taints(NODE) == 1,
            "call {k} ({failed}) failing freed a volume of an untainted node"
        );
        if failed == "DescribeInstances" {
            let after: Vec<_> = log[k..]
                .iter()
                .filter(|c| c.starts_with("TaintNode") || c.starts_with("DetachVolume"))
                .collect();
            assert!(
                after.is_empty(),
                "acted after a failed confirmation: {after:?}"
            );
        }
        // A failed read by name, of the census or of the labelled Nodes
        // falls back to reading every Node; a failed read of an attachment
        // or a volume by name, to the lists.
        let benign = failed.starts_with("CreateEvent")
            || failed == "ReleaseLease"
            || failed.starts_with("GetNode")
            || failed == "GetCensus"
            || failed == "ListFencedNodes"
            || failed.starts_with("GetVolumeAttachment")
            || failed.starts_with("GetPersistentVolume");
        match &result {
            Err(_) => {}
            Ok(report) => assert!(
                benign || report.incomplete(),
                "call {k} ({failed}) failing was reported done: {report:#?}"
            ),
        }

        w.calls.fail_at(None);
        let again = w.fence_as("request-1").await.unwrap();
        let r = &again.results[0];
        assert!(
            matches!(r.outcome, Outcome::Fenced | Outcome::AlreadyFenced),
            "call {k} ({failed}): the retry did not converge: {again:#?}"
        );
        assert!(!again.incomplete(), "call {k} ({failed})");
        assert_eq!(w.out_of_service_taints(NODE), 1, "call {k} ({failed})");
        assert_eq!(
            w.cloud.volume_state(&volume(1)),
            Some(VolumeState::Available)
        );
        let applied = w
            .cluster
            .events(NODE)
            .iter()
            .filter(|e| **e == "OutOfServiceTaintApplied")
            .count();
        assert_eq!(
            applied, 1,
            "call {k} ({failed}): the taint recorded {applied} times"
        );
    }
}

/// Every call of a power-off failing in turn: nothing is tainted while the
/// machine runs, the machine is stopped at most once, and the retry fences.
#[tokio::test]
async fn every_call_failing_in_turn_while_powering_off_stays_safe() {
    let baseline = World::hung();
    baseline.run(&active(), power_off()).await.unwrap();
    let calls = baseline.calls.log();
    let stop = calls
        .iter()
        .position(|c| c.starts_with("StopInstances"))
        .unwrap();
    for (k, failed) in calls.iter().enumerate() {
        let w = World::hung();
        w.calls.fail_at(Some(k));
        let result = w.run_as("request-1", &active(), power_off()).await;
        let log = w.calls.log();
        assert_eq!(log.get(k), Some(failed), "the same path up to the fault");
        if let Some(taint) = log.iter().position(|c| c.starts_with("TaintNode")) {
            assert!(
                log[..taint].iter().any(|c| c.starts_with("StopInstances")),
                "call {k} ({failed}): tainted without a stop: {log:?}"
            );
        }
        // Reads with a fallback, and what is only recorded.
        let benign = failed.starts_with("CreateEvent")
            || failed.starts_with("GetNode")
            || failed == "GetCensus"
            || failed == "ListFencedNodes"
            || failed == "DescribeInstanceStatus"
            || failed == "ReleaseLease";
        if k <= stop
            && !benign
            && let Ok(report) = &result
        {
            assert!(
                report.incomplete(),
                "call {k} ({failed}) failing before the stop was reported done: {report:#?}"
            );
        }
        w.calls.fail_at(None);
        let again = w.run_as("request-1", &active(), power_off()).await.unwrap();
        assert_eq!(
            again.results[0].outcome,
            Outcome::Fenced,
            "call {k} ({failed}): the retry did not converge: {again:#?}"
        );
        assert_eq!(
            w.stops(),
            if failed.starts_with("StopInstances") {
                2
            } else {
                1
            },
            "call {k} ({failed})"
        );
        assert_eq!(w.out_of_service_taints(NODE), 1);
        assert_eq!(
            w.cloud.volume_state(&volume(1)),
            Some(VolumeState::Available)
        );
    }
}
