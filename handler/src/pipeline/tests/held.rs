//! Issue 59, the simulator's override world once more: a kubelet that
//! served the Node from another machine died there, and a later one took
//! the name over and wrote its own address, so the Node's addresses no
//! longer show the first machine. The Node's disk, attached to that
//! machine for the Node, still does: while it may run, the Node is
//! refused.

use super::*;
use crate::core::rules::held_disks::DiskHolder;
use crate::core::rules::namesake::Namesake;

/// The seed Node, NotReady, on a stopped machine; its disk attached for it
/// to machine 2, in `state`.
fn held_by(state: InstanceState) -> World {
    let w = World::stopped();
    w.cluster.pod(NODE, "db-0");
    w.cloud.instance(&w.instance(2), state);
    w.cloud
        .attached_volume(&w.volume(1), &w.instance(2), "/dev/xvdbb");
    w
}

#[tokio::test]
async fn a_node_whose_disk_a_running_machine_holds_is_refused() {
    let w = held_by(InstanceState::Running);
    let report = w.fence(&policy()).await.unwrap();
    let skip = report.results[0].skip.as_ref();
    assert_eq!(
        skip,
        Some(&Skip::DiskHeld {
            machine: w.instance(1).as_str().to_owned(),
            by: DiskHolder {
                volume: w.volume(1).as_str().to_owned(),
                by: Namesake {
                    machine: w.instance(2).as_str().to_owned(),
                    state: "running".into(),
                },
            },
        }),
        "{report:#?}"
    );
    assert!(!skip.unwrap().leaves_work(), "no retry can change it");
    w.assert_refused_untouched("delete the Node");
}

/// A holder that is off runs nothing; one a Ready Node names serves that
/// Node, which the disk has moved to: the Node is fenced, and its disk,
/// on another machine, is not detached from it.
#[tokio::test]
async fn a_holder_that_is_off_or_serves_a_ready_node_fences_as_before() {
    for state in [InstanceState::Stopped, InstanceState::Terminated] {
        let w = held_by(state.clone());
        let report = w.fence(&policy()).await.unwrap();
        assert_eq!(
            report.results[0].outcome,
            Outcome::Fenced,
            "{state:?}: {report:#?}"
        );
        assert!(!w.called("DetachVolume"), "{:?}", w.calls.log());
    }
    let w = held_by(InstanceState::Running);
    w.cluster.node("healthy-2", &w.instance(2), "True");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
}

/// A question that fails is never taken for "no holder": the Node waits
/// for the retry.
#[tokio::test]
async fn a_failed_holder_question_leaves_the_node_for_the_retry() {
    let w = held_by(InstanceState::Stopped);
    w.fence(&policy()).await.unwrap();
    let log = w.calls.log();
    let volumes = log.iter().position(|c| c.starts_with("DescribeVolumes"));
    let at = volumes.and_then(|v| {
        let after = log[v..]
            .iter()
            .position(|c| c.starts_with("DescribeInstances"))?;
        Some(v + after)
    });
    assert!(at.is_some(), "{log:?}");
    let w = held_by(InstanceState::Stopped);
    w.calls.fail_at(at);
    let report = w.fence(&policy()).await.unwrap();
    assert!(
        matches!(&report.results[0].skip, Some(Skip::LookupFailed { error })
            if error.contains("hold the Node's disks")),
        "{report:#?}"
    );
    assert!(report.incomplete());
    assert_eq!(w.out_of_service_taints(NODE), 0);
}
