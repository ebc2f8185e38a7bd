//! The real binary under the Lambda runtime emulator (`cargo lambda watch`),
//! driven by the events EventBridge and Alertmanager send, against moto and
//! the API server, under the node-fencer ClusterRole.

use node_fencer_tests::fixtures::*;
use node_fencer_tests::lambda::{WEBHOOK_TOKEN, emulator};
use node_fencer_tests::{repo_root, serial, stack};
use serde_json::{Value, json};

fn fixture(name: &str) -> Value {
    let path = repo_root().join("handler/tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A stopped machine with one CSI volume, and its silent Node.
async fn stopped_node() -> anyhow::Result<(Machine, String, String)> {
    let s = stack();
    let ec2 = s.ec2().await;
    let admin = s.admin().await?;
    let m = launch(&ec2).await?;
    let vol = attach_new_volume(&ec2, &m, "/dev/xvdba").await?;
    stop(&ec2, &m).await?;
    let spec = NodeSpec::for_machine(&m);
    create_node(&admin, &spec).await?;
    let pv = unique("pv");
    create_pv(&admin, &pv, &vol).await?;
    create_va(&admin, &spec.name, &pv, "ebs.csi.aws.com").await?;
    Ok((m, spec.name, vol))
}

#[tokio::test]
async fn eventbridge_stopped_event_fences_through_the_runtime() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (m, node, vol) = stopped_node().await?;
    let mut event = fixture("eventbridge-ec2-stopped.json");
    event["detail"]["instance-id"] = json!(m.instance);
    let out = emulator(s).invoke(&event)?;
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert_eq!(report["results"][0]["node"], json!(node));
    assert!(taints(&get_node(&s.admin().await?, &node).await?).contains(&OUT_OF_SERVICE.into()));
    assert_eq!(volume(&s.ec2().await, &vol).await?.0, "available");

    // Its CloudWatch metrics, as EMF lines on stdout.
    let correlation_id = report["correlation_id"].as_str().unwrap_or_default();
    let metrics = emulator(s).metric_lines(correlation_id)?;
    let with = |key: &str, value: &str| -> Vec<&Value> {
        metrics.iter().filter(|l| l[key] == json!(value)).collect()
    };
    assert_eq!(
        with("Trigger", "ec2_state_change")[0]["Suspects"],
        1,
        "{metrics:#?}"
    );
    let decision = with("Outcome", "fenced");
    assert_eq!(decision[0]["Reason"], "fenced", "{metrics:#?}");
    assert_eq!(decision[0]["Decisions"], 1, "{metrics:#?}");
    assert!(
        with("Dependency", "EC2").is_empty(),
        "no failed call: {metrics:#?}"
    );
    let total: Vec<&Value> = metrics
        .iter()
        .filter(|l| l.get("VolumesDetached").is_some())
        .collect();
    assert_eq!(total.len(), 1, "{metrics:#?}");
    assert_eq!(total[0]["VolumesDetached"], 1);
    for (stage, samples) in [
        // confirm, re-confirm before the taint, before the pods, and once
        // more before the node's first detach
        ("ConfirmLatency", 4),
        ("TaintLatency", 1),
        ("DetachLatency", 1),
        ("VerifyLatency", 1),
    ] {
        assert_eq!(
            total[0][stage].as_array().map(Vec::len),
            Some(samples),
            "{stage}: {metrics:#?}"
        );
    }
    assert_eq!(
        total[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        "NodeFencer"
    );

    // The same event again (a Lambda retry): same end state, still a success.
    let again = emulator(s).invoke(&event)?;
    assert!(!again.error, "{}", again.output);
    let report: Value = serde_json::from_str(&again.output)?;
    assert_eq!(report["results"][0]["outcome"], "already_fenced");
    Ok(())
}

#[tokio::test]
async fn alertmanager_through_the_function_url() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (_m, node, vol) = stopped_node().await?;
    let mut payload = fixture("alertmanager-v4.json");
    payload["alerts"][0]["labels"]["node"] = json!(node);
    let body = payload.to_string();
    let emu = emulator(s);

    // Refused requests change nothing.
    for auth in [
        None,
        Some("Bearer wrong-token-0123456789".to_owned()),
        Some(format!("Basic {WEBHOOK_TOKEN}")),
    ] {
        let (status, text) = emu.post_function_url(&body, auth.as_deref())?;
        assert_eq!(status, 401, "{auth:?}: {text}");
        assert!(!text.contains(WEBHOOK_TOKEN));
    }
    let (status, _) =
        emu.post_function_url("{not json", Some(&format!("Bearer {WEBHOOK_TOKEN}")))?;
    assert_eq!(status, 400);
    assert!(!taints(&get_node(&s.admin().await?, &node).await?).contains(&OUT_OF_SERVICE.into()));

    let (status, text) = emu.post_function_url(&body, Some(&format!("Bearer {WEBHOOK_TOKEN}")))?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    let ours = report["results"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["node"] == json!(node)))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ours["outcome"], "fenced", "{report:#}");
    assert_eq!(
        report["ignored"].as_array().map(Vec::len),
        Some(1),
        "the Watchdog alert"
    );
    assert!(taints(&get_node(&s.admin().await?, &node).await?).contains(&OUT_OF_SERVICE.into()));
    assert_eq!(volume(&s.ec2().await, &vol).await?.0, "available");

    // Neither the right token nor a wrong one ends up in the function's logs.
    let log = std::fs::read_to_string(&emu.log)?;
    assert!(log.contains("request refused"), "the refusals are logged");
    for secret in [WEBHOOK_TOKEN, "wrong-token-0123456789"] {
        assert!(
            !log.contains(secret),
            "{secret} appears in {}",
            emu.log.display()
        );
    }
    Ok(())
}

#[tokio::test]
async fn bad_events_are_errors_and_change_nothing() -> anyhow::Result<()> {
    let s = stack();
    let emu = emulator(s);
    for (event, expect) in [
        (json!({"hello": "world"}), "unrecognised event shape"),
        (json!({"action": "fence"}), "missing `node` or `instanceId`"),
        (
            json!({"detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2", "detail": {}}),
            "invalid",
        ),
        (json!([1, 2, 3]), "must be a JSON object"),
    ] {
        let out = emu.invoke(&event)?;
        assert!(out.error, "{event} should fail: {}", out.output);
        assert!(out.output.contains(expect), "{event}: {}", out.output);
    }
    Ok(())
}

/// Issue 21: the real Alertmanager, configured from the shipped example, as
/// the client of the Function URL. It routes only alerts with
/// `node_fencer="true"`, sends the token from its credentials file, and the
/// node named by `node` (not the `instance` label, kube-state-metrics'
/// address) is fenced. An alert that comes before the node is NotReady gets
/// 500 (work left undone) and Alertmanager delivers it again until it
/// converges. With a wrong token every delivery gets 401, changes nothing,
/// and Alertmanager counts the failed requests. A resolved notification is
/// delivered and answered.
#[tokio::test]
async fn a_real_alertmanager_fences_through_the_function_url() -> anyhow::Result<()> {
    use node_fencer_tests::alertmanager::{Alertmanager, FAILED_REQUESTS};
    use node_fencer_tests::scene::{is_fenced, wait_until};
    use std::time::Duration;

    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let emu = emulator(s);
    let url = format!("http://127.0.0.1:{}/lambda-url/node-fencer/", emu.port);
    let (routed, unrouted, refused, early) = (
        target(s, false).await?,
        target(s, false).await?,
        target(s, false).await?,
        target(s, false).await?,
    );
    let alert = |node: &str, routed: bool| {
        let mut labels = json!({
            "alertname": "KubeNodeNotReady",
            "node": node,
            "condition": "Ready",
            "status": "true",
            "instance": "10.0.7.12:8080",
            "job": "kube-state-metrics",
            "severity": "warning",
        });
        if routed {
            labels["node_fencer"] = json!("true");
        }
        json!({"labels": labels, "annotations": {"summary": "node not ready"}})
    };

    let am = Alertmanager::start(&url, WEBHOOK_TOKEN).await?;
    am.post_alerts(&json!([
        alert(&routed.node, true),
        alert(&unrouted.node, false)
    ]))?;
    wait_until(
        "the routed node fenced",
        Duration::from_secs(60),
        || async { Ok(is_fenced(&admin, &routed.node).await?.then_some(())) },
    )
    .await?;
    assert!(am.webhook_counter("alertmanager_notifications_total")? >= 1.0);
    assert_eq!(
        am.webhook_counter("alertmanager_notifications_failed_total")?,
        0.0
    );
    assert!(
        !is_fenced(&admin, &unrouted.node).await?,
        "no route, no fencing"
    );

    // The alert comes before Kubernetes marks the node NotReady: work left
    // undone, 500, and Alertmanager delivers again until the retry converges.
    set_ready(&admin, &early.node, "True").await?;
    am.post_alerts(&json!([alert(&early.node, true)]))?;
    am.wait_for_failed_request("a delivery answered 500")
        .await?;
    assert!(
        !is_fenced(&admin, &early.node).await?,
        "a Ready node is never fenced"
    );
    set_ready(&admin, &early.node, "Unknown").await?;
    wait_until(
        "the node fenced on a later delivery",
        Duration::from_secs(90),
        || async { Ok(is_fenced(&admin, &early.node).await?.then_some(())) },
    )
    .await?;

    let wrong = Alertmanager::start(&url, "wrong-token-0123456789abcdef").await?;
    wrong.post_alerts(&json!([alert(&refused.node, true)]))?;
    wrong
        .wait_for_failed_request("a delivery answered 401")
        .await?;
    assert!(
        !is_fenced(&admin, &refused.node).await?,
        "401 changes nothing"
    );
    assert_eq!(volume(&s.ec2().await, &refused.volume).await?.0, "in-use");

    // Resolved (`send_resolved: true`): delivered at the group's next flush,
    // within `group_interval` (1m), and answered 200; the machine is still
    // stopped, so the fencing stays. First the deliveries so far settle:
    // the routed and the early node's groups each answered 200 once (the
    // delivery that tainted a node may still have answered 500, work left
    // on a slow machine, and been sent again).
    wait_until(
        "the routed and early groups answered 200",
        Duration::from_secs(90),
        || async {
            let answered = am.webhook_counter("alertmanager_notification_requests_total")?
                - am.webhook_counter(FAILED_REQUESTS)?;
            Ok((answered >= 2.0).then_some(()))
        },
    )
    .await?;
    let (sent, failed) = (
        am.webhook_counter("alertmanager_notifications_total")?,
        am.webhook_counter(FAILED_REQUESTS)?,
    );
    let mut resolved = alert(&routed.node, true);
    resolved["endsAt"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
    am.post_alerts(&json!([resolved]))?;
    wait_until(
        "the resolved notification",
        Duration::from_secs(90),
        || async {
            Ok((am.webhook_counter("alertmanager_notifications_total")? > sent).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        am.webhook_counter(FAILED_REQUESTS)?,
        failed,
        "the resolved notification was answered 200"
    );
    assert!(
        is_fenced(&admin, &routed.node).await?,
        "still stopped: still fenced"
    );
    Ok(())
}
