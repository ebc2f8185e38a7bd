//! Each stage driven alone, from an invocation built by hand: what it asks,
//! what it writes, and what it leaves in the invocation for the next stage.
//! The scenario tests beside these run the whole list.

use super::*;
use crate::core::model::facts::{Confirmation, InstanceFacts};
use crate::core::rules::decide::Verdict;
use crate::core::rules::plan::{self, NodeRun, Stage, Target};
use crate::core::rules::view::NodeView;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::recover;
use crate::pipeline::stages::{
    act, admit, decide, discover, plan as planning, power, screen, survey, verify,
};
use crate::shell::cloud::Cloud;

/// The calls made since the log had `from` entries.
fn since(w: &World, from: usize) -> Vec<String> {
    w.calls.log()[from..].to_vec()
}

/// Every Node of the world, as the survey would read them (not logged as a
/// call of the stage under test).
async fn view_of(w: &World) -> NodeView {
    NodeView::full(w.cluster.list_nodes().await.unwrap())
}

fn stopped(n: u8) -> Confirmation {
    Confirmation::Seen(InstanceFacts::bare(instance(n), InstanceState::Stopped))
}

/// The seed node decided for fencing: one target, its verdict, its look.
async fn decided<'p>(w: &World, policy: &'p Policy) -> Invocation<'p> {
    let mut inv = Invocation::new(policy, Batch::default());
    let view = view_of(w).await;
    inv.decision.targets = vec![Target {
        reference: NodeRef::Instance(instance(1)),
        node: Some(0),
        instance: Some(instance(1)),
        intent: Intent::Fence,
        origins: vec![Origin::Direct],
        power_off: false,
    }];
    inv.decision.verdicts = vec![Verdict::Fence {
        add_taint: true,
        dry_run: false,
    }];
    inv.looks.seed(instance(1), stopped(1));
    inv.view = Some(view);
    inv
}

/// The seed node's run, planned with its volume, in taint mode.
async fn planned<'p>(w: &World, policy: &'p Policy) -> Invocation<'p> {
    let mut inv = decided(w, policy).await;
    let view = inv.view.as_ref().unwrap();
    let d = std::mem::take(&mut inv.decision);
    inv.runs = plan::plan(&d.targets, &d.verdicts, &view.nodes, inv.looks.answers());
    inv.mode = Some(crate::core::model::facts::FenceMode::Taint);
    let meter = Meter::default();
    discover::run(&w.ctx(&meter), &mut inv).await.unwrap();
    inv
}

/// The seed node's run with its taint on.
async fn tainted<'p>(w: &World, policy: &'p Policy) -> Invocation<'p> {
    let mut inv = planned(w, policy).await;
    let run: &mut NodeRun = &mut inv.runs[0];
    run.confirm_again(Some(&stopped(1)), false);
    run.tainted(Ok(Some(
        crate::core::outbound::kube_patch::TaintOutcome::Applied,
    )));
    inv
}

#[tokio::test]
async fn the_screen_alone_settles_another_clusters_machine_with_one_look() {
    let w = World::stopped();
    w.cloud.describe_as(&instance(1), |f| {
        f.tags = vec![("eks:cluster-name".into(), "staging".into())];
    });
    let policy = identified();
    let mut inv = Invocation::new(&policy, batch(Intent::Fence, &[instance(1)]));
    let meter = Meter::default();
    screen::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(w.calls.log(), ["DescribeInstances"]);
    assert!(inv.suspects.is_empty() && inv.nothing_for_this_cluster());
    assert!(
        inv.looks.get(&instance(1)).is_some(),
        "kept for later stages"
    );
}

#[tokio::test]
async fn the_survey_alone_reads_the_version_the_switch_and_the_nodes_and_sets_recoveries_aside() {
    let w = World::stopped();
    w.cluster.set_kill_switch(KillSwitch::On);
    let mut b = batch(Intent::Fence, &[instance(1)]);
    b.suspects
        .extend(batch(Intent::Recover, &[instance(2)]).suspects);
    let policy = policy();
    let mut inv = Invocation::new(&policy, b);
    let meter = Meter::default();
    survey::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(w.calls.log(), ["GetVersion", "GetKillSwitch", "ListNodes"]);
    assert!(inv.switch.is_on(), "the kill switch makes the run a plan");
    assert_eq!(inv.view.as_ref().map(|v| v.nodes.len()), Some(1));
    assert_eq!(inv.suspects.len(), 1);
    assert_eq!(inv.requested[0].intent, Intent::Recover);
}

#[tokio::test]
async fn the_decision_alone_asks_the_cloud_once_and_decides() {
    let w = World::stopped();
    let policy = policy();
    let mut inv = Invocation::new(&policy, batch(Intent::Fence, &[instance(1)]));
    inv.view = Some(view_of(&w).await);
    let from = w.calls.log().len();
    let meter = Meter::default();
    decide::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(
        since(&w, from),
        [
            "DescribeInstances".to_owned(),
            format!("DescribeInstances named {NODE}")
        ]
    );
    assert_eq!(
        inv.decision.verdicts,
        [Verdict::Fence {
            add_taint: true,
            dry_run: false
        }]
    );
}

#[tokio::test]
async fn the_power_stage_alone_powers_a_hung_node_off_and_decides_it_again() {
    let w = World::hung();
    let policy = active();
    let mut inv = Invocation::new(&policy, Batch::default());
    let view = view_of(&w).await;
    let hung = view.nodes.iter().position(|n| n.name == NODE).unwrap();
    inv.decision.targets = vec![Target {
        reference: NodeRef::Name(crate::core::model::names::NodeName::parse(NODE).unwrap()),
        node: Some(hung),
        instance: Some(instance(1)),
        intent: Intent::Fence,
        origins: vec![Origin::Sweep],
        power_off: true,
    }];
    inv.decision.verdicts = vec![Verdict::Skip {
        reason: Skip::InstanceNotOff {
            state: InstanceState::Running,
        },
    }];
    let running = InstanceFacts::bare(instance(1), InstanceState::Running);
    inv.looks.seed(instance(1), Confirmation::Seen(running));
    inv.view = Some(view);
    let from = w.calls.log().len();
    let meter = Meter::default();
    power::run(&w.ctx(&meter), &mut inv).await.unwrap();
    let calls = since(&w, from);
    let stop = calls
        .iter()
        .position(|c| c.starts_with("StopInstances"))
        .unwrap();
    assert_eq!(
        calls[stop - 1],
        format!("MarkPoweredOff {NODE}"),
        "{calls:?}"
    );
    assert!(calls[..stop].contains(&"AcquireLease".to_owned()));
    assert!(calls[stop..].contains(&"ReleaseLease".to_owned()));
    assert_eq!(inv.decision.power[&0].outcome, PowerOutcome::Stopped);
    assert!(
        matches!(inv.decision.verdicts[0], Verdict::Fence { .. }),
        "decided again once stopped: {:?}",
        inv.decision.verdicts
    );
    assert_eq!(w.out_of_service_taints(NODE), 0, "nothing here taints");
}

#[tokio::test]
async fn the_plan_alone_makes_one_run_per_target_and_chooses_the_mode() {
    let w = World::stopped();
    let policy = policy();
    let mut inv = decided(&w, &policy).await;
    let from = w.calls.log().len();
    let meter = Meter::default();
    planning::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(since(&w, from), ["GetVersion"]);
    assert_eq!(inv.runs.len(), 1);
    assert_eq!(*inv.runs[0].stage(), Stage::Decided);
    assert_eq!(inv.mode, Some(crate::core::model::facts::FenceMode::Taint));
}

#[tokio::test]
async fn discovery_alone_plans_the_detach_of_the_nodes_volume() {
    let w = World::stopped();
    let policy = policy();
    let mut inv = decided(&w, &policy).await;
    let view = inv.view.as_ref().unwrap();
    let d = std::mem::take(&mut inv.decision);
    inv.runs = plan::plan(&d.targets, &d.verdicts, &view.nodes, inv.looks.answers());
    inv.mode = Some(crate::core::model::facts::FenceMode::Taint);
    let from = w.calls.log().len();
    let meter = Meter::default();
    discover::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(
        since(&w, from),
        [
            "ListVolumeAttachments".to_owned(),
            "ListPersistentVolumes".into(),
            "DescribeVolumes".into(),
            format!("ListPods {NODE}"),
        ]
    );
    let detaches: Vec<_> = inv.runs[0].plan().unwrap().detaches().cloned().collect();
    assert_eq!(detaches, [volume(1)]);
}

#[tokio::test]
async fn admission_alone_confirms_again_and_taints_under_the_lease() {
    let w = World::stopped();
    let policy = policy();
    let mut inv = planned(&w, &policy).await;
    let from = w.calls.log().len();
    let meter = Meter::default();
    admit::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(
        since(&w, from),
        [
            "AcquireLease".to_owned(),
            "ListNodes".into(),
            "DescribeInstances".into(),
            format!("TaintNode {NODE}"),
            "ReleaseLease".into(),
            format!("CreateEvent {NODE}"),
        ]
    );
    assert_eq!(*inv.runs[0].stage(), Stage::Tainted);
    assert_eq!(w.out_of_service_taints(NODE), 1);
}

#[tokio::test]
async fn acting_alone_confirms_once_more_then_frees_the_pods_and_volumes() {
    let w = World::stopped();
    w.cluster.pod(NODE, "db-0");
    let policy = policy();
    let mut inv = tainted(&w, &policy).await;
    let from = w.calls.log().len();
    let meter = Meter::default();
    act::run(&w.ctx(&meter), &mut inv).await.unwrap();
    let calls = since(&w, from);
    assert_eq!(calls[0], "DescribeInstances", "{calls:?}");
    assert!(calls.contains(&"DeletePod db-0".to_owned()), "{calls:?}");
    assert!(
        calls.contains(&format!("DetachVolume {}", volume(1))),
        "{calls:?}"
    );
    assert_eq!(*inv.runs[0].stage(), Stage::DetachSent);
}

#[tokio::test]
async fn verification_alone_sees_the_detached_volume_free() {
    let w = World::stopped();
    let policy = policy();
    let mut inv = tainted(&w, &policy).await;
    inv.runs[0].start_detaching();
    let meter = Meter::default();
    let stopped = InstanceFacts::bare(instance(1), InstanceState::Stopped);
    let order = crate::shell::cloud::Detach {
        machine: &stopped,
        fencing: "2026-11-26T10:00:00Z",
    };
    w.cloud.detach_volume(&volume(1), &order).await.unwrap();
    let from = w.calls.log().len();
    verify::run(&w.ctx(&meter), &mut inv).await.unwrap();
    assert_eq!(since(&w, from), ["DescribeVolumes"]);
    assert_eq!(*inv.runs[0].stage(), Stage::Verified);
    assert_eq!(inv.runs[0].pending().count(), 0);
}

#[tokio::test]
async fn the_recovery_check_alone_ends_a_fencing_whose_node_is_back() {
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    w.back_up();
    let policy = policy();
    let mut inv = Invocation::new(&policy, Batch::default());
    inv.view = Some(view_of(&w).await);
    let from = w.calls.log().len();
    let meter = Meter::default();
    recover::run(&w.ctx(&meter), &mut inv).await.unwrap();
    let calls = since(&w, from);
    assert_eq!(calls[0], "DescribeInstances", "{calls:?}");
    assert!(calls.contains(&format!("UntaintNode {NODE}")), "{calls:?}");
    assert_eq!(inv.recoveries[0].outcome, RecoveryOutcome::Recovered);
    assert_eq!(w.out_of_service_taints(NODE), 0);
}
