//! `FAST_NOT_READY` against the controller stack: the real node lifecycle
//! controller (grace period 10 s, checked every 2 s), a real kubelet (the
//! hollow kubelet of [`node_fencer_tests::kubelet`], renewing its Lease
//! every 2 s, or at its default 10 s for a live kubelet) whose process
//! lives and dies with its machine, moto recording the stop. The pipeline runs in-process as the node-fencer group under
//! `infra/kubernetes/rbac.yaml`.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use node_fencer::core::inbound::suspect::{Intent, NodeRef};
use node_fencer::core::inbound::trigger::eventbridge;
use node_fencer::core::model::kube_read::ANNOTATION_MACHINE_SEEN_OFF;
use node_fencer::core::model::names::NodeName;
use node_fencer::core::outbound::report::Outcome;
use node_fencer::core::rules::decide::Skip;
use node_fencer::core::rules::silence::{
    LATE_RENEWAL_MARGIN_SECS, MARK_REASON, SKEW_MARGIN_SECS, lease,
};
use node_fencer::core::settings::policy::Policy;
use node_fencer_tests::cluster::{cluster_serial, cluster_stack};
use node_fencer_tests::fixtures::{
    NodeSpec, assert_node_events, create_node, fence, node_events, settings, start_instance, stop,
    unique,
};
use node_fencer_tests::kubelet::SkewedLease;
use node_fencer_tests::scene::{
    Hosts, Kubelets, Worker, add_workers_with, eventbridge_event, node_taints, ready, teardown,
    wait_until,
};

use crate::one;

/// The defaults (the setting on), with the wait the Lambda module
/// configures by default.
fn fast() -> Policy {
    Policy {
        not_ready_wait: Duration::from_secs(30),
        ..settings()
    }
}

/// One worker on an EC2 instance, its kubelet a real one.
async fn hollow_worker(scene: &str) -> anyhow::Result<Worker> {
    worker_of(scene, Kubelets::Real(0)).await
}

/// One worker on an EC2 instance, its kubelet as `kubelets` says.
async fn worker_of(scene: &str, kubelets: Kubelets) -> anyhow::Result<Worker> {
    let workers = add_workers_with(
        cluster_stack(),
        Hosts::Ec2,
        kubelets,
        &unique(scene),
        1,
        |_| false,
    )
    .await?;
    workers
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no worker"))
}

/// The worker's kubelet process.
fn kubelet(w: &Worker) -> anyhow::Result<&node_fencer_tests::kubelet::Kubelet> {
    w.kubelet
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("{} has no kubelet of its own", w.name))
}

/// Waits until the clock is past the Lease's last renewal by the margin
/// and by its next renewal overdue (a quarter of the Lease's duration and
/// the margin for a late one, a second more for the apiserver's rounding):
/// a stop recorded then comes after the kubelet's silence, and the proof
/// needs no wait.
async fn past_the_margin(admin: &Client, node: &str) -> anyhow::Result<()> {
    let last = renewed_at(admin, node).await?;
    let lease = Api::<Lease>::namespaced(admin.clone(), "kube-node-lease")
        .get(node)
        .await?;
    let every = lease::renew_every(lease.spec.and_then(|s| s.lease_duration_seconds));
    let due = SKEW_MARGIN_SECS.max(every + LATE_RENEWAL_MARGIN_SECS + 1);
    while now() <= last + due {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The Node's kubelet Lease's last renewal, in Unix seconds.
async fn renewed_at(admin: &Client, node: &str) -> anyhow::Result<i64> {
    let lease = Api::<Lease>::namespaced(admin.clone(), "kube-node-lease")
        .get(node)
        .await?;
    lease
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0.as_second())
        .ok_or_else(|| anyhow::anyhow!("the Lease of {node} was never renewed"))
}

/// The Node's `Ready` condition: status and reason.
async fn ready_condition(admin: &Client, node: &str) -> anyhow::Result<(String, Option<String>)> {
    let node = Api::<Node>::all(admin.clone()).get(node).await?;
    node.status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status, c.reason))
        .ok_or_else(|| anyhow::anyhow!("no Ready condition"))
}

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

fn by_name(node: &str) -> NodeRef {
    NodeRef::Name(NodeName::parse(node).expect("a node name"))
}

/// The machine stops and its kubelet dies with it, the stop recorded more
/// than the margin after the kubelet's last renewal, and the event comes at
/// the stop, long before the node controller's grace period is over: at the
/// default settings node-fencer marks the Node `Ready=Unknown` and fences it
/// at once. The node controller's own next passes leave the mark as it is
/// and add their `unreachable` taint. Then the machine comes back: the
/// kubelet, booted again, posts Ready over the mark itself, and the taint
/// goes only once the Node has been Ready for the settle delay.
#[tokio::test]
async fn a_dead_kubelets_node_is_marked_and_fenced_at_once_and_its_return_recovered()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let w = hollow_worker("fast").await?;
    let nodes = vec![w.name.clone()];
    let result = async {
        kubelet(&w)?.kill()?;
        past_the_margin(&admin, &w.name).await?;
        stop(&s.ec2().await, &w.machine).await?;
        assert_eq!(
            ready(&admin, &w.name).await?.as_deref(),
            Some("True"),
            "the node controller has not noticed yet"
        );
        let started = Instant::now();
        let report = fence(s, one(by_name(&w.name), Intent::Fence), fast()).await?;
        let took = started.elapsed();
        assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
        assert!(took < Duration::from_secs(3), "no wait: {took:?}");
        let (status, reason) = ready_condition(&admin, &w.name).await?;
        assert_eq!(status, "Unknown");
        assert_eq!(reason.as_deref(), Some(MARK_REASON));
        assert_node_events(&admin, &w.name, &["MarkedNotReady"]).await?;
        assert!(is_out_of_service(&admin, &w.name).await?, "tainted");

        // The node controller's grace period runs out (10 s after the last
        // renewal, seen within 2 s): it keeps the mark and adds its taint.
        wait_until(
            "the node controller's unreachable taint",
            Duration::from_secs(30),
            || async {
                let taints = node_taints(&admin, &w.name).await?;
                Ok(taints
                    .iter()
                    .any(|t| t.starts_with("node.kubernetes.io/unreachable"))
                    .then_some(()))
            },
        )
        .await?;
        let (status, reason) = ready_condition(&admin, &w.name).await?;
        assert_eq!(status, "Unknown");
        assert_eq!(reason.as_deref(), Some(MARK_REASON));

        machine_back(&w, &admin).await
    }
    .await;
    let _ = kubelet(&w).and_then(|k| k.kill());
    teardown(&admin, None, &nodes).await;
    result
}

/// The stop is undone and the kubelet boots again (a new boot id): it posts
/// Ready over node-fencer's mark, and the recovery takes the taint off only
/// once the Node has been Ready for `RECOVERY_SETTLE_SECONDS`.
async fn machine_back(w: &Worker, admin: &Client) -> anyhow::Result<()> {
    let s = cluster_stack();
    let boot_before = boot_id(admin, &w.name).await?;
    start_instance(&s.ec2().await, &w.machine).await?;
    kubelet(w)?.boot()?;
    wait_until(
        "the kubelet to post Ready",
        Duration::from_secs(30),
        || async { Ok((ready_condition(admin, &w.name).await?.0 == "True").then_some(())) },
    )
    .await?;
    let (_, reason) = ready_condition(admin, &w.name).await?;
    assert_ne!(reason.as_deref(), Some(MARK_REASON), "the kubelet's own");
    assert_ne!(boot_id(admin, &w.name).await?, boot_before, "a new boot");
    let settle = Duration::from_secs(4);
    let recover = Policy {
        recovery_settle: settle,
        ..fast()
    };
    let report = fence(s, one(by_name(&w.name), Intent::Recover), recover).await?;
    let ready_for = ready_since(admin, &w.name).await?;
    assert!(
        !report.incomplete(),
        "the recovery ends within the invocation: {report:#?}"
    );
    assert!(!is_out_of_service(admin, &w.name).await?, "{report:#?}");
    assert!(
        ready_for >= settle,
        "the taint came off after the Node was Ready for {ready_for:?}, not the {settle:?} asked"
    );
    assert_node_events(admin, &w.name, &["OutOfServiceTaintRemoved"]).await
}

async fn is_out_of_service(admin: &Client, node: &str) -> anyhow::Result<bool> {
    Ok(node_taints(admin, node)
        .await?
        .iter()
        .any(|t| t.starts_with("node.kubernetes.io/out-of-service")))
}

async fn boot_id(admin: &Client, node: &str) -> anyhow::Result<String> {
    let node = Api::<Node>::all(admin.clone()).get(node).await?;
    Ok(node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.boot_id)
        .unwrap_or_default())
}

/// How long the Node's `Ready=True` has held now.
async fn ready_since(admin: &Client, node: &str) -> anyhow::Result<Duration> {
    let node = Api::<Node>::all(admin.clone()).get(node).await?;
    let since = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time)
        .ok_or_else(|| anyhow::anyhow!("no Ready transition"))?;
    let held = k8s_openapi::jiff::Timestamp::now().duration_since(since.0);
    Ok(Duration::try_from(held).unwrap_or_default())
}

/// An ordinary stop: EC2 records the request while the kubelet still
/// renews its Lease through the shutdown, as a live kubelet whose machine
/// the cloud calls stopped does (a Node pointing at the wrong machine, an
/// event replayed). Heard after the recorded stop, the Node is never
/// marked nor fenced, a Warning Event says why, and the Node is left to the
/// node controller. Then the shutdown ends, the kubelet dies and the
/// instance gets to `stopped`: EventBridge's event, timed then, proves the
/// kubelet silent, and the Node is marked and fenced at once, before the
/// node controller's grace period is over.
#[tokio::test]
async fn a_kubelet_heard_after_the_stop_request_is_proven_silent_only_by_the_stopped_event()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let w = hollow_worker("heard").await?;
    let nodes = vec![w.name.clone()];
    let result = async {
        stop(&s.ec2().await, &w.machine).await?;
        let stopped = now();
        // The kubelet renews every 2 s: wait for a renewal after the stop.
        wait_until(
            "a renewal after the stop",
            Duration::from_secs(10),
            || async { Ok((renewed_at(&admin, &w.name).await? > stopped).then_some(())) },
        )
        .await?;
        let short = Policy {
            not_ready_wait: Duration::from_secs(2),
            ..fast()
        };
        let report = fence(s, one(by_name(&w.name), Intent::Fence), short).await?;
        // The shutdown ends: the kubelet dies. At once, so that its last
        // renewal stays within the margin of node-fencer's sight of the
        // machine off, noted on the Node just now: a later one would be a
        // kubelet on another machine.
        kubelet(&w)?.kill()?;
        assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
        let (status, reason) = ready_condition(&admin, &w.name).await?;
        assert_eq!(status, "True");
        assert_ne!(reason.as_deref(), Some(MARK_REASON));
        let annotations = Api::<Node>::all(admin.clone())
            .get(&w.name)
            .await?
            .metadata
            .annotations
            .unwrap_or_default();
        let note = annotations.get(ANNOTATION_MACHINE_SEEN_OFF);
        assert!(
            note.is_some_and(|n| n.starts_with(&format!("{} ", w.machine.instance))),
            "the machine seen off is noted: {annotations:?}"
        );
        let events: Vec<String> = node_events(&admin, &w.name)
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert!(
            events.iter().any(|r| r == "KubeletHeardAfterStop"),
            "{events:?}"
        );
        assert!(!events.iter().any(|r| r == "MarkedNotReady"), "{events:?}");
        assert!(!is_out_of_service(&admin, &w.name).await?, "not tainted");

        // The `stopped` event comes more than the margin after the
        // kubelet's last renewal.
        past_the_margin(&admin, &w.name).await?;
        let event = eventbridge::parse(eventbridge_event(&w.machine.instance, "stopped"))?;
        let started = Instant::now();
        let report = fence(s, event, fast()).await?;
        let took = started.elapsed();
        assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
        assert!(took < Duration::from_secs(3), "no wait: {took:?}");
        let (status, reason) = ready_condition(&admin, &w.name).await?;
        assert_eq!(status, "Unknown");
        assert_eq!(
            reason.as_deref(),
            Some(MARK_REASON),
            "marked by node-fencer"
        );
        anyhow::Ok(())
    }
    .await;
    let _ = kubelet(&w).and_then(|k| k.kill());
    teardown(&admin, None, &nodes).await;
    result
}

/// One worker on an EC2 instance whose kubelet is a real one at the
/// kubelet's default Lease (renewed every 10 s), posting its status every
/// 2 s so that the stack's 10 s grace period never finds it late.
async fn live_worker(scene: &str) -> anyhow::Result<Worker> {
    worker_of(scene, Kubelets::DefaultLease(0)).await
}

/// Waits for the Node's kubelet to renew its Lease (its resourceVersion
/// changes) and returns when that was seen, on this clock.
async fn next_renewal(admin: &Client, node: &str) -> anyhow::Result<Instant> {
    let leases = Api::<Lease>::namespaced(admin.clone(), "kube-node-lease");
    let version = |l: &Lease| l.metadata.resource_version.clone();
    let before = version(&leases.get(node).await?);
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if version(&leases.get(node).await?) != before {
            return Ok(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the kubelet of {node} did not renew its Lease within 30 s")
}

/// Nothing of node-fencer's fast path on the Node: still Ready by its own
/// kubelet, no mark, no taint, and the contradiction reported.
async fn assert_not_marked(admin: &Client, node: &str, at: &str) -> anyhow::Result<()> {
    let (status, reason) = ready_condition(admin, node).await?;
    assert_eq!(status, "True", "{at}");
    assert_ne!(reason.as_deref(), Some(MARK_REASON), "{at}");
    assert!(!is_out_of_service(admin, node).await?, "{at}: not tainted");
    let events: Vec<String> = node_events(admin, node)
        .await?
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(
        !events.iter().any(|r| r == "MarkedNotReady"),
        "{at}: {events:?}"
    );
    assert!(
        events.iter().any(|r| r == "KubeletHeardAfterStop"),
        "{at}: {events:?}"
    );
    Ok(())
}

/// Issue 58, item 1: a live kubelet at its default renewal (every 10 s)
/// serving a Node whose providerID's machine the cloud calls stopped (a
/// kubelet on another machine, a replacement that took over the name). The
/// stop comes 2, 6 and 9 s into its renewal cycle, with EventBridge's
/// `stopped` event at once, at the default settings: the Node is never
/// marked nor fenced, whatever the phase. Before the proof asked for a
/// missed renewal, a stop 5 s or more after a renewal was fenced within a
/// second.
#[tokio::test]
async fn a_live_kubelet_at_its_default_renewal_is_never_marked_at_any_phase_of_its_cycle()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let w = live_worker("live").await?;
    let nodes = vec![w.name.clone()];
    let ec2 = s.ec2().await;
    let result = async {
        wait_until(
            "the kubelet's Node Ready",
            Duration::from_secs(60),
            || async {
                Ok((ready(&admin, &w.name).await?.as_deref() == Some("True")).then_some(()))
            },
        )
        .await?;
        for phase in [2, 6, 9] {
            let at = format!("a stop {phase} s after a renewal");
            let renewed = next_renewal(&admin, &w.name).await?;
            tokio::time::sleep_until((renewed + Duration::from_secs(phase)).into()).await;
            stop(&ec2, &w.machine).await?;
            let event = eventbridge::parse(eventbridge_event(&w.machine.instance, "stopped"))?;
            // Long enough that a dead kubelet's Node would be marked within
            // it: 15 s after its last renewal at the latest, so `15 - phase`
            // s after the stop, and two more.
            let wait = Policy {
                not_ready_wait: Duration::from_secs(17 - phase),
                ..fast()
            };
            let report = fence(s, event, wait).await?;
            assert_eq!(
                report.results[0].skip,
                Some(Skip::NodeReady),
                "{at}: {report:#?}"
            );
            assert_not_marked(&admin, &w.name, &at).await?;
            start_instance(&ec2, &w.machine).await?;
        }
        anyhow::Ok(())
    }
    .await;
    let _ = kubelet(&w).and_then(|k| k.kill());
    teardown(&admin, None, &nodes).await;
    result
}

/// Issue 58, item 1: a live kubelet whose clock runs 40 s behind stamps
/// each renewal 40 s early, so its `renewTime` falls before any stop. The
/// real kubelet's clock cannot be set back here, so the test writes its
/// Lease as such a kubelet does, every 2 s (an 8 s Lease), on a Node it
/// registered; the apiserver times each write on its own clock. At the
/// default settings the Node is never marked nor fenced.
#[tokio::test]
async fn a_live_kubelet_whose_clock_runs_behind_is_never_marked() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let ec2 = s.ec2().await;
    let machine = node_fencer_tests::fixtures::launch(&ec2).await?;
    let spec = NodeSpec {
        ready: "True",
        taints: Vec::new(),
        ..NodeSpec::for_machine(&machine)
    };
    create_node(&admin, &spec).await?;
    let nodes = vec![spec.name.clone()];
    let kubelet = SkewedLease::start(&admin, &spec.name, Duration::from_secs(40)).await?;
    let result = async {
        stop(&ec2, &machine).await?;
        let event = eventbridge::parse(eventbridge_event(&machine.instance, "stopped"))?;
        let wait = Policy {
            not_ready_wait: Duration::from_secs(8),
            ..fast()
        };
        let report = fence(s, event, wait).await?;
        assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
        assert_not_marked(&admin, &spec.name, "a kubelet 40 s behind").await
    }
    .await;
    drop(kubelet);
    teardown(&admin, None, &nodes).await;
    result
}
