//! Issue 59, the simulator's stale Node that no sight of it off could
//! catch: the terminated machine's address went to a new instance, whose
//! kubelet adopted the Node, renewed, and went quiet before node-fencer
//! read its Lease. The new instance carries the Node's name; while it may
//! run, the Node is refused.

use super::*;
use crate::core::rules::namesake::{Holder, Namesake};

/// The seed Node, NotReady, on a terminated machine; machine 2 carries
/// its name, in `state`.
fn taken_over(state: InstanceState) -> World {
    let w = World::new().with_node(NODE, 1, InstanceState::Terminated, "Unknown");
    w.cluster.pod(NODE, "db-0");
    w.cloud.namesake(&w.instance(2), NODE, state);
    w
}

#[tokio::test]
async fn a_node_whose_name_a_running_machine_carries_is_refused() {
    let w = taken_over(InstanceState::Running);
    let report = w.fence(&policy()).await.unwrap();
    let skip = report.results[0].skip.as_ref();
    assert_eq!(
        skip,
        Some(&Skip::NameTaken {
            machine: w.instance(1).as_str().to_owned(),
            by: Namesake {
                machine: w.instance(2).as_str().to_owned(),
                state: "running".into(),
            },
        }),
        "{report:#?}"
    );
    assert!(!skip.unwrap().leaves_work(), "no retry can change it");
    w.assert_refused_untouched("delete the Node");
}

/// A namesake that is off runs no kubelet: the Node is fenced, and the
/// cloud is asked once.
#[tokio::test]
async fn a_namesake_that_is_off_fences_as_before() {
    for state in [InstanceState::Stopped, InstanceState::Terminated] {
        let w = taken_over(state.clone());
        let report = w.fence(&policy()).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
        let asked = w
            .calls
            .log()
            .iter()
            .filter(|c| c.starts_with("DescribeInstances named"))
            .count();
        assert_eq!(asked, 1, "{:?}", w.calls.log());
    }
}

/// A question that fails is never taken for "no namesake": the Node waits
/// for the retry.
#[tokio::test]
async fn a_failed_question_leaves_the_node_for_the_retry() {
    a_failed_call_leaves_the_node_for_the_retry(
        || taken_over(InstanceState::Stopped),
        "DescribeInstances named",
    )
    .await;
}

/// A refusal of the decision stands when active fencing powers another
/// Node's machine off in the same invocation and the Nodes are decided
/// again: the stale Node is not fenced along with the hung one. Before,
/// the decision after the power-off was made afresh over every Node, and
/// fenced it.
#[tokio::test]
async fn a_power_off_beside_it_does_not_lift_the_refusal() {
    let mut w = World::hung_on(On::Ec2);
    for n in 6..=9 {
        w = w.with_node(&format!("healthy-{n}"), n, InstanceState::Running, "True");
    }
    let w = w.with_node("stale-4", 4, InstanceState::Terminated, "Unknown");
    w.cloud
        .namesake(&w.instance(5), "stale-4", InstanceState::Running);
    w.cloud.checks(&w.instance(1), "impaired", "ok");
    let report = w
        .run(&active(), crate::core::inbound::trigger::direct::sweep())
        .await
        .unwrap();
    let of = |node: &str| {
        report
            .results
            .iter()
            .find(|r| r.node.as_deref() == Some(node))
            .unwrap_or_else(|| panic!("a result for {node}: {report:#?}"))
    };
    assert_eq!(of(NODE).outcome, Outcome::Fenced, "{report:#?}");
    assert!(
        matches!(of("stale-4").skip, Some(Skip::NameTaken { .. })),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints("stale-4"), 0);
    assert_eq!(w.out_of_service_taints(NODE), 1);
}

/// The simulator's seed 2803: a Node refused after the core's verdict took
/// the cap's room from another dead Node, refused in its turn by the cap,
/// and the second was never fenced. The core decides again without the
/// refused Node.
#[tokio::test]
async fn a_refused_node_takes_no_room_under_the_cap() {
    let w = taken_over(InstanceState::Running).with_node(
        "other",
        3,
        InstanceState::Terminated,
        "Unknown",
    );
    let p = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    let report = w
        .run(&p, batch(Intent::Fence, &[w.instance(1), w.instance(3)]))
        .await
        .unwrap();
    let skips: Vec<Option<&Skip>> = report.results.iter().map(|r| r.skip.as_ref()).collect();
    assert!(
        matches!(skips[..], [Some(Skip::NameTaken { .. }), None]),
        "{report:#?}"
    );
    assert_eq!(report.results[1].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert_eq!(w.out_of_service_taints("other"), 1);
}

/// A Node whose namesake question failed is not fenced unasked when a
/// power-off beside it has every Node decided again: the refusals are made
/// again over the new verdicts. Before, the decision after the power-off
/// fenced it while its namesake ran.
#[tokio::test]
async fn a_power_off_beside_it_does_not_fence_a_node_unasked() {
    let world = || {
        let mut w = World::hung_on(On::Ec2);
        for n in 6..=9 {
            w = w.with_node(&format!("healthy-{n}"), n, InstanceState::Running, "True");
        }
        let w = w.with_node("stale-4", 4, InstanceState::Terminated, "Unknown");
        w.cloud
            .namesake(&w.instance(5), "stale-4", InstanceState::Running);
        w.cloud.checks(&w.instance(1), "impaired", "ok");
        w
    };
    let sweep = crate::core::inbound::trigger::direct::sweep;
    let w = world();
    w.run(&active(), sweep()).await.unwrap();
    let log = w.calls.log();
    let at = log
        .iter()
        .position(|c| c.starts_with("DescribeInstances named"));
    assert!(at.is_some(), "{log:?}");
    let w = world();
    w.calls.fail_at(at);
    let report = w.run(&active(), sweep()).await.unwrap();
    let of = |node: &str| {
        report
            .results
            .iter()
            .find(|r| r.node.as_deref() == Some(node))
            .unwrap_or_else(|| panic!("a result for {node}: {report:#?}"))
    };
    assert_eq!(of(NODE).outcome, Outcome::Fenced, "{report:#?}");
    assert!(
        matches!(
            of("stale-4").skip,
            Some(Skip::NameTaken { .. } | Skip::LookupFailed { .. })
        ),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints("stale-4"), 0);
}

/// The simulator's override world: a kubelet on machine 2, under a name of
/// its own, serves the seed Node by `--hostname-override` and reports its
/// machine's address; the Node names machine 1, terminated. Machine 2, in
/// `state`, holds the address.
fn served_by_override(state: InstanceState) -> World {
    let w = World::new().with_node(NODE, 1, InstanceState::Terminated, "Unknown");
    w.cluster.pod(NODE, "db-0");
    w.cluster.internal_ip(NODE, "10.0.0.7");
    w.cloud
        .namesake(&w.instance(2), "ip-10-0-0-7", state.clone());
    w.cloud.describe_as(&w.instance(2), |m| {
        m.private_ips = vec!["10.0.0.7".parse().unwrap()];
    });
    w
}

#[tokio::test]
async fn a_node_whose_address_a_running_machine_holds_is_refused() {
    let w = served_by_override(InstanceState::Running);
    let report = w.fence(&policy()).await.unwrap();
    let skip = report.results[0].skip.as_ref();
    assert_eq!(
        skip,
        Some(&Skip::AddressTaken {
            machine: w.instance(1).as_str().to_owned(),
            by: Holder {
                address: "10.0.0.7".parse().unwrap(),
                by: Namesake {
                    machine: w.instance(2).as_str().to_owned(),
                    state: "running".into(),
                },
            },
        }),
        "{report:#?}"
    );
    assert!(!skip.unwrap().leaves_work(), "no retry can change it");
    w.assert_refused_untouched("delete the Node");
}

/// A holder that is off runs no kubelet; and a Node whose machine holds
/// its address asks no one.
#[tokio::test]
async fn a_holder_that_is_off_or_the_nodes_own_machine_fences_as_before() {
    for state in [InstanceState::Stopped, InstanceState::Terminated] {
        let w = served_by_override(state.clone());
        let report = w.fence(&policy()).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
        assert!(w.called("DescribeInstances holding 10.0.0.7"));
    }
    let w = served_by_override(InstanceState::Running);
    w.cloud.describe_as(&w.instance(1), |m| {
        m.private_ips = vec!["10.0.0.7".parse().unwrap()];
    });
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(
        !w.called("DescribeInstances holding"),
        "{:?}",
        w.calls.log()
    );
}

#[tokio::test]
async fn a_failed_address_question_leaves_the_node_for_the_retry() {
    a_failed_call_leaves_the_node_for_the_retry(
        || served_by_override(InstanceState::Stopped),
        "DescribeInstances holding",
    )
    .await;
}
