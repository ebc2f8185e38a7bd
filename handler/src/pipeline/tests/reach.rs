//! Issue 37, scope and veto: `NODE_SELECTOR` and the opt-out label hold on
//! every path that acts (an event, the sweep, an operator's power-off,
//! active fencing's own), each refusal reported with its reason; neither
//! holds back the recovery of a fencing made earlier.

use super::*;
use crate::core::model::selector::LabelSelector;
use crate::core::rules::reach::{Exemption, OPT_OUT_LABEL, Reach};

/// Only the Nodes of pool `stateful`.
fn stateful(base: Policy) -> Policy {
    Policy {
        reach: Reach {
            selector: Some(LabelSelector::parse("pool=stateful").unwrap()),
        },
        ..base
    }
}

fn skip_of(report: &Report, node: &str) -> Option<Skip> {
    report
        .results
        .iter()
        .find(|r| r.node.as_deref() == Some(node))
        .and_then(|r| r.skip.clone())
}

/// The seed event for a Node out of the selector, and for one opted out:
/// nothing written but the refusal's Event, and nothing left for a retry.
#[tokio::test]
async fn an_event_for_a_node_outside_the_reach_changes_nothing() {
    for (labels, policy, why) in [
        (
            vec![("pool", "web")],
            stateful(policy()),
            Exemption::OutOfScope {
                selector: "pool=stateful".into(),
            },
        ),
        (
            vec![("pool", "stateful"), (OPT_OUT_LABEL, "true")],
            stateful(policy()),
            Exemption::OptedOut,
        ),
        (vec![(OPT_OUT_LABEL, "true")], policy(), Exemption::OptedOut),
    ] {
        let w = World::stopped();
        for (k, v) in &labels {
            w.cluster.label(NODE, k, v);
        }
        let report = w.fence(&policy).await.unwrap();
        assert_eq!(
            skip_of(&report, NODE),
            Some(Skip::Exempt(why.clone())),
            "{report:#?}"
        );
        assert!(!report.incomplete(), "a veto is no work left: {report:#?}");
        assert_eq!(w.changes(), Vec::<String>::new(), "{labels:?}");
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert_eq!(w.cloud.volume_state(&w.volume(1)), Some(VolumeState::InUse));
        assert_eq!(w.cluster.events(NODE), ["FencingRefused"], "{labels:?}");
    }
    // Selected, the same Node is fenced.
    let w = World::stopped();
    w.cluster.label(NODE, "pool", "stateful");
    let report = w.fence(&stateful(policy())).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
}

/// The sweep takes every NotReady Node not fenced; one outside the reach
/// is reported and left, the others fenced as ever.
#[tokio::test]
async fn the_sweep_leaves_a_node_outside_the_reach() {
    let w = World::new()
        .with_node(NODE, 1, InstanceState::Stopped, "Unknown")
        .with_node("worker-3", 3, InstanceState::Stopped, "Unknown")
        .with_node("healthy-2", 2, InstanceState::Running, "True");
    w.cluster.label(NODE, "pool", "stateful");
    w.cluster.label("worker-3", "pool", "web");
    let report = w
        .run(
            &stateful(policy()),
            crate::core::inbound::trigger::direct::sweep(),
        )
        .await
        .unwrap();
    let fenced: Vec<&str> = report
        .results
        .iter()
        .filter(|r| r.outcome == Outcome::Fenced)
        .filter_map(|r| r.node.as_deref())
        .collect();
    assert_eq!(fenced, [NODE], "{report:#?}");
    assert!(matches!(
        skip_of(&report, "worker-3"),
        Some(Skip::Exempt(Exemption::OutOfScope { .. }))
    ));
    assert_eq!(w.out_of_service_taints("worker-3"), 0);
    assert_eq!(w.cluster.events("worker-3"), ["FencingRefused"]);
    // The next sweep refuses it again, and finds its Event there: one
    // Warning per exemption, not one every ten minutes.
    w.run(
        &stateful(policy()),
        crate::core::inbound::trigger::direct::sweep(),
    )
    .await
    .unwrap();
    assert_eq!(w.cluster.events("worker-3"), ["FencingRefused"]);
}

/// Active fencing's sweep and an operator's `fence --power-off` alike:
/// a hung Node that opted out is never powered off.
#[tokio::test]
async fn a_hung_node_outside_the_reach_is_never_powered_off() {
    for batch in [crate::core::inbound::trigger::direct::sweep(), power_off()] {
        let w = World::hung();
        w.cluster.label(NODE, OPT_OUT_LABEL, "true");
        let report = w.run(&active(), batch).await.unwrap();
        assert_eq!(w.stops(), 0, "{report:#?}");
        assert_eq!(
            w.cloud.instance_state(&w.instance(1)),
            Some(InstanceState::Running)
        );
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert_eq!(
            skip_of(&report, NODE),
            Some(Skip::Exempt(Exemption::OptedOut)),
            "{report:#?}"
        );
        assert!(!w.cluster.events(NODE).contains(&"PoweredOff"));
    }
}

/// A fencing made before the Node left the reach still ends: a veto must
/// not keep a Node out of service.
#[tokio::test]
async fn a_veto_added_after_the_fencing_does_not_hold_back_its_recovery() {
    let w = World::stopped();
    w.cluster.label(NODE, "pool", "stateful");
    w.fence(&stateful(policy())).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 1);
    w.cluster.label(NODE, OPT_OUT_LABEL, "true");
    w.cluster.label(NODE, "pool", "web");
    w.back_up();
    w.assert_recovered(&w.recover(&stateful(policy()), Intent::Recover).await);
}
