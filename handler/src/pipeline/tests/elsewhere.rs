//! Issue 59, the simulator's stale Node: a kubelet on another machine
//! adopted a Node that names an old machine, now off. Heard after the
//! machine's recorded stop, the Node gets node-fencer's note that it saw the
//! machine off; a later write of its Lease, the machine not started since,
//! refuses every fencing of the Node.

use super::*;
use crate::core::model::facts::SeenOff;
use crate::core::model::kube_read::{ANNOTATION_MACHINE_SEEN_OFF, seen_off_value};
use crate::core::rules::silence::{KubeletLease, LeaseRead, SKEW_MARGIN_SECS};

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// The machine's last start, as EC2 records it (Unix seconds; fixed, so
/// that no second ticks between a test's two reads of the clock).
const LAUNCHED: i64 = 1_795_000_000;

/// The seed Node, `ready` as given, on a machine EC2 stopped `stopped_ago`
/// seconds ago and last started at [`LAUNCHED`].
fn on_a_stopped_machine(ready: &str, stopped_ago: i64) -> World {
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, ready);
    let now = now();
    w.cloud.describe_as(&w.instance(1), |f| {
        f.stopped_at = Some(now - stopped_ago);
        f.started_at = Some(LAUNCHED);
    });
    w
}

/// The kubelet's Lease last written at `at`, by the apiserver's clock.
fn lease_written_at(w: &World, at: i64) {
    w.cluster.kubelet_lease_read(
        NODE,
        LeaseRead {
            lease: KubeletLease::RenewedAt(at),
            version: Some("7".into()),
            written_at: Some(at),
            server_now: None,
            renew_every_secs: 10,
        },
    );
}

/// node-fencer's note on the seed Node that it saw machine 1 off at
/// `seen_at`, its last start then at `started_at`.
fn noted(w: &World, started_at: i64, seen_at: i64) {
    let note = SeenOff {
        machine: w.instance(1).as_str().to_owned(),
        started_at,
        at: seen_at,
    };
    w.cluster
        .annotate(NODE, ANNOTATION_MACHINE_SEEN_OFF, &seen_off_value(&note));
}

fn fast() -> Policy {
    Policy {
        fast_not_ready: true,
        not_ready_wait: Duration::from_millis(200),
        poll_interval: Duration::from_millis(10),
        ..policy()
    }
}

#[tokio::test]
async fn a_kubelet_heard_after_the_stop_gets_its_machine_noted_off() {
    let w = on_a_stopped_machine("True", 20);
    w.cluster
        .kubelet_lease(NODE, KubeletLease::RenewedAt(now() - 17));
    let before = now();
    let report = w.fence(&fast()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    let note = w.cluster.facts(NODE).unwrap().seen_off.expect("the note");
    assert_eq!(note.machine, w.instance(1).as_str());
    assert_eq!(note.started_at, LAUNCHED);
    assert!((before..=now()).contains(&note.at), "{note:?}");
    // Heard again on the retry: the first sight is kept.
    let report = w.fence(&fast()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    assert_eq!(w.cluster.facts(NODE).unwrap().seen_off, Some(note));
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

/// The seed case of the simulator (seed 1537): the kubelet elsewhere hangs,
/// the node controller marks the Node Unknown, and its machine is still off.
#[tokio::test]
async fn a_lease_written_after_the_note_refuses_the_fencing() {
    let w = on_a_stopped_machine("Unknown", 120);
    let seen = now() - 90;
    noted(&w, LAUNCHED, seen);
    lease_written_at(&w, seen + SKEW_MARGIN_SECS + 20);
    w.cluster.pod(NODE, "db-0");
    let report = w.fence(&policy()).await.unwrap();
    let skip = report.results[0].skip.clone();
    assert!(
        matches!(
            &skip,
            Some(Skip::KubeletElsewhere { seen_off_at, written_at, .. })
                if *seen_off_at == seen && *written_at == seen + SKEW_MARGIN_SECS + 20
        ),
        "{report:#?}"
    );
    assert!(!skip.unwrap().leaves_work(), "no retry can change it");
    w.assert_refused_untouched("Delete the Node");
}

/// The note refuses only where it proves something: a Lease written before
/// it (within the clocks' margin), or a machine started since, is fenced.
#[tokio::test]
async fn a_note_that_does_not_apply_fences_as_before() {
    let seen = now() - 90;
    for (started_at, written_at) in [
        (LAUNCHED, seen + SKEW_MARGIN_SECS),
        (LAUNCHED, seen - 30),
        (now() - 60, seen + 40),
    ] {
        let w = on_a_stopped_machine("Unknown", 30);
        noted(&w, LAUNCHED, seen);
        w.cloud
            .describe_as(&w.instance(1), |f| f.started_at = Some(started_at));
        lease_written_at(&w, written_at);
        let report = w.fence(&policy()).await.unwrap();
        assert_eq!(
            report.results[0].outcome,
            Outcome::Fenced,
            "{started_at} {written_at}: {report:#?}"
        );
    }
    // A Node without the note is fenced without reading the Lease.
    let w = on_a_stopped_machine("Unknown", 30);
    lease_written_at(&w, now() - 5);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(!w.called("GetNodeLease"), "{:?}", w.calls.log());
}

/// A Lease that cannot be read, on a Node whose note applies, is never
/// taken for a dead kubelet: the Node waits for the retry.
#[tokio::test]
async fn a_lease_that_cannot_be_read_leaves_a_noted_node_for_the_retry() {
    let world = || {
        let w = on_a_stopped_machine("Unknown", 120);
        noted(&w, LAUNCHED, now() - 90);
        lease_written_at(&w, now() - 100);
        w
    };
    a_failed_call_leaves_the_node_for_the_retry(world, "GetNodeLease").await;
}

/// The simulator's seed 1488 (a kubelet serving the Node's name by an
/// override): the adopting kubelet renewed after the machine's `stopped`
/// event, was heard once with the Node still Ready, and died before the
/// next look. Noted from the sight alone, its last write came before the
/// note and the Node was fenced while that kubelet's machine ran on; the
/// note is dated from the event's time, when the machine got there.
#[tokio::test]
async fn a_kubelet_quiet_since_it_was_heard_is_refused_by_the_events_time() {
    let w = on_a_stopped_machine("True", 125);
    let stopped = now() - 120;
    let written = stopped + SKEW_MARGIN_SECS + 60;
    lease_written_at(&w, written);
    let event = super::hasten::stopped_event(&w, stopped);
    let report = w.run(&fast(), event).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
    let note = w.cluster.facts(NODE).unwrap().seen_off.expect("the note");
    assert_eq!(note.at, stopped, "{note:?}");

    w.cluster.set_ready(NODE, "Unknown");
    w.cluster.pod(NODE, "db-0");
    let report = w.fence(&policy()).await.unwrap();
    assert!(
        matches!(
            &report.results[0].skip,
            Some(Skip::KubeletElsewhere { seen_off_at, written_at, .. })
                if *seen_off_at == stopped && *written_at == written
        ),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert_eq!(w.cluster.pods(NODE), 1, "its pods left running");
    assert!(!w.called("DetachVolume"), "{:?}", w.calls.log());
    assert_eq!(
        w.cluster.events(NODE),
        ["KubeletHeardAfterStop", "FencingRefused"]
    );
}
