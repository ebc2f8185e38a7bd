//! The whole pipeline in-process against moto and the API server, under the
//! node-fencer ClusterRole: one test per invariant of design.md and per flow.

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use node_fencer::core::inbound::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use node_fencer::core::model::facts::{
    OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE,
};
use node_fencer::core::model::kube_read::ANNOTATION_FENCED_AT;
use node_fencer::core::model::names::NodeName;
use node_fencer::core::outbound::metrics::{Dependency, Stage};
use node_fencer::core::outbound::report::{Outcome, Report, VolumeOutcome};
use node_fencer::core::rules::decide::Skip;
use node_fencer::core::rules::resolve::ClusterScope;
use node_fencer::core::settings::policy::Policy;
use node_fencer::shell::cloud::aws::Ec2;
use node_fencer::shell::cluster::Kube;
use node_fencer_tests::fixtures::*;
use node_fencer_tests::timing::{Timeline, TimingCloud};
use node_fencer_tests::{NodeCleanup, serial, stack};
use serde_json::json;

use crate::{by_instance, one};

/// A stopped machine with a CSI volume, an in-tree volume, a volume that
/// backs no PV, and its root volume; and its NotReady Node.
struct Scene {
    m: Machine,
    node: String,
    csi_volume: String,
    in_tree_volume: String,
    stray_volume: String,
    _cleanup: NodeCleanup,
}

async fn scene(ready: &'static str, stopped: bool) -> anyhow::Result<Scene> {
    let s = stack();
    let ec2 = s.ec2().await;
    let admin = s.admin().await?;
    let m = launch(&ec2).await?;
    let csi_volume = attach_new_volume(&ec2, &m, "/dev/xvdba").await?;
    let in_tree_volume = attach_new_volume(&ec2, &m, "/dev/xvdbb").await?;
    let stray_volume = attach_new_volume(&ec2, &m, "/dev/xvdbc").await?;
    if stopped {
        stop(&ec2, &m).await?;
    }
    let mut spec = NodeSpec::for_machine(&m);
    spec.ready = ready;
    create_node(&admin, &spec).await?;
    let _cleanup = s.delete_on_drop(&[&spec.name]);
    let pv_csi = unique("pv");
    create_pv(&admin, &pv_csi, &csi_volume).await?;
    create_va(&admin, &spec.name, &pv_csi, "ebs.csi.aws.com").await?;
    let pv_tree = unique("pv");
    create_pv_with(
        &admin,
        &pv_tree,
        json!({"awsElasticBlockStore": {"volumeID": format!("aws://{}/{in_tree_volume}", m.az)}}),
    )
    .await?;
    // CSI migration attaches in-tree EBS PVs through the CSI driver.
    create_va(&admin, &spec.name, &pv_tree, "ebs.csi.aws.com").await?;
    // The stray volume backs a PV of another driver: never ours to touch.
    let pv_other = unique("pv");
    create_pv_with(
        &admin,
        &pv_other,
        json!({"csi": {"driver": "efs.csi.aws.com", "volumeHandle": stray_volume}}),
    )
    .await?;
    create_va(&admin, &spec.name, &pv_other, "efs.csi.aws.com").await?;
    Ok(Scene {
        m,
        node: spec.name,
        csi_volume,
        in_tree_volume,
        stray_volume,
        _cleanup,
    })
}

fn only(report: &Report) -> &node_fencer::core::outbound::report::NodeReport {
    assert_eq!(report.results.len(), 1, "{report:#?}");
    &report.results[0]
}

async fn attached_to(volume_id: &str) -> anyhow::Result<Vec<String>> {
    Ok(volume(&stack().ec2().await, volume_id).await?.1)
}

/// Nothing changed: no out-of-service taint, the CSI volume still on its instance.
async fn assert_unfenced(sc: &Scene) -> anyhow::Result<()> {
    let node = get_node(&stack().admin().await?, &sc.node).await?;
    assert!(
        !taints(&node).contains(&OUT_OF_SERVICE.into()),
        "{} must not be tainted",
        sc.node
    );
    assert_eq!(
        attached_to(&sc.csi_volume).await?,
        vec![sc.m.instance.clone()]
    );
    Ok(())
}

/// Runs the pipeline as node-fencer against the stack, every call timed
/// (and its hooks run) on `calls`.
async fn fence_timed(calls: &Timeline, batch: Batch) -> anyhow::Result<Report> {
    let s = stack();
    let real_cloud = Ec2::new(s.ec2().await);
    let real_cluster = Kube::new(s.fencer().await?, "tests");
    let (cloud, cluster) = calls.wrap(&real_cloud, &real_cluster);
    fence_with(&cloud, &cluster, batch, settings()).await
}

#[tokio::test]
async fn fences_a_stopped_node_and_detaches_only_its_pv_volumes() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", true).await?;
    let calls = Timeline::new();
    let report = fence_timed(&calls, one(by_instance(&sc.m.instance), Intent::Fence)).await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::Fenced, "{r:#?}");
    assert!(r.taint_applied);
    assert!(!report.incomplete());

    let admin = s.admin().await?;
    let node = get_node(&admin, &sc.node).await?;
    let t = taints(&node);
    assert!(t.contains(&OUT_OF_SERVICE.into()), "{t:?}");
    assert!(
        t.contains(&"node.kubernetes.io/unreachable:NoExecute".into()),
        "other taints kept: {t:?}"
    );
    assert!(
        node.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ANNOTATION_FENCED_AT)
    );

    assert!(
        attached_to(&sc.csi_volume).await?.is_empty(),
        "CSI volume detached"
    );
    assert!(
        attached_to(&sc.in_tree_volume).await?.is_empty(),
        "in-tree volume detached"
    );
    assert_eq!(
        attached_to(&sc.stray_volume).await?,
        vec![sc.m.instance.clone()],
        "no PV of ours: untouched"
    );
    assert_eq!(
        attached_to(&sc.m.root_volume).await?,
        vec![sc.m.instance.clone()],
        "root: untouched"
    );
    let detached: Vec<_> = r
        .volumes
        .iter()
        .filter(|v| v.outcome == VolumeOutcome::Detached)
        .collect();
    assert_eq!(detached.len(), 2, "{:#?}", r.volumes);

    assert_node_events(
        &admin,
        &sc.node,
        &["OutOfServiceTaintApplied", "VolumesForceDetached"],
    )
    .await?;

    // Confirm, re-confirm before the taint, again before the pods (batched
    // over the nodes) and once more before the node's first detach: four
    // EC2 lookups; one node list to resolve and one under the Lease to count.
    assert_eq!(calls.count("DescribeInstances"), 4);
    // And once for the machines that carry the Node's name.
    assert_eq!(calls.count("DescribeInstances by name"), 1);
    assert_eq!(calls.count("ListNodes"), 2);
    assert_eq!(calls.count("DetachVolume"), 2);
    Ok(())
}

/// Issue 12, item 3: between the confirmation before the taint and the
/// force-detach lie the taint patch and its retries, the Events and the
/// Lease; an instance started in that window keeps its volumes.
#[tokio::test]
async fn an_instance_started_after_the_taint_keeps_its_volumes() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", true).await?;
    let calls = Timeline::new();
    let (ec2, instance) = (s.ec2().await, sc.m.instance.clone());
    calls.after(
        "TaintNode",
        Box::new(move || {
            let (ec2, instance) = (ec2.clone(), instance.clone());
            Box::pin(async move {
                let started = ec2.start_instances().instance_ids(instance).send().await;
                assert!(started.is_ok(), "{started:?}");
            })
        }),
    );
    let report = fence_timed(&calls, one(by_instance(&sc.m.instance), Intent::Fence)).await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert!(report.incomplete(), "a retry looks again");
    assert_eq!(calls.count("DescribeInstances"), 3);
    assert_eq!(calls.count("DetachVolume"), 0);
    for volume in [&sc.csi_volume, &sc.in_tree_volume] {
        assert_eq!(attached_to(volume).await?, vec![sc.m.instance.clone()]);
    }
    Ok(())
}

/// Issue 12, item 13: a volume the attach/detach controller gives to the
/// replacement's node right after the detach is never `available`; what
/// counts is that the fenced instance let go of it.
#[tokio::test]
async fn a_volume_already_attached_to_the_replacement_counts_as_detached() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", true).await?;
    let ec2 = s.ec2().await;
    let replacement = launch(&ec2).await?;
    let calls = Timeline::new();
    let (volume, to) = (sc.csi_volume.clone(), replacement.instance.clone());
    calls.after(
        "DetachVolume",
        Box::new(move || {
            let (ec2, volume, to) = (ec2.clone(), volume.clone(), to.clone());
            Box::pin(async move {
                let attached = ec2
                    .attach_volume()
                    .volume_id(volume)
                    .instance_id(to)
                    .device("/dev/xvdbz")
                    .send()
                    .await;
                assert!(attached.is_ok(), "{attached:?}");
            })
        }),
    );
    let report = fence_timed(&calls, one(by_instance(&sc.m.instance), Intent::Fence)).await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(
        r.volumes
            .iter()
            .all(|v| v.outcome == VolumeOutcome::Detached),
        "{:#?}",
        r.volumes
    );
    assert_eq!(
        attached_to(&sc.csi_volume).await?,
        vec![replacement.instance.clone()]
    );
    Ok(())
}

#[tokio::test]
async fn split_brain_a_running_instance_is_never_fenced() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", false).await?;
    let report = fence(
        s,
        one(by_instance(&sc.m.instance), Intent::Fence),
        settings(),
    )
    .await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::Skipped);
    assert!(
        matches!(r.skip, Some(Skip::InstanceNotOff { .. })),
        "{r:#?}"
    );
    assert_unfenced(&sc).await
}

/// A fencing of the Node `node`, asked for by name.
fn fence_named(node: &str) -> Batch {
    one(NodeRef::Name(NodeName::parse(node).unwrap()), Intent::Fence)
}

/// A kubelet that serves the Node by `--hostname-override` from another
/// instance reports that instance's address: while it may run, the Node is
/// refused, though its own instance is stopped and no instance carries its
/// name. Once the holder is stopped too, the Node is fenced.
#[tokio::test]
async fn a_node_whose_address_a_running_instance_holds_is_never_fenced() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let ec2 = s.ec2().await;
    let sc = scene("Unknown", true).await?;
    let holder = launch(&ec2).await?;
    let ip = holder
        .private_ip
        .clone()
        .expect("moto gives a private address");
    let nodes: Api<Node> = Api::all(s.admin().await?);
    let addresses = json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
    nodes
        .patch_status(
            &sc.node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&addresses),
        )
        .await?;
    let by_name = || fence_named(&sc.node);
    let report = fence(s, by_name(), settings()).await?;
    let r = only(&report);
    assert!(
        matches!(&r.skip, Some(Skip::AddressTaken { by, .. }) if by.by.machine == holder.instance),
        "{r:#?}"
    );
    assert_unfenced(&sc).await?;
    stop(&ec2, &holder).await?;
    let report = fence(s, by_name(), settings()).await?;
    assert_eq!(only(&report).outcome, Outcome::Fenced, "{report:#?}");
    Ok(())
}

/// A kubelet that served the Node by an override from another instance
/// got one of the Node's disks attached there, and the Node's addresses
/// no longer show it: while that instance may run, the Node is refused.
/// Once it is stopped too, the Node is fenced, and the disk it holds is
/// left where it is.
#[tokio::test]
async fn a_node_whose_disk_a_running_instance_holds_is_never_fenced() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let ec2 = s.ec2().await;
    let sc = scene("Unknown", true).await?;
    let holder = launch(&ec2).await?;
    ec2.detach_volume()
        .volume_id(&sc.in_tree_volume)
        .instance_id(&sc.m.instance)
        .device("/dev/xvdbb")
        .send()
        .await?;
    ec2.attach_volume()
        .volume_id(&sc.in_tree_volume)
        .instance_id(&holder.instance)
        .device("/dev/xvdbd")
        .send()
        .await?;
    let by_name = || fence_named(&sc.node);
    let report = fence(s, by_name(), settings()).await?;
    let r = only(&report);
    assert!(
        matches!(&r.skip, Some(Skip::DiskHeld { by, .. })
            if by.by.machine == holder.instance && by.volume == sc.in_tree_volume),
        "{r:#?}"
    );
    assert_unfenced(&sc).await?;
    stop(&ec2, &holder).await?;
    let report = fence(s, by_name(), settings()).await?;
    assert_eq!(only(&report).outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(
        attached_to(&sc.in_tree_volume).await?,
        vec![holder.instance.clone()]
    );
    Ok(())
}

#[tokio::test]
async fn a_ready_node_is_never_fenced_even_if_its_instance_is_stopped() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("True", true).await?;
    let report = fence(
        s,
        one(
            NodeRef::Name(NodeName::parse(&sc.node).unwrap()),
            Intent::Fence,
        ),
        settings(),
    )
    .await?;
    assert_eq!(only(&report).skip, Some(Skip::NodeReady));
    assert!(
        report.incomplete(),
        "retried until Kubernetes notices the node is gone"
    );
    assert_unfenced(&sc).await?;

    // Issue 16: with a wait, the same invocation fences once the Node
    // turns NotReady, a second after the event.
    let admin = s.admin().await?;
    let flip = {
        let (admin, node) = (admin.clone(), sc.node.clone());
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            set_ready(&admin, &node, "Unknown").await
        })
    };
    let waiting = Policy {
        not_ready_wait: std::time::Duration::from_secs(20),
        ..settings()
    };
    let started = std::time::Instant::now();
    let report = fence(
        s,
        one(
            NodeRef::Name(NodeName::parse(&sc.node).unwrap()),
            Intent::Fence,
        ),
        waiting,
    )
    .await?;
    flip.await??;
    assert_eq!(only(&report).outcome, Outcome::Fenced, "{report:#?}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    Ok(())
}

#[tokio::test]
async fn the_same_event_twice_leaves_the_same_end_state() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("False", true).await?;
    let batch = || one(by_instance(&sc.m.instance), Intent::Fence);
    let first = fence(s, batch(), settings()).await?;
    assert_eq!(only(&first).outcome, Outcome::Fenced);
    let admin = s.admin().await?;
    let after_first = get_node(&admin, &sc.node).await?;

    let real_cloud = Ec2::new(s.ec2().await);
    let calls = Timeline::new();
    let cloud = TimingCloud {
        inner: &real_cloud,
        timeline: &calls,
    };
    let cluster = Kube::new(s.fencer().await?, "tests");
    let second = fence_with(&cloud, &cluster, batch(), settings()).await?;
    let r = only(&second);
    assert_eq!(r.outcome, Outcome::AlreadyFenced, "{r:#?}");
    assert!(!r.taint_applied);
    assert_eq!(calls.count("DetachVolume"), 0, "nothing left to detach");
    let after_second = get_node(&admin, &sc.node).await?;
    assert_eq!(after_first.spec, after_second.spec, "taints unchanged");
    assert_eq!(
        after_first.metadata.annotations,
        after_second.metadata.annotations
    );
    Ok(())
}

#[tokio::test]
async fn a_taint_without_detached_volumes_converges_on_retry() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", true).await?;
    // A previous run tainted the node, then died before detaching.
    let admin = s.admin().await?;
    let patch = json!({"spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": OUT_OF_SERVICE_KEY, "value": OUT_OF_SERVICE_VALUE, "effect": OUT_OF_SERVICE_EFFECT}
    ]}});
    Api::<Node>::all(admin.clone())
        .patch(
            &sc.node,
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    let report = fence(
        s,
        one(
            NodeRef::Name(NodeName::parse(&sc.node).unwrap()),
            Intent::Fence,
        ),
        settings(),
    )
    .await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::AlreadyFenced, "{r:#?}");
    assert!(attached_to(&sc.csi_volume).await?.is_empty());
    assert!(attached_to(&sc.in_tree_volume).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn dry_run_reports_the_full_plan_and_changes_nothing() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", true).await?;
    let admin = s.admin().await?;
    let before = get_node(&admin, &sc.node).await?.metadata.resource_version;
    for (batch, settings) in [
        (one(by_instance(&sc.m.instance), Intent::Check), settings()),
        (
            one(by_instance(&sc.m.instance), Intent::Fence),
            Policy {
                dry_run: true,
                ..settings()
            },
        ),
    ] {
        let report = fence(s, batch, settings).await?;
        let r = only(&report);
        assert_eq!(r.outcome, Outcome::Planned, "{r:#?}");
        let planned: Vec<_> = r
            .volumes
            .iter()
            .filter(|v| v.outcome == VolumeOutcome::WouldDetach)
            .collect();
        assert_eq!(planned.len(), 2, "{:#?}", r.volumes);
    }
    assert_eq!(
        get_node(&admin, &sc.node).await?.metadata.resource_version,
        before
    );
    assert_eq!(
        attached_to(&sc.csi_volume).await?,
        vec![sc.m.instance.clone()]
    );
    assert!(node_events(&admin, &sc.node).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_cap_refuses_loudly_beyond_the_limit() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let a = scene("Unknown", true).await?;
    let b = scene("Unknown", true).await?;
    let tainted_now = room_taken(s).await?;
    let batch = Batch {
        suspects: [&a, &b]
            .iter()
            .map(|sc| Suspect {
                target: by_instance(&sc.m.instance),
                intent: Intent::Fence,
                origin: Origin::Direct,
            })
            .collect(),
        ..Batch::default()
    };
    let settings = Policy {
        max_out_of_service: tainted_now + 1,
        ..settings()
    };
    let report = fence(s, batch, settings).await?;
    let outcomes: Vec<Outcome> = report.results.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Fenced, Outcome::Skipped], "{report:#?}");
    assert!(matches!(
        report.results[1].skip,
        Some(Skip::CapReached { .. })
    ));
    assert!(
        report.incomplete(),
        "a refusal leaves work: the invocation must fail"
    );
    assert_unfenced(&b).await?;
    let events = node_events(&admin, &b.node).await?;
    assert!(
        events.iter().any(|(r, _)| r == "FencingRefused"),
        "{events:?}"
    );
    Ok(())
}

/// Issue 12, item 14: without a cloud controller the Node of a terminated
/// instance stays, tainted, for ever. It takes no room under the cap: the
/// machine can never come back. A Node whose machine is stopped does.
#[tokio::test]
async fn a_node_whose_instance_is_terminated_does_not_fill_the_cap() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let a = scene("Unknown", true).await?;
    let b = scene("Unknown", true).await?;
    let settings = Policy {
        max_out_of_service: room_taken(s).await? + 1,
        ..settings()
    };
    let fence_one = |sc: &Scene| one(by_instance(&sc.m.instance), Intent::Fence);
    let first = fence(s, fence_one(&a), settings.clone()).await?;
    assert_eq!(only(&first).outcome, Outcome::Fenced, "{first:#?}");
    let refused = fence(s, fence_one(&b), settings.clone()).await?;
    assert!(
        matches!(only(&refused).skip, Some(Skip::CapReached { .. })),
        "{refused:#?}"
    );
    s.ec2()
        .await
        .terminate_instances()
        .instance_ids(&a.m.instance)
        .send()
        .await?;
    let report = fence(s, fence_one(&b), settings).await?;
    assert_eq!(only(&report).outcome, Outcome::Fenced, "{report:#?}");
    assert!(attached_to(&b.csi_volume).await?.is_empty());
    Ok(())
}

/// Issue 12, item 4: a storage daemon tolerates every taint (`operator:
/// Exists`), so the out-of-service taint never evicts it and its
/// VolumeAttachment stays. Its volume stays attached (reported kept) and is
/// left out of the fencing's annotation, which recovery waits on; the
/// volume of an ordinary pod is detached.
#[tokio::test]
async fn the_volume_of_a_pod_that_tolerates_the_taint_stays_attached() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = target(s, true).await?;
    let daemons = attach_new_volume(&ec2, &t.m, "/dev/xvdbz").await?;
    stop(&ec2, &t.m).await?;
    let ns = unique("daemons");
    node_fencer_tests::scene::create_namespace(&admin, &ns).await?;
    let pv = unique("pv");
    node_fencer_tests::scene::create_ebs_pv(&admin, &pv, &daemons, &t.m.az, Some((&ns, "data")))
        .await?;
    create_va(&admin, &t.node, &pv, "ebs.csi.aws.com").await?;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "storage-daemon", "namespace": ns},
        "spec": {
            "nodeName": t.node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "daemon", "image": "daemon"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        }
    }))?;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns)
        .create(&Default::default(), &pod)
        .await?;

    let report = fence(
        s,
        one(by_instance(&t.m.instance), Intent::Fence),
        settings(),
    )
    .await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete(), "{report:#?}");
    let outcome = |v: &str| {
        r.volumes
            .iter()
            .find(|x| x.volume.as_str() == v)
            .map(|x| x.outcome)
    };
    assert_eq!(
        outcome(&t.volume),
        Some(VolumeOutcome::Detached),
        "{report:#?}"
    );
    assert_eq!(outcome(&daemons), Some(VolumeOutcome::Kept), "{report:#?}");
    assert!(attached_to(&t.volume).await?.is_empty());
    assert_eq!(attached_to(&daemons).await?, vec![t.m.instance.clone()]);
    let node = get_node(&admin, &t.node).await?;
    let recorded = node
        .metadata
        .annotations
        .unwrap_or_default()
        .get(node_fencer::core::model::kube_read::ANNOTATION_VOLUMES)
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        recorded, t.volume,
        "the annotation lists only what was detached"
    );
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin)
        .delete(&ns, &Default::default())
        .await;
    Ok(())
}

#[tokio::test]
async fn one_invocation_lists_nodes_once_per_phase_and_batches_ec2_lookups() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let a = scene("Unknown", true).await?;
    let b = scene("Unknown", true).await?;
    let c = scene("Unknown", false).await?;
    let b_ip = get_node(&admin, &b.node)
        .await?
        .status
        .and_then(|st| st.addresses)
        .and_then(|a| a.into_iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address)
        .expect("ip");
    let batch = Batch {
        suspects: vec![
            Suspect {
                target: NodeRef::Name(NodeName::parse(&a.node).unwrap()),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
            Suspect {
                target: NodeRef::Address(b_ip.parse()?),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
            Suspect {
                target: by_instance(&c.m.instance),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
            // The same node again, by another name: decided once.
            Suspect {
                target: by_instance(&a.m.instance),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
        ],
        ..Batch::default()
    };
    let real_cloud = Ec2::new(s.ec2().await);
    let real_cluster = Kube::new(s.fencer().await?, "tests");
    let calls = Timeline::new();
    let (cloud, cluster) = calls.wrap(&real_cloud, &real_cluster);
    let report = fence_with(&cloud, &cluster, batch, settings()).await?;
    let outcomes: Vec<Outcome> = report.results.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [Outcome::Fenced, Outcome::Fenced, Outcome::Skipped],
        "{report:#?}"
    );
    assert_eq!(report.results[0].origins.len(), 2);
    // Once to resolve, once under the Lease to count the Nodes out of service.
    assert_eq!(calls.count("ListNodes"), 2);
    assert_eq!(calls.count("AcquireLease"), 1);
    assert_eq!(calls.count("ReleaseLease"), 1);
    assert_eq!(calls.count("ListVolumeAttachments"), 1);
    assert_eq!(calls.count("ListPersistentVolumes"), 1);
    assert_eq!(
        calls.count("DescribeInstances"),
        3 + 2,
        "confirm, re-confirm before the taint and before the pods, each batched; \
         then one look per fenced node before its first detach"
    );
    assert_eq!(
        calls.count("DescribeInstances by name"),
        2,
        "one per node decided for fencing"
    );
    Ok(())
}

/// Issue 12, item 1: a Node without a provider id used to be matched to an
/// EC2 event's instance by private DNS name alone. Another VPC of the account
/// reusing the CIDR has an instance with the same address and name; its stop
/// must never fence our Node, whose machine may be running.
#[tokio::test]
async fn a_node_without_provider_id_is_fenced_only_for_its_own_machine_in_the_cluster_vpc()
-> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let ec2 = s.ec2().await;
    let admin = s.admin().await?;
    // Two VPCs with one CIDR, each with an instance at the same address:
    // moto gives both the same private DNS name, as EC2 does.
    let octet = std::process::id() % 250 + 1;
    let ip = format!("10.200.{octet}.17");
    let ami = launch(&ec2).await?;
    let image = ec2
        .describe_instances()
        .instance_ids(&ami.instance)
        .send()
        .await?
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find_map(|i| i.image_id().map(str::to_owned))
        .unwrap_or_default();
    let mut machines = Vec::new();
    for _ in 0..2 {
        let vpc = ec2.create_vpc().cidr_block("10.200.0.0/16").send().await?;
        let vpc = vpc
            .vpc()
            .and_then(|v| v.vpc_id())
            .unwrap_or_default()
            .to_owned();
        let subnet = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(format!("10.200.{octet}.0/24"))
            .availability_zone("us-east-1a")
            .send()
            .await?;
        let run = ec2
            .run_instances()
            .image_id(&image)
            .min_count(1)
            .max_count(1)
            .subnet_id(
                subnet
                    .subnet()
                    .and_then(|s| s.subnet_id())
                    .unwrap_or_default(),
            )
            .private_ip_address(&ip)
            .send()
            .await?;
        let inst = run.instances()[0].clone();
        assert_eq!(inst.private_ip_address(), Some(ip.as_str()));
        machines.push((
            vpc,
            inst.instance_id().unwrap_or_default().to_owned(),
            inst.private_dns_name().unwrap_or_default().to_owned(),
        ));
    }
    let (our_vpc, ours, dns) = machines[0].clone();
    let (_, twin_id, twin_dns) = machines[1].clone();
    assert_eq!(twin_dns, dns, "the same name in both VPCs");
    ec2.stop_instances().instance_ids(&twin_id).send().await?;

    let spec = NodeSpec {
        name: dns.clone(),
        provider_id: None,
        ready: "Unknown",
        ip: ip.clone(),
        hostname: None,
        taints: vec![],
    };
    create_node(&admin, &spec).await?;
    let _cleanup = s.delete_on_drop(&[&spec.name]);
    let scoped = Policy {
        scope: Some(ClusterScope {
            vpc: our_vpc,
            tag: None,
        }),
        ..settings()
    };

    // The twin stops; our machine runs. Without a scope the Node is named and
    // not fenced; with the cluster's VPC the twin is not ours at all.
    let report = fence(s, one(by_instance(&twin_id), Intent::Fence), settings()).await?;
    assert_eq!(only(&report).skip, Some(Skip::NoInstance), "{report:#?}");
    let report = fence(s, one(by_instance(&twin_id), Intent::Fence), scoped.clone()).await?;
    assert_eq!(only(&report).skip, Some(Skip::NotInCluster), "{report:#?}");
    let node = get_node(&admin, &spec.name).await?;
    assert!(
        !taints(&node).contains(&OUT_OF_SERVICE.into()),
        "the twin's stop fenced our node"
    );

    // Our own machine stops: found by its address within the cluster's VPC.
    ec2.stop_instances().instance_ids(&ours).send().await?;
    let report = fence(s, one(by_instance(&ours), Intent::Fence), scoped).await?;
    assert_eq!(only(&report).outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(only(&report).node.as_deref(), Some(spec.name.as_str()));
    Ok(())
}

#[tokio::test]
async fn suspects_outside_this_cluster_are_reported_not_errors() -> anyhow::Result<()> {
    let s = stack();
    let ec2 = s.ec2().await;
    let stranger = launch(&ec2).await?;
    stop(&ec2, &stranger).await?;
    let batch = Batch {
        suspects: vec![
            Suspect {
                target: by_instance(&stranger.instance),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
            Suspect {
                target: by_instance("i-0eeeeeeeeeeeeeee0"),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
            Suspect {
                target: NodeRef::Name(NodeName::parse(&unique("nobody")).unwrap()),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
        ],
        ..Batch::default()
    };
    let report = fence(s, batch, settings()).await?;
    for r in &report.results {
        assert_eq!(r.skip, Some(Skip::NotInCluster), "{r:#?}");
    }
    assert!(!report.incomplete());
    Ok(())
}

#[tokio::test]
async fn an_unreachable_ec2_fences_nothing_and_is_counted_as_an_ec2_error() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let sc = scene("Unknown", true).await?;
    // Nothing listens on port 1: every EC2 call fails to connect.
    let config = s.sdk_config().await;
    let dead = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&config)
            .endpoint_url("http://127.0.0.1:1")
            .build(),
    );
    let cluster = Kube::new(s.fencer().await?, "node-fencer-tests");
    let (report, measured) = fence_measured(
        &Ec2::new(dead),
        &cluster,
        one(by_instance(&sc.m.instance), Intent::Fence),
        settings(),
    )
    .await?;
    let r = only(&report);
    assert_eq!(r.outcome, Outcome::Skipped, "{r:#?}");
    assert!(matches!(r.skip, Some(Skip::LookupFailed { .. })), "{r:#?}");
    assert!(report.incomplete(), "left for a retry");
    assert_eq!(
        measured.errors.get(&Dependency::Ec2),
        Some(&1),
        "{measured:?}"
    );
    assert_eq!(measured.errors.get(&Dependency::Kubernetes), None);
    let stages: Vec<Stage> = measured.stages.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        stages,
        vec![Stage::Confirm],
        "no taint, detach or verify was timed"
    );
    assert_unfenced(&sc).await
}

/// Recovery is not built yet, so nothing may remove a taint: not one another
/// writer applied (here on a Ready node whose instance runs, the state in
/// which a naive recovery would strip it), and not ours while the instance is
/// still stopped, whatever the trigger says.
#[tokio::test]
async fn no_trigger_removes_an_out_of_service_taint() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let foreign = scene("True", false).await?;
    let patch = json!({"spec": {"taints": [
        {"key": OUT_OF_SERVICE_KEY, "value": OUT_OF_SERVICE_VALUE, "effect": OUT_OF_SERVICE_EFFECT}
    ]}});
    Api::<Node>::all(admin.clone())
        .patch(
            &foreign.node,
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    let ours = scene("Unknown", true).await?;
    let fenced = fence(
        s,
        one(by_instance(&ours.m.instance), Intent::Fence),
        settings(),
    )
    .await?;
    assert_eq!(only(&fenced).outcome, Outcome::Fenced);
    let before = [
        get_node(&admin, &foreign.node).await?,
        get_node(&admin, &ours.node).await?,
    ];

    for sc in [&foreign, &ours] {
        for intent in [Intent::Recover, Intent::Fence, Intent::Check] {
            fence(s, one(by_instance(&sc.m.instance), intent), settings()).await?;
        }
    }
    for (sc, before) in [&foreign, &ours].into_iter().zip(before) {
        let after = get_node(&admin, &sc.node).await?;
        assert!(
            taints(&after).contains(&OUT_OF_SERVICE.into()),
            "{}: {:?}",
            sc.node,
            taints(&after)
        );
        assert_eq!(before.spec, after.spec, "{}: taints unchanged", sc.node);
        assert_eq!(
            before.metadata.annotations, after.metadata.annotations,
            "{}: annotations unchanged",
            sc.node
        );
    }
    Ok(())
}

/// Issue 15, against moto and the apiserver: an operator's power-off of a
/// node that reports Ready again is refused and stops nothing; with two
/// nodes dark at once and a partition guard that allows one, neither is
/// powered off, and each carries a `PowerOffRefused` Warning Event.
#[tokio::test]
async fn power_offs_are_refused_for_a_ready_node_and_by_the_partition_guard() -> anyhow::Result<()>
{
    use node_fencer::core::rules::power::ActiveFencing;
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let (a, b) = (target(s, true).await?, target(s, true).await?);
    let active = Policy {
        active_fencing: Some(ActiveFencing {
            partition_percent: 1,
            ..ActiveFencing::default()
        }),
        ..settings()
    };
    let power_off = |t: &Target| {
        fence(
            s,
            one(by_instance(&t.m.instance), Intent::PowerOff),
            active.clone(),
        )
    };

    // Two dark at once: more than 1 % of the Nodes.
    for t in [&a, &b] {
        let report = power_off(t).await?;
        let refusal = report.results[0]
            .power_off
            .as_ref()
            .and_then(|p| p.refusal.as_ref())
            .map(|r| r.code());
        assert_eq!(refusal, Some("partition"), "{report:#?}");
    }
    // b reports again: the partition is over for a, and b is Ready.
    set_ready(&admin, &b.node, "True").await?;
    let report = power_off(&b).await?;
    assert!(
        report.results[0]
            .power_off
            .as_ref()
            .is_none_or(|p| p.refusal.as_ref().map(|r| r.code()) == Some("node_ready")),
        "{report:#?}"
    );
    for t in [&a, &b] {
        assert_eq!(machine_state(&ec2, &t.m).await?, "running");
        assert!(!taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));
    }
    assert_node_events(&admin, &a.node, &["PowerOffRefused"]).await?;
    Ok(())
}

/// Issue 15: Rook/Ceph's taint pair, written to and removed from a real
/// apiserver (which keeps no `timeAdded` for a `NoSchedule` taint): both go
/// on in one patch, an operator's other taint stays, and recovery takes both
/// off once the machine EC2 saw stopped runs again.
#[tokio::test]
async fn the_no_schedule_pair_goes_on_and_comes_off_together() -> anyhow::Result<()> {
    const NO_SCHEDULE: &str = "node.kubernetes.io/out-of-service:NoSchedule";
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = target(s, false).await?;
    let pair = Policy {
        no_schedule_too: true,
        ..settings()
    };
    let run = |intent| fence(s, one(by_instance(&t.m.instance), intent), pair.clone());
    let report = run(Intent::Fence).await?;
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let fenced = taints(&get_node(&admin, &t.node).await?);
    assert!(fenced.contains(&OUT_OF_SERVICE.into()), "{fenced:?}");
    assert!(fenced.contains(&NO_SCHEDULE.into()), "{fenced:?}");

    start_instance(&ec2, &t.m).await?;
    set_ready(&admin, &t.node, "True").await?;
    delete_vas_of(&admin, &t.node).await?;
    let report = run(Intent::Recover).await?;
    assert_eq!(
        report.recoveries[0].outcome,
        node_fencer::core::outbound::report::RecoveryOutcome::Recovered,
        "{report:#?}"
    );
    let left = taints(&get_node(&admin, &t.node).await?);
    assert!(
        !left
            .iter()
            .any(|t| t.starts_with("node.kubernetes.io/out-of-service")),
        "{left:?}"
    );
    Ok(())
}

/// Issue 15: with manual recovery the fencing of a node back up ends only
/// once an operator confirmed it, the confirmation written to the Node and
/// read back from the apiserver.
#[tokio::test]
async fn manual_recovery_ends_only_after_the_operators_confirmation() -> anyhow::Result<()> {
    use node_fencer::core::model::kube_read::ANNOTATION_RECOVERY_CONFIRMED;
    use node_fencer::core::outbound::report::RecoveryOutcome;
    use node_fencer::core::rules::recovery::RecoveryPolicy;

    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = target(s, false).await?;
    let manual = Policy {
        recovery: RecoveryPolicy::Manual,
        ..settings()
    };
    let run = |intent| fence(s, one(by_instance(&t.m.instance), intent), manual.clone());
    let report = run(Intent::Fence).await?;
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");

    // Back, Ready, detached: everything but the operator allows the end.
    start_instance(&ec2, &t.m).await?;
    set_ready(&admin, &t.node, "True").await?;
    delete_vas_of(&admin, &t.node).await?;
    let report = run(Intent::Recover).await?;
    let r = &report.recoveries[0];
    assert_eq!(r.outcome, RecoveryOutcome::Kept, "{report:#?}");
    assert_eq!(
        r.hold.as_ref().map(|h| h.code()),
        Some("awaiting_confirmation")
    );
    assert!(taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));

    let report = run(Intent::Confirm).await?;
    assert_eq!(
        report.recoveries[0].outcome,
        RecoveryOutcome::Recovered,
        "{report:#?}"
    );
    let node = get_node(&admin, &t.node).await?;
    assert!(!taints(&node).contains(&OUT_OF_SERVICE.into()));
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(ANNOTATION_RECOVERY_CONFIRMED));
    assert!(!annotations.contains_key(ANNOTATION_FENCED_AT));
    assert_node_events(&admin, &t.node, &["RecoveryConfirmed"]).await?;
    Ok(())
}

/// Issue 33, item 1, against moto and the apiserver: a second Node names
/// the machine (re-registered under a new name). Running, the machine is
/// not powered off; stopped, neither Node is tainted and no volume moves.
#[tokio::test]
async fn a_machine_two_nodes_name_is_left_to_a_person() -> anyhow::Result<()> {
    use node_fencer::core::rules::power::ActiveFencing;
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = target(s, true).await?;
    let mut twin = NodeSpec::for_machine(&t.m);
    twin.ready = "True";
    create_node(&admin, &twin).await?;
    let _twin = s.delete_on_drop(&[&twin.name]);
    let active = Policy {
        active_fencing: Some(ActiveFencing {
            partition_percent: 100,
            ..ActiveFencing::default()
        }),
        ..settings()
    };
    let report = fence(s, one(by_instance(&t.m.instance), Intent::PowerOff), active).await?;
    let refusal = report.results[0]
        .power_off
        .as_ref()
        .and_then(|p| p.refusal.as_ref())
        .map(|r| r.code());
    assert_eq!(refusal, Some("shared_machine"), "{report:#?}");
    assert_eq!(machine_state(&ec2, &t.m).await?, "running");

    stop(&ec2, &t.m).await?;
    let report = fence(
        s,
        one(by_instance(&t.m.instance), Intent::Fence),
        settings(),
    )
    .await?;
    assert!(
        report
            .results
            .iter()
            .all(|r| r.skip.as_ref().map(Skip::code) == Some("shared_machine")),
        "{report:#?}"
    );
    for node in [&t.node, &twin.name] {
        assert!(!taints(&get_node(&admin, node).await?).contains(&OUT_OF_SERVICE.into()));
    }
    assert_eq!(attached_to(&t.volume).await?, vec![t.m.instance.clone()]);
    Ok(())
}

/// Issue 33, item 7, against moto and the apiserver: a hung control-plane
/// Node (kubeadm's role label) is not powered off; with
/// POWER_OFF_CONTROL_PLANE it is.
#[tokio::test]
async fn a_control_plane_node_is_not_powered_off_unless_configured() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    use node_fencer::core::rules::power::{ActiveFencing, PowerOutcome};
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = target(s, true).await?;
    let label = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}});
    Api::<Node>::all(admin.clone())
        .patch(&t.node, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let active = |control_plane| Policy {
        active_fencing: Some(ActiveFencing {
            partition_percent: 100,
            control_plane,
            wait: std::time::Duration::from_secs(20),
            ..ActiveFencing::default()
        }),
        ..settings()
    };
    let power_off = || one(by_instance(&t.m.instance), Intent::PowerOff);
    let report = fence(s, power_off(), active(false)).await?;
    let power = report.results[0]
        .power_off
        .clone()
        .expect("a power-off report");
    assert_eq!(
        power.refusal.as_ref().map(|r| r.code()),
        Some("control_plane"),
        "{report:#?}"
    );
    assert_eq!(machine_state(&ec2, &t.m).await?, "running");
    let report = fence(s, power_off(), active(true)).await?;
    let power = report.results[0]
        .power_off
        .clone()
        .expect("a power-off report");
    assert_eq!(power.outcome, PowerOutcome::Stopped, "{report:#?}");
    Ok(())
}

/// Issue 37: the opt-out label and `NODE_SELECTOR` against the apiserver
/// and moto. A stopped, NotReady Node that opted out, or that the selector
/// does not select, is left untouched, with a `FencingRefused` Event that
/// says why; selected and no longer opted out, the same Node is fenced.
#[tokio::test]
async fn a_node_outside_the_reach_is_refused_with_an_event_then_fenced_once_in_it()
-> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    use node_fencer::core::model::selector::LabelSelector;
    use node_fencer::core::rules::reach::{Exemption, OPT_OUT_LABEL, Reach};
    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let sc = scene("Unknown", true).await?;
    let label = |labels: serde_json::Value| {
        let nodes: Api<Node> = Api::all(admin.clone());
        let name = sc.node.clone();
        async move {
            nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": labels}})),
                )
                .await
        }
    };
    let stateful = Policy {
        reach: Reach {
            selector: Some(LabelSelector::parse("pool=stateful").map_err(anyhow::Error::msg)?),
        },
        ..settings()
    };
    let target = || {
        one(
            NodeRef::Name(NodeName::parse(&sc.node).unwrap()),
            Intent::Fence,
        )
    };

    label(json!({OPT_OUT_LABEL: "true", "pool": "stateful"})).await?;
    let report = fence(s, target(), stateful.clone()).await?;
    assert_eq!(only(&report).skip, Some(Skip::Exempt(Exemption::OptedOut)));
    assert!(!report.incomplete());
    assert_unfenced(&sc).await?;

    label(json!({OPT_OUT_LABEL: null, "pool": "web"})).await?;
    let report = fence(s, target(), stateful.clone()).await?;
    assert!(
        matches!(
            only(&report).skip,
            Some(Skip::Exempt(Exemption::OutOfScope { .. }))
        ),
        "{report:#?}"
    );
    assert_unfenced(&sc).await?;
    let refusals = node_event_notes(&admin, &sc.node, "FencingRefused").await?;
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(
        refusals.iter().any(|m| m.contains(OPT_OUT_LABEL)),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|m| m.contains("NODE_SELECTOR (pool=stateful)")),
        "{refusals:?}"
    );

    label(json!({"pool": "stateful"})).await?;
    let report = fence(s, target(), stateful).await?;
    assert_eq!(only(&report).outcome, Outcome::Fenced, "{report:#?}");
    Ok(())
}

/// Issue 37: another writer's out-of-service taint (here the value
/// aws-node-termination-handler and medik8s FAR write). On a running
/// machine node-fencer touches nothing and records a Warning naming that
/// taint; once the machine is stopped, it detaches the volume without
/// writing a mark of its own, so the taint stays the other writer's.
#[tokio::test]
async fn another_writers_taint_is_reported_on_a_running_machine_and_freed_once_off()
-> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let sc = scene("Unknown", false).await?;
    let neighbour = json!({"spec": {"taints": [{
        "key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"
    }]}});
    Api::<Node>::all(admin.clone())
        .patch(&sc.node, &PatchParams::default(), &Patch::Merge(neighbour))
        .await?;
    let target = || {
        one(
            NodeRef::Name(NodeName::parse(&sc.node).unwrap()),
            Intent::Fence,
        )
    };

    let report = fence(s, target(), settings()).await?;
    assert!(
        matches!(only(&report).skip, Some(Skip::InstanceNotOff { .. })),
        "{report:#?}"
    );
    let warned = node_event_notes(&admin, &sc.node, "OutOfServiceTaintOnLiveMachine").await?;
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"),
        "{warned:?}"
    );
    assert_eq!(
        attached_to(&sc.csi_volume).await?,
        vec![sc.m.instance.clone()]
    );

    stop(&s.ec2().await, &sc.m).await?;
    let report = fence(s, target(), settings()).await?;
    assert_eq!(only(&report).outcome, Outcome::AlreadyFenced, "{report:#?}");
    assert!(
        attached_to(&sc.csi_volume).await?.is_empty(),
        "force-detached"
    );
    let node = get_node(&admin, &sc.node).await?;
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(ANNOTATION_FENCED_AT),
        "no mark: the taint is not node-fencer's to remove"
    );
    Ok(())
}
