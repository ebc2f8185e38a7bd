//! The survey: which Nodes an invocation reads (by name with a fresh census, all of them otherwise) and the sweep's census.

use super::*;

#[tokio::test]
async fn with_a_fresh_census_an_event_reads_its_node_by_name_and_never_every_node() {
    let w =
        World::stopped()
            .named(1, NODE)
            .with_node("bystander", 2, InstanceState::Running, "True");
    w.cluster.census(census(0));
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.lists(), 0, "{:?}", w.calls.log());
    let log = w.calls.log();
    let reads: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("GetNode") || *c == "ListFencedNodes" || *c == "GetCensus")
        .collect();
    assert_eq!(
        reads,
        [
            "GetCensus",
            &format!("GetNode {NODE}"),
            "ListFencedNodes",
            // Under the Lease, the recount reads them again.
            "GetCensus",
            &format!("GetNode {NODE}"),
            "ListFencedNodes",
        ]
    );
    // Fenced, so labelled: the next invocation counts it without a full list.
    let labelled = w.cluster.list_fenced_nodes().await.unwrap();
    assert_eq!(labelled.len(), 1);
    assert_eq!(labelled[0].name, NODE);
}

#[tokio::test]
async fn a_node_of_that_name_whose_provider_id_names_another_instance_is_not_trusted() {
    // Instance 1's private DNS name is the name of instance 2's Node (a
    // later instance at the same address, or another VPC).
    let w = World::new().with_node(NODE, 2, InstanceState::Stopped, "Unknown");
    w.cloud.instance(&instance(1), InstanceState::Stopped);
    let w = w.named(1, NODE);
    w.cluster.census(census(0));
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(
        report.results[0].skip,
        Some(Skip::NotInCluster),
        "{report:#?}"
    );
    assert_eq!(w.lists(), 1, "read every Node instead: {:?}", w.calls.log());
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

#[tokio::test]
async fn without_a_fresh_census_every_node_is_read() {
    for stale in [None, Some(20 * 60 + 5)] {
        let w = World::stopped().named(1, NODE);
        if let Some(age) = stale {
            let mut old = census(0);
            old.counted_at -= age;
            w.cluster.census(old);
        }
        let report = w.fence(&policy()).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Fenced);
        assert_eq!(w.lists(), 2, "{stale:?}: {:?}", w.calls.log());
        assert!(!w.calls.log().iter().any(|c| c.starts_with("GetNode")));
    }
}

#[tokio::test]
async fn a_partial_view_only_admits_a_refusal_is_decided_over_every_node() {
    let one = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    // The census counted a Node that has come back since: over every Node,
    // there is room.
    let w = World::stopped().named(1, NODE);
    w.cluster.census(census(1));
    let report = w.fence(&one).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(w.lists() >= 1, "decided again over every Node");
    // A Node tainted by hand, which the census counted: refused over every
    // Node too, as without a census.
    let w =
        World::stopped()
            .named(1, NODE)
            .with_node("by-hand", 2, InstanceState::Stopped, "False");
    w.cluster.taint_by_hand("by-hand");
    w.cluster.census(census(1));
    let report = w.fence(&one).await.unwrap();
    assert!(
        matches!(
            report.results[0].skip,
            Some(Skip::CapReached { limit: 1, .. })
        ),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

#[tokio::test]
async fn the_sweep_leaves_a_census_of_the_nodes_others_put_out_of_service() {
    let w = World::stopped()
        .with_node("by-hand", 2, InstanceState::Stopped, "False")
        .with_node("by-hand-dead", 3, InstanceState::Terminated, "False")
        .with_node("healthy", 4, InstanceState::Running, "True");
    w.cluster.taint_by_hand("by-hand");
    w.cluster.taint_by_hand("by-hand-dead");
    let sweep = Batch {
        sweep: true,
        ..Batch::default()
    };
    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    w.run(&dry, sweep.clone()).await.unwrap();
    assert_eq!(w.cluster.census_written(), None, "a dry run writes nothing");
    let report = w.run(&policy(), sweep).await.unwrap();
    let fenced: Vec<_> = report.results.iter().map(|r| r.outcome).collect();
    assert_eq!(fenced, [Outcome::Fenced], "{report:#?}");
    // Both Nodes tainted by hand count: the sweep knows nothing of their
    // machines when it counts, and a Node not known dead takes room.
    let left = w.cluster.census_written().expect("a census");
    assert_eq!(left.others, 2);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(left.fresh(now));
}

#[tokio::test]
async fn a_cluster_older_than_the_oldest_supported_is_refused_before_anything_is_read() {
    let w = World::stopped().named(1, NODE);
    w.cluster.set_version(1, 14);
    let err = w.fence(&policy()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Kubernetes 1.14 is older than 1.15, the oldest node-fencer supports: nothing was done"
    );
    let log = w.calls.log();
    assert!(
        !log.iter()
            .any(|c| c.starts_with("GetNode") || c.starts_with("List") || c == "GetConfigMap"),
        "nothing read past the version: {log:?}"
    );
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert_eq!(w.out_of_service_taints(NODE), 0);

    // The oldest supported is served as every other.
    let w = World::stopped().named(1, NODE);
    w.cluster.set_version(1, 15);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
}
