//! `make run`: node-fencer's main job on the local stack, step by step.
//!
//! Brings up moto, etcd and kube-apiserver, builds a scene (a worker whose
//! EC2 instance has stopped, its Node silent, a PersistentVolume attached),
//! then sends the EventBridge `stopped` event to the real binary under
//! `cargo lambda watch`, and shows what changed. `--keep` leaves the stack up.

use std::time::Instant;

use node_fencer_tests::fixtures::*;
use node_fencer_tests::lambda::emulator;
use node_fencer_tests::{repo_root, stack};
use serde_json::{Value, json};

fn step(t0: Instant, what: &str) {
    println!("[{:>5.1}s] {what}", t0.elapsed().as_secs_f64());
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "usage: local-run [--keep]\n\n\
             Runs node-fencer's main job against the local stack (moto, etcd, kube-apiserver)\n\
             through the Lambda runtime emulator. --keep leaves the stack running and prints\n\
             how to reach and stop it. Set NODE_FENCER_STACK_DIR to use a stack you started."
        );
        return Ok(());
    }
    let keep = args.iter().any(|a| a == "--keep");
    if let Some(bad) = args.iter().find(|a| *a != "--keep") {
        anyhow::bail!("unknown argument {bad:?} (see --help)");
    }
    let t0 = Instant::now();
    step(t0, "starting the local stack (moto, etcd, kube-apiserver)");
    let s = stack();
    let ec2 = s.ec2().await;
    let admin = s.admin().await?;

    step(t0, "EC2: launching worker-2's instance with a data volume");
    let m = launch(&ec2).await?;
    let vol = attach_new_volume(&ec2, &m, "/dev/xvdba").await?;
    let mut spec = NodeSpec::for_machine(&m);
    spec.name = unique("worker-2");
    create_node(&admin, &spec).await?;
    let pv = unique("pvc-data-postgres-0");
    create_pv(&admin, &pv, &vol).await?;
    create_va(&admin, &spec.name, &pv, "ebs.csi.aws.com").await?;
    println!(
        "         node {} -> {} ({}), volume {vol} backs PV {pv}",
        spec.name, m.instance, m.az
    );

    step(
        t0,
        "EC2: stopping the instance; the node has gone silent (Ready=Unknown)",
    );
    stop(&ec2, &m).await?;

    step(
        t0,
        "Lambda: starting the function under cargo lambda watch (first start compiles)",
    );
    let emu = emulator(s);
    let mut event: Value = serde_json::from_str(&std::fs::read_to_string(
        repo_root().join("handler/tests/fixtures/eventbridge-ec2-stopped.json"),
    )?)?;
    event["detail"]["instance-id"] = json!(m.instance);

    step(t0, "invoking with the EventBridge `stopped` event");
    let sent = Instant::now();
    let out = emu.invoke(&event)?;
    let took = sent.elapsed();
    if out.error {
        anyhow::bail!("the invocation failed: {}", out.output);
    }
    let report: Value = serde_json::from_str(&out.output)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    step(
        t0,
        &format!("invocation answered in {} ms", took.as_millis()),
    );

    let node = get_node(&admin, &spec.name).await?;
    println!("         node taints: {}", taints(&node).join(", "));
    let (state, attached) = volume(&ec2, &vol).await?;
    println!("         volume {vol}: {state}, attached to {attached:?}");
    for (reason, note) in node_events(&admin, &spec.name).await? {
        println!("         event {reason}: {note}");
    }
    step(
        t0,
        "invoking again, warm: the same event (a Lambda retry) converges with no change",
    );
    let sent = Instant::now();
    let again = emu.invoke(&event)?;
    let again: Value = serde_json::from_str(&again.output)?;
    step(
        t0,
        &format!(
            "answered in {} ms: {}",
            sent.elapsed().as_millis(),
            again["results"][0]["outcome"].as_str().unwrap_or("?")
        ),
    );
    if keep {
        println!(
            "\nThe stack stays up until Ctrl-C. From another shell:\n  \
             source {dir}/env   # KUBECONFIG, AWS_ENDPOINT_URL, ...\n  \
             cargo lambda invoke node-fencer --invoke-port {port} --data-file handler/tests/fixtures/direct-check.json",
            dir = s.dir.display(),
            port = emu.port
        );
        // The watchdog stops the stack when this process exits.
        tokio::signal::ctrl_c().await?;
    }
    Ok(())
}
