//! Acting: the third look, the pods, the legacy recipe, the detaches and their verification.

use super::*;
use crate::pipeline::CUT_BEFORE_END;
use crate::pipeline::invocation::ANSWER_RESERVE;

/// Issue 12, item 3: the taint patch, its retries and the Lease lie between
/// the second look and the detaches.
#[tokio::test]
async fn an_instance_started_after_the_taint_keeps_its_volumes() {
    for mode in [ModeSetting::Taint, ModeSetting::Legacy] {
        let w = World::stopped();
        w.cluster.pod(NODE, "db-0");
        w.cluster
            .driver_attachment(NODE, "cstor.csi.openebs.io", "pv-cstor");
        w.cloud.on_describe(3, &instance(1), InstanceState::Running);
        let p = Policy { mode, ..policy() };
        let report = w.fence(&p).await.unwrap();
        let r = &report.results[0];
        assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
        assert!(report.incomplete(), "a retry looks again");
        let log = w.calls.log();
        for write in ["DetachVolume", "DeletePod", "DeleteVolumeAttachment"] {
            assert!(
                !log.iter().any(|c| c.starts_with(write)),
                "{mode:?}: {log:?}"
            );
        }
        assert_eq!(w.cloud.volume_state(&volume(1)), Some(VolumeState::InUse));
        assert_eq!(w.cluster.pods(NODE), 1);
        assert_eq!(w.cluster.attachments().len(), 2, "no driver's is freed");
    }
}

/// Issue 12, item 4: a pod that tolerates the out-of-service taint (a
/// storage daemon with `operator: Exists`) is never evicted, so its volume
/// stays attached and is reported kept; the fencing's annotation does not
/// list it, so recovery does not wait for its VolumeAttachment to go.
#[tokio::test]
async fn the_volume_of_a_pod_that_stays_on_the_node_stays_attached() {
    let w = World::stopped();
    let daemons = volume(9);
    w.cloud
        .attached_volume(&daemons, &instance(1), "/dev/xvdbz");
    w.cluster.attachment(NODE, &daemons);
    w.cluster
        .staying_pod(NODE, "storage-daemon", true, Some(&daemons));
    w.cluster
        .staying_pod(NODE, "app-0", false, Some(&volume(1)));
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete(), "{report:#?}");
    let outcomes: Vec<(String, VolumeOutcome)> = r
        .volumes
        .iter()
        .map(|v| (v.volume.to_string(), v.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            (volume(1).to_string(), VolumeOutcome::Detached),
            (daemons.to_string(), VolumeOutcome::Kept)
        ]
    );
    assert_eq!(w.cloud.volume_state(&daemons), Some(VolumeState::InUse));
    let mark = w.cluster.facts(NODE).unwrap().fenced.unwrap();
    assert_eq!(mark.volumes, [volume(1)], "only what was detached");
    // Back: the daemon's attachment remains, and recovery ends the fencing.
    w.cloud.instance(&instance(1), InstanceState::Running);
    w.cluster.set_ready(NODE, "True");
    w.cluster.remove_attachment(&volume(1));
    let asked = w.describes();
    let back = w
        .run(&policy(), batch(Intent::Recover, &[instance(1)]))
        .await
        .unwrap();
    assert_eq!(
        back.recoveries[0].outcome,
        RecoveryOutcome::Recovered,
        "{back:#?}"
    );
    assert_eq!(
        w.describes() - asked,
        1,
        "the screen's answer serves the recovery"
    );
}

#[tokio::test]
async fn legacy_mode_deletes_pods_and_attachments_then_detaches() {
    let w = World::stopped();
    w.cluster.pod(NODE, "db-0");
    let p = legacy();
    let report = w.fence(&p).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!((r.pods_deleted, r.attachments_deleted), (1, 1));
    assert_eq!(w.out_of_service_taints(NODE), 0, "no taint in legacy mode");
    assert_eq!(w.cluster.pods(NODE), 0);
    assert!(w.cluster.attachments().is_empty());
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    assert_eq!(
        w.cluster.events(NODE),
        [
            "FencedLegacy",
            "PodsForceDeleted",
            "VolumeAttachmentsDeleted",
            "VolumesForceDetached"
        ]
    );
    let mark = w.cluster.facts(NODE).and_then(|n| n.fenced).unwrap();
    assert_eq!(mark.volumes, [volume(1)]);
}

/// The legacy mode, with the tests' other settings.
fn legacy() -> Policy {
    Policy {
        mode: ModeSetting::Legacy,
        ..policy()
    }
}

/// The seed node with a cStor volume its leaving pod `db-0` claims and an
/// iSCSI volume of a pod that stays (it tolerates the taint for good).
fn two_drivers_one_pod_staying() -> World {
    let w = World::stopped();
    w.cluster
        .driver_attachment(NODE, "cstor.csi.openebs.io", "pv-db");
    w.cluster
        .driver_attachment(NODE, "iscsi.csi.example.com", "pv-target");
    w.cluster
        .pod_with_claim(NODE, "db-0", false, Some("claim-pv-db"));
    w.cluster
        .pod_with_claim(NODE, "iscsi-target", true, Some("claim-pv-target"));
    w
}

/// Issue 35: once the machine is confirmed off again and the pods are
/// deleted, the freed volumes leave the Node's `status.volumesInUse`, before
/// the attachments are deleted; a staying pod's volume, and any other
/// entry, stay listed.
#[tokio::test]
async fn legacy_mode_releases_the_freed_volumes_from_volumes_in_use() {
    let w = two_drivers_one_pod_staying();
    let ebs = format!("kubernetes.io/csi/ebs.csi.aws.com^{}", volume(1));
    let cstor = "kubernetes.io/csi/cstor.csi.openebs.io^handle-pv-db";
    let target = "kubernetes.io/csi/iscsi.csi.example.com^handle-pv-target";
    let other = "kubernetes.io/aws-ebs/aws://us-east-1a/vol-0ffffffffffffffff";
    w.cluster.report_in_use(NODE, &[target, cstor, &ebs, other]);

    let report = w.fence(&legacy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.cluster.volumes_in_use(NODE), [target, other]);
    let log = w.calls.log();
    let at = |call: &str| log.iter().rposition(|c| c.starts_with(call)).unwrap();
    assert!(at("DeletePod") < at("ReleaseVolumesInUse"), "{log:?}");
    assert!(
        at("DescribeInstances") < at("ReleaseVolumesInUse"),
        "{log:?}"
    );
    assert!(
        at("ReleaseVolumesInUse")
            < log
                .iter()
                .position(|c| c.starts_with("DeleteVolumeAttachment"))
                .unwrap(),
        "{log:?}"
    );
    assert_eq!(
        w.cluster.events(NODE),
        [
            "FencedLegacy",
            "PodsForceDeleted",
            "VolumesInUseReleased",
            "VolumeAttachmentsDeleted",
            "VolumesForceDetached"
        ]
    );

    // A dry run writes none.
    let w = two_drivers_one_pod_staying();
    w.cluster.report_in_use(NODE, &[cstor]);
    let dry = Policy {
        dry_run: true,
        ..legacy()
    };
    w.fence(&dry).await.unwrap();
    assert_eq!(w.cluster.volumes_in_use(NODE), [cstor]);
    assert!(!w.called("ReleaseVolumesInUse"));

    // The taint mode writes none: the taint makes the controller detach.
    let w = World::stopped();
    w.cluster.report_in_use(NODE, &[&ebs]);
    w.fence(&policy()).await.unwrap();
    assert_eq!(w.cluster.volumes_in_use(NODE), [ebs.as_str()]);
    assert!(!w.called("ReleaseVolumesInUse"));
}

/// Issue 58, item 3: the release is held to the Node judged. A Node deleted
/// and registered again under its name right before it is another object,
/// whose `volumesInUse` is its own kubelet's: left as it is.
#[tokio::test]
async fn legacy_mode_releases_nothing_from_a_node_registered_again() {
    let ebs = format!("kubernetes.io/csi/ebs.csi.aws.com^{}", volume(1));
    let w = World::stopped();
    w.cluster.report_in_use(NODE, &[&ebs]);
    w.cluster.reregistered_before_release(NODE);
    w.fence(&legacy()).await.unwrap();
    assert!(w.called("ReleaseVolumesInUse"));
    assert_eq!(w.cluster.volumes_in_use(NODE), [ebs.as_str()]);
    assert!(!w.cluster.events(NODE).contains(&"VolumesInUseReleased"));
}

/// A failed release costs speed only: the attachments are deleted all the
/// same, and the fencing is done.
#[tokio::test]
async fn legacy_mode_a_failed_release_still_deletes_the_attachments() {
    let ebs = format!("kubernetes.io/csi/ebs.csi.aws.com^{}", volume(1));
    let world = || {
        let w = World::stopped();
        w.cluster.report_in_use(NODE, &[&ebs]);
        w
    };

    let w = world();
    w.fence(&legacy()).await.unwrap();
    let release = w
        .calls
        .log()
        .iter()
        .position(|c| *c == format!("ReleaseVolumesInUse {NODE}"));
    assert!(release.is_some());
    let w = world();
    w.calls.fail_at(release);
    let report = w.fence(&legacy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.attachments_deleted, 1);
    assert!(w.cluster.attachments().is_empty());
    assert_eq!(w.cluster.volumes_in_use(NODE), [ebs.as_str()]);
    assert!(!w.cluster.events(NODE).contains(&"VolumesInUseReleased"));
}

/// Issue 20: without the taint, every driver's attachment is held for the
/// attach/detach controller's 6 minutes, so the legacy recipe deletes the
/// node's VolumeAttachments of every CSI driver (naming their uids), not
/// only EBS's, and reports them per driver; a pod that tolerates the taint
/// stays, with its volume's attachment. The taint mode deletes none: the
/// attach/detach controller frees every driver's volumes once the taint is
/// on (shown against the real controllers in `tests/`).
#[tokio::test]
async fn legacy_mode_frees_the_attachments_of_every_csi_driver() {
    let w = two_drivers_one_pod_staying();
    w.cluster
        .driver_attachment("another-node", "cstor.csi.openebs.io", "pv-other");

    let report = w.fence(&legacy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!((r.pods_deleted, r.attachments_deleted), (1, 2), "{r:#?}");
    let attachments: Vec<(&str, &str, AttachmentOutcome)> = r
        .attachments
        .iter()
        .map(|a| (a.attachment.as_str(), a.driver.as_str(), a.outcome))
        .collect();
    let ebs = format!("csi-{}", volume(1));
    assert_eq!(
        attachments,
        [
            (ebs.as_str(), "ebs.csi.aws.com", AttachmentOutcome::Deleted),
            (
                "va-pv-db",
                "cstor.csi.openebs.io",
                AttachmentOutcome::Deleted
            ),
            (
                "va-pv-target",
                "iscsi.csi.example.com",
                AttachmentOutcome::Kept
            ),
        ]
    );
    assert!(
        r.reason
            .contains("(cstor.csi.openebs.io 1, ebs.csi.aws.com 1)"),
        "{}",
        r.reason
    );
    assert_eq!(w.cluster.attachments(), ["va-pv-target", "va-pv-other"]);
    assert_eq!(w.cluster.pods(NODE), 1, "the tolerating pod stays");
    let deletes: Vec<String> = w
        .calls
        .log()
        .into_iter()
        .filter(|c| c.starts_with("Delete"))
        .collect();
    assert_eq!(
        deletes,
        [
            "DeletePod db-0".to_owned(),
            format!("DeleteVolumeAttachment {ebs}"),
            "DeleteVolumeAttachment va-pv-db".to_owned(),
        ]
    );
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available),
        "EBS volumes are still force-detached"
    );

    let w = World::stopped();
    w.cluster
        .driver_attachment(NODE, "cstor.csi.openebs.io", "pv-db");
    w.cluster
        .pod_with_claim(NODE, "db-0", false, Some("claim-pv-db"));
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(r.attachments.is_empty(), "{r:#?}");
    assert_eq!(w.cluster.attachments().len(), 2);
    assert!(!w.called("DeleteVolumeAttachment"));
}

#[tokio::test]
async fn a_volume_still_attached_after_the_wait_fails_the_node() {
    let w = World::stopped();
    w.cloud.stick(&volume(1));
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Stuck);
    assert_eq!(
        r.volumes[0].detail.as_deref(),
        Some("not available after 0s")
    );
    assert!(report.incomplete());
}

#[tokio::test]
async fn a_volume_attached_elsewhere_is_not_detached() {
    let w = World::stopped();
    // Stopped: a holder that may run refuses the Node (`tests::held`).
    w.cloud.instance(&instance(9), InstanceState::Stopped);
    w.cloud
        .attached_volume(&volume(1), &instance(9), "/dev/xvdba");
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::AlreadyDetached);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));
}

/// Issue 19: a Node that records its volumes has its attachments and their
/// PersistentVolumes read by name; no list of either is read.
#[tokio::test]
async fn a_node_that_records_its_volumes_has_them_read_by_name() {
    let w = World::stopped_recorded();
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes.len(), 1, "{report:#?}");
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    let log = w.calls.log();
    let lists: Vec<_> = log
        .iter()
        .filter(|c| *c == "ListVolumeAttachments" || *c == "ListPersistentVolumes")
        .collect();
    assert!(lists.is_empty(), "{log:?}");
    let attachment = crate::core::rules::volumes::attachment_name(
        &crate::core::model::facts::CsiVolume {
            driver: crate::core::model::instance::EBS_CSI_DRIVER.into(),
            handle: volume(1).to_string(),
        },
        NODE,
    );
    for read in [
        format!("GetVolumeAttachment {attachment}"),
        format!("GetPersistentVolume pv-{}", volume(1)),
    ] {
        assert!(log.contains(&read), "{read} missing from {log:?}");
    }

    // A read by name that fails (a role without `get`, say): the lists.
    let w = World::stopped_recorded();
    let get = log
        .iter()
        .position(|c| c.starts_with("GetVolumeAttachment"));
    w.calls.fail_at(get);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete(), "{report:#?}");
    assert!(w.calls.log().contains(&"ListVolumeAttachments".to_owned()));
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
}

/// Issue 33, item 4: the machine is asked about once more right before the
/// node's first detach, after its pods went: a machine that runs again by
/// then (Compute Engine restarts a VM after a host error on its own) keeps
/// its volumes, and the invocation is retried.
#[tokio::test]
async fn a_machine_started_after_the_pods_went_keeps_its_volumes() {
    let w = World::stopped();
    w.cluster.pod(NODE, "db-0");
    // The decision's look, the second under the Lease, the one before the
    // pods; the fourth, right before the detach, finds it running.
    w.cloud.on_describe(4, &instance(1), InstanceState::Running);
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert!(report.incomplete());
    assert_eq!(r.pods_deleted, 1, "the pods went while it was off");
    assert!(
        !w.calls.log().iter().any(|c| c.starts_with("DetachVolume")),
        "{:?}",
        w.calls.log()
    );
    assert_eq!(w.cloud.volume_state(&volume(1)), Some(VolumeState::InUse));
}

/// Issue 33, item 14: a pod that stays on the node names a volume inline,
/// without a PersistentVolume: its volume stays attached in taint mode, and
/// its VolumeAttachment stays in legacy mode.
#[tokio::test]
async fn the_inline_volume_of_a_pod_that_stays_stays_attached() {
    for mode in [ModeSetting::Taint, ModeSetting::Legacy] {
        let w = World::stopped();
        w.cloud
            .attached_volume(&volume(2), &instance(1), "/dev/xvdbb");
        w.cluster
            .inline_attachment_of_staying_pod(NODE, &volume(2), "legacy-daemon");
        let p = Policy { mode, ..policy() };
        let report = w.fence(&p).await.unwrap();
        let r = &report.results[0];
        assert!(!report.incomplete(), "{mode:?}: {report:#?}");
        assert_eq!(
            w.cloud.volume_state(&volume(2)),
            Some(VolumeState::InUse),
            "{mode:?}"
        );
        assert!(
            !w.calls
                .log()
                .iter()
                .any(|c| *c == format!("DetachVolume {}", volume(2))
                    || c.starts_with("DeleteVolumeAttachment csi-inline")),
            "{mode:?}: {:?}",
            w.calls.log()
        );
        let kept = r
            .volumes
            .iter()
            .chain(std::iter::empty())
            .any(|v| v.volume == volume(2) && v.outcome == VolumeOutcome::Kept);
        let kept_attachment = r
            .attachments
            .iter()
            .any(|a| a.outcome == AttachmentOutcome::Kept);
        assert!(kept || kept_attachment, "{mode:?}: {r:#?}");
        // The other volume, of no staying pod, is freed.
        assert_eq!(
            w.cloud.volume_state(&volume(1)),
            Some(VolumeState::Available)
        );
    }
}

/// Issue 33, item 13: a request ends at its deadline (a Cloud Run request's
/// timeout, Pub/Sub's ack deadline): a node whose detaches may not finish
/// in the time left keeps its volumes for the retry the unfinished request
/// brings; with time enough, the same request frees them.
#[tokio::test]
async fn detaches_that_may_outlast_the_request_are_left_for_its_retry() {
    let w = World::stopped();
    let soon = tokio::time::Instant::now() + Duration::from_secs(12);
    let report = w.fence_within(&policy(), soon).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert!(report.incomplete());
    assert!(r.reason.contains("request's time"), "{}", r.reason);
    assert_eq!(w.out_of_service_taints(NODE), 1, "the taint is on");
    assert!(
        !w.calls.log().iter().any(|c| c.starts_with("DetachVolume")),
        "{:?}",
        w.calls.log()
    );
    // The retry of the same request (its id kept) finishes its fencing.
    let later = tokio::time::Instant::now() + Duration::from_secs(300);
    let report = w.fence_within(&policy(), later).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
}

/// Issue 58, the runtime's deadlines: a detach the cloud carries out but
/// answers late (a hung connection; the EC2 client's own budget is 30 s,
/// its retries included) is cut at the request's end, its answer's reserve
/// kept, instead of running on until the runtime kills the request. The
/// retry finds the volume detached and finishes with no second taint.
/// Before, the request waited for the whole answer.
#[tokio::test(start_paused = true)]
async fn a_detach_answered_past_the_request_s_end_is_left_for_the_retry() {
    let w = World::stopped();
    w.cloud.detach_answers_held(Duration::from_secs(3600));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let report = w.fence_within(&policy(), deadline).await.unwrap();
    let answered = tokio::time::Instant::now();
    assert!(
        answered + ANSWER_RESERVE <= deadline,
        "answered {:?} before the deadline",
        deadline - answered
    );
    assert!(report.incomplete(), "{report:#?}");
    assert_eq!(report.results[0].outcome, Outcome::Failed, "{report:#?}");
    assert_eq!(w.out_of_service_taints(NODE), 1, "the taint is on");
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available),
        "the cloud carried the detach out"
    );
    // The retry, with an answering cloud: fenced, nothing written twice.
    w.cloud.detach_answers_held(Duration::ZERO);
    let later = tokio::time::Instant::now() + Duration::from_secs(300);
    let report = w.fence_within(&policy(), later).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.out_of_service_taints(NODE), 1, "one taint");
}

/// Issue 58, item 5: another invocation's Lease, held past the request's
/// end, is waited for only until the request's time is up (its answer's
/// reserve kept), not for the Lease wait's full 30 s: the invocation
/// answers before the runtime kills it, writes nothing, and leaves the node
/// to its retry.
#[tokio::test]
async fn the_wait_for_another_holders_lease_ends_before_the_request_does() {
    let w = World::stopped();
    w.cluster.lease_held_for(Duration::from_secs(60));
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let result = w.fence_within(&policy(), deadline).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "ended with the reserve left: {took:?}"
    );
    match result {
        Err(e) => assert!(e.to_string().contains("lease"), "{e}"),
        Ok(report) => assert!(report.incomplete(), "{report:#?}"),
    }
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.called("DetachVolume"), "{:?}", w.writes());
}

/// Issue 58, the runtime's deadlines: the apiserver hangs while the
/// invocation waits for a Node still Ready on a stopped machine to turn
/// NotReady. Each Kubernetes read is bounded only by its own attempts and
/// retries (up to 20 s); the invocation is cut 2 s before its end and
/// answers that its time ran out, having written nothing, rather than being
/// killed by the runtime. Before the cut it answered an hour later, when
/// the hung reads did.
#[tokio::test(start_paused = true)]
async fn an_apiserver_hanging_during_the_wait_for_not_ready_is_cut_before_the_end() {
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    // The first read is the survey's; the waiting ones hang.
    w.cluster.reads_hang_from(2, Duration::from_secs(3600));
    let waiting = Policy {
        not_ready_wait: Duration::from_secs(60),
        poll_interval: Duration::from_secs(2),
        fast_not_ready: false,
        ..policy()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let result = w.fence_within(&waiting, deadline).await;
    let answered = tokio::time::Instant::now();
    assert!(
        answered + CUT_BEFORE_END <= deadline,
        "answered {:?} before the deadline",
        deadline.saturating_duration_since(answered)
    );
    match result {
        Err(e @ PipelineError::OutOfTime { during }) => {
            assert!(during.contains("NotReady"), "{e}");
        }
        other => panic!("cut for lack of time: {other:?}"),
    }
    assert!(w.writes().is_empty(), "{:?}", w.writes());
}
