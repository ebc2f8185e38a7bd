//! Issue 39, `FAST_NOT_READY`, against the controller stack: the real node
//! lifecycle controller (grace period 10 s, checked every 2 s), kwok
//! renewing each Node's Lease as its kubelet would, moto recording the
//! stop. The pipeline runs in-process as the node-fencer group under
//! `infra/kubernetes/rbac.yaml`.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use node_fencer::core::inbound::suspect::{Intent, NodeRef};
use node_fencer::core::inbound::trigger::eventbridge;
use node_fencer::core::model::names::NodeName;
use node_fencer::core::outbound::report::Outcome;
use node_fencer::core::rules::decide::Skip;
use node_fencer::core::rules::silence::{MARK_REASON, SKEW_MARGIN_SECS};
use node_fencer::core::settings::policy::Policy;
use node_fencer_tests::cluster::{cluster_serial, cluster_stack};
use node_fencer_tests::fixtures::{assert_node_events, fence, node_events, settings, stop, unique};
use node_fencer_tests::scene::{
    add_workers, eventbridge_event, node_taints, ready, stop_heartbeats, teardown,
};

use crate::one;

/// The setting on, with the wait the Lambda module configures by default.
fn fast() -> Policy {
    Policy {
        fast_not_ready: true,
        not_ready_wait: Duration::from_secs(30),
        ..settings()
    }
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

/// The kubelet's Lease stops being renewed, the machine stops more than
/// the margin later, and the event comes at the stop, long before the
/// node controller's grace period is over: node-fencer marks the Node
/// `Ready=Unknown` and fences it at once. The node controller's own next
/// passes leave the mark as it is and add their `unreachable` taint.
#[tokio::test]
async fn fast_not_ready_marks_and_fences_a_silent_kubelets_node_before_the_grace_period()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let workers = add_workers(s, &unique("fast"), 1, |_| false).await?;
    let w = &workers[0];
    let nodes = vec![w.name.clone()];
    let result = async {
        stop_heartbeats(&admin, &w.name).await?;
        let last = renewed_at(&admin, &w.name).await?;
        // The stop comes more than the margin after the last renewal.
        let stop_from = last + SKEW_MARGIN_SECS + 1;
        while now() < stop_from {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
        assert!(
            node_taints(&admin, &w.name)
                .await?
                .iter()
                .any(|t| t.starts_with("node.kubernetes.io/out-of-service")),
            "tainted"
        );

        // The node controller's grace period runs out (10 s after the last
        // renewal, seen within 2 s): it keeps the mark and adds its taint.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let taints = node_taints(&admin, &w.name).await?;
            if taints
                .iter()
                .any(|t| t.starts_with("node.kubernetes.io/unreachable"))
            {
                break;
            }
            anyhow::ensure!(
                Instant::now() < until,
                "the node controller never added its unreachable taint: {taints:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // A pass past the grace period changes nothing of the condition.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (status, reason) = ready_condition(&admin, &w.name).await?;
        assert_eq!(status, "Unknown");
        assert_eq!(reason.as_deref(), Some(MARK_REASON));
        anyhow::Ok(())
    }
    .await;
    teardown(&admin, None, &nodes).await;
    result
}

/// An ordinary stop: EC2 records the request while the kubelet still
/// renews its Lease (kwok keeps renewing it through the "shutdown"). Heard
/// after the recorded stop, the Node is not marked, a Warning Event says
/// why, and the Node is left to the node controller. Then the kubelet falls
/// silent and the instance gets to `stopped`: EventBridge's event, timed
/// then, proves the kubelet silent, and the Node is marked and fenced at
/// once, before the node controller's grace period is over.
#[tokio::test]
async fn fast_not_ready_a_kubelet_heard_after_the_stop_request_is_proven_by_the_stopped_event()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let workers = add_workers(s, &unique("heard"), 1, |_| false).await?;
    let w = &workers[0];
    let nodes = vec![w.name.clone()];
    let result = async {
        stop(&s.ec2().await, &w.machine).await?;
        let stopped = now();
        // kwok renews every 2 s: wait for a renewal after the stop.
        let until = Instant::now() + Duration::from_secs(10);
        while renewed_at(&admin, &w.name).await? <= stopped {
            anyhow::ensure!(Instant::now() < until, "kwok renewed nothing");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let short = Policy {
            not_ready_wait: Duration::from_secs(2),
            ..fast()
        };
        let report = fence(s, one(by_name(&w.name), Intent::Fence), short).await?;
        assert_eq!(report.results[0].skip, Some(Skip::NodeReady), "{report:#?}");
        let (status, reason) = ready_condition(&admin, &w.name).await?;
        assert_eq!(status, "True");
        assert_ne!(reason.as_deref(), Some(MARK_REASON));
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
        assert!(
            !node_taints(&admin, &w.name)
                .await?
                .iter()
                .any(|t| t.starts_with("node.kubernetes.io/out-of-service")),
            "not tainted"
        );

        // The shutdown ends: the kubelet falls silent, and the `stopped`
        // event comes more than the margin after its last renewal.
        stop_heartbeats(&admin, &w.name).await?;
        let last = renewed_at(&admin, &w.name).await?;
        while now() <= last + SKEW_MARGIN_SECS {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
    teardown(&admin, None, &nodes).await;
    result
}
