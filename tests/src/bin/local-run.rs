//! `make run`: node-fencer's main job on the local stack, step by step.
//!
//! Brings up the controller stack (etcd, kube-apiserver, controller-manager,
//! scheduler, kwok nodes, moto, the real CSI external-attacher in front of each
//! driver's controller), sets up the seed
//! scenario (a StatefulSet and a Deployment with ReadWriteOnce EBS volumes on
//! node 2), stops node 2's instance and heartbeats, shows Kubernetes stuck,
//! then sends the EventBridge `stopped` event to the real binary under
//! `cargo lambda watch` and follows the recovery. It ends with a summary: the
//! run's timeline and, with `--keep`, the commands to look at what is left.
//! With `--cloud gce` the same on Compute Engine: nodes backed by VMs of the
//! fake Compute Engine, Persistent Disks, node 2's VM `TERMINATED`, and the
//! KubeNodeNotReady alert from Alertmanager's webhook as the trigger. With
//! `--cloud redfish`, on-premises: machines behind a Redfish BMC
//! (sushy-tools' emulator), cStor-like volumes, node 2's power cut at its
//! BMC, and node-fencer off the cluster as `serve`, told by the alert.

use std::time::{Duration, Instant, SystemTime};

use node_fencer_tests::attacher::Driver;
use node_fencer_tests::cluster::{cluster_stack, cluster_stack_drivers};
use node_fencer_tests::fixtures::{event_time, fenced_at, node_events, volume};
use node_fencer_tests::gce::fake_compute;
use node_fencer_tests::lambda::{WEBHOOK_TOKEN, start_gce_emulator, start_harness_emulator};
use node_fencer_tests::recovery_timeline::{self, Lane, Phase};
use node_fencer_tests::scene::{
    Hosts, Kubelets, eventbridge_event, kill_node2, kube_node_not_ready, node_taints,
    pods_left_on_node2, running_with_volume, seed_on_with, stuck, wait_not_ready, wait_until,
};
use serde_json::Value;

const USAGE: &str = "\
usage: local-run [--cloud aws|gce|redfish] [--keep]

Runs node-fencer's main job on the local stack: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok nodes, moto (EC2), the fake
Compute Engine and the real CSI external-attacher sidecar in front of the
scene's driver (our EBS controller, the real PD CSI driver, or our cStor
controller), with node-fencer under cargo lambda watch. Replays the seed
scenario: a StatefulSet and a Deployment with ReadWriteOnce volumes on a
node whose machine stops; Kubernetes alone leaves them stuck; node-fencer
lets them move, volumes included.

  --cloud aws   (the default) EC2 instances in moto and EBS volumes; the
                trigger is the EventBridge `stopped` event
  --cloud gce   Compute Engine VMs and Persistent Disks in the fake Compute
                Engine (tests/gce/fake_compute.py); node 2's VM is set
                TERMINATED, the trigger is the KubeNodeNotReady alert from
                Alertmanager's webhook
  --cloud redfish
                on-premises: three machines behind a Redfish BMC (sushy-tools'
                emulator over TLS, its fake systems driver), cStor-like
                volumes; node 2's BMC cuts its power (ForceOff), and
                node-fencer runs off the cluster as `serve`, told by the
                KubeNodeNotReady alert, confirming the machine off at its BMC
  --keep        leave the stack and the emulator running until Ctrl-C, and
                print how to reach them

Set NODE_FENCER_CLUSTER_STACK_DIR to use a stack started with
`tests/stack/up.sh DIR --controllers`.";

/// How long the stuck state is shown before node-fencer is called.
const STUCK: Duration = Duration::from_secs(20);

fn step(t0: Instant, what: &str) {
    println!("[{:>5.1}s] {what}", t0.elapsed().as_secs_f64());
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let mut keep = false;
    let mut gce = false;
    let mut onprem = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--keep" => keep = true,
            "--cloud" => match it.next().map(String::as_str) {
                Some("aws") => (gce, onprem) = (false, false),
                Some("gce") => (gce, onprem) = (true, false),
                Some("redfish") => (gce, onprem) = (false, true),
                other => anyhow::bail!("--cloud: aws, gce or redfish, not {other:?} (see --help)"),
            },
            bad => anyhow::bail!("unknown argument {bad:?} (see --help)"),
        }
    }
    // Only the scene's driver runs, so that `make run` builds only its
    // binaries (`setup.sh --for-run --cloud=...`).
    let driver = match (gce, onprem) {
        (_, true) => Driver::Cstor,
        (true, _) => Driver::Pd,
        _ => Driver::Ebs,
    };
    cluster_stack_drivers(&[driver]);
    if onprem {
        return onprem::run(keep).await;
    }
    let t0 = Instant::now();
    step(
        t0,
        "starting the local stack (etcd, kube-apiserver, controllers, kwok, moto, fake Compute Engine, the CSI external-attacher and the scene's driver)",
    );
    let s = cluster_stack();
    let admin = s.admin().await?;
    let compute = fake_compute();
    step(
        t0,
        "Lambda: starting node-fencer under cargo lambda watch (the first start compiles)",
    );
    let endpoint = compute.endpoint();
    let emu = if gce {
        start_gce_emulator(s, &[])?
    } else {
        start_harness_emulator(s, &[])?
    };
    // The emulator builds the function on its first invocation: a harmless
    // one (an instance EC2 does not know) gets that out of the way.
    let warm_up = Instant::now();
    let out = emu.invoke(&eventbridge_event("i-0ffffffffffffffff", "stopped"))?;
    if out.error {
        anyhow::bail!("the warm-up invocation failed: {}", out.output);
    }
    step(
        t0,
        &format!(
            "  the function answered a warm-up event in {:.1} s (build and cold start)",
            warm_up.elapsed().as_secs_f64()
        ),
    );

    let (volumes, disk, machine) = if gce {
        ("Persistent Disk", "PD", "VM")
    } else {
        ("EBS volume", "EBS", "instance")
    };
    step(
        t0,
        &format!(
            "the seed scenario: StatefulSet db and Deployment app, each with a ReadWriteOnce {volumes}, on node 2"
        ),
    );
    // kwok plays every kubelet here: the hollow kubelet is a test-only
    // build (tests/docs/real-kubelets.md).
    let hosts = if driver.on_gce() {
        Hosts::Gce
    } else {
        Hosts::Ec2
    };
    let seed = seed_on_with(s, driver, hosts, Kubelets::Kwok).await?;
    let node2 = seed.node2().name.clone();
    for w in &seed.workers {
        println!(
            "         node {} -> {machine} {} ({})",
            w.name, w.machine.instance, w.machine.az
        );
    }
    for w in [&seed.db, &seed.app] {
        println!(
            "         {} {}: PVC {} -> PV {} -> {disk} {}",
            w.kind, w.name, w.pvc, w.pv, w.volume
        );
    }

    step(
        t0,
        if gce {
            "Compute Engine: node 2's VM is TERMINATED; its heartbeats stop"
        } else {
            "EC2: stopping node 2's instance; its heartbeats stop"
        },
    );
    let stopped = Instant::now();
    let stopped_wall = SystemTime::now();
    let since_stop = |t: SystemTime| t.duration_since(stopped_wall).ok();
    let mut marks = vec![(Phase::Stopped, Duration::ZERO)];
    kill_node2(s, &seed, false).await?;
    marks.push((Phase::NotReady, stuck_alone(s, &seed, stopped, t0).await?));

    step(
        t0,
        if gce {
            "invoking node-fencer with the KubeNodeNotReady alert (Alertmanager's webhook, the Function URL)"
        } else {
            "invoking node-fencer with the EventBridge `stopped` event"
        },
    );
    let sent = Instant::now();
    marks.push((Phase::Event, stopped.elapsed()));
    let output = if gce {
        let body = kube_node_not_ready(&[&node2]).to_string();
        let (status, text) =
            emu.post_function_url(&body, Some(&format!("Bearer {WEBHOOK_TOKEN}")))?;
        if status != 200 {
            anyhow::bail!("the webhook answered {status}: {text}");
        }
        text
    } else {
        let out = emu.invoke(&eventbridge_event(
            &seed.node2().machine.instance,
            "stopped",
        ))?;
        if out.error {
            anyhow::bail!("the invocation failed: {}", out.output);
        }
        out.output
    };
    let took = sent.elapsed();
    let report: Value = serde_json::from_str(&output)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    step(
        t0,
        &format!("invocation answered in {} ms", took.as_millis()),
    );
    println!(
        "         node taints: {}",
        node_taints(&admin, &node2).await?.join(", ")
    );
    for (reason, note) in node_events(&admin, &node2).await? {
        println!("         event {reason}: {note}");
    }
    // The binary times nothing itself: the Node's `fenced-at` (written with
    // the taint) and its Events' times say when, on this machine's clock.
    if let Some(t) = fenced_at(&admin, &node2).await?.and_then(since_stop) {
        marks.push((Phase::Tainted, t));
    }
    if let Some(t) = event_time(&admin, &node2, "VolumesForceDetached")
        .await?
        .and_then(since_stop)
    {
        marks.push((Phase::Detached, t));
    }

    step(t0, "the controllers take it from here");
    let (pods_gone, back) = moved(s, &seed, stopped, t0).await?;
    let ec2 = s.ec2().await;
    let mut running = Duration::ZERO;
    for (w, at) in [&seed.db, &seed.app].into_iter().zip(&back) {
        let Some((t, node)) = at else { continue };
        running = running.max(*t);
        if gce {
            let users = compute.client().disk_users(&w.volume).await?;
            println!(
                "         {} runs on {node}; {} attached to {:?}",
                w.name,
                w.volume,
                users.unwrap_or_default()
            );
        } else {
            let (state, attached) = volume(&ec2, &w.volume).await?;
            println!(
                "         {} runs on {node}; {} {state}, attached to {attached:?}",
                w.name, w.volume
            );
        }
    }
    marks.extend(pods_gone.map(|t| (Phase::PodsDeleted, t)));
    marks.push((Phase::Running, running));
    step(
        t0,
        &format!(
            "recovered {:.1} s after the event",
            sent.elapsed().as_secs_f64()
        ),
    );

    summary(
        "this run: node-fencer through the binary",
        &format!("the {machine} stopped"),
        marks,
        took,
    );
    if keep {
        // `make run` sources the cache's env.sh, which names the kubectl it built.
        let kubectl = std::env::var("NODE_FENCER_KUBE_BIN")
            .map_or_else(|_| "kubectl".to_owned(), |d| format!("{d}/kubectl"));
        println!(
            "The stack stays up until Ctrl-C. From another shell:\n  \
             source {dir}/env   # KUBECONFIG, AWS_ENDPOINT_URL, ...\n  \
             curl -s {endpoint}/_fake/state   # the fake Compute Engine's VMs and disks\n  \
             {kubectl} get nodes,pods,volumeattachments -A -o wide\n  \
             {kubectl} get events -n default --field-selector involvedObject.name={node2}\n  \
             cargo lambda invoke node-fencer --invoke-port {port} --data-ascii '{{\"action\": \"check\", \"node\": \"{node2}\"}}'\n  \
             tail {dir}/logs/csi-attacher-*.log {dir}/logs/csi-*.log",
            dir = s.dir.display(),
            port = emu.port,
        );
        // The watchdog stops the stack when this process exits.
        tokio::signal::ctrl_c().await?;
    } else {
        println!(
            "The stack is torn down now; `make run ARGS=--keep` leaves it up, with the commands to look at it."
        );
    }
    Ok(())
}

/// The run's summary: when both workloads ran again (the `Running` mark),
/// how long node-fencer took, and the timeline of `marks`, in one lane.
fn summary(lane: &str, zero: &str, marks: Vec<(Phase, Duration)>, took: Duration) {
    let running = marks
        .iter()
        .filter(|(p, _)| *p == Phase::Running)
        .map(|(_, t)| *t)
        .max()
        .unwrap_or_default();
    let lane = Lane {
        name: lane.into(),
        marks: marks
            .into_iter()
            .map(|(p, t)| (p, t.as_secs_f64()))
            .collect(),
        watched_until: None,
    };
    println!(
        "\nSummary: both workloads run elsewhere with their volumes, {:.1} s after {zero} \
         ({} ms in node-fencer).\n\n{}",
        running.as_secs_f64(),
        took.as_millis(),
        recovery_timeline::text(std::slice::from_ref(&lane))
    );
}

/// Waits until node 2 is NotReady, then shows Kubernetes alone for
/// [`STUCK`]: the pods stuck on node 2, the replacement refused its volume.
/// Returns when node 2 turned NotReady, since `stopped`.
async fn stuck_alone(
    s: &node_fencer_tests::Stack,
    seed: &node_fencer_tests::scene::Seed,
    stopped: Instant,
    t0: Instant,
) -> anyhow::Result<Duration> {
    let admin = s.admin().await?;
    let node2 = seed.node2().name.clone();
    wait_not_ready(
        &admin,
        std::slice::from_ref(&node2),
        Duration::from_secs(60),
    )
    .await?;
    let not_ready = stopped.elapsed();
    step(
        t0,
        &format!(
            "node {node2} is NotReady; Kubernetes alone, for {} s:",
            STUCK.as_secs()
        ),
    );
    let watched = Instant::now();
    let _ = wait_until("the pods to be stuck", STUCK, || async {
        let st = stuck(s, seed).await?;
        Ok((st.db_terminating && !st.multi_attach.is_empty()).then_some(()))
    })
    .await;
    tokio::time::sleep(STUCK.saturating_sub(watched.elapsed())).await;
    let st = stuck(s, seed).await?;
    println!(
        "         db-0 Terminating on node 2: {}; app's replacement without its volume: {}",
        st.db_terminating, st.app_replacement_without_volume
    );
    for m in st.multi_attach.iter().take(1) {
        println!("         FailedAttachVolume: {m}");
    }
    Ok(not_ready)
}

/// Waits, up to 120 s, until node 2's pods are gone and both workloads run
/// elsewhere with their volumes: when each happened, since `stopped`.
async fn moved(
    s: &node_fencer_tests::Stack,
    seed: &node_fencer_tests::scene::Seed,
    stopped: Instant,
    t0: Instant,
) -> anyhow::Result<(Option<Duration>, [Option<(Duration, String)>; 2])> {
    let admin = s.admin().await?;
    let node2 = seed.node2().name.clone();
    let (mut pods_gone, mut back) = (None, [None, None]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while pods_gone.is_none() || back.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            anyhow::bail!("not recovered 120 s after the event");
        }
        if pods_gone.is_none() && pods_left_on_node2(&admin, seed).await? == 0 {
            pods_gone = Some(stopped.elapsed());
            step(t0, "the old pods are gone");
        }
        for (w, at) in [&seed.db, &seed.app].into_iter().zip(back.iter_mut()) {
            if at.is_none()
                && let Some(node) = running_with_volume(s, seed, w, Some(&node2)).await?
            {
                *at = Some((stopped.elapsed(), node));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((pods_gone, back))
}

/// `--cloud redfish`: the seed scenario on machines behind a BMC.
mod onprem {
    use std::time::{Duration, Instant};

    use node_fencer_tests::attacher::Driver;
    use node_fencer_tests::cluster::cluster_stack;
    use node_fencer_tests::fixtures::{fenced_at, node_events};
    use node_fencer_tests::recovery_timeline::Phase;
    use node_fencer_tests::redfish::{Bmc, Inventory, Serve, SystemSpec};
    use node_fencer_tests::scene::{
        Hosts, Kubelets, kube_node_not_ready, node_taints, seed_on_with, stop_heartbeats,
    };

    use super::{moved, step, stuck_alone, summary};

    pub(super) async fn run(keep: bool) -> anyhow::Result<()> {
        let t0 = Instant::now();
        step(
            t0,
            "starting the local stack (etcd, kube-apiserver, controllers, kwok, the CSI external-attacher and the cStor-like driver)",
        );
        let s = cluster_stack();
        let admin = s.admin().await?;
        step(
            t0,
            "the BMC: sushy-tools' Redfish emulator, its fake systems driver, three machines; TLS with a CA of its own, basic auth",
        );
        let systems: Vec<SystemSpec> = (1..=3)
            .map(|i| SystemSpec::new(&format!("rack1-m{i}"), true))
            .collect();
        let bmc = Bmc::start(&s.dir.join("bmc"), &systems, false).await?;
        step(
            t0,
            "the seed scenario on those machines: StatefulSet db and Deployment app, each with a ReadWriteOnce cStor-like volume, on node 2",
        );
        let seed = seed_on_with(s, Driver::Cstor, Hosts::Bmc(&systems), Kubelets::Kwok).await?;
        let node2 = seed.node2().name.clone();
        let mut inventory = Inventory::default();
        for (system, w) in systems.iter().zip(&seed.workers) {
            println!(
                "         node {} -> machine {} ({}{}, UUID {})",
                w.name,
                system.name,
                bmc.url,
                bmc.system(&system.name)?,
                system.uuid
            );
            inventory = inventory.machine(&bmc, &system.name, &bmc.url, Some(&w.name))?;
        }
        let inventory_path = bmc.dir.join("inventory.json");
        inventory.write(&inventory_path)?;
        let credentials = bmc.credentials_dir(None)?;
        let binary = std::env::current_exe()?.with_file_name("node-fencer-full");
        step(
            t0,
            "node-fencer serve, off the cluster: Alertmanager's route, the BMC inventory",
        );
        let text = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let serve = Serve::start(
            &text(&binary),
            s,
            s.dir.join("logs").join("serve-onprem.log"),
            &[
                ("REDFISH_INVENTORY", &text(&inventory_path)),
                ("REDFISH_CREDENTIALS_DIR", &text(&credentials)),
                ("NOT_READY_WAIT_SECONDS", "30"),
            ],
        )
        .await?;

        step(
            t0,
            "the power cut: node 2's BMC forces its machine off; its kubelet goes silent",
        );
        let cut = Instant::now();
        bmc.reset(&systems[1].name, "ForceOff").await?;
        stop_heartbeats(&admin, &node2).await?;
        bmc.wait_power(&systems[1].name, "Off").await?;
        let stopped = Instant::now();
        let stopped_wall = std::time::SystemTime::now();
        step(
            t0,
            &format!(
                "  the BMC reports the machine Off {:.1} s after the cut",
                cut.elapsed().as_secs_f64()
            ),
        );
        let mut marks = vec![(Phase::Stopped, Duration::ZERO)];
        marks.push((Phase::NotReady, stuck_alone(s, &seed, stopped, t0).await?));

        step(
            t0,
            "Alertmanager's KubeNodeNotReady alert to node-fencer serve",
        );
        marks.push((Phase::Event, stopped.elapsed()));
        let sent = Instant::now();
        let (status, report) = serve.alert(&kube_node_not_ready(&[&node2])).await?;
        let took = sent.elapsed();
        println!("{}", serde_json::to_string_pretty(&report)?);
        if status != 200 {
            anyhow::bail!("serve answered {status}; its log:\n{}", serve.logged());
        }
        step(t0, &format!("answered in {} ms", took.as_millis()));
        println!(
            "         node taints: {}",
            node_taints(&admin, &node2).await?.join(", ")
        );
        for (reason, note) in node_events(&admin, &node2).await? {
            println!("         event {reason}: {note}");
        }
        if let Some(t) = fenced_at(&admin, &node2)
            .await?
            .and_then(|t| t.duration_since(stopped_wall).ok())
        {
            marks.push((Phase::Tainted, t));
        }
        step(t0, "the controllers take it from here");
        let (pods_gone, back) = moved(s, &seed, stopped, t0).await?;
        let mut running = Duration::ZERO;
        for at in back.iter().flatten() {
            running = running.max(at.0);
            println!("         runs again on {} with its volume", at.1);
        }
        marks.extend(pods_gone.map(|t| (Phase::PodsDeleted, t)));
        marks.push((Phase::Running, running));
        summary(
            "this run: node-fencer serve, the machine off at its BMC",
            "the BMC reported the machine off",
            marks,
            took,
        );
        if keep {
            println!(
                "The stack stays up until Ctrl-C. From another shell:\n  \
                 source {dir}/env\n  \
                 curl -s --cacert {ca} -u {user}:PASSWORD {url}{system}   # node 2's System (the password: {creds}/lab/password)\n  \
                 tail -f {log}",
                dir = s.dir.display(),
                ca = bmc.ca.display(),
                user = bmc.user,
                url = bmc.url,
                system = bmc.system(&systems[1].name)?,
                creds = credentials.display(),
                log = serve.log.display(),
            );
            tokio::signal::ctrl_c().await?;
        } else {
            println!(
                "The stack is torn down now; `make run ARGS=\"--cloud redfish --keep\"` leaves it up."
            );
        }
        Ok(())
    }
}
