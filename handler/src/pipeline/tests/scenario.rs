//! The seed scenario over the fakes: every call, in order.

use super::*;

#[tokio::test]
async fn a_stopped_silent_node_is_tainted_and_its_volume_freed_in_this_order() {
    let w = World::stopped();
    // Evicted by the taint at once; staying for good; staying for a while.
    w.cluster.pod(NODE, "db-0");
    w.cluster.staying_pod(NODE, "storage-daemon", true, None);
    w.cluster.patient_pod(NODE, "batch-job");
    w.cluster.pod("another-node", "web-0");
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(r.taint_applied);
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Detached);
    assert_eq!(
        r.reason,
        "tainted out-of-service, 1 pod(s) force-deleted; 1 volume(s) force-detached"
    );
    assert_eq!(r.pods_deleted, 1);
    assert_eq!(
        w.cluster.pods(NODE),
        2,
        "the pods the taint does not evict yet"
    );
    assert_eq!(w.cluster.pods("another-node"), 1);
    assert!(!report.incomplete());
    assert_eq!(w.out_of_service_taints(NODE), 1);
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    assert_eq!(
        w.cluster.events(NODE),
        [
            "OutOfServiceTaintApplied",
            "PodsForceDeleted",
            "VolumesForceDetached"
        ]
    );
    assert!(w.cluster.lease().is_none(), "the Lease is released");
    let vol = volume(1);
    assert_eq!(
        w.calls.log(),
        [
            // The instance first: its answer is also the confirmation.
            "DescribeInstances".to_owned(),
            // The oldest supported version checked before anything else
            // (the shell asks the server once per execution environment).
            "GetVersion".into(),
            "GetKillSwitch".into(),
            "ListNodes".into(),
            // No other machine carries the Node's name.
            format!("DescribeInstances named {NODE}"),
            "GetVersion".into(),
            "ListVolumeAttachments".into(),
            "ListPersistentVolumes".into(),
            "DescribeVolumes".into(),
            format!("ListPods {NODE}"),
            "AcquireLease".into(),
            "ListNodes".into(),
            "DescribeInstances".into(),
            format!("TaintNode {NODE}"),
            // The Events wait until the Lease is free.
            "ReleaseLease".into(),
            format!("CreateEvent {NODE}"),
            // Confirmed off again, then the pods the garbage collector would
            // delete on its next pass, right after the taint.
            "DescribeInstances".into(),
            format!("ListPods {NODE}"),
            // Issue 58, item 3: the Node judged still there after the
            // list, so every pod listed was bound to it.
            format!("GetNode {NODE}"),
            "DeletePod db-0".into(),
            format!("CreateEvent {NODE}"),
            // Issue 33, item 4: confirmed off once more, this node's machine
            // alone, right before its first detach.
            "DescribeInstances".into(),
            format!("DetachVolume {vol}"),
            format!("CreateEvent {NODE}"),
            "DescribeVolumes".into(),
        ]
    );
}
