//! The screen: another cluster's machine costs one cloud call and no Kubernetes request.

use super::*;

/// Issue 19: every cluster of the account hears of every instance.
#[tokio::test]
async fn another_clusters_instance_costs_one_ec2_call_and_no_kubernetes_request() {
    let w = World::stopped().with_node(
        "ip-10-0-9-9.ec2.internal",
        2,
        InstanceState::Stopped,
        "Unknown",
    );
    w.cloud.describe_as(&instance(1), |f| {
        f.tags = vec![("eks:cluster-name".into(), "staging".into())];
    });
    w.cloud
        .describe_as(&instance(2), |f| f.vpc_id = Some("vpc-99999999".into()));
    let ours = identified();
    let report = w
        .run(&ours, batch(Intent::Fence, &[instance(1), instance(2)]))
        .await
        .unwrap();
    assert_eq!(w.calls.log(), ["DescribeInstances"]);
    let skips: Vec<_> = report.results.iter().map(|r| r.skip.clone()).collect();
    assert_eq!(
        skips,
        [
            Some(Skip::OtherCluster {
                cluster: "staging".into()
            }),
            Some(Skip::OtherVpc {
                vpc: "vpc-99999999".into()
            }),
        ]
    );
    assert!(!report.incomplete(), "nothing for a retry to do");
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

#[tokio::test]
async fn with_an_identity_this_clusters_instance_is_fenced_and_asked_about_no_more_often() {
    let plain = World::stopped();
    let report = plain.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced);
    let w = World::stopped().with_node(
        "ip-10-0-9-9.ec2.internal",
        2,
        InstanceState::Stopped,
        "Unknown",
    );
    w.cloud.describe_as(&instance(1), |f| {
        f.tags = vec![("kubernetes.io/cluster/prod".into(), "owned".into())];
        f.vpc_id = Some("vpc-0123abcd".into());
    });
    w.cloud.describe_as(&instance(2), |f| {
        f.tags = vec![("kubernetes.io/cluster/staging".into(), "owned".into())];
    });
    let ours = identified();
    let report = w
        .run(&ours, batch(Intent::Fence, &[instance(2), instance(1)]))
        .await
        .unwrap();
    let fenced: Vec<_> = report
        .results
        .iter()
        .map(|r| (r.node.clone(), r.outcome))
        .collect();
    assert_eq!(
        fenced,
        [
            (None, Outcome::Skipped),
            (Some(NODE.into()), Outcome::Fenced)
        ],
        "{report:#?}"
    );
    assert_eq!(w.calls.log()[0], "DescribeInstances", "screened first");
    assert_eq!(
        w.describes(),
        plain.describes(),
        "the screen's answer is the first confirmation"
    );
    assert_eq!(w.out_of_service_taints("ip-10-0-9-9.ec2.internal"), 0);
}
