//! The notifications through the real binary under `cargo lambda watch`:
//! to SNS on moto, read back from an SQS queue subscribed to the topic; and
//! to Pub/Sub, the publish method of the fake Compute Engine's server
//! (`tests/gce/fake_pubsub.py`), with the Compute Engine build. A topic that
//! fails never fails the fencing, and is counted.

use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;
use node_fencer_tests::fixtures::*;
use node_fencer_tests::gce::fake_compute_on;
use node_fencer_tests::lambda::{Emulator, start_emulator, start_gce_emulator};
use node_fencer_tests::{serial, stack};
use serde_json::{Value, json};

/// Fences `node` with a direct invocation; the report, which must say
/// `fenced`.
fn fence(emu: &Emulator, node: &str) -> anyhow::Result<Value> {
    let out = emu.invoke(&json!({"action": "fence", "node": node}))?;
    anyhow::ensure!(!out.error, "the invocation failed: {}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    Ok(report)
}

/// What every fencing message of `target` says, whatever the cloud.
fn assert_fencing(notice: &Value, t: &Target, report: &Value) {
    assert_eq!(notice["schema"], "node-fencer.io/notice/v1", "{notice:#}");
    assert_eq!(notice["kind"], "fencing", "{notice:#}");
    assert_eq!(notice["outcome"], "fenced", "{notice:#}");
    assert_eq!(notice["node"], json!(t.node), "{notice:#}");
    assert_eq!(notice["machine"]["id"], json!(t.m.instance), "{notice:#}");
    assert_eq!(notice["dry_run"], false, "{notice:#}");
    assert_eq!(notice["done"]["taint_applied"], true, "{notice:#}");
    assert_eq!(
        notice["done"]["volumes_detached"],
        json!([t.volume]),
        "{notice:#}"
    );
    assert_eq!(notice["evidence"]["triggers"][0]["kind"], "direct");
    assert_eq!(notice["correlation_id"], report["correlation_id"]);
}

/// The count of failed calls to `dependency` in an invocation's metrics.
fn errors_counted(emu: &Emulator, report: &Value, dependency: &str) -> anyhow::Result<Value> {
    let id = report["correlation_id"].as_str().unwrap_or_default();
    let lines = emu.metric_lines(id)?;
    Ok(lines
        .iter()
        .find(|l| l["Dependency"] == dependency)
        .map_or(Value::Null, |l| l["Errors"].clone()))
}

#[tokio::test]
async fn a_fencing_is_told_on_sns_and_a_dead_topic_fails_nothing() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let config = s.sdk_config().await;
    let sns = aws_sdk_sns::Client::new(&config);
    let sqs = aws_sdk_sqs::Client::new(&config);
    let topic = sns
        .create_topic()
        .name(unique("notices"))
        .send()
        .await?
        .topic_arn
        .context("no topic ARN")?;
    let queue = sqs
        .create_queue()
        .queue_name(unique("notices"))
        .send()
        .await?
        .queue_url
        .context("no queue URL")?;
    let arn = QueueAttributeName::QueueArn;
    let queue_arn = sqs
        .get_queue_attributes()
        .queue_url(&queue)
        .attribute_names(arn.clone())
        .send()
        .await?
        .attributes
        .and_then(|a| a.get(&arn).cloned())
        .context("no queue ARN")?;
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(&queue_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await?;
    let emu = start_emulator(s, &[("NOTIFY_TOPIC", &topic)])?;

    let t = target(s, false).await?;
    let report = fence(&emu, &t.node)?;
    let mut received = Vec::new();
    for _ in 0..10 {
        let got = sqs
            .receive_message()
            .queue_url(&queue)
            .wait_time_seconds(1)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .send()
            .await?;
        received.extend(got.messages.unwrap_or_default());
        if !received.is_empty() {
            break;
        }
    }
    assert_eq!(received.len(), 1, "one message: {received:#?}");
    let body = received[0].body.as_deref().unwrap_or_default();
    let notice: Value = serde_json::from_str(body).with_context(|| body.to_owned())?;
    assert_fencing(&notice, &t, &report);
    assert_eq!(notice["machine"]["cloud"], "aws", "{notice:#}");
    let kind = received[0]
        .message_attributes
        .as_ref()
        .and_then(|a| a.get("kind"))
        .and_then(|v| v.string_value.as_deref());
    assert_eq!(kind, Some("fencing"), "{received:#?}");
    assert_eq!(errors_counted(&emu, &report, "SNS")?, Value::Null);

    // The topic is gone: the next fencing is still done, and the failure
    // is counted.
    sns.delete_topic().topic_arn(&topic).send().await?;
    let other = target(s, false).await?;
    let report = fence(&emu, &other.node)?;
    assert_eq!(errors_counted(&emu, &report, "SNS")?, 1, "{report:#}");
    Ok(())
}

#[tokio::test]
async fn a_fencing_is_told_on_pub_sub_and_retried_through_a_fault() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let fake = fake_compute_on(s);
    let compute = fake.client();
    let topic = compute.create_topic(&unique("notices")).await?;
    let endpoint = fake.endpoint();
    let emu = start_gce_emulator(
        s,
        &[("NOTIFY_TOPIC", &topic), ("PUBSUB_ENDPOINT", &endpoint)],
    )?;

    let t = gce_target(s, &compute, false).await?;
    // Pub/Sub answers the first publish 503: the retry sends it.
    compute.inject_publish_fault(503, 1).await?;
    let report = fence(&emu, &t.node)?;
    let published = compute.published(&topic).await?;
    assert_eq!(published.len(), 1, "{published:#?}");
    let text = published[0]["text"].as_str().unwrap_or_default();
    let notice: Value = serde_json::from_str(text).with_context(|| text.to_owned())?;
    assert_fencing(&notice, &t, &report);
    assert_eq!(notice["machine"]["cloud"], "gce", "{notice:#}");
    assert_eq!(published[0]["attributes"]["kind"], "fencing");
    assert_eq!(
        published[0]["attributes"]["schema"],
        "node-fencer.io/notice/v1"
    );
    assert_eq!(errors_counted(&emu, &report, "PubSub")?, Value::Null);

    // Pub/Sub answers 503 to every attempt: the fencing is done, the
    // failure counted, nothing published.
    compute.inject_publish_fault(503, 3).await?;
    let other = gce_target(s, &compute, false).await?;
    let report = fence(&emu, &other.node)?;
    assert_eq!(errors_counted(&emu, &report, "PubSub")?, 1, "{report:#}");
    assert_eq!(compute.published(&topic).await?.len(), 1);
    Ok(())
}
