//! End-to-end scenarios on Compute Engine: the controller stack of
//! [`super::scenario`] (kube-controller-manager, kube-scheduler, kwok nodes),
//! nodes backed by VMs of the fake Compute Engine
//! (`tests/gce/fake_compute.py`, `gce://proj-fencer/us-central1-a/NAME`),
//! Persistent Disks of `pd.csi.storage.gke.io` attached and detached by the
//! real external-attacher and the real PD CSI driver's controller (calling
//! the fake through Google's Go client), and the real binary under `cargo lambda watch` reaching the
//! fake through `COMPUTE_ENDPOINT`, as the node-fencer group under
//! `infra/kubernetes/rbac.yaml`. The triggers: the Alertmanager webhook, the
//! direct invocation and the sweep.
//!
//! Lean on purpose: the seed scenario once (its repeat, the boot disk and the
//! recovery time in the same run), and every refusal on one silent node.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use node_fencer::core::inbound::trigger::webhook;
use node_fencer::core::model::facts::CsiVolume;
use node_fencer::core::model::kube_read::{ANNOTATION_VOLUMES, csi_unique_name};
use node_fencer::core::rules::volumes::attachment_name;
use node_fencer_tests::attacher::Driver;
use node_fencer_tests::cluster::{cluster_serial, cluster_stack};
use node_fencer_tests::fixtures::{assert_node_events, count_node_events, node_events};
use node_fencer_tests::gce::{Compute, PD_DRIVER, Vm, fake_compute};
use node_fencer_tests::lambda::{Emulator, WEBHOOK_TOKEN, start_gce_emulator};
use node_fencer_tests::scene::*;
use serde_json::{Value, json};

use crate::only_result;

/// Bound on a node turning NotReady (grace period 10 s, checked every 2 s).
const NOT_READY: Duration = Duration::from_secs(40);
/// Bound on the recovery after fencing.
const RECOVERY: Duration = Duration::from_secs(75);
/// Bound on Kubernetes evicting node 2's pods (5 s of toleration).
const EVICTED: Duration = Duration::from_secs(30);

/// The emulator of the controller stack, the binary built with every
/// feature (`node-fencer-full`) and pointed at the fake Compute Engine, started once per process.
fn emulator() -> &'static Emulator {
    static EMULATOR: OnceLock<Result<Emulator, String>> = OnceLock::new();
    match EMULATOR.get_or_init(|| {
        let emu = start_gce_emulator(cluster_stack(), &[("NOT_READY_WAIT_SECONDS", "30")])
            .map_err(|e| format!("{e:#}"))?;
        // The emulator builds the function on its first invocation: a
        // harmless one (a VM of no node) gets that out of the timed ones.
        let vm = "gce://proj-fencer/us-central1-a/no-such-vm";
        let out = emu
            .invoke(&json!({"action": "check", "instanceId": vm}))
            .map_err(|e| format!("{e:#}"))?;
        if out.error {
            return Err(format!("the warm-up invocation failed: {}", out.output));
        }
        Ok(emu)
    }) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

fn bearer() -> String {
    format!("Bearer {WEBHOOK_TOKEN}")
}

/// The outcome for `node` in an answer of `serve`, which must be a 200.
fn outcome_of((status, text): (u16, String), node: &str) -> anyhow::Result<Value> {
    anyhow::ensure!(status == 200, "answered {status}: {text}");
    let report: Value = serde_json::from_str(&text)?;
    Ok(only_result(&report, node)["outcome"].clone())
}

/// A direct invocation `{"action": "fence", "node": NODE}`: its report.
fn fence(emu: &Emulator, node: &str) -> anyhow::Result<Value> {
    let out = emu.invoke(&json!({"action": "fence", "node": node}))?;
    anyhow::ensure!(!out.error, "the invocation failed: {}", out.output);
    Ok(serde_json::from_str(&out.output)?)
}

/// The Alertmanager webhook naming `node`, through the Function URL.
fn alert(emu: &Emulator, node: &str) -> anyhow::Result<Value> {
    let body = kube_node_not_ready(&[node]).to_string();
    let (status, text) = emu.post_function_url(&body, Some(&bearer()))?;
    anyhow::ensure!(status == 200, "the webhook answered {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

fn vm_of(seed: &Seed) -> Vm {
    seed.node2()
        .machine
        .vm
        .clone()
        .expect("a GCE seed's nodes are VMs")
}

/// The seed scene on Compute Engine with node 2 silent (its VM `TERMINATED`
/// unless `keep_vm`), once Kubernetes sees it NotReady.
async fn gce_seed_with_node2_down(keep_vm: bool) -> anyhow::Result<(kube::Client, Seed, String)> {
    let s = cluster_stack();
    let admin = s.admin().await?;
    let seed = seed_with(s, Driver::Pd).await?;
    let node2 = seed.node2().name.clone();
    let t0 = Instant::now();
    kill_node2(s, &seed, keep_vm).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    eprintln!(
        "{}: node 2 NotReady after {:?}",
        seed.namespace,
        t0.elapsed()
    );
    Ok((admin, seed, node2))
}

/// Both data disks of node 2's VM detached and its boot disk kept, once
/// the taint is on. A disk is detached by node-fencer or, once the
/// attach/detach controller let go of it, by the PD CSI driver: how many
/// of each is a race (node-fencer's look right before its detach finds a
/// disk the driver detached first), so only the sum is fixed. A disk may
/// already be attached to the replacement's VM (the attach/detach
/// controller attaches it as soon as it is free): only node 2's VM is
/// held to have let go. Returns node-fencer's own `detachDisk` count, for
/// "nothing more" checks.
async fn data_disks_detached(compute: &Compute, seed: &Seed, vm: &Vm) -> anyhow::Result<usize> {
    for w in [&seed.db, &seed.app] {
        let users = compute.disk_users(&w.volume).await?;
        assert!(
            users.as_ref().is_some_and(|u| !u.contains(&vm.path())),
            "{} detached from node 2's VM: its users {users:?}",
            w.name
        );
    }
    let ours = compute.detach_requests(vm).await?;
    let by_driver = compute.driver_detach_requests(vm).await?;
    assert!(
        ours.len() <= 2
            && ours
                .iter()
                .chain(&by_driver)
                .all(|d| d.query.get("deviceName") != Some(&vm.boot_device)),
        "at most one detachDisk per data disk, never the boot disk: {ours:?} {by_driver:?}"
    );
    Ok(ours.len())
}

/// Attaches the PersistentVolume `pv` (of PD volume handle `handle`) to
/// `node` as the attach/detach controller does: the VolumeAttachment under
/// the name Kubernetes gives it (the external-attacher handles it), the volume
/// recorded in the Node's `status.volumesAttached` beside the others.
async fn attach_by_hand(
    admin: &kube::Client,
    node: &str,
    pv: &str,
    handle: &str,
) -> anyhow::Result<()> {
    let volume = CsiVolume {
        driver: PD_DRIVER.into(),
        handle: handle.into(),
    };
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": attachment_name(&volume, node)},
        "spec": {"attacher": PD_DRIVER, "nodeName": node,
                 "source": {"persistentVolumeName": pv}}
    }))?;
    Api::<VolumeAttachment>::all(admin.clone())
        .create(&PostParams::default(), &va)
        .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut attached = nodes
        .get_status(node)
        .await?
        .status
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default();
    attached.push(serde_json::from_value(
        json!({"name": csi_unique_name(&volume), "devicePath": ""}),
    )?);
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesAttached": attached}})),
        )
        .await?;
    Ok(())
}

/// What must not have changed on node 2 after a refusal: no taint, no
/// `detachDisk` asked of its VM, both disks still attached to it, its
/// VolumeAttachments kept, db-0 still bound to it.
async fn assert_untouched(
    admin: &kube::Client,
    compute: &Compute,
    seed: &Seed,
    vm: &Vm,
    step: &str,
) -> anyhow::Result<()> {
    let node2 = seed.node2().name.as_str();
    assert!(!is_fenced(admin, node2).await?, "{step}: no taint");
    let detaches = compute.detach_requests(vm).await?;
    assert!(detaches.is_empty(), "{step}: no detachDisk: {detaches:?}");
    for w in [&seed.db, &seed.app] {
        assert_eq!(
            compute.disk_users(&w.volume).await?,
            Some(vec![vm.path()]),
            "{step}: {} still attached to node 2's VM",
            w.name
        );
        assert!(
            attachments(admin, &w.pv)
                .await?
                .iter()
                .any(|va| va.node == node2 && va.attached && !va.deleting),
            "{step}: {}: node 2's attachment stays",
            w.name
        );
    }
    let db = pods(admin, &seed.namespace, "db").await?;
    assert!(
        db.iter()
            .any(|p| p.name == "db-0" && p.node.as_deref() == Some(node2)),
        "{step}: db-0 was not force-deleted: {db:?}"
    );
    let events = node_events(admin, node2).await?;
    assert!(
        !events
            .iter()
            .any(|(r, _)| r == "OutOfServiceTaintApplied" || r == "VolumesForceDetached"),
        "{step}: {events:?}"
    );
    Ok(())
}

/// The seed scenario on Compute Engine: node 2's VM is `TERMINATED` and its
/// heartbeats stop; the KubeNodeNotReady alert has node-fencer taint it and
/// detach both Persistent Disks (never the boot disk, which a PV names
/// too), and the StatefulSet's and the Deployment's pods run on another node
/// with their disks attached there. The same fence again is
/// `already_fenced` and detaches nothing more.
/// `FAST_NOT_READY` at its default on Compute Engine, against node 2's real
/// kubelet killed more than the margin before its VM stops, node-fencer
/// told at the stop: the VM's `lastStopTimestamp` proves the kubelet
/// silent, node-fencer marks the Node itself and fences it at once, and
/// the workloads move long before the node controller's grace period ends.
/// (Without the setting, the wait for the node controller is the EC2
/// scenario's, `scenario::without_the_fast_path_the_seed_waits_for_the_node_controller`.)
#[tokio::test]
async fn gce_the_fast_path_moves_the_seed_before_the_grace_period() -> anyhow::Result<()> {
    use node_fencer::core::rules::silence::{MARK_REASON, SKEW_MARGIN_SECS};
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let admin = s.admin().await?;
    let seed = seed_with(s, Driver::Pd).await?;
    let node2 = seed.node2().name.clone();
    kill_node2_after_its_kubelet(s, &seed, SKEW_MARGIN_SECS).await?;
    let stopped = Instant::now();
    assert_eq!(ready(&admin, &node2).await?.as_deref(), Some("True"));
    let report = fence(emu, &node2)?;
    let answered = stopped.elapsed();
    assert_eq!(
        only_result(&report, &node2)["outcome"],
        "fenced",
        "{report:#}"
    );
    assert_eq!(
        ready_reason(&admin, &node2).await?.as_deref(),
        Some(MARK_REASON),
        "marked by node-fencer"
    );
    assert_node_events(&admin, &node2, &["MarkedNotReady"]).await?;
    let rec = wait_recovered(s, &seed, RECOVERY).await?;
    eprintln!(
        "Compute Engine, fast path: answered {answered:?} after the stop; db on {}, app on {} {:?} after it",
        rec.db_node,
        rec.app_node,
        stopped.elapsed()
    );
    teardown_seed(&admin, &seed).await;
    Ok(())
}

#[tokio::test]
async fn gce_seed_scenario_recovered_once_boot_disk_kept() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let compute = fake_compute().client();
    let (admin, seed, node2) = gce_seed_with_node2_down(false).await?;
    let vm = vm_of(&seed);

    // A PV naming node 2's boot disk, given to node 2 as the attach/detach
    // controller gives one: node-fencer finds it among the node's
    // attachments and must leave it. The real PD CSI driver never attaches
    // it: the VM holds the disk under another device name, so the driver
    // asks attachDisk, and Compute Engine refuses a disk in use, even by
    // the VM itself; the attachment keeps that error.
    let boot_pv = format!("{}-boot", seed.namespace);
    create_pd_pv(&admin, &boot_pv, &vm.boot_disk, &vm.zone, None).await?;
    attach_by_hand(&admin, &node2, &boot_pv, &vm.boot_disk).await?;
    // The sidecar retries, and the driver answers some retries with its own
    // backoff ("not permitted ... due to backoff condition"): Compute
    // Engine's refusal is waited for among them.
    let refusal = format!("is already being used by '{}'", vm.path());
    wait_until(
        "the driver's refusal of the boot disk",
        Duration::from_secs(30),
        || async {
            let a = attachments(&admin, &boot_pv).await?;
            Ok(a.into_iter()
                .filter_map(|va| va.attach_error)
                .find(|e| e.contains(&refusal)))
        },
    )
    .await?;

    // Kubernetes evicted the pods; they are stuck, not gone, when the alert arrives.
    let st = wait_until("db Terminating on node 2", EVICTED, || async {
        let st = stuck(s, &seed).await?;
        Ok(st.db_terminating.then_some(st))
    })
    .await?;
    assert!(st.db_stuck_on_node2 && st.node2_attachments_kept, "{st:?}");
    assert!(compute.detach_requests(&vm).await?.is_empty());

    let sent = Instant::now();
    let report = alert(emu, &node2)?;
    let answered = sent.elapsed();
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["instance_id"], json!(vm.provider_id()), "{r:#}");
    assert_eq!(r["taint_applied"], true, "{r:#}");
    assert_eq!(r["pods_deleted"], 2, "{r:#}");
    let outcome_of = |handle: &str| {
        r["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["volume"] == json!(handle)))
            .map(|v| v["outcome"].clone())
    };
    for w in [&seed.db, &seed.app] {
        assert_eq!(
            outcome_of(&w.volume),
            Some(json!("detached")),
            "{}: {r:#}",
            w.name
        );
    }
    assert_eq!(
        outcome_of(&vm.boot_disk),
        Some(json!("refused")),
        "the boot disk: {r:#}"
    );
    assert!(is_fenced(&admin, &node2).await?, "node 2 carries the taint");
    // The fencing's record lists the disks it frees, never the boot disk.
    let fenced = Api::<Node>::all(admin.clone()).get(&node2).await?;
    let listed = fenced
        .metadata
        .annotations
        .and_then(|a| a.get(ANNOTATION_VOLUMES).cloned())
        .unwrap_or_default();
    let mut listed: Vec<&str> = listed.split(',').collect();
    listed.sort_unstable();
    let mut data = [seed.db.volume.as_str(), seed.app.volume.as_str()];
    data.sort_unstable();
    assert_eq!(listed, data, "{ANNOTATION_VOLUMES}");

    // node-fencer's detachDisk: at most one per data disk, by its device
    // name, with a requestId; none for the boot device. Once the taint is
    // on and the pods are gone, the attach/detach controller deletes the
    // attachments and the PD CSI driver detaches the disks too, so a disk
    // the driver had already let go of is found not attached and asked
    // nothing: every data disk was detached by one of the two.
    let mut devices: Vec<String> = Vec::new();
    for d in compute.detach_requests(&vm).await? {
        assert!(
            d.query.contains_key("requestId"),
            "a retry must not detach twice: {d:?}"
        );
        devices.extend(d.query.get("deviceName").cloned());
    }
    let by_driver: Vec<String> = compute
        .driver_detach_requests(&vm)
        .await?
        .into_iter()
        .filter_map(|d| d.query.get("deviceName").cloned())
        .collect();
    for w in [&seed.db, &seed.app] {
        let ours = devices.iter().filter(|d| **d == w.pv).count();
        assert!(
            ours <= 1,
            "one detachDisk at most per data disk: {devices:?}"
        );
        assert!(
            ours == 1 || by_driver.contains(&w.pv),
            "{}: detached by node-fencer or the driver: {devices:?} {by_driver:?}",
            w.name
        );
    }
    assert!(!devices.contains(&vm.boot_device) && !by_driver.contains(&vm.boot_device));
    assert_eq!(
        compute.disk_users(&vm.boot_disk).await?,
        Some(vec![vm.path()]),
        "the boot disk stays on its VM"
    );

    // The controllers move both workloads; their disks follow.
    let rec = wait_recovered(s, &seed, RECOVERY).await?;
    let recovered = sent.elapsed();
    for (w, node) in [(&seed.db, &rec.db_node), (&seed.app, &rec.app_node)] {
        assert_ne!(node, &node2);
        let there = seed
            .worker(node)
            .and_then(|x| x.machine.vm.as_ref())
            .map(Vm::path);
        assert_eq!(
            compute.disk_users(&w.volume).await?,
            Some(Vec::from_iter(there)),
            "{}: its disk is attached to {node}'s VM alone",
            w.name
        );
    }
    eprintln!(
        "gce seed: invocation answered in {answered:?}; db on {}, app on {} {recovered:?} after the alert",
        rec.db_node, rec.app_node
    );
    // `VolumesForceDetached` names the detaches node-fencer sent: none
    // when the driver freed both disks first (above).
    let expected: &[&str] = if devices.is_empty() {
        &["OutOfServiceTaintApplied"]
    } else {
        &["OutOfServiceTaintApplied", "VolumesForceDetached"]
    };
    assert_node_events(&admin, &node2, expected).await?;

    // The same fence again: already fenced, nothing detached twice.
    let before = compute.detach_requests(&vm).await?.len();
    let again = fence(emu, &node2)?;
    let r = only_result(&again, &node2);
    assert_eq!(r["outcome"], "already_fenced", "{again:#}");
    assert_eq!(r["taint_applied"], false, "{again:#}");
    assert_eq!(
        compute.detach_requests(&vm).await?.len(),
        before,
        "no detachDisk more"
    );
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// Once node-fencer's taint is on and the pods are gone, the attach/detach
/// controller deletes node 2's VolumeAttachments and the external-attacher
/// has the PD CSI driver detach the disks itself (`ControllerUnpublishVolume`:
/// the VM still lists them, so `detachDisk`). When node-fencer's own
/// `detachDisk` of a disk comes while the driver's is still running,
/// Compute Engine answers 400 `resourceNotReady`. That is a detach under
/// way, the end node-fencer wants, not a failure: the node is fenced, the
/// disk is left to the detach in flight (the verification trusts what the
/// cloud shows), and the workloads move. Here the other detach is asked
/// first, deterministically, with operations taking 5 s.
#[tokio::test]
async fn gce_a_disk_whose_detach_is_in_flight_is_not_a_failure() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let emu = emulator();
    let compute = fake_compute().client();
    let (admin, seed, node2) = gce_seed_with_node2_down(false).await?;
    let vm = vm_of(&seed);
    let checked = async {
        wait_until("db Terminating on node 2", EVICTED, || async {
            let st = stuck(s, &seed).await?;
            Ok(st.db_terminating.then_some(()))
        })
        .await?;
        compute.set_operation_delay(5.0).await?;
        let answer = match compute.detach_disk(&vm, &seed.app.pv).await {
            Ok(_) => alert(emu, &node2),
            Err(e) => Err(e),
        };
        compute.set_operation_delay(0.5).await?;
        let report = answer?;
        let r = only_result(&report, &node2);
        assert_eq!(r["outcome"], "fenced", "{report:#}");
        assert_eq!(r["taint_applied"], true, "{r:#}");
        let outcome_of = |handle: &str| {
            r["volumes"]
                .as_array()
                .and_then(|v| v.iter().find(|v| v["volume"] == json!(handle)))
                .map(|v| v["outcome"].clone())
        };
        for w in [&seed.db, &seed.app] {
            assert_eq!(outcome_of(&w.volume), Some(json!("detached")), "{r:#}");
        }
        let rec = wait_recovered(s, &seed, RECOVERY).await?;
        assert!(rec.db_node != node2 && rec.app_node != node2, "{rec:?}");
        Ok::<(), anyhow::Error>(())
    };
    // Its nodes go whatever the outcome: left tainted, they would count
    // against the next scene's cap and stand in its preflight.
    let outcome = std::panic::AssertUnwindSafe(checked).catch_unwind().await;
    teardown_seed(&admin, &seed).await;
    match outcome {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Every refusal on one silent node whose pods and disks stay put: the VM
/// runs (a network partition, asked by the alert and directly), is
/// `SUSPENDED` (found by the sweep), and is recreated under the same name
/// with a new id while the Node still carries the old one (the new VM is
/// `TERMINATED`, so only the id tells). Nothing changes: no taint, no
/// `detachDisk`, the disks and pods where they were.
#[tokio::test]
async fn gce_a_running_suspended_or_recreated_vm_is_left_alone() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let emu = emulator();
    let compute = fake_compute().client();
    let (admin, seed, node2) = gce_seed_with_node2_down(true).await?;
    let vm = vm_of(&seed);

    preflight_tests_the_permissions_on_a_ready_vm(emu, &compute, &seed).await?;
    the_witness_tells_a_denied_permission_once(emu, &compute, &admin, &seed).await?;

    // Split brain: heartbeats stop, the VM runs (and writes).
    for (how, report) in [
        ("fence", fence(emu, &node2)?),
        ("alert", alert(emu, &node2)?),
    ] {
        let r = only_result(&report, &node2);
        assert_eq!(r["outcome"], "skipped", "{how}: {report:#}");
        assert_eq!(r["skip"]["reason"], "instance_not_off", "{how}: {report:#}");
        assert_eq!(r["instance_id"], json!(vm.provider_id()), "{how}: {r:#}");
    }
    assert_untouched(&admin, &compute, &seed, &vm, "RUNNING").await?;

    // Suspended: its memory is kept, it may resume; never fenced.
    compute.set_status(&vm, "SUSPENDED").await?;
    let out = emu.invoke(&json!({"action": "sweep"}))?;
    assert!(!out.error, "nothing to retry: {}", out.output);
    let report: Value = serde_json::from_str(&out.output)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "skipped", "{report:#}");
    assert_eq!(r["skip"]["reason"], "instance_not_off", "{report:#}");
    assert_eq!(r["origins"][0]["kind"], "sweep", "{r:#}");
    assert_untouched(&admin, &compute, &seed, &vm, "SUSPENDED").await?;

    // Recreated under the same name, off: another machine, whatever its status.
    let new = compute.recreate_instance(&vm, "TERMINATED").await?;
    assert_ne!(new.id, vm.id);
    let report = fence(emu, &node2)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "skipped", "{report:#}");
    // The Node's machine is gone: what now carries its name is not it.
    assert_eq!(r["skip"]["reason"], "instance_not_found", "{report:#}");
    assert_untouched(&admin, &compute, &seed, &new, "recreated").await?;
    assert!(compute.detach_requests(&vm).await?.is_empty());
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// How long a hung node must be NotReady before active fencing powers it
/// off, in the active emulator.
const POWER_OFF_AFTER: Duration = Duration::from_secs(60);

/// The emulator with active fencing on, Compute Engine's binary pointed at
/// the fake (its own, beside [`emulator`]).
fn active_emulator() -> &'static Emulator {
    static ACTIVE: OnceLock<Result<Emulator, String>> = OnceLock::new();
    match ACTIVE.get_or_init(|| {
        start_gce_emulator(
            cluster_stack(),
            &[
                ("NOT_READY_WAIT_SECONDS", "30"),
                ("ACTIVE_FENCING", "on"),
                ("POWER_OFF_AFTER_SECONDS", "60"),
                ("POWER_OFF_WAIT_SECONDS", "30"),
            ],
        )
        .map_err(|e| format!("{e:#}"))
    }) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

/// Issue 36: a hung GKE node, its heartbeats stopped while its VM stays
/// RUNNING. Preflight tests `compute.instances.stop` on a node's VM. Too
/// early, an operator's power-off is refused and nothing is
/// sent; once NotReady for POWER_OFF_AFTER_SECONDS, the KubeNodeNotReady
/// alert has the VM stopped (one `instances.stop`, no graceful shutdown,
/// with a request id), seen TERMINATED, and the node fenced in the same
/// request, its disks detached. The alert again stops nothing more.
#[tokio::test]
async fn gce_active_fencing_powers_off_a_hung_node_then_fences_it() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let emu = active_emulator();
    let compute = fake_compute().client();
    let (admin, seed, node2) = gce_seed_with_node2_down(true).await?;
    let not_ready = Instant::now();
    let vm = vm_of(&seed);

    // Preflight tests the stop on a node's VM, with active fencing only.
    let stop_row = || -> anyhow::Result<Option<String>> {
        let out = emu.invoke(&json!({"action": "preflight"}))?;
        anyhow::ensure!(!out.error, "preflight failed to run: {}", out.output);
        let p: Value = serde_json::from_str(&out.output)?;
        Ok(p["checks"].as_array().into_iter().flatten().find_map(|c| {
            let check = c["check"].as_str().unwrap_or_default();
            check
                .starts_with("compute.instances.stop on gce://")
                .then(|| c["status"].as_str().unwrap_or_default().to_owned())
        }))
    };
    assert_eq!(stop_row()?.as_deref(), Some("pass"));
    compute
        .deny_permissions(&["compute.instances.stop"])
        .await?;
    let denied = stop_row();
    compute.deny_permissions(&[]).await?;
    assert_eq!(denied?.as_deref(), Some("fail"));

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
    assert!(compute.stop_requests(&vm).await?.is_empty());
    assert_eq!(compute.status(&vm).await?.as_deref(), Some("RUNNING"));

    tokio::time::sleep(
        POWER_OFF_AFTER.saturating_sub(not_ready.elapsed()) + Duration::from_secs(2),
    )
    .await;
    let sent = Instant::now();
    let report = alert(emu, &node2)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["power_off"]["outcome"], "stopped", "{report:#}");
    assert!(r["power_off"]["status_checks"].is_null(), "{report:#}");
    assert_eq!(compute.status(&vm).await?.as_deref(), Some("TERMINATED"));
    let stops = compute.stop_requests(&vm).await?;
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(
        stops[0].query.get("noGracefulShutdown").map(String::as_str),
        Some("true")
    );
    assert!(stops[0].query.contains_key("requestId"), "{stops:?}");
    for w in [&seed.db, &seed.app] {
        let v = r["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["volume"] == json!(w.volume)));
        assert_eq!(v.map(|v| &v["outcome"]), Some(&json!("detached")), "{r:#}");
    }
    assert!(is_fenced(&admin, &node2).await?);
    eprintln!(
        "hung GKE node: powered off and fenced {:?} after the alert, {:?} after NotReady",
        sent.elapsed(),
        not_ready.elapsed()
    );
    // No `VolumesForceDetached` is required, as on EC2: once the taint is
    // on, the attach/detach controller and the PD CSI driver may free both
    // disks before node-fencer's own detach reaches them, and the Event
    // names only the detaches it sent. The disks' outcome above covers
    // the end state either way.
    assert_node_events(&admin, &node2, &["PoweredOff", "OutOfServiceTaintApplied"]).await?;

    let report = alert(emu, &node2)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "already_fenced", "{report:#}");
    assert_eq!(compute.stop_requests(&vm).await?.len(), 1);
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// Preflight on Compute Engine: each permission `testIamPermissions` can
/// test, on a Ready node's VM and its boot disk, passes; with
/// `compute.instances.detachDisk` denied it fails and says where to grant
/// it; the permissions no resource holds are listed for the record.
async fn preflight_tests_the_permissions_on_a_ready_vm(
    emu: &Emulator,
    compute: &Compute,
    seed: &Seed,
) -> anyhow::Result<()> {
    let preflight = || -> anyhow::Result<Value> {
        let out = emu.invoke(&json!({"action": "preflight"}))?;
        anyhow::ensure!(!out.error, "preflight failed to run: {}", out.output);
        Ok(serde_json::from_str(&out.output)?)
    };
    let gce_rows = |p: &Value| -> Vec<(String, String)> {
        p["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                let check = c["check"].as_str().unwrap_or_default();
                check.starts_with("compute.") || check.starts_with("container.")
            })
            .map(|c| {
                (
                    c["check"].as_str().unwrap_or_default().to_owned(),
                    c["status"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let ready_vm = seed.workers[0]
        .machine
        .vm
        .clone()
        .expect("a GCE seed's nodes are VMs");
    let on_vm = ready_vm.provider_id();
    let disk_name = ready_vm.boot_disk.rsplit('/').next().unwrap_or_default();
    let boot = format!("boot disk {disk_name}");
    let expected = |detach: &str| {
        vec![
            (
                format!("compute.instances.detachDisk on {on_vm}"),
                detach.to_owned(),
            ),
            (
                format!("compute.instances.get on {on_vm}"),
                "pass".to_owned(),
            ),
            (format!("compute.disks.get on {boot}"), "pass".to_owned()),
            ("compute.zoneOperations.get".to_owned(), "info".to_owned()),
            ("container.clusters.get".to_owned(), "info".to_owned()),
        ]
    };
    let granted = preflight()?;
    assert_eq!(gce_rows(&granted), expected("pass"), "{granted:#}");

    compute
        .deny_permissions(&["compute.instances.detachDisk"])
        .await?;
    let denied = preflight();
    compute.deny_permissions(&[]).await?;
    let denied = denied?;
    assert_eq!(gce_rows(&denied), expected("fail"), "{denied:#}");
    assert_eq!(denied["passed"], false, "{denied:#}");
    let row = denied["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["status"] == "fail")
        .cloned()
        .unwrap_or_default();
    assert!(
        row["fix"]
            .as_str()
            .is_some_and(|f| f.contains("infra/modules/node-fencer-gcp")),
        "{row:#}"
    );
    Ok(())
}

/// Issue 48: the witness round that ends a sweep, on Compute Engine. With
/// `compute.instances.detachDisk` denied, every seed Node's witness fails
/// (`forbidden`, with the permission and where to grant it in the sweep's
/// report), told once as a `WitnessFailing` Warning on the Ready node 1
/// however many sweeps see it; granted again, a `WitnessRestored`. Nothing
/// is fenced.
async fn the_witness_tells_a_denied_permission_once(
    emu: &Emulator,
    compute: &Compute,
    admin: &kube::Client,
    seed: &Seed,
) -> anyhow::Result<()> {
    let node1 = seed.workers[0].name.clone();
    let sweep = || -> anyhow::Result<Value> {
        let out = emu.invoke(&json!({"action": "sweep"}))?;
        anyhow::ensure!(!out.error, "the sweep failed: {}", out.output);
        Ok(serde_json::from_str(&out.output)?)
    };
    let reason_of = |report: &Value, node: &str| -> Option<String> {
        report["witness"]["failing"]
            .as_array()?
            .iter()
            .find(|f| f["node"] == json!(node))
            .and_then(|f| f["reason"].as_str().map(str::to_owned))
    };
    let before = sweep()?;
    assert_eq!(reason_of(&before, &node1), None, "{before:#}");

    compute
        .deny_permissions(&["compute.instances.detachDisk"])
        .await?;
    let denied: anyhow::Result<Vec<Value>> = (0..2).map(|_| sweep()).collect();
    compute.deny_permissions(&[]).await?;
    for (round, report) in denied?.iter().enumerate() {
        for w in &seed.workers {
            assert_eq!(
                reason_of(report, &w.name).as_deref(),
                Some("forbidden"),
                "{}: {report:#}",
                w.name
            );
        }
        let failing = report["witness"]["failing"].to_string();
        assert!(
            failing.contains("compute.instances.detachDisk"),
            "{failing}"
        );
        assert!(failing.contains("node-fencer-gcp"), "the fix: {failing}");
        if round == 1 {
            let told = report["witness"]["changes"].as_array().map_or(0, Vec::len);
            assert_eq!(told, 0, "told once: {report:#}");
        }
    }
    assert_eq!(count_node_events(admin, &node1, "WitnessFailing").await?, 1);

    let after = sweep()?;
    assert_eq!(reason_of(&after, &node1), None, "{after:#}");
    assert_eq!(
        count_node_events(admin, &node1, "WitnessRestored").await?,
        1
    );
    assert!(!is_fenced(admin, &node1).await?);
    Ok(())
}

/// The test key the push tokens are signed with, and its kid; the public
/// half is what the key server of the test serves.
struct Signer {
    pair: ring::signature::RsaKeyPair,
    kid: &'static str,
}

static PUSH_KEY: &[u8] = include_bytes!("../../../handler/tests/fixtures/oidc/test-key-a.pk8.der");
static OTHER_KEY: &[u8] = include_bytes!("../../../handler/tests/fixtures/oidc/test-key-b.pk8.der");
/// The push subscription's audience (a URL, as the module sets it).
const PUSH_AUDIENCE: &str = "https://push.node-fencer.example";
/// The service's own URL, what an Eventarc trigger's tokens name; the
/// module passes it beside the subscription's audience.
const SERVICE_URL: &str = "https://node-fencer-test.a.run.app";
const PUSH_ACCOUNT: &str = "node-fencer-push@proj-fencer.iam.gserviceaccount.com";

impl Signer {
    fn new(der: &[u8], kid: &'static str) -> anyhow::Result<Self> {
        let pair = ring::signature::RsaKeyPair::from_pkcs8(der)
            .map_err(|e| anyhow::anyhow!("a test key: {e}"))?;
        Ok(Self { pair, kid })
    }

    fn jwks(&self) -> Value {
        use ring::signature::KeyPair;
        let b64 = |b: &[u8]| base64_url(b);
        let public =
            ring::signature::RsaPublicKeyComponents::<Vec<u8>>::from(self.pair.public_key());
        json!({"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
                         "n": b64(&public.n), "e": b64(&public.e)}]})
    }

    /// A push token as Pub/Sub signs it, for `audience`.
    fn token(&self, audience: &str) -> anyhow::Result<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let header = json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"});
        let claims = json!({"aud": audience, "email": PUSH_ACCOUNT, "email_verified": true,
                            "exp": now + 3600, "iat": now - 10,
                            "iss": "https://accounts.google.com", "sub": "1234567890"});
        let input = format!(
            "{}.{}",
            base64_url(header.to_string().as_bytes()),
            base64_url(claims.to_string().as_bytes())
        );
        let mut signature = vec![0; self.pair.public().modulus_len()];
        self.pair
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                input.as_bytes(),
                &mut signature,
            )
            .map_err(|e| anyhow::anyhow!("signing: {e}"))?;
        Ok(format!("{input}.{}", base64_url(&signature)))
    }
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Serves `body` as JSON to every request on a loopback port: Google's key
/// set, as far as `serve` can tell. Returns the port.
async fn key_server(body: String) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: public, max-age=3600\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    Ok(port)
}

/// The host name the requests to `serve` name unless told otherwise, as
/// Cloud Run's front end passes the service's own.
const SERVED_HOST: &str = "node-fencer-test.a.run.app";

/// The headers of an Eventarc CloudEvent in binary mode carrying an audit
/// log entry.
fn eventarc_headers(vm: &Vm) -> Vec<(&'static str, String)> {
    vec![
        ("ce-specversion", "1.0".into()),
        (
            "ce-id",
            "projects/proj-fencer/logs/cloudaudit.googleapis.com%2Factivity-stop1".into(),
        ),
        ("ce-type", "google.cloud.audit.log.v1.written".into()),
        (
            "ce-source",
            format!(
                "//cloudaudit.googleapis.com/projects/{}/logs/activity",
                vm.project
            ),
        ),
        ("ce-methodname", "v1.compute.instances.stop".into()),
        ("ce-servicename", "compute.googleapis.com".into()),
        ("ce-resourcename", vm.path()),
    ]
}

/// `node-fencer serve` (the harness's build, every feature) on the controller stack, killed
/// when dropped.
struct Served {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// The metric entries one request wrote to stdout for Cloud Logging.
    fn metric_entries(&self, correlation_id: &str) -> anyhow::Result<Vec<Value>> {
        Ok(std::fs::read_to_string(&self.log)?
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["CorrelationId"] == correlation_id && v.get("metric").is_some())
            .collect())
    }

    async fn start(certs_port: u16) -> anyhow::Result<Self> {
        Self::start_with(certs_port, &[]).await
    }

    /// [`Self::start`] with these variables besides.
    async fn start_with(certs_port: u16, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let stack = cluster_stack();
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
            .local_addr()?
            .port();
        let log_path = stack.dir.join("logs").join(format!("serve-{port}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_node-fencer-full"));
        cmd.args(["serve", "--port", &port.to_string()])
            .envs(node_fencer_tests::lambda::function_env(stack))
            .env("COMPUTE_ENDPOINT", fake_compute().endpoint())
            .env("NOT_READY_WAIT_SECONDS", "30")
            .env("PUSH_AUDIENCE", format!("{PUSH_AUDIENCE},{SERVICE_URL}"))
            .env("PUSH_SERVICE_ACCOUNT", PUSH_ACCOUNT)
            .env(
                "PUSH_CERTS_URL",
                format!("http://127.0.0.1:{certs_port}/certs"),
            )
            .envs(env.iter().copied())
            .stdout(log.try_clone()?)
            .stderr(log);
        let served = Self {
            child: cmd.spawn()?,
            port,
            log: log_path,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while served.post("/healthz", None, "").await.is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "serve did not listen within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(served)
    }

    /// The process's peak resident memory so far (`VmHWM`), in KiB.
    fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/{}/status", self.child.id()))
    }

    /// A POST to `path` whose headers declare a body of `declared` bytes,
    /// of which `sent` (spaces) are written as fast as the server takes
    /// them while its answer is read: the status, or `None` when the
    /// connection closed unanswered (a server may refuse a request without
    /// reading its body, and its reset can overtake the answer). The
    /// connection is not half-closed while the answer is awaited: hyper
    /// takes a client's end of input for the end of the connection and
    /// drops the answer under way, and no client this serves half-closes.
    async fn post_declared(
        &self,
        path: &str,
        token: Option<&str>,
        declared: usize,
        sent: usize,
    ) -> Option<u16> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let (mut rx, mut tx) = stream.into_split();
        let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {SERVED_HOST}\r\nContent-Type: application/json\r\n{auth}Content-Length: {declared}\r\nConnection: close\r\n\r\n"
        );
        let write = async move {
            tx.write_all(head.as_bytes()).await?;
            let chunk = vec![b' '; 1 << 20];
            let mut left = sent;
            while left > 0 {
                let n = left.min(chunk.len());
                tx.write_all(&chunk[..n]).await?;
                left -= n;
            }
            tx.flush().await?;
            Ok::<_, std::io::Error>(tx)
        };
        let read = async move {
            let mut raw = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match rx.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => raw.extend_from_slice(&buf[..n]),
                }
            }
            raw
        };
        let (_, raw) = tokio::time::timeout(Duration::from_secs(120), async {
            tokio::join!(write, read)
        })
        .await
        .ok()?;
        let text = String::from_utf8_lossy(&raw);
        text.split_whitespace().nth(1)?.parse().ok()
    }

    /// One request: its status and body. `/healthz` is asked with GET.
    async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> anyhow::Result<(u16, String)> {
        self.post_with(path, token, &[], body).await
    }

    /// [`Self::post`] with these headers besides (a `host` one in place
    /// of [`SERVED_HOST`]).
    async fn post_with(
        &self,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, String)],
        body: &str,
    ) -> anyhow::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        let method = if path == "/healthz" { "GET" } else { "POST" };
        let mut auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
        let mut host = SERVED_HOST;
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("host") {
                host = value;
            } else {
                auth.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(300), stream.read_to_end(&mut raw)).await??;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("no HTTP answer: {text:?}"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?;
        Ok((status, body.to_owned()))
    }
}

/// The audit log entry of the end of a `stop` of `vm`.
fn stop_entry(vm: &Vm) -> Value {
    json!({
        "insertId": "-stop1",
        "logName": format!("projects/{}/logs/cloudaudit.googleapis.com%2Factivity", vm.project),
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "methodName": "v1.compute.instances.stop",
            "resourceName": vm.path(),
            "serviceName": "compute.googleapis.com"
        },
        "resource": {"type": "gce_instance", "labels": {
            "instance_id": vm.id, "project_id": vm.project, "zone": vm.zone}},
        "operation": {"id": "operation-1", "producer": "compute.googleapis.com", "last": true},
        "severity": "NOTICE"
    })
}

/// A Pub/Sub push request carrying [`stop_entry`], as the Logging sink
/// writes it.
fn stop_pushed(vm: &Vm) -> String {
    pushed(&stop_entry(vm))
}

/// A Pub/Sub push request carrying `entry`, as the Logging sink writes it.
fn pushed(entry: &Value) -> String {
    use base64::Engine;
    json!({
        "message": {
            "data": base64::engine::general_purpose::STANDARD.encode(entry.to_string()),
            "messageId": "4711"
        },
        "subscription": "projects/proj-fencer/subscriptions/node-fencer-push"
    })
    .to_string()
}

/// The audit log path on Cloud Run: the VM's stop reaches `serve` twice,
/// as it does with both the Logging sink and the Eventarc trigger. Without
/// a token, with one signed by a key Google does not publish, with one for
/// another audience, or (issue 33, item 11) for the URL of the host the
/// request names, which a caller picks behind a load balancer, either
/// route answers 401 and nothing changes. The Eventarc CloudEvent, its
/// token for the service's URL as `PUSH_AUDIENCE` lists it (a trigger
/// cannot be given an audience), fences the node; the Pub/Sub push of the
/// same entry, its token for the subscription's audience, finds it fenced
/// and detaches nothing more, and so does its redelivery.
#[tokio::test]
async fn gce_a_pushed_stop_needs_a_valid_token_and_a_redelivery_changes_nothing()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let compute = fake_compute().client();
    let signer = Signer::new(PUSH_KEY, "push-key")?;
    let stranger = Signer::new(OTHER_KEY, "push-key")?;
    let certs = key_server(signer.jwks().to_string()).await?;
    let served = Served::start(certs).await?;
    let (admin, seed, node2) = gce_seed_with_node2_down(false).await?;
    let vm = vm_of(&seed);
    let pushed = stop_pushed(&vm);
    let event = stop_entry(&vm).to_string();
    let headers = eventarc_headers(&vm);
    let balancer = "lb.node-fencer-test.example";

    for (how, token, host) in [
        ("no token", None, None),
        ("another key", Some(stranger.token(PUSH_AUDIENCE)?), None),
        (
            "another audience",
            Some(signer.token("https://elsewhere.example")?),
            None,
        ),
        (
            "another path of this service",
            Some(signer.token(&format!("{SERVICE_URL}/sweep"))?),
            None,
        ),
        (
            "the host the request names",
            Some(signer.token(&format!("https://{balancer}"))?),
            Some(balancer),
        ),
    ] {
        let host: Vec<(&str, String)> = host.map(|h| ("host", h.to_owned())).into_iter().collect();
        let (status, text) = served
            .post_with("/pubsub", token.as_deref(), &host, &pushed)
            .await?;
        assert_eq!(status, 401, "/pubsub, {how}: {text}");
        let with_host: Vec<(&str, String)> = headers.iter().cloned().chain(host).collect();
        let (status, text) = served
            .post_with("/eventarc", token.as_deref(), &with_host, &event)
            .await?;
        assert_eq!(status, 401, "/eventarc, {how}: {text}");
        assert_untouched(&admin, &compute, &seed, &vm, how).await?;
    }

    let eventarc_token = signer.token(SERVICE_URL)?;
    let (status, text) = served
        .post_with("/eventarc", Some(&eventarc_token), &headers, &event)
        .await?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["origins"][0]["kind"], "gce_audit_log", "{r:#}");
    assert!(is_fenced(&admin, &node2).await?, "the taint is on");
    let detached = data_disks_detached(&compute, &seed, &vm).await?;

    // The sink's copy, then Pub/Sub's redelivery of it (at least once).
    let token = signer.token(PUSH_AUDIENCE)?;
    for delivery in ["the sink's copy", "a redelivery"] {
        let (status, text) = served.post("/pubsub", Some(&token), &pushed).await?;
        assert_eq!(status, 200, "{delivery}: {text}");
        let again: Value = serde_json::from_str(&text)?;
        assert_eq!(
            only_result(&again, &node2)["outcome"],
            "already_fenced",
            "{delivery}: {again:#}"
        );
        assert_eq!(
            compute.detach_requests(&vm).await?.len(),
            detached,
            "{delivery}: no detachDisk more"
        );
    }
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// Unauthenticated `/alertmanager` requests sent at once, each again as
/// soon as it is answered, for as long as the push takes.
const FLOOD_CONNECTIONS: usize = 16;
/// The body each of them declares and sends: under the 14 MiB `serve`
/// once read of any route before looking at the webhook's token.
const FLOOD_BODY: usize = 12 << 20;
/// How much the flood and the push together may raise `serve`'s peak
/// memory: a fence's own allocations, far below one flood body per
/// connection.
const FLOOD_PEAK_GROWTH_KIB: u64 = 64 << 10;

/// Regression (issue 33, item 8): on the one public service, a flood of
/// unauthenticated `/alertmanager` requests with large bodies neither
/// fills the service's memory nor keeps a Pub/Sub push from being answered
/// and fencing, as the Cloud Run scenario above does: the bearer token is
/// checked from the headers before any of the body is read, and a request
/// is refused unread past its route's bound. With the token, the webhook
/// is served by the same entry as the Lambda Function URL.
#[tokio::test]
async fn gce_a_flood_of_unauthenticated_webhooks_neither_fills_memory_nor_holds_up_a_push()
-> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _g = cluster_serial().await;
    let compute = fake_compute().client();
    let signer = Signer::new(PUSH_KEY, "push-key")?;
    let certs = key_server(signer.jwks().to_string()).await?;
    let served = Arc::new(Served::start(certs).await?);
    let (admin, seed, node2) = gce_seed_with_node2_down(false).await?;
    let vm = vm_of(&seed);
    let before = served.peak_rss_kib()?;

    let pushing = Arc::new(AtomicBool::new(true));
    let flood: Vec<_> = (0..FLOOD_CONNECTIONS)
        .map(|_| {
            let (served, pushing) = (served.clone(), pushing.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while pushing.load(Ordering::SeqCst) {
                    let answer = served
                        .post_declared("/alertmanager", None, FLOOD_BODY, FLOOD_BODY)
                        .await;
                    answers.push(answer);
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let token = signer.token(PUSH_AUDIENCE)?;
    let pushed = served
        .post("/pubsub", Some(&token), &stop_pushed(&vm))
        .await;
    pushing.store(false, Ordering::SeqCst);
    let mut answers = Vec::new();
    for worker in flood {
        answers.extend(worker.await?);
    }
    let after = served.peak_rss_kib()?;
    eprintln!(
        "serve's peak RSS (VmHWM): {before} KiB before, {after} KiB after {} unauthenticated \
         /alertmanager requests of {FLOOD_BODY} bytes on {FLOOD_CONNECTIONS} connections and \
         the push",
        answers.len()
    );

    let (status, text) = pushed?;
    assert_eq!(status, 200, "the push, during the flood: {text}");
    let report: Value = serde_json::from_str(&text)?;
    assert_eq!(
        only_result(&report, &node2)["outcome"],
        "fenced",
        "{report:#}"
    );
    assert!(is_fenced(&admin, &node2).await?, "the taint is on");
    data_disks_detached(&compute, &seed, &vm).await?;
    assert!(
        answers.len() >= FLOOD_CONNECTIONS,
        "{} requests",
        answers.len()
    );
    let refused = answers.iter().filter(|a| **a == Some(401)).count();
    assert!(
        answers.iter().all(|a| matches!(a, None | Some(401))),
        "every flood request refused: {answers:?}"
    );
    assert!(
        after.saturating_sub(before) < FLOOD_PEAK_GROWTH_KIB,
        "peak RSS grew by {} KiB ({refused} answered 401)",
        after.saturating_sub(before)
    );

    // Refused by its headers alone: no token, or a body over the bound,
    // whatever follows (none is sent here, and none is waited for).
    let none = served.post_declared("/alertmanager", None, 0, 0).await;
    assert_eq!(none, Some(401));
    let over = webhook::MAX_BODY_BYTES + 1;
    let too_large = served
        .post_declared("/alertmanager", Some(WEBHOOK_TOKEN), over, 0)
        .await;
    assert_eq!(too_large, Some(413));
    // And the webhook itself, through the same entry as on Lambda.
    let alert = kube_node_not_ready(&[&node2]).to_string();
    let answer = served
        .post("/alertmanager", Some(WEBHOOK_TOKEN), &alert)
        .await?;
    assert_eq!(outcome_of(answer, &node2)?, "already_fenced");
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// `SERVE_ROUTES` splits `serve` in two services: the events Google
/// delivers, and the public webhook, so that no caller of the webhook can
/// take the events' slots. A route of the other service is not there
/// (404); a value it does not know stops `serve` at start, naming it.
#[tokio::test]
async fn gce_serve_answers_only_the_routes_it_is_given() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let signer = Signer::new(PUSH_KEY, "push-key")?;
    let certs = key_server(signer.jwks().to_string()).await?;
    for (routes, here, gone) in [
        (
            "events",
            ["/pubsub", "/eventarc", "/sweep"].as_slice(),
            ["/alertmanager"].as_slice(),
        ),
        (
            "alertmanager",
            &["/alertmanager"],
            &["/pubsub", "/eventarc", "/sweep"],
        ),
    ] {
        let served = Served::start_with(certs, &[("SERVE_ROUTES", routes)]).await?;
        for path in here {
            let (status, text) = served.post(path, None, "{}").await?;
            assert_eq!(status, 401, "{routes}: {path} is served: {text}");
        }
        for path in gone {
            let (status, text) = served.post(path, None, "{}").await?;
            assert_eq!(status, 404, "{routes}: {path} is not: {text}");
        }
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-fencer-full"))
        .args(["serve", "--port", "0"])
        .envs(node_fencer_tests::lambda::function_env(cluster_stack()))
        .env("SERVE_ROUTES", "events,webhook")
        .output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("SERVE_ROUTES") && said.contains("`alertmanager`"),
        "{said}"
    );
    Ok(())
}

/// Regression (issue 33, item 18): the audit entry of a stop an instance
/// schedule made names the project by its number
/// (`projects/NUMBER/zones/Z/instances/N`); `resource.labels.project_id`
/// names it as the Node's provider id does. Through Eventarc it fences the
/// node; the same entry pushed by Pub/Sub finds it fenced, where both were
/// refused as no Cloud Audit Log entry (400, dead-lettered).
#[tokio::test]
async fn gce_a_stop_that_names_the_project_by_number_fences_through_both_routes()
-> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let compute = fake_compute().client();
    let signer = Signer::new(PUSH_KEY, "push-key")?;
    let certs = key_server(signer.jwks().to_string()).await?;
    let served = Served::start(certs).await?;
    let (admin, seed, node2) = gce_seed_with_node2_down(false).await?;
    let vm = vm_of(&seed);
    let by_number = format!(
        "projects/123456789012/zones/{}/instances/{}",
        vm.zone, vm.name
    );
    let mut entry = stop_entry(&vm);
    entry["protoPayload"]["resourceName"] = json!(by_number);
    entry["protoPayload"]["authenticationInfo"] =
        json!({"principalEmail": "service-123456789012@compute-system.iam.gserviceaccount.com"});
    let mut headers = eventarc_headers(&vm);
    for (name, value) in &mut headers {
        if *name == "ce-resourcename" {
            value.clone_from(&by_number);
        }
    }

    let token = signer.token(SERVICE_URL)?;
    let (status, text) = served
        .post_with("/eventarc", Some(&token), &headers, &entry.to_string())
        .await?;
    assert_eq!(status, 200, "{text}");
    let report: Value = serde_json::from_str(&text)?;
    let r = only_result(&report, &node2);
    assert_eq!(r["outcome"], "fenced", "{report:#}");
    assert_eq!(r["instance_id"], json!(vm.provider_id()), "{r:#}");
    assert!(is_fenced(&admin, &node2).await?, "the taint is on");
    data_disks_detached(&compute, &seed, &vm).await?;
    // The request's metrics, as the entries the log-based metrics count.
    let id = report["correlation_id"].as_str().unwrap_or_default();
    let entries = served.metric_entries(id)?;
    let decisions: Vec<&Value> = entries
        .iter()
        .filter(|e| e["metric"] == "Decisions")
        .collect();
    assert_eq!(decisions.len(), 1, "{entries:#?}");
    assert_eq!(decisions[0]["Outcome"], "fenced");
    assert!(
        entries
            .iter()
            .any(|e| e["metric"] == "TaintLatency" && e["value"].is_number()),
        "{entries:#?}"
    );

    let token = signer.token(PUSH_AUDIENCE)?;
    let answer = served
        .post("/pubsub", Some(&token), &pushed(&entry))
        .await?;
    assert_eq!(outcome_of(answer, &node2)?, "already_fenced");
    teardown_seed(&admin, &seed).await;
    Ok(())
}
