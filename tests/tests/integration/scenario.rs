//! End-to-end scenarios on a control plane with its controllers
//! (kube-controller-manager, kube-scheduler, kwok nodes), moto, the CSI
//! attacher stand-in, and the real binary under `cargo lambda watch`, as the
//! node-fencer group under `infra/kubernetes/rbac.yaml`.
//!
//! The seed scenario: a StatefulSet and a Deployment, each with a
//! ReadWriteOnce volume, run on node 2; node 2's instance stops. Kubernetes
//! alone leaves them stuck; node-fencer's taint and detach let the
//! controllers move them, volumes included.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::PostParams;
use node_fencer::core::rules::silence::{MARK_REASON, SKEW_MARGIN_SECS};
use node_fencer_tests::Stack;
use node_fencer_tests::attacher::Driver;
use node_fencer_tests::cluster::{
    cluster_serial, cluster_stack, old_cluster_serial, old_cluster_stack, restore_rbac,
    wait_for_rbac,
};
use node_fencer_tests::fixtures::{
    assert_node_events, instance_state, node_events, room_taken, unique, volume,
};
use node_fencer_tests::lambda::{Emulator, WEBHOOK_TOKEN, start_emulator};
use node_fencer_tests::scene::*;
use serde_json::{Value, json};

use crate::{only_result, results_for};

/// How long the stuck state is watched before node-fencer is called.
const OBSERVE: Duration = Duration::from_secs(20);
/// Bound on the recovery after fencing (the pod garbage collector runs every 20 s).
const RECOVERY: Duration = Duration::from_secs(75);
/// Bound on the recovery after legacy fencing, on the old control plane:
/// with the freed volumes released from the Node's `volumesInUse` the
/// attach/detach controller detaches them at once; without, it noticed the
/// deleted VolumeAttachments only on its sync, every minute.
const LEGACY_RECOVERY: Duration = Duration::from_secs(30);
/// Bound on a node turning NotReady (grace period 10 s, checked every 2 s).
const NOT_READY: Duration = Duration::from_secs(40);

/// The controller stack's grace period is 10 s: a `stopped` event sent at
/// the stop is answered once the Node turns NotReady, well within this.
const NOT_READY_WAIT: &[(&str, &str)] = &[("NOT_READY_WAIT_SECONDS", "30")];

/// The emulator of the controller stack, started once per process.
fn emulator() -> &'static Emulator {
    static EMULATOR: OnceLock<Result<Emulator, String>> = OnceLock::new();
    match EMULATOR.get_or_init(|| {
        start_emulator(cluster_stack(), NOT_READY_WAIT).map_err(|e| format!("{e:#}"))
    }) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

/// The emulator of the old control plane's stack, `FENCING_MODE` left at
/// `auto`: it must pick the legacy recipe by itself there. Started once per
/// process.
fn legacy_emulator() -> &'static Emulator {
    static LEGACY: OnceLock<Result<Emulator, String>> = OnceLock::new();
    match LEGACY.get_or_init(|| {
        start_emulator(old_cluster_stack(), NOT_READY_WAIT).map_err(|e| format!("{e:#}"))
    }) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

/// The emulator with `FAST_NOT_READY=false`, started once per process.
fn slow_emulator() -> &'static Emulator {
    static SLOW: OnceLock<Result<Emulator, String>> = OnceLock::new();
    match SLOW.get_or_init(|| {
        start_emulator(
            cluster_stack(),
            &[("FAST_NOT_READY", "false"), NOT_READY_WAIT[0]],
        )
        .map_err(|e| format!("{e:#}"))
    }) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

/// Active fencing at its shortest: a node NotReady for a minute may be
/// powered off.
const POWER_OFF_AFTER: Duration = Duration::from_secs(60);

/// The emulator with `ACTIVE_FENCING=stuck`, started once per process:
/// node 2's pods hold volumes only one node may attach (the seed's claims
/// are ReadWriteOnce), read from the apiserver before the power-off.
fn active_emulator() -> &'static Emulator {
    static ACTIVE: OnceLock<Result<Emulator, String>> = OnceLock::new();
    match ACTIVE.get_or_init(|| {
        start_emulator(
            cluster_stack(),
            &[
                ("ACTIVE_FENCING", "stuck"),
                ("POWER_OFF_AFTER_SECONDS", "60"),
                ("POWER_OFF_WAIT_SECONDS", "30"),
                NOT_READY_WAIT[0],
            ],
        )
        .map_err(|e| format!("{e:#}"))
    }) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

fn bearer() -> String {
    format!("Bearer {WEBHOOK_TOKEN}")
}

async fn attached_instances(s: &Stack, volume_id: &str) -> anyhow::Result<Vec<String>> {
    Ok(volume(&s.ec2().await, volume_id).await?.1)
}

/// Neither workload's volume is attached to node 2's instance any more.
async fn assert_volumes_off_node2(s: &Stack, seed: &Seed) -> anyhow::Result<()> {
    for w in [&seed.db, &seed.app] {
        assert!(
            !attached_instances(s, &w.volume)
                .await?
                .contains(&seed.node2().machine.instance),
            "{}: off node 2's instance",
            w.name
        );
    }
    Ok(())
}

/// After fencing: node 2 tainted, both workloads running elsewhere with their
/// volumes attached to the new instances, node 2's attachments and pods gone.
async fn assert_recovered(seed: &Seed) -> anyhow::Result<Recovery> {
    let s = cluster_stack();
    let admin = s.admin().await?;
    let node2 = seed.node2().name.clone();
    assert!(is_fenced(&admin, &node2).await?, "node 2 carries the taint");
    let rec = wait_recovered(s, seed, RECOVERY).await?;
    assert_ne!(rec.db_node, node2);
    assert_ne!(rec.app_node, node2);
    for (w, node) in [(&seed.db, &rec.db_node), (&seed.app, &rec.app_node)] {
        let vas = attachments(&admin, &w.pv).await?;
        assert!(
            vas.iter().all(|va| va.node != node2),
            "{}: node 2's VolumeAttachment is gone: {vas:?}",
            w.name
        );
        let instance = &seed.worker(node).map(|x| x.machine.instance.clone());
        assert_eq!(
            Some(attached_instances(cluster_stack(), &w.volume).await?),
            instance.as_ref().map(|i| vec![i.clone()]),
            "{}: the volume follows to {node}'s instance",
            w.name
        );
    }
    for app in ["db", "app"] {
        let left: Vec<PodView> = pods(&admin, &seed.namespace, app)
            .await?
            .into_iter()
            .filter(|p| p.node.as_deref() == Some(node2.as_str()))
            .collect();
        assert!(left.is_empty(), "{app}: old pods force-deleted: {left:?}");
    }
    Ok(rec)
}

/// The seed scene with node 2 gone silent (and its instance stopped unless
/// `keep_instance`), once Kubernetes sees it NotReady. Returns the admin
/// client, the scene and node 2's name.
async fn seed_with_node2_down(keep_instance: bool) -> anyhow::Result<(kube::Client, Seed, String)> {
    seed_of_driver_with_node2_down(cluster_stack(), Driver::Ebs, keep_instance).await
}

/// [`seed_with_node2_down`] with the volumes of `driver`.
async fn seed_of_driver_with_node2_down(
    s: &Stack,
    driver: Driver,
    keep_instance: bool,
) -> anyhow::Result<(kube::Client, Seed, String)> {
    let admin = s.admin().await?;
    let seed = seed_with(s, driver).await?;
    let node2 = seed.node2().name.clone();
    let t0 = Instant::now();
    kill_node2(s, &seed, keep_instance).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    eprintln!(
        "{}: node 2 NotReady after {:?}",
        seed.namespace,
        t0.elapsed()
    );
    Ok((admin, seed, node2))
}

#[tokio::test]
async fn seed_scenario_stuck_without_node_fencer_recovered_with_it() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let (admin, seed, node2) = seed_with_node2_down(false).await?;

    // Without node-fencer: Kubernetes evicts (Terminating) but cannot move anything.
    let not_ready_at = Instant::now();
    wait_stuck(s, &seed, OBSERVE).await?;
    tokio::time::sleep(OBSERVE.saturating_sub(not_ready_at.elapsed())).await;
    let st = stuck(s, &seed).await?;
    eprintln!("seed: after {OBSERVE:?} NotReady without node-fencer: {st:?}");
    assert!(
        st.db_stuck_on_node2 && st.db_terminating,
        "db-0 stays Terminating on node 2, no replacement: {st:?}"
    );
    assert!(
        st.app_replacement_without_volume,
        "app's replacement has no volume: {st:?}"
    );
    assert!(
        st.multi_attach
            .iter()
            .any(|m| m.contains("Volume is already used by pod")),
        "{st:?}"
    );
    assert!(st.node2_attachments_kept, "{st:?}");
    assert!(!is_fenced(&admin, &node2).await?);
    for w in [&seed.db, &seed.app] {
        assert_eq!(
            attached_instances(cluster_stack(), &w.volume).await?,
            vec![seed.node2().machine.instance.clone()]
        );
    }

    // The EventBridge `stopped` event, through the real binary.
    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let sent = Instant::now();
    let out = emu.invoke(&event)?;
    let answered = sent.elapsed();
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    let detached: Vec<&Value> = r["volumes"]
        .as_array()
        .map(|v| v.iter().filter(|v| v["outcome"] == "detached").collect())
        .unwrap_or_default();
    assert_eq!(detached.len(), 2, "both volumes force-detached: {r:#}");
    // Both old pods were evicted (Terminating): the pod garbage collector
    // would force-delete them on its next pass; node-fencer did at once.
    assert_eq!(r["pods_deleted"], 2, "{r:#}");
    assert_volumes_off_node2(cluster_stack(), &seed).await?;
    let rec = assert_recovered(&seed).await?;
    eprintln!(
        "seed: invocation answered in {answered:?}; db on {}, app on {} {:?} after the event",
        rec.db_node,
        rec.app_node,
        sent.elapsed()
    );
    // Once the taint is on, the attach/detach controller may free a volume
    // before node-fencer's own detach reaches it, which then finds it
    // detaching (the volume's `detail` says so): the Event names only the
    // detaches node-fencer sent.
    let ours = detached.iter().any(|v| v["detail"].is_null());
    let mut reasons = vec!["OutOfServiceTaintApplied"];
    if ours {
        reasons.push("VolumesForceDetached");
    }
    assert_node_events(&admin, &node2, &reasons).await?;
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// Issue 16: EC2's `stopped` comes before the node controller notices. The
/// event sent at the stop, while node 2 is still Ready, is answered by one
/// invocation: it waits for NotReady, fences, and force-deletes the pods
/// the taint evicts right after it (never a pod of another node), so the
/// workloads move without waiting for a retry or the pod garbage collector.
#[tokio::test]
async fn a_stopped_event_sent_at_the_stop_is_fenced_in_one_invocation() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let admin = s.admin().await?;
    let seed = seed(s).await?;
    let node2 = seed.node2().name.clone();
    let bystander: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bystander"},
        "spec": {"nodeName": seed.workers[0].name,
                 "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    let pods_api: Api<Pod> = Api::namespaced(admin.clone(), &seed.namespace);
    pods_api.create(&PostParams::default(), &bystander).await?;
    let stopped = Instant::now();
    kill_node2(s, &seed, false).await?;
    assert_eq!(ready(&admin, &node2).await?.as_deref(), Some("True"));
    let out = emu.invoke(&eventbridge_event(
        &seed.node2().machine.instance,
        "stopped",
    ))?;
    let answered = stopped.elapsed();
    assert!(!out.error, "one invocation, no retry: {}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["pods_deleted"], 2, "db-0 and app's pod: {r:#}");
    assert_ne!(ready(&admin, &node2).await?.as_deref(), Some("True"));
    let rec = recovered_elsewhere(s, &seed, RECOVERY, "seed (event at the stop)", stopped).await?;
    eprintln!(
        "event at the stop: answered {answered:?} after the stop; db on {}, app on {}",
        rec.db_node, rec.app_node
    );
    let b = pods_api.get("bystander").await?;
    assert!(
        b.metadata.deletion_timestamp.is_none(),
        "a pod of another node is never deleted"
    );
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// `FAST_NOT_READY` at its default, against node 2's real kubelet, killed
/// more than the margin before its instance stops, and the `stopped` event
/// sent at the stop: node-fencer marks the Node `Ready=Unknown` itself and
/// fences it at once, and the workloads move long before the node
/// controller's grace period would have ended.
#[tokio::test]
async fn the_fast_path_moves_the_seed_before_the_grace_period() -> anyhow::Result<()> {
    event_at_a_proven_stop(emulator(), true).await
}

/// The same stop with `FAST_NOT_READY=false`: the invocation waits for the
/// node controller to mark the Node, then fences it.
#[tokio::test]
async fn without_the_fast_path_the_seed_waits_for_the_node_controller() -> anyhow::Result<()> {
    event_at_a_proven_stop(slow_emulator(), false).await
}

/// The seed, node 2's kubelet dead more than the margin before its
/// instance's stop, the `stopped` event sent at the stop to `emu`.
async fn event_at_a_proven_stop(emu: &Emulator, fast: bool) -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let seed = seed(s).await?;
    let node2 = seed.node2().name.clone();
    kill_node2_after_its_kubelet(s, &seed, SKEW_MARGIN_SECS).await?;
    let stopped = Instant::now();
    assert_eq!(ready(&admin, &node2).await?.as_deref(), Some("True"));
    let out = emu.invoke(&eventbridge_event(
        &seed.node2().machine.instance,
        "stopped",
    ))?;
    let answered = stopped.elapsed();
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    assert_eq!(
        only_result(&report, &node2)["outcome"],
        "fenced",
        "{report:#}"
    );
    let reason = ready_reason(&admin, &node2).await?;
    if fast {
        assert_eq!(
            reason.as_deref(),
            Some(MARK_REASON),
            "marked by node-fencer"
        );
        assert_node_events(&admin, &node2, &["MarkedNotReady"]).await?;
    } else {
        assert_ne!(
            reason.as_deref(),
            Some(MARK_REASON),
            "the node controller's"
        );
    }
    let label = if fast {
        "fast path"
    } else {
        "without the fast path"
    };
    let rec = recovered_elsewhere(s, &seed, RECOVERY, label, stopped).await?;
    eprintln!(
        "{label}: answered {answered:?} after the stop; db on {}, app on {}",
        rec.db_node, rec.app_node
    );
    teardown_seed(&admin, &seed).await;
    Ok(())
}

#[tokio::test]
async fn split_brain_a_silent_node_whose_instance_runs_is_left_alone() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    // A network partition: heartbeats stop, the instance keeps running (and writing).
    let (admin, seed, node2) = seed_with_node2_down(true).await?;
    let instance = seed.node2().machine.instance.clone();

    // A `stopped` event that EC2 contradicts, and the alert a partition raises.
    let out = emu.invoke(&eventbridge_event(&instance, "stopped"))?;
    assert!(!out.error, "nothing to retry: {}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "skipped", "{report:#}");
    assert_eq!(r["skip"]["reason"], "instance_not_off", "{report:#}");
    let (status, body) =
        emu.post_function_url(&kube_node_not_ready(&[&node2]).to_string(), Some(&bearer()))?;
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body)?;
    assert_eq!(
        only_result(&report, &node2)["skip"]["reason"],
        "instance_not_off",
        "{report:#}"
    );

    // One pod garbage collection period later, nothing was forced.
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(!is_fenced(&admin, &node2).await?, "no taint");
    for w in [&seed.db, &seed.app] {
        assert_eq!(
            attached_instances(cluster_stack(), &w.volume).await?,
            vec![instance.clone()],
            "{}: still attached to the running instance",
            w.name
        );
        assert!(
            attachments(&admin, &w.pv)
                .await?
                .iter()
                .any(|va| va.node == node2 && va.attached && !va.deleting),
            "{}: node 2's attachment stays",
            w.name
        );
    }
    let db = pods(&admin, &seed.namespace, "db").await?;
    assert!(
        db.iter()
            .any(|p| p.name == "db-0" && p.node.as_deref() == Some(node2.as_str())),
        "db-0 was not force-deleted: {db:?}"
    );
    assert!(
        running_with_volume(s, &seed, &seed.db, Some(&node2))
            .await?
            .is_none(),
        "no second db with the volume"
    );
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// Issue 15: a hung node (heartbeats stop, the instance keeps running in
/// EC2) with active fencing on. Too early, it is left running; once NotReady
/// for POWER_OFF_AFTER_SECONDS, the KubeNodeNotReady alert has its machine
/// powered off, and the same invocation fences it once EC2 reports it
/// stopped: both workloads run elsewhere with their volumes. (With active
/// fencing off, the same alert changes nothing: the split-brain test.)
#[tokio::test]
async fn active_fencing_powers_off_a_hung_node_and_its_workloads_move() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = active_emulator();
    let hung = Instant::now();
    let (admin, seed, node2) = seed_with_node2_down(true).await?;
    let not_ready = Instant::now();
    let instance = seed.node2().machine.instance.clone();
    let ec2 = s.ec2().await;
    let state = || instance_state(&ec2, &instance);

    // Too early: an operator's request is refused, the machine runs on.
    let early = json!({"action": "fence", "node": node2, "powerOff": true});
    let out = emu.invoke(&early)?;
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "skipped", "{report:#}");
    assert_eq!(
        r["power_off"]["refusal"]["reason"], "not_ready_too_short",
        "{report:#}"
    );
    assert_eq!(state().await?, "running");
    assert!(!is_fenced(&admin, &node2).await?);

    tokio::time::sleep(
        POWER_OFF_AFTER.saturating_sub(not_ready.elapsed()) + Duration::from_secs(2),
    )
    .await;
    let body = kube_node_not_ready(&[&node2]).to_string();
    let sent = Instant::now();
    let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["power_off"]["outcome"], "stopped", "{report:#}");
    assert!(
        r["power_off"]["status_checks"]["instance"].is_string(),
        "the status checks are recorded: {report:#}"
    );
    assert_eq!(state().await?, "stopped");
    assert_volumes_off_node2(cluster_stack(), &seed).await?;
    let rec = assert_recovered(&seed).await?;
    eprintln!(
        "hung node: NotReady {:?} after the hang; db on {}, app on {} {:?} after the alert, {:?} after the hang",
        not_ready - hung,
        rec.db_node,
        rec.app_node,
        sent.elapsed(),
        hung.elapsed()
    );
    // No `VolumesForceDetached` is required: once the taint is on, the
    // attach/detach controller and the CSI chain may free both volumes
    // before node-fencer's own detach reaches them (a race the volumes'
    // end state above covers either way).
    assert_node_events(&admin, &node2, &["PoweredOff", "OutOfServiceTaintApplied"]).await?;

    // The alert again: already fenced, and the machine is not stopped twice.
    let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "already_fenced", "{report:#}");
    assert!(r["power_off"].is_null(), "{report:#}");
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

#[tokio::test]
async fn alertmanager_kube_node_not_ready_recovers_the_seed_scenario() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let (admin, seed, node2) = seed_with_node2_down(false).await?;
    // Kubernetes evicted the pods; they are stuck, not gone, when the alert arrives.
    let st = wait_until("db Terminating on node 2", OBSERVE, || async {
        let st = stuck(s, &seed).await?;
        Ok(st.db_terminating.then_some(st))
    })
    .await?;
    assert!(st.db_stuck_on_node2 && st.node2_attachments_kept, "{st:?}");

    let body = kube_node_not_ready(&[&node2]).to_string();
    let (status, _) = emu.post_function_url(&body, None)?;
    assert_eq!(status, 401, "no token, no fencing");
    assert!(!is_fenced(&admin, &node2).await?);
    let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    assert_eq!(
        only_result(&report, &node2)["outcome"],
        "fenced",
        "{report:#}"
    );
    assert_recovered(&seed).await?;

    // Alertmanager repeats a firing alert: the same end state, still a success.
    let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    assert_eq!(
        only_result(&report, &node2)["outcome"],
        "already_fenced",
        "{report:#}"
    );
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// Issue 35: on the old control plane (no out-of-service taint), the
/// default `FENCING_MODE=auto` picks the legacy recipe, which recovers the
/// seed scenario: the stuck pods are force-deleted, their volumes released
/// from node 2's `volumesInUse`, its VolumeAttachments deleted and its
/// volumes force-detached; the attach/detach controller detaches at once
/// and the volumes follow their pods within seconds.
#[tokio::test]
async fn legacy_mode_alone_recovers_the_seed_scenario() -> anyhow::Result<()> {
    let _g = old_cluster_serial().await;
    let s = old_cluster_stack();
    let emu = legacy_emulator();
    let (admin, seed, node2) = seed_of_driver_with_node2_down(s, Driver::Ebs, false).await?;
    wait_until("db Terminating on node 2", OBSERVE, || async {
        let st = stuck(s, &seed).await?;
        Ok(st.db_terminating.then_some(()))
    })
    .await?;

    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let sent = Instant::now();
    let out = emu.invoke(&event)?;
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    assert_eq!(report["mode"], "legacy", "{report:#}");
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert!(r["pods_deleted"].as_u64().unwrap_or(0) >= 1, "{report:#}");
    assert_eq!(r["attachments_deleted"], 2, "{report:#}");
    assert!(!is_fenced(&admin, &node2).await?, "no out-of-service taint");
    recovered_elsewhere(s, &seed, LEGACY_RECOVERY, "seed (legacy)", sent).await?;
    assert_volumes_off_node2(s, &seed).await?;
    assert_node_events(
        &admin,
        &node2,
        &[
            "FencedLegacy",
            "PodsForceDeleted",
            "VolumesInUseReleased",
            "VolumeAttachmentsDeleted",
        ],
    )
    .await?;
    assert_eq!(
        volumes_in_use(&admin, &node2).await?,
        Vec::<String>::new(),
        "both volumes released"
    );
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// Waits up to `bound` for both workloads to run away from node 2 with their
/// volumes, and says how long after the event (`sent`) it took.
async fn recovered_elsewhere(
    s: &Stack,
    seed: &Seed,
    bound: Duration,
    label: &str,
    sent: Instant,
) -> anyhow::Result<Recovery> {
    let node2 = seed.node2().name.as_str();
    let rec = wait_recovered(s, seed, bound).await?;
    assert_ne!(rec.db_node, node2);
    assert_ne!(rec.app_node, node2);
    eprintln!(
        "{label}: db on {}, app on {} {:?} after the event",
        rec.db_node,
        rec.app_node,
        sent.elapsed()
    );
    Ok(rec)
}

/// The node's VolumeAttachments of a workload's PersistentVolume, as the
/// scenario checks them.
async fn node2_attachments(
    admin: &kube::Client,
    seed: &Seed,
) -> anyhow::Result<Vec<AttachmentView>> {
    let node2 = seed.node2().name.as_str();
    let mut out = Vec::new();
    for w in [&seed.db, &seed.app] {
        out.extend(
            attachments(admin, &w.pv)
                .await?
                .into_iter()
                .filter(|va| va.node == node2),
        );
    }
    Ok(out)
}

/// Issues 20 and 35: an older cluster (the old control plane) whose
/// volumes come from another CSI driver (cStor over iSCSI: attached without
/// any cloud call). Left alone, the seed scenario is stuck as with EBS; the
/// legacy recipe releases the volumes from node 2's `volumesInUse` and
/// deletes its VolumeAttachments of that driver too, the driver
/// unpublishes, and both workloads move with their volumes within seconds.
#[tokio::test]
async fn cstor_legacy_stuck_without_node_fencer_recovered_with_it() -> anyhow::Result<()> {
    let _g = old_cluster_serial().await;
    let s = old_cluster_stack();
    let emu = legacy_emulator();
    let (admin, seed, node2) = seed_of_driver_with_node2_down(s, Driver::Cstor, false).await?;
    let st = wait_stuck(s, &seed, OBSERVE).await?;
    assert!(
        st.db_stuck_on_node2 && st.app_replacement_without_volume && st.node2_attachments_kept,
        "stuck without node-fencer: {st:?}"
    );

    let sent = Instant::now();
    let out = emu.invoke(&eventbridge_event(
        &seed.node2().machine.instance,
        "stopped",
    ))?;
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    assert_eq!(report["mode"], "legacy", "{report:#}");
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["attachments_deleted"], 2, "{report:#}");
    let drivers: Vec<(&str, &str)> = r["attachments"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|a| {
                    (
                        a["driver"].as_str().unwrap_or(""),
                        a["outcome"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        drivers,
        [
            ("cstor.csi.openebs.io", "deleted"),
            ("cstor.csi.openebs.io", "deleted")
        ],
        "{r:#}"
    );
    assert_eq!(r["volumes"], json!([]), "no EBS volume to detach: {r:#}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap_or("")
            .contains("cstor.csi.openebs.io 2"),
        "{r:#}"
    );
    recovered_elsewhere(s, &seed, LEGACY_RECOVERY, "seed (cStor, legacy)", sent).await?;
    let left = node2_attachments(&admin, &seed).await?;
    assert!(left.is_empty(), "node 2's attachments are gone: {left:?}");
    assert_node_events(
        &admin,
        &node2,
        &[
            "FencedLegacy",
            "PodsForceDeleted",
            "VolumesInUseReleased",
            "VolumeAttachmentsDeleted",
        ],
    )
    .await?;
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// Issue 20: the taint mode needs nothing for another CSI driver: once the
/// taint is on, the pod garbage collector deletes the pods and the
/// attach/detach controller deletes node 2's VolumeAttachments itself,
/// whatever their driver; node-fencer deletes none.
#[tokio::test]
async fn cstor_taint_mode_recovers_through_the_attach_detach_controller() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let (admin, seed, node2) = seed_of_driver_with_node2_down(s, Driver::Cstor, false).await?;
    assert_eq!(node2_attachments(&admin, &seed).await?.len(), 2);
    let sent = Instant::now();
    let out = emu.invoke(&eventbridge_event(
        &seed.node2().machine.instance,
        "stopped",
    ))?;
    assert!(!out.error, "{}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert!(
        r.get("attachments").is_none(),
        "node-fencer deletes none: {r:#}"
    );
    assert!(is_fenced(&admin, &node2).await?);
    recovered_elsewhere(s, &seed, RECOVERY, "seed (cStor, taint)", sent).await?;
    let left = node2_attachments(&admin, &seed).await?;
    assert!(
        left.is_empty(),
        "the controller removed node 2's attachments: {left:?}"
    );
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}

/// One invocation of the storm: which trigger, whether it failed, its text.
#[derive(Debug)]
struct Answer {
    trigger: String,
    failed: bool,
    text: String,
}

#[tokio::test]
async fn storm_respects_the_cap_fences_nothing_twice_and_handles_every_node() -> anyhow::Result<()>
{
    const NODES: usize = 20;
    const STOPPED: usize = 8; // workers 0..8: instance stopped, heartbeats stopped
    const PARTITIONED: usize = 2; // workers 8..10: heartbeats stopped, instance running
    const ROOM: usize = 5;
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let ec2 = s.ec2().await;
    let fleet = fleet(s, NODES, |i| i < STOPPED + PARTITIONED).await?;
    let before = room_taken(s).await?;
    let limit = before + ROOM;
    let emu = start_emulator(s, &[("MAX_OUT_OF_SERVICE", &limit.to_string())])?;

    // An availability zone goes down.
    for w in &fleet.workers[..STOPPED] {
        node_fencer_tests::fixtures::stop(&ec2, &w.machine).await?;
    }
    let silent: Vec<String> = fleet.workers[..STOPPED + PARTITIONED]
        .iter()
        .map(|w| w.name.clone())
        .collect();
    for n in &silent {
        stop_heartbeats(&admin, n).await?;
    }
    wait_not_ready(&admin, &silent, NOT_READY).await?;

    // One EventBridge event per stopped instance, all at once, and one
    // Alertmanager batch naming every silent node.
    let t = Instant::now();
    let answers: Vec<Answer> = std::thread::scope(|scope| {
        let emu = &emu;
        let mut handles = Vec::new();
        for w in &fleet.workers[..STOPPED] {
            let event = eventbridge_event(&w.machine.instance, "stopped");
            let trigger = format!("eventbridge {}", w.name);
            handles.push(scope.spawn(move || match emu.invoke(&event) {
                Ok(out) => Answer {
                    trigger,
                    failed: out.error,
                    text: out.output,
                },
                Err(e) => Answer {
                    trigger,
                    failed: true,
                    text: format!("{e:#}"),
                },
            }));
        }
        let names: Vec<&str> = silent.iter().map(String::as_str).collect();
        let body = kube_node_not_ready(&names).to_string();
        handles.push(scope.spawn(
            move || match emu.post_function_url(&body, Some(&bearer())) {
                Ok((status, text)) => Answer {
                    trigger: "alertmanager batch".into(),
                    failed: status != 200,
                    text,
                },
                Err(e) => Answer {
                    trigger: "alertmanager batch".into(),
                    failed: true,
                    text: format!("{e:#}"),
                },
            },
        ));
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Answer {
                    trigger: "panicked".into(),
                    failed: true,
                    text: String::new(),
                })
            })
            .collect()
    });
    eprintln!(
        "storm: {} invocations answered in {:?}",
        answers.len(),
        t.elapsed()
    );

    // The cap holds across concurrent invocations.
    let tainted: Vec<&Worker> = {
        let mut v = Vec::new();
        for w in &fleet.workers {
            if is_fenced(&admin, &w.name).await? {
                v.push(w);
            }
        }
        v
    };
    assert_eq!(
        tainted.len(),
        ROOM,
        "exactly the room under the cap: {answers:#?}"
    );
    assert_eq!(room_taken(s).await?, limit);
    for w in &tainted {
        assert!(
            fleet.workers[..STOPPED].iter().any(|x| x.name == w.name),
            "only stopped instances are fenced: {}",
            w.name
        );
    }

    // Nothing fenced twice: one `fenced` outcome and one taint Event per node.
    let reports: Vec<Value> = answers
        .iter()
        .filter_map(|a| serde_json::from_str::<Value>(&a.text).ok())
        .filter(|v| v.get("results").is_some())
        .collect();
    for w in &fleet.workers[..STOPPED + PARTITIONED] {
        let fenced = reports
            .iter()
            .flat_map(|r| results_for(r, &w.name))
            .filter(|r| r["outcome"] == "fenced")
            .count();
        let applied = node_events(&admin, &w.name)
            .await?
            .iter()
            .filter(|(reason, _)| reason == "OutOfServiceTaintApplied")
            .count();
        let is_tainted = tainted.iter().any(|t| t.name == w.name);
        assert_eq!(fenced, usize::from(is_tainted), "{}: {answers:#?}", w.name);
        assert_eq!(applied, usize::from(is_tainted), "{}", w.name);
    }

    // Every eligible node handled: fenced, or refused by the cap loudly (a
    // Warning Event, and the invocations naming it failed so they are retried).
    for (i, w) in fleet.workers[..STOPPED].iter().enumerate() {
        let (pv, vol) = fleet.volumes[i].clone().unwrap_or_default();
        if tainted.iter().any(|t| t.name == w.name) {
            assert!(
                attached_instances(cluster_stack(), &vol).await?.is_empty(),
                "{pv} detached"
            );
            continue;
        }
        let events = node_events(&admin, &w.name).await?;
        assert!(
            events.iter().any(|(r, _)| r == "FencingRefused"),
            "{}: {events:?}",
            w.name
        );
        let own = answers
            .iter()
            .find(|a| a.trigger == format!("eventbridge {}", w.name));
        assert!(
            own.is_some_and(|a| a.failed),
            "{}: its event failed, so Lambda retries it: {own:?}",
            w.name
        );
        assert_eq!(
            attached_instances(cluster_stack(), &vol).await?,
            vec![w.machine.instance.clone()],
            "{pv}: left attached"
        );
    }
    let batch = answers.iter().find(|a| a.trigger == "alertmanager batch");
    assert!(
        batch.is_some_and(|a| a.failed),
        "the batch left work (cap): {batch:?}"
    );
    // The partitioned nodes: EC2 says running, never fenced, volumes kept.
    for (i, w) in fleet.workers[STOPPED..STOPPED + PARTITIONED]
        .iter()
        .enumerate()
    {
        assert!(!is_fenced(&admin, &w.name).await?);
        let (_, vol) = fleet.volumes[STOPPED + i].clone().unwrap_or_default();
        assert_eq!(
            attached_instances(cluster_stack(), &vol).await?,
            vec![w.machine.instance.clone()]
        );
    }
    teardown_fleet(&admin, &fleet).await;
    Ok(())
}

#[tokio::test]
async fn rbac_a_role_without_patch_nodes_fails_with_403_and_changes_nothing() -> anyhow::Result<()>
{
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let admin = s.admin().await?;
    let fencer = s.fencer().await?;
    let fleet = fleet(s, 1, |_| true).await?;
    let w = fleet.workers[0].clone();
    let (_, vol) = fleet.volumes[0].clone().unwrap_or_default();
    node_fencer_tests::fixtures::stop(&s.ec2().await, &w.machine).await?;
    stop_heartbeats(&admin, &w.name).await?;
    wait_not_ready(&admin, std::slice::from_ref(&w.name), NOT_READY).await?;
    let body = kube_node_not_ready(&[&w.name]).to_string();

    // The shipped role minus `patch` on nodes.
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let mut role = roles.get("node-fencer").await?;
    let rules = role.rules.clone().unwrap_or_default();
    let without: Vec<_> = rules
        .iter()
        .cloned()
        .map(|mut r| {
            if r.resources
                .as_ref()
                .is_some_and(|res| res.iter().any(|x| x == "nodes"))
            {
                r.verbs.retain(|v| v != "patch");
            }
            r
        })
        .collect();
    role.rules = Some(without);
    role.metadata.managed_fields = None;
    roles
        .replace("node-fencer", &PostParams::default(), &role)
        .await?;

    let outcome = async {
        wait_for_rbac(&fencer, "patch", "", "nodes", false).await?;
        let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
        anyhow::ensure!(status == 500, "work left undone: {status} {text}");
        let report: Value = serde_json::from_str(&text)?;
        let r = results_for(&report, &w.name);
        anyhow::ensure!(
            r.len() == 1 && r[0]["outcome"] == "failed",
            "the taint fails: {report:#}"
        );
        let errors = r[0]["errors"].to_string();
        anyhow::ensure!(
            errors.contains("403") || errors.to_lowercase().contains("forbidden"),
            "a 403 from the API server: {errors}"
        );
        anyhow::ensure!(!is_fenced(&admin, &w.name).await?, "no taint");
        anyhow::ensure!(
            attached_instances(cluster_stack(), &vol).await? == vec![w.machine.instance.clone()],
            "no detach without the taint"
        );
        Ok(())
    }
    .await;
    restore_rbac(s).await?;
    wait_for_rbac(&fencer, "patch", "", "nodes", true).await?;
    outcome?;

    // With the role restored, the retry completes.
    let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    assert_eq!(
        only_result(&report, &w.name)["outcome"],
        "fenced",
        "{report:#}"
    );
    assert!(attached_instances(cluster_stack(), &vol).await?.is_empty());
    teardown_fleet(&admin, &fleet).await;
    Ok(())
}

#[tokio::test]
async fn the_attacher_refuses_a_volume_attached_to_another_instance() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    // Worker 1 holds the volume (attached through its VolumeAttachment).
    let fleet = fleet(s, 2, |i| i == 0).await?;
    let (pv, vol) = fleet.volumes[0].clone().unwrap_or_default();
    let holder = fleet.workers[0].machine.instance.clone();
    let other = fleet.workers[1].name.clone();
    let ns = unique("refuse");
    create_namespace(&admin, &ns).await?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                 "volumeName": pv, "resources": {"requests": {"storage": "10Gi"}}}
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &claim)
        .await?;
    // A pod on worker 2 wants it: the attach/detach controller creates a
    // VolumeAttachment, EBS (the stand-in) refuses, the controller reports it.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reader"},
        "spec": {"nodeName": other, "containers": [{"name": "c", "image": "busybox",
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    }))?;
    Api::<Pod>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &pod)
        .await?;
    let error = wait_until(
        "the attach error on the new VolumeAttachment",
        Duration::from_secs(30),
        || async {
            Ok(attachments(&admin, &pv)
                .await?
                .into_iter()
                .find(|va| va.node == other)
                .and_then(|va| va.attach_error))
        },
    )
    .await?;
    assert!(error.contains("VolumeInUse"), "{error}");
    let events = wait_until(
        "FailedAttachVolume on the pod",
        Duration::from_secs(30),
        || async {
            let ev = failed_attach_events(&admin, &ns).await?;
            Ok((!ev.is_empty()).then_some(ev))
        },
    )
    .await?;
    assert!(
        events
            .iter()
            .any(|(pod, msg)| pod == "reader" && msg.contains("VolumeInUse")),
        "{events:?}"
    );
    assert_eq!(
        attached_instances(cluster_stack(), &vol).await?,
        vec![holder.clone()]
    );
    assert!(
        attachments(&admin, &pv)
            .await?
            .iter()
            .any(|va| va.node == other && !va.attached)
    );
    // Once the pod is gone, the refused attachment is removed, and that
    // detaches nothing from the volume's holder.
    let pods_api = Api::<Pod>::namespaced(admin.clone(), &ns);
    pods_api.delete("reader", &Default::default()).await?;
    wait_until("the pod to go", Duration::from_secs(30), || async {
        Ok(pods_api.get_opt("reader").await?.is_none().then_some(()))
    })
    .await?;
    report_volumes_unmounted(&admin, &other).await?;
    wait_until(
        "the refused VolumeAttachment to go",
        Duration::from_secs(60),
        || async {
            let gone = attachments(&admin, &pv)
                .await?
                .iter()
                .all(|va| va.node != other);
            Ok(gone.then_some(()))
        },
    )
    .await?;
    assert_eq!(
        attached_instances(cluster_stack(), &vol).await?,
        vec![holder]
    );
    teardown(&admin, Some(&ns), &[]).await;
    teardown_fleet(&admin, &fleet).await;
    Ok(())
}

/// Issue 38: seed 001 on-premises. Three machines behind a Redfish BMC (the
/// emulator), a cStor-like volume for each workload, a self-managed control
/// plane, node-fencer off the cluster as `serve`; node 2's machine loses
/// its power (ForceOff at its BMC) and its kubelet goes silent. The
/// KubeNodeNotReady alert fences it once the BMC reports it `Off`, and both
/// workloads run again elsewhere with their volumes: how long from the
/// machine off to both replacements running is printed.
#[tokio::test]
async fn seed_scenario_on_premises_through_the_bmc() -> anyhow::Result<()> {
    use node_fencer_tests::redfish::{Bmc, Inventory, Serve, SystemSpec};
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let admin = s.admin().await?;
    let systems: Vec<SystemSpec> = (1..=3)
        .map(|i| SystemSpec::new(&unique(&format!("rack-m{i}")), true))
        .collect();
    let bmc = Bmc::start(&s.dir.join(unique("bmc")), &systems, false).await?;
    let seed = seed_on(s, Driver::Cstor, Hosts::Bmc(&systems)).await?;
    let node2 = seed.node2().name.clone();
    let mut inventory = Inventory::default();
    for (system, worker) in systems.iter().zip(&seed.workers) {
        inventory = inventory.machine(&bmc, &system.name, &bmc.url, Some(&worker.name))?;
    }
    let inventory_path = bmc.dir.join("inventory.json");
    inventory.write(&inventory_path)?;
    let credentials = bmc.credentials_dir(None)?;
    let text = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (inventory_path, credentials) = (text(&inventory_path), text(&credentials));
    let serve = Serve::start(
        env!("CARGO_BIN_EXE_node-fencer-full"),
        s,
        bmc.dir.join("serve.log"),
        &[
            ("REDFISH_INVENTORY", &inventory_path),
            ("REDFISH_CREDENTIALS_DIR", &credentials),
            ("NOT_READY_WAIT_SECONDS", "30"),
        ],
    )
    .await?;

    // The power cut: the BMC takes the machine off, the kubelet goes silent.
    let cut = Instant::now();
    bmc.reset(&systems[1].name, "ForceOff").await?;
    silence(s, seed.node2()).await?;
    bmc.wait_power(&systems[1].name, "Off").await?;
    let off = Instant::now();
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    eprintln!(
        "seed on-premises: machine off {:?} after the cut, node 2 NotReady {:?} after",
        off - cut,
        off.elapsed()
    );

    let (status, report) = serve.alert(&kube_node_not_ready(&[&node2])).await?;
    assert_eq!(status, 200, "{report:#}; serve's log:\n{}", serve.logged());
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(
        r["instance_id"],
        format!("redfish://{}", systems[1].name),
        "{report:#}"
    );
    assert!(is_fenced(&admin, &node2).await?);
    let rec = recovered_elsewhere(s, &seed, RECOVERY, "seed on-premises (cStor, BMC)", off).await?;
    eprintln!(
        "seed on-premises: machine off -> both replacements Running with their volumes: {:?} (db on {}, app on {})",
        off.elapsed(),
        rec.db_node,
        rec.app_node
    );
    // The other machines were only read, never reset.
    for system in [&systems[0], &systems[2]] {
        assert_eq!(bmc.resets_of(&system.name)?, 0);
        assert_eq!(bmc.power(&system.name).await?, "On");
    }
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(())
}
