//! What one event costs, counted through the fault proxies (which here
//! inject nothing): an instance of another cluster of the account makes one
//! EC2 call and not a single request to the apiserver; one of this cluster,
//! with a census from a recent sweep, reads its Node by name and never
//! every Node, and the attachments its Node records by name, never every
//! attachment and volume of the cluster.

use aws_sdk_ec2::types::Tag;
use http::Method;
use node_fencer::core::inbound::suspect::Intent;
use node_fencer::core::model::kube_read::LABEL_FENCED;
use node_fencer::core::outbound::report::Outcome;
use node_fencer::core::rules::decide::Skip;
use node_fencer::core::rules::ownership::ClusterIdentity;
use node_fencer::core::rules::view::Census;
use node_fencer::core::settings::policy::Policy;
use node_fencer::shell::cluster::Coordination;
use node_fencer_tests::faults::Seen;
use node_fencer_tests::fixtures::*;
use node_fencer_tests::serial;

use crate::faults::{Faulty, faulty};
use crate::{by_instance, one};

#[tokio::test]
async fn another_clusters_instance_causes_no_apiserver_request() -> anyhow::Result<()> {
    let f = faulty().await?;
    let ec2 = f.stack.ec2().await;
    let tagged = launch(&ec2).await?;
    ec2.create_tags()
        .resources(&tagged.instance)
        .tags(
            Tag::builder()
                .key("kubernetes.io/cluster/staging")
                .value("owned")
                .build(),
        )
        .send()
        .await?;
    let elsewhere = launch(&ec2).await?;
    for m in [&tagged, &elsewhere] {
        stop(&ec2, m).await?;
    }
    let mut batch = one(by_instance(&tagged.instance), Intent::Fence);
    batch
        .suspects
        .extend(one(by_instance(&elsewhere.instance), Intent::Fence).suspects);
    let policy = Policy {
        identity: ClusterIdentity {
            name: Some("prod".into()),
            // Not moto's default VPC, where both run.
            vpc: Some("vpc-0123abcd".into()),
        },
        ..settings()
    };
    // The VPC tells first, whatever the tags say.
    let report = fence_with(&f.cloud, &f.cluster, batch.clone(), policy.clone()).await?;
    assert!(f.kube.seen().is_empty(), "{:?}", f.kube.seen());
    assert_eq!(f.ec2.ec2_calls("DescribeInstances"), 1);
    assert!(
        report
            .results
            .iter()
            .all(|r| matches!(r.skip, Some(Skip::OtherVpc { .. }))),
        "{report:#?}"
    );
    // Without the VPC, the tags: the untagged instance may be ours and is
    // looked up in Kubernetes (where no Node claims it).
    let by_name = Policy {
        identity: ClusterIdentity {
            name: Some("prod".into()),
            vpc: None,
        },
        ..settings()
    };
    let report = fence_with(&f.cloud, &f.cluster, batch, by_name).await?;
    let skips: Vec<_> = report.results.iter().map(|r| r.skip.clone()).collect();
    assert_eq!(
        skips,
        [
            Some(Skip::OtherCluster {
                cluster: "staging".into()
            }),
            Some(Skip::NotInCluster),
        ],
        "{report:#?}"
    );
    assert!(
        !f.kube.seen().is_empty(),
        "the untagged instance was looked up"
    );
    Ok(())
}

/// Fences `instance`'s Node through the proxies, as one event would.
async fn fenced(f: &Faulty, instance: &str) -> anyhow::Result<()> {
    let report = fence_with(
        &f.cloud,
        &f.cluster,
        one(by_instance(instance), Intent::Fence),
        settings(),
    )
    .await?;
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    Ok(())
}

/// The requests that read every object at `collection`: a list without a
/// label selector, other than the count's one-item page.
fn full_lists(seen: &[Seen], collection: &str) -> usize {
    seen.iter()
        .filter(|s| s.method == Method::GET)
        .filter(|s| {
            let (path, query) = s.path.split_once('?').unwrap_or((&s.path, ""));
            let count = query.split('&').any(|p| p == "limit=1");
            path == collection && !query.contains("labelSelector") && !count
        })
        .count()
}

fn full_node_lists(seen: &[Seen]) -> usize {
    full_lists(seen, "/api/v1/nodes")
}

const VOLUME_ATTACHMENTS: &str = "/apis/storage.k8s.io/v1/volumeattachments";
const PERSISTENT_VOLUMES: &str = "/api/v1/persistentvolumes";

/// Issue 19: with a census from a recent sweep, an event reads its Node by
/// name; a Node of that name whose provider id names another instance is not
/// trusted, and every Node is read instead.
#[tokio::test]
async fn an_event_reads_its_node_by_name_and_trusts_only_its_own() -> anyhow::Result<()> {
    let _serial = serial().await;
    let f = faulty().await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    f.cluster
        .write_census(
            &settings().control_namespace,
            &Census {
                others: room_taken(f.stack).await?,
                counted_at: now,
                shared: vec![],
            },
            "scale-tests",
        )
        .await?;
    let t = named_target(f.stack, None).await?;
    fenced(&f, &t.m.instance).await?;
    let seen = f.kube.seen();
    assert_eq!(full_node_lists(&seen), 0, "{seen:#?}");
    let by_name = format!("/api/v1/nodes/{}", t.node);
    assert!(
        seen.iter().any(|s| s.path.starts_with(&by_name)),
        "{seen:#?}"
    );
    // The Node records its volume: its attachment and volume are read by
    // name, and the volume is detached.
    assert_eq!(full_lists(&seen, VOLUME_ATTACHMENTS), 0, "{seen:#?}");
    assert_eq!(full_lists(&seen, PERSISTENT_VOLUMES), 0, "{seen:#?}");
    let attachment = format!(
        "{VOLUME_ATTACHMENTS}/{}",
        ebs_attachment_name(&t.volume, &t.node)
    );
    assert!(
        seen.iter().any(|s| s.path.starts_with(&attachment)),
        "{seen:#?}"
    );
    let ec2 = f.stack.ec2().await;
    assert_eq!(volume(&ec2, &t.volume).await?.1, Vec::<String>::new());
    let admin = f.stack.admin().await?;
    let node = get_node(&admin, &t.node).await?;
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get(LABEL_FENCED).map(String::as_str), Some("true"));

    // Another machine's Node carries this one's private DNS name.
    let other = launch(&ec2).await?;
    let twin = named_target(f.stack, Some(&other)).await?;
    let before = full_node_lists(&f.kube.seen());
    let report = fence_with(
        &f.cloud,
        &f.cluster,
        one(by_instance(&twin.m.instance), Intent::Fence),
        settings(),
    )
    .await?;
    assert_eq!(
        report.results[0].skip,
        Some(Skip::NotInCluster),
        "{report:#?}"
    );
    assert!(
        full_node_lists(&f.kube.seen()) > before,
        "read every Node instead"
    );
    assert!(!taints(&get_node(&admin, &twin.node).await?).contains(&OUT_OF_SERVICE.into()));
    Ok(())
}

/// Issue 19: an attachment read by name counts only if it names the Node
/// (an object of that name may say otherwise), and a Node that does not
/// record its volumes has its attachments found in the lists.
#[tokio::test]
async fn an_attachment_read_by_name_counts_only_if_it_names_the_node() -> anyhow::Result<()> {
    let _serial = serial().await;
    let f = faulty().await?;
    let admin = f.stack.admin().await?;
    let ec2 = f.stack.ec2().await;
    let t = named_target(f.stack, None).await?;
    // A second volume on the machine, recorded on the Node, whose attachment
    // of the expected name says it is another node's.
    let stray = attach_new_volume(&ec2, &t.m, "/dev/xvdbb").await?;
    let pv = unique("pv");
    create_pv(&admin, &pv, &stray).await?;
    let name = ebs_attachment_name(&stray, &t.node);
    create_va_named(&admin, &name, "another-node", &pv, "ebs.csi.aws.com").await?;
    record_volumes(&admin, &t.node, &[&t.volume, &stray]).await?;
    fenced(&f, &t.m.instance).await?;
    assert_eq!(full_lists(&f.kube.seen(), VOLUME_ATTACHMENTS), 0);
    assert_eq!(volume(&ec2, &t.volume).await?.1, Vec::<String>::new());
    assert_eq!(volume(&ec2, &stray).await?.1, vec![t.m.instance.clone()]);

    // Without the controller's annotation the Node's status says nothing:
    // its attachments are found in the list of all of them.
    let plain = target(f.stack, false).await?;
    let before = full_lists(&f.kube.seen(), VOLUME_ATTACHMENTS);
    fenced(&f, &plain.m.instance).await?;
    assert_eq!(full_lists(&f.kube.seen(), VOLUME_ATTACHMENTS), before + 1);
    assert_eq!(volume(&ec2, &plain.volume).await?.1, Vec::<String>::new());
    Ok(())
}
