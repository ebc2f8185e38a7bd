//! The oldest Kubernetes node-fencer supports, 1.15 (seed 001's), for real:
//! a control plane built from `tests/stack/gomod/kubernetes-1.15` with its
//! controllers, kwok nodes and the cStor driver behind the external-attacher
//! of 1.15's day (v2.0.0), the Lambda build under AWS's runtime emulator.
//! Seed 001's own scene moves there. Every call that differs by version is
//! made there: the version probe that picks the legacy mode, the node count
//! behind a percentage cap (1.15 does not count what is left of a paged
//! list: counted page by page), the Events (`events.k8s.io/v1beta1`, in
//! `kube-system`), the status patches, the VolumeAttachments. And a server
//! older than 1.15 is refused, by the run and by `preflight`, with nothing
//! written.

use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use node_fencer::core::model::facts::CsiVolume;
use node_fencer::core::rules::volumes::attachment_name;
use node_fencer::shell::cluster::{ClusterReads, Kube};
use node_fencer_tests::Stack;
use node_fencer_tests::attacher::{DRIVER, Driver};
use node_fencer_tests::cluster::{oldest_cluster_serial, oldest_cluster_stack};
use node_fencer_tests::faults::{Fault, FaultProxy, Match};
use node_fencer_tests::fixtures::{self, attach_new_volume, stop, unique, volume};
use node_fencer_tests::rie::{Function, Rie};
use node_fencer_tests::scene::*;
use serde_json::json;

use crate::only_result;

/// Bound on a node turning NotReady (grace period 10 s, checked every 2 s).
const NOT_READY: Duration = Duration::from_secs(40);
/// Bound on the stuck state showing once the node is NotReady.
const STUCK: Duration = Duration::from_secs(20);
/// Bound on the recovery after legacy fencing, as on the old control plane.
const RECOVERY: Duration = Duration::from_secs(30);

/// The Events node-fencer wrote about `node` on 1.15: `events.k8s.io/v1beta1`
/// in `kube-system`, their reasons.
async fn v1beta1_events(admin: &kube::Client, node: &str) -> anyhow::Result<Vec<String>> {
    Ok(fixtures::v1beta1_events(admin)
        .await?
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .filter(|e| e.reporting_controller.as_deref() == Some("node-fencer.io/node-fencer"))
        .filter_map(|e| e.reason)
        .collect())
}

/// What the attach/detach controller and the external-attacher leave for
/// an EBS volume attached to `node` (neither attaches here: 1.15 serves no
/// `storage.k8s.io/v1` CSINode for this attacher): the VolumeAttachment of
/// `pv`, attached, under the name Kubernetes gives it, and the volume in
/// the Node's `status.volumesAttached`.
async fn attached_va(
    admin: &kube::Client,
    pv: &str,
    volume: &str,
    node: &str,
) -> anyhow::Result<String> {
    let csi = CsiVolume {
        driver: DRIVER.into(),
        handle: volume.into(),
    };
    let name = attachment_name(&csi, node);
    let api: Api<VolumeAttachment> = Api::all(admin.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": node,
                 "source": {"persistentVolumeName": pv}}
    }))?;
    api.create(&PostParams::default(), &va).await?;
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"attached": true}})),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesAttached": [
                {"name": format!("kubernetes.io/csi/{DRIVER}^{volume}"), "devicePath": ""}
            ]}})),
        )
        .await?;
    Ok(name)
}

/// A scene on the oldest stack: three kwok nodes, node 2 down with a pod
/// and an attached EBS volume.
struct Scene {
    admin: kube::Client,
    /// Its namespace, holding node 2's pod.
    namespace: String,
    workers: Vec<Worker>,
    /// The EBS volume, its PersistentVolume and its VolumeAttachment.
    volume: String,
    pv: String,
    va: String,
}

impl Scene {
    fn node2(&self) -> &Worker {
        &self.workers[1]
    }

    /// Removes what the scene made: its namespace, Nodes, PV and
    /// VolumeAttachment.
    async fn teardown(self) {
        let names: Vec<String> = self.workers.iter().map(|w| w.name.clone()).collect();
        teardown(&self.admin, Some(self.namespace.as_str()), &names).await;
        let _ = Api::<VolumeAttachment>::all(self.admin.clone())
            .delete(&self.va, &Default::default())
            .await;
        let _ = Api::<PersistentVolume>::all(self.admin.clone())
            .delete(&self.pv, &Default::default())
            .await;
    }
}

/// Three kwok nodes on moto instances; node 2 with a pod and an attached
/// EBS volume (its PV and VolumeAttachment), its instance stopped and its
/// heartbeats gone, NotReady.
async fn scene_with_node2_down(s: &Stack) -> anyhow::Result<Scene> {
    let admin = s.admin().await?;
    let namespace = unique("oldest");
    create_namespace(&admin, &namespace).await?;
    let workers = add_workers(s, &namespace, 3, |_| false).await?;
    let node2 = &workers[1];
    let ec2 = s.ec2().await;
    let volume = attach_new_volume(&ec2, &node2.machine, "/dev/sdf").await?;
    let pv = format!("{namespace}-pv");
    create_ebs_pv(&admin, &pv, &volume, &node2.machine.az, None).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"nodeName": node2.name, "containers": [{"name": "c", "image": "db"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    stop_heartbeats(&admin, &node2.name).await?;
    let va = attached_va(&admin, &pv, &volume, &node2.name).await?;
    stop(&ec2, &node2.machine).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2.name), NOT_READY).await?;
    Ok(Scene {
        admin,
        namespace,
        workers,
        volume,
        pv,
        va,
    })
}

/// Seed 001's fencing on its own Kubernetes: `FENCING_MODE` at `auto` picks
/// the legacy recipe; the pod and the VolumeAttachment deleted, the volume
/// detached, the Events written where 1.15 takes them. And the count of
/// Nodes behind a percentage cap, which 1.15 leaves to be made page by page.
#[tokio::test]
async fn on_kubernetes_1_15_the_legacy_fencing_makes_every_call_it_serves() -> anyhow::Result<()> {
    let _g = oldest_cluster_serial().await;
    let s = oldest_cluster_stack();
    let scene = scene_with_node2_down(s).await?;
    let (admin, node2) = (&scene.admin, scene.node2());

    // The count behind a percentage cap: 1.15 leaves `remainingItemCount`
    // out of a paged list, so a first page of one counts one.
    let nodes: Api<Node> = Api::all(admin.clone());
    let every = nodes
        .list_metadata(&ListParams::default())
        .await?
        .items
        .len();
    let fencer = Kube::new(s.fencer().await?, "oldest-test");
    assert_eq!(fencer.count_nodes().await?, every, "every Node counted");
    assert!(every >= 3);

    let rie = Rie::start(s, Function::Lambda, 60, &[])?;
    let answer = rie
        .invoke(&eventbridge_event(&node2.machine.instance, "stopped"))
        .await?;
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    let report = answer.json()?;
    assert_eq!(report["mode"], "legacy", "{report:#}");
    let result = only_result(&report, &node2.name);
    assert_eq!(result["outcome"], "fenced", "{report:#}");

    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    assert!(
        vas.get_opt(&scene.va).await?.is_none(),
        "the VolumeAttachment deleted: {report:#}"
    );
    let (_, on) = volume(&s.ec2().await, &scene.volume).await?;
    assert!(on.is_empty(), "the volume detached: {on:?}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &scene.namespace);
    let left: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node2.name.as_str())
        })
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(left.is_empty(), "node 2's pod force-deleted: {left:?}");
    let reasons = v1beta1_events(admin, &node2.name).await?;
    assert!(
        reasons.iter().any(|r| r == "VolumesForceDetached"),
        "the Events in kube-system, events.k8s.io/v1beta1: {reasons:?}"
    );
    scene.teardown().await;
    Ok(())
}

/// Seed 001's own scene on its own Kubernetes: the cStor StatefulSet and
/// Deployment of a node whose machine stopped. Without node-fencer 1.15's
/// attach/detach controller refuses the replacement the volume (Multi-Attach)
/// and the StatefulSet's pod stays Terminating; with it, `FENCING_MODE` at
/// `auto` picks the legacy recipe, which deletes the pods and both
/// VolumeAttachments and releases the volumes from `volumesInUse`, and the
/// workloads run elsewhere with their volumes, attached by 1.15's attach/detach
/// controller through the external-attacher of 1.15's day.
#[tokio::test]
async fn on_kubernetes_1_15_seed_001s_cstor_workloads_move_in_legacy_mode() -> anyhow::Result<()> {
    let _g = oldest_cluster_serial().await;
    let s = oldest_cluster_stack();
    let admin = s.admin().await?;
    let seed = seed_with(s, Driver::Cstor).await?;
    let node2 = seed.node2().name.clone();
    kill_node2(s, &seed, false).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    let st = wait_stuck(s, &seed, STUCK).await?;
    assert!(
        st.db_stuck_on_node2 && st.app_replacement_without_volume && st.node2_attachments_kept,
        "stuck without node-fencer: {st:?}"
    );

    let rie = Rie::start(s, Function::Lambda, 60, &[])?;
    let sent = Instant::now();
    let answer = rie
        .invoke(&eventbridge_event(
            &seed.node2().machine.instance,
            "stopped",
        ))
        .await?;
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    let report = answer.json()?;
    assert_eq!(report["mode"], "legacy", "{report:#}");
    let result = only_result(&report, &node2);
    assert_eq!(result["outcome"], "fenced", "{report:#}");
    assert_eq!(result["attachments_deleted"], 2, "{report:#}");
    let rec = wait_recovered(s, &seed, RECOVERY).await?;
    eprintln!(
        "seed 001 on 1.15: db on {}, app on {} {:?} after the event",
        rec.db_node,
        rec.app_node,
        sent.elapsed()
    );
    assert_ne!(rec.db_node, node2);
    assert_ne!(rec.app_node, node2);
    let left: Vec<String> = Api::<VolumeAttachment>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|va| va.spec.node_name == node2)
        .filter_map(|va| va.metadata.name)
        .collect();
    assert!(left.is_empty(), "node 2's attachments are gone: {left:?}");
    let reasons = v1beta1_events(&admin, &node2).await?;
    for want in [
        "FencedLegacy",
        "PodsForceDeleted",
        "VolumeAttachmentsDeleted",
    ] {
        assert!(
            reasons.iter().any(|r| r == want),
            "{want} among node-fencer's Events: {reasons:?}"
        );
    }
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// A server older than 1.15 (the apiserver's `/version` answered as 1.14 by
/// a proxy): the run refuses before anything is read past the version, and
/// says why; `preflight` fails with the same words; the Node is untouched.
#[tokio::test]
async fn a_server_older_than_the_oldest_supported_is_refused_and_nothing_is_written()
-> anyhow::Result<()> {
    let _g = oldest_cluster_serial().await;
    let s = oldest_cluster_stack();
    let scene = scene_with_node2_down(s).await?;
    let (admin, node2) = (&scene.admin, scene.node2());
    let proxy = FaultProxy::to_apiserver(s.var("KUBECONFIG")).await?;
    proxy.inject(
        Match::any().method(Method::GET).path("/version"),
        Fault::Respond {
            status: 200,
            content_type: "application/json",
            body: json!({"major": "1", "minor": "14", "gitVersion": "v1.14.10"}).to_string(),
        },
        usize::MAX,
    );
    let kubeconfig = s
        .fencer_kubeconfig_file_via(&proxy.url, "v1.14")?
        .display()
        .to_string();
    let words =
        "Kubernetes 1.14 is older than 1.15, the oldest node-fencer supports: nothing was done";

    let rie = Rie::start(s, Function::Lambda, 60, &[("KUBECONFIG", &kubeconfig)])?;
    let answer = rie
        .invoke(&eventbridge_event(&node2.machine.instance, "stopped"))
        .await?;
    assert_eq!(
        answer.error_type().as_deref(),
        Some("NodeFencer.UnsupportedCluster"),
        "{}",
        answer.body
    );
    assert!(answer.body.contains(words), "{}", answer.body);
    let asked: Vec<String> = proxy
        .seen()
        .iter()
        .map(|r| r.path.split('?').next().unwrap_or_default().to_owned())
        .collect();
    assert!(
        asked.iter().all(|p| p == "/version"),
        "nothing asked past the version: {asked:?}"
    );

    // Run beside this test's runtime, which serves the proxy.
    let mut command = std::process::Command::new(Function::Lambda.binary()?);
    command
        .arg("preflight")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("KUBECONFIG", &kubeconfig)
        .env("AWS_ENDPOINT_URL", s.var("AWS_ENDPOINT_URL"))
        .env("AWS_REGION", s.var("AWS_REGION"))
        .env("AWS_ACCESS_KEY_ID", s.var("AWS_ACCESS_KEY_ID"))
        .env("AWS_SECRET_ACCESS_KEY", s.var("AWS_SECRET_ACCESS_KEY"))
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let preflight = tokio::task::spawn_blocking(move || command.output()).await??;
    let out = String::from_utf8_lossy(&preflight.stdout);
    assert!(!preflight.status.success(), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("api server") && l.contains(words)),
        "{out}"
    );

    // The node controller writes the Node; node-fencer wrote nothing on it.
    assert_eq!(
        node_taints(admin, &node2.name)
            .await?
            .iter()
            .filter(|t| t.starts_with("node.kubernetes.io/out-of-service"))
            .count(),
        0
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = nodes.get(&node2.name).await?;
    let marks: Vec<&String> = node
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("node-fencer.io/"))
        .collect();
    assert!(marks.is_empty(), "no mark of node-fencer's: {marks:?}");
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    assert!(
        vas.get_opt(&scene.va).await?.is_some(),
        "the VolumeAttachment kept"
    );
    let (_, on) = volume(&s.ec2().await, &scene.volume).await?;
    assert_eq!(on, vec![node2.machine.instance.clone()], "the volume kept");
    assert!(v1beta1_events(admin, &node2.name).await?.is_empty());
    scene.teardown().await;
    Ok(())
}
