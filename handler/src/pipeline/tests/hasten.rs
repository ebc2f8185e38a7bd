//! Issue 39, `FAST_NOT_READY`: a Node still Ready whose kubelet is proven
//! silent since its machine's recorded stop is marked `Ready=Unknown` and
//! fenced without waiting out the node controller's grace period; anything
//! short of the proof waits as before.

use super::*;
use crate::core::inbound::suspect::{AuditOrigin, Delivery};
use crate::core::outbound::report::Outcome;
use crate::core::rules::silence::{
    KubeletLease, LATE_RENEWAL_MARGIN_SECS, LeaseRead, MARK_REASON, SKEW_MARGIN_SECS,
};

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// The setting on, and a wait long enough that a test which waited it out
/// would show it.
fn fast() -> Policy {
    Policy {
        fast_not_ready: true,
        not_ready_wait: Duration::from_secs(30),
        poll_interval: Duration::from_millis(10),
        ..policy()
    }
}

/// [`fast`], with a wait short enough for a test that waits it out.
fn short() -> Policy {
    short_of(Duration::from_millis(200))
}

/// [`fast`], waiting `wait` for the node controller.
fn short_of(wait: Duration) -> Policy {
    Policy {
        not_ready_wait: wait,
        ..fast()
    }
}

/// The seed node still Ready; EC2 recorded its stop at `stopped_at`, and
/// its kubelet last renewed at `renewed`.
fn ready_on_a_stopped_machine(stopped_at: Option<i64>, renewed: KubeletLease) -> World {
    ready_on_a_stopped_machine_of(On::Ec2, stopped_at, renewed)
}

/// [`ready_on_a_stopped_machine`], on either cloud.
fn ready_on_a_stopped_machine_of(on: On, stopped_at: Option<i64>, renewed: KubeletLease) -> World {
    let w = World::on(on).with_node(NODE, 1, InstanceState::Stopped, "True");
    w.cloud
        .describe_as(&w.instance(1), |f| f.stopped_at = stopped_at);
    w.cluster.kubelet_lease(NODE, renewed);
    w
}

fn count(w: &World, call: &str) -> usize {
    w.calls.log().iter().filter(|c| *c == call).count()
}

#[tokio::test]
async fn fast_not_ready_a_kubelet_silent_since_the_stop_is_marked_and_fenced_without_waiting() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 8));
    let started = std::time::Instant::now();
    let report = w.fence(&fast()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no wait for the node controller: {:?}",
        started.elapsed()
    );
    let (status, reason, message) = w.cluster.ready_condition(NODE).unwrap();
    assert_eq!(status, "Unknown");
    assert_eq!(reason.as_deref(), Some(MARK_REASON));
    assert!(message.is_some_and(|m| m.starts_with("node-fencer:")));
    assert_eq!(w.out_of_service_taints(NODE), 1);
    let events = w.cluster.events(NODE);
    assert_eq!(events[0], "MarkedNotReady", "{events:?}");
    assert!(events.contains(&"OutOfServiceTaintApplied"), "{events:?}");
    // The proof is made on the first look and again on a fresh one, the
    // Lease read right before the status write; then the taint.
    let log = w.calls.log();
    let at = |call: &str| log.iter().position(|c| c == call).unwrap();
    let order: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|c| {
            c.starts_with("GetNodeLease")
                || c.starts_with("MarkNotReady")
                || c.starts_with("TaintNode")
                || *c == "DescribeInstances"
        })
        .take(5)
        .collect();
    assert_eq!(
        order,
        [
            "DescribeInstances",
            &format!("GetNodeLease {NODE}"),
            "DescribeInstances",
            &format!("GetNodeLease {NODE}"),
            &format!("MarkNotReady {NODE}"),
        ],
        "{log:#?}"
    );
    assert!(at(&format!("MarkNotReady {NODE}")) < at(&format!("TaintNode {NODE}")));
}

#[tokio::test]
async fn fast_not_ready_a_kubelet_heard_after_the_stop_is_not_marked_and_reported() {
    let stop = now() - 20;
    for renewed in [stop + 3, stop - SKEW_MARGIN_SECS + 1] {
        let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(renewed));
        let report = w.fence(&short()).await.unwrap();
        assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{renewed}");
        assert!(
            report.incomplete(),
            "left to the node controller and a retry"
        );
        assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
        assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
        // Judged once: not asked again on every look of the wait.
        assert_eq!(count(&w, &format!("GetNodeLease {NODE}")), 1);
    }
}

/// The Lease is read again right before the write: a kubelet heard between
/// the two reads stops the marking.
#[tokio::test]
async fn fast_not_ready_a_renewal_between_the_two_reads_stops_the_marking() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    w.cluster.kubelet_renews_at_read(NODE, 2, now());
    let report = w.fence(&short()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
}

/// The mark is written over the Node as it was read before the Lease that
/// proved the silence: a kubelet that writes the Node after that read (one
/// starting: another machine's, adopting the Node, or this one back) sends
/// the mark back to be proven again, and the Lease then tells it renewed.
/// Found by the simulator (seed 1356 with its stale-Node moves): the
/// kubelet renewed 1.2 s after the Lease read, and the mark went out 0.9 s
/// after that, over the Node it had just written.
#[tokio::test]
async fn fast_not_ready_a_kubelet_writing_its_node_after_the_proof_is_not_marked() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    // The decision's proof reads the Lease once; the mark's proof, twice.
    w.cluster.kubelet_writes_after_read(NODE, 2, now());
    let report = w.fence(&short()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    assert_eq!(
        count(&w, &format!("MarkNotReady {NODE}")),
        1,
        "{:?}",
        w.calls.log()
    );
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
}

/// The second look at the cloud stops the marking of a machine started
/// again since the first.
#[tokio::test]
async fn fast_not_ready_a_machine_started_since_the_first_look_is_not_marked() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    w.cloud.on_describe(2, &instance(1), InstanceState::Running);
    let report = w.fence(&short()).await.unwrap();
    assert!(report.results[0].skip.is_some(), "{report:#?}");
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    // The second look is made under the fencing Lease: nothing else.
    let writes = w.writes();
    assert!(writes.iter().all(|c| c == "AcquireLease"), "{writes:?}");
}

/// A machine recreated under the name between the two looks (Compute
/// Engine's managed instance groups keep the name): the fresh look is of
/// another machine, whose stop proves nothing of this kubelet.
#[tokio::test]
async fn fast_not_ready_a_machine_recreated_since_the_first_look_is_not_marked() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    w.cloud
        .describe_as(&instance(1), |f| f.identity.uid = Some(7));
    w.cloud.recreated_on_describe(2, &instance(1), 8);
    let report = w.fence(&short()).await.unwrap();
    assert!(report.results[0].skip.is_some(), "{report:#?}");
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");
}

/// Issue 45, item 5: the Node deleted and registered again under its name
/// between the proof and the write is another Node object: the mark is
/// held to the uid judged, and nothing is written on the new one.
#[tokio::test]
async fn fast_not_ready_a_node_registered_again_before_the_write_is_not_marked() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    w.cluster.reregistered_before_mark(NODE);
    let report = w.fence(&short()).await.unwrap();
    assert!(report.results[0].skip.is_some(), "{report:#?}");
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");
    assert!(!w.cluster.events(NODE).contains(&"MarkedNotReady"));
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

/// A Node the cap would refuse once NotReady is not written to: no Lease
/// read, no mark.
#[tokio::test]
async fn fast_not_ready_a_node_the_cap_would_refuse_is_not_marked() {
    let full = Policy {
        max_out_of_service: 1,
        not_ready_wait: Duration::from_millis(200),
        ..fast()
    };
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30)).with_node(
        "other",
        2,
        InstanceState::Stopped,
        "Unknown",
    );
    w.cluster.taint_by_hand("other");
    let report = w.fence(&full).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    assert_eq!(count(&w, &format!("GetNodeLease {NODE}")), 0);
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");

    // With room, the same Node is marked.
    let room = Policy {
        max_out_of_service: 2,
        ..full
    };
    let report = w.fence(&room).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 1);
}

/// Without a recorded stop, without a Lease, with a Lease never renewed,
/// or with the setting off: today's wait, unchanged, and the Node fenced
/// once the node controller marks it.
#[tokio::test]
async fn fast_not_ready_without_the_proof_waits_for_the_node_controller_as_before() {
    let stop = now() - 20;
    let cases = [
        (
            "no stop time",
            fast(),
            None,
            KubeletLease::RenewedAt(stop - 30),
        ),
        ("no lease", fast(), Some(stop), KubeletLease::Missing),
        (
            "never renewed",
            fast(),
            Some(stop),
            KubeletLease::NeverRenewed,
        ),
        (
            "the setting off",
            Policy {
                fast_not_ready: false,
                ..fast()
            },
            Some(stop),
            KubeletLease::RenewedAt(stop - 30),
        ),
    ];
    for (name, policy, stopped_at, lease) in cases {
        let w = ready_on_a_stopped_machine(stopped_at, lease);
        w.cluster.not_ready_from_list(NODE, 4);
        let report = w.fence(&policy).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Fenced, "{name}");
        assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0, "{name}");
        assert!(count(&w, "ListNodes") >= 4, "{name}: waited");
        assert_eq!(
            w.cluster.ready_condition(NODE).unwrap().1,
            None,
            "{name}: the node controller's mark, not ours"
        );
        assert!(
            !w.cluster.events(NODE).contains(&"MarkedNotReady"),
            "{name}"
        );
        if !policy.fast_not_ready {
            assert_eq!(count(&w, &format!("GetNodeLease {NODE}")), 0, "{name}");
        }
    }
}

/// A writer between the read and the write: proven again and marked on
/// the next attempt.
#[tokio::test]
async fn fast_not_ready_a_conflicting_write_is_proven_again_and_retried() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    w.cluster.status_conflict_once(NODE);
    let report = w.fence(&fast()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 2);
    // Once in the decision, then before each write at admission.
    assert_eq!(count(&w, &format!("GetNodeLease {NODE}")), 3);
}

/// A dry run, and the kill switch, mark nothing.
#[tokio::test]
async fn fast_not_ready_a_dry_run_marks_nothing() {
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    let dry = Policy {
        dry_run: true,
        ..fast()
    };
    let report = w.fence(&dry).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert!(w.writes().is_empty(), "{:?}", w.writes());

    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30));
    w.cluster.set_kill_switch(KillSwitch::On);
    w.fence(&fast()).await.unwrap();
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");
}

/// EventBridge's `stopped` event for the seed machine, timed at `at`.
pub(super) fn stopped_event(w: &World, at: i64) -> Batch {
    Batch {
        suspects: vec![Suspect {
            target: NodeRef::Instance(w.instance(1)),
            intent: Intent::Fence,
            origin: Origin::Ec2StateChange {
                event_id: Some("stopped-event".into()),
                reported_state: "stopped".into(),
                reported_at: Some(at),
            },
        }],
        ..Batch::default()
    }
}

/// An ordinary stop: EC2 records when it was asked for, and the kubelet
/// renews through the guest's shutdown. The `stopped` event's time, when
/// the machine got there, proves the kubelet silent; without the event
/// the renewal is after the recorded stop and the Node waits.
#[tokio::test]
async fn fast_not_ready_a_graceful_stop_is_proven_by_the_stopped_events_time() {
    let asked = now() - 40;
    let renewed = KubeletLease::RenewedAt(asked + 15);
    let w = ready_on_a_stopped_machine(Some(asked), renewed);
    let report = w.run(&fast(), stopped_event(&w, asked + 30)).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "Unknown");
    assert_eq!(w.cluster.events(NODE)[0], "MarkedNotReady");

    let w = ready_on_a_stopped_machine(Some(asked), renewed);
    let report = w.fence(&short()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
}

/// The audit entry that ends a Compute Engine stop, timed at `at`.
fn stop_entry(w: &World, at: i64) -> Batch {
    Batch {
        suspects: vec![Suspect {
            target: NodeRef::Instance(w.instance(1)),
            intent: Intent::Fence,
            origin: Origin::AuditLog(AuditOrigin {
                method: "v1.compute.instances.stop".into(),
                insert_id: Some("stop-entry".into()),
                reported_at: Some(at),
                delivery: Delivery::Eventarc { id: None },
            }),
        }],
        ..Batch::default()
    }
}

/// The same on Compute Engine: the last audit entry of the `stop`, written
/// once the VM is down, proves a kubelet that renewed after the recorded
/// stop silent since.
#[tokio::test]
async fn fast_not_ready_a_graceful_stop_on_compute_engine_is_proven_by_the_audit_entry() {
    let asked = now() - 40;
    let renewed = KubeletLease::RenewedAt(asked + 15);
    let w = ready_on_a_stopped_machine_of(On::Gce, Some(asked), renewed);
    let report = w.run(&fast(), stop_entry(&w, asked + 30)).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "Unknown");
    assert_eq!(w.cluster.events(NODE)[0], "MarkedNotReady");

    let w = ready_on_a_stopped_machine_of(On::Gce, Some(asked), renewed);
    let report = w.fence(&short()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
}

/// An event timed after the handler's clock proves nothing: it would make
/// any renewal look earlier. The recorded stop alone is weighed.
#[tokio::test]
async fn fast_not_ready_an_event_timed_in_the_future_is_not_believed() {
    let asked = now() - 40;
    let w = ready_on_a_stopped_machine(Some(asked), KubeletLease::RenewedAt(asked + 15));
    let report = w
        .run(&short(), stopped_event(&w, now() + 3600))
        .await
        .unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
}

/// The seed node Ready on a machine EC2 stopped 8 s ago, its kubelet's
/// last renewal 6 s before that: 14 s ago by the apiserver's clock, so a
/// renewal is overdue (by the margin) in a second.
fn renewed_before_the_stop() -> World {
    let stop = now() - 8;
    ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 6))
}

/// Issue 58, item 1: a live kubelet whose last renewal fell 6 s before the
/// recorded stop (one serving the Node's name from another machine) was
/// marked and fenced at once. Now nothing is proven before its next
/// renewal is overdue, and the renewal, on time, is heard.
#[tokio::test]
async fn fast_not_ready_a_live_kubelet_is_heard_at_its_next_renewal_and_never_marked() {
    let w = renewed_before_the_stop();
    w.cluster.kubelet_renews_at_read(NODE, 2, now());
    let report = w.fence(&short_of(Duration::from_secs(3))).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.cluster.ready_condition(NODE).unwrap().0, "True");
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
    assert_eq!(count(&w, &format!("GetNodeLease {NODE}")), 2);
}

/// The same kubelet dead: its renewal never comes, and the Node is marked
/// once it is overdue by the margin on the apiserver's clock, then fenced;
/// not before.
#[tokio::test]
async fn fast_not_ready_a_dead_kubelet_is_marked_once_its_renewal_is_overdue() {
    let w = renewed_before_the_stop();
    let started = std::time::Instant::now();
    let report = w.fence(&fast()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(
        took >= Duration::from_millis(500),
        "not before the renewal is overdue: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "then at once: {took:?}");
    let (status, reason, message) = w.cluster.ready_condition(NODE).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("Unknown", Some(MARK_REASON))
    );
    let message = message.unwrap_or_default();
    assert!(message.contains("by the apiserver's clock"), "{message}");
    assert_eq!(w.cluster.events(NODE)[0], "MarkedNotReady");
}

/// Issue 58, item 1: a live kubelet whose clock runs 40 s behind stamps
/// `renewTime` 40 s early, long before the stop; the apiserver's time of
/// its last write, after the stop, is what it is heard by.
#[tokio::test]
async fn fast_not_ready_a_kubelet_whose_clock_runs_behind_is_never_marked() {
    let stop = now() - 3;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 38));
    w.cluster.kubelet_lease_read(
        NODE,
        LeaseRead {
            lease: KubeletLease::RenewedAt(stop - 38),
            version: Some("9".into()),
            written_at: Some(stop + 2),
            server_now: None,
            renew_every_secs: 10,
        },
    );
    let report = w.fence(&short()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    assert_eq!(count(&w, &format!("MarkNotReady {NODE}")), 0);
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert_eq!(w.cluster.events(NODE), ["KubeletHeardAfterStop"]);
}

/// Where the apiserver keeps no managed fields (before 1.18), the Lease
/// unchanged on node-fencer's own clock for a renewal interval and the
/// margin is the proof (the shortest cadence here, a second, so 6 s).
#[tokio::test]
async fn fast_not_ready_without_the_apiservers_time_node_fencers_clock_proves_it() {
    let stop = now() - 60;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::Missing);
    w.cluster.kubelet_lease_read(
        NODE,
        LeaseRead {
            lease: KubeletLease::RenewedAt(stop - 30),
            version: Some("3".into()),
            written_at: None,
            server_now: None,
            renew_every_secs: 1,
        },
    );
    let started = std::time::Instant::now();
    let report = w.fence(&fast()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let due = Duration::from_secs((1 + LATE_RENEWAL_MARGIN_SECS).unsigned_abs());
    assert!(started.elapsed() >= due, "{:?}", started.elapsed());
    let message = w
        .cluster
        .ready_condition(NODE)
        .unwrap()
        .2
        .unwrap_or_default();
    assert!(message.contains("node-fencer's own clock"), "{message}");
}

/// Issue 58, item 4: two machines stopped at once under a cap of 1, their
/// kubelets dead. Both are proven before either is fenced; the recount
/// under the Lease refuses one. That one was marked `Ready=Unknown` in the
/// decision, before the recount, and kept its dead pods as Ready
/// endpoints with no fencing after the mark (the node controller marks
/// pods NotReady only on a transition it sees itself). Now the mark comes
/// after the recount, right before the taint: a Node is marked only where
/// it is fenced.
#[tokio::test]
async fn fast_not_ready_a_node_the_recount_refuses_is_never_marked() {
    const OTHER: &str = "other";
    let stop = now() - 20;
    let w = ready_on_a_stopped_machine(Some(stop), KubeletLease::RenewedAt(stop - 30)).with_node(
        OTHER,
        2,
        InstanceState::Stopped,
        "True",
    );
    w.cloud
        .describe_as(&w.instance(2), |f| f.stopped_at = Some(stop));
    w.cluster
        .kubelet_lease(OTHER, KubeletLease::RenewedAt(stop - 30));
    // The delay before the second look lets both invocations decide
    // before either takes the Lease.
    let policy = Policy {
        max_out_of_service: 1,
        confirm_again_after: Duration::from_millis(200),
        ..fast()
    };
    let (first, second) = tokio::join!(
        w.run_as("first", &policy, batch(Intent::Fence, &[w.instance(1)])),
        w.run_as("second", &policy, batch(Intent::Fence, &[w.instance(2)])),
    );
    let reports = [first.unwrap(), second.unwrap()];
    let log = w.calls.log();
    let at = |call: &str| log.iter().position(|c| c.starts_with(call));
    let first_taint = at("TaintNode").expect("one Node fenced");
    for node in [NODE, OTHER] {
        let proven = at(&format!("GetNodeLease {node}")).expect("proven");
        assert!(proven < first_taint, "both decided first: {log:#?}");
    }
    let fenced: Vec<&str> = [NODE, OTHER]
        .into_iter()
        .filter(|n| w.out_of_service_taints(n) == 1)
        .collect();
    assert_eq!(fenced.len(), 1, "{reports:#?}");
    for node in [NODE, OTHER] {
        let ready = w.cluster.ready_condition(node).unwrap().0;
        if fenced.contains(&node) {
            assert_eq!(ready, "Unknown", "{node}");
        } else {
            assert_eq!(ready, "True", "{node}: not marked, not fenced");
            assert_eq!(count(&w, &format!("MarkNotReady {node}")), 0);
            assert!(!w.cluster.events(node).contains(&"MarkedNotReady"));
        }
    }
    let refused: Vec<_> = reports
        .iter()
        .flat_map(|r| &r.results)
        .filter_map(|r| r.skip.as_ref())
        .collect();
    assert!(
        matches!(refused[..], [Skip::CapReached { limit: 1, .. }]),
        "{refused:?}"
    );
}
