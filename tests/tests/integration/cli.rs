//! The command line as an operator runs it, the real binary against the
//! stack (moto and the apiserver, as the node-fencer role).

use std::process::Command;

use node_fencer_tests::fixtures::*;
use node_fencer_tests::lambda::function_env;
use node_fencer_tests::scene::{eventbridge_event, kube_node_not_ready};
use node_fencer_tests::{Stack, serial, stack};
use serde_json::Value;

/// Runs `node-fencer ARGS... handle FILE` with `event` in FILE, with active
/// fencing on; the exit status and the JSON report.
fn handle(s: &Stack, flags: &[&str], event: &Value) -> anyhow::Result<(i32, Value)> {
    let file = s.dir.join(format!("event-{}.json", unique("cli")));
    std::fs::write(&file, event.to_string())?;
    let out = Command::new(env!("CARGO_BIN_EXE_node-fencer-full"))
        .args(flags)
        .args(["--output", "json", "handle"])
        .arg(&file)
        .envs(function_env(s))
        .env("ACTIVE_FENCING", "on")
        .env("POWER_OFF_AFTER_SECONDS", "60")
        .env("POWER_OFF_WAIT_SECONDS", "20")
        // The bare stack's other tests leave NotReady Nodes about.
        .env("PARTITION_PERCENT", "100")
        .env("LOG_FORMAT", "text")
        .output()?;
    let _ = std::fs::remove_file(&file);
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    Ok((out.status.code().unwrap_or(-1), report))
}

/// Issue 33, item 3: `node-fencer --dry-run handle event.json` fenced for
/// real, and with a KubeNodeNotReady alert and active fencing on it powered
/// a machine off. Whatever the event, a dry run changes nothing; the same
/// event without the flag does what it says.
#[tokio::test]
async fn a_dry_run_handle_changes_nothing_whatever_the_event() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let stopped = target(s, false).await?;
    let hung = target(s, true).await?;
    let events = [
        eventbridge_event(&stopped.m.instance, "stopped"),
        kube_node_not_ready(&[&hung.node]),
    ];
    // The stop: the fencing planned; the alert: the power-off planned.
    for (event, planned) in events
        .iter()
        .zip(["/results/0/outcome", "/results/0/power_off/outcome"])
    {
        let (code, report) = handle(s, &["--dry-run"], event)?;
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["dry_run"], true, "{report:#}");
        assert_eq!(
            report.pointer(planned),
            Some(&Value::from("planned")),
            "{report:#}"
        );
    }
    for t in [&stopped, &hung] {
        assert!(!taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));
        assert_eq!(volume(&ec2, &t.volume).await?.1, vec![t.m.instance.clone()]);
    }
    assert_eq!(machine_state(&ec2, &hung.m).await?, "running");

    // Without the flag the same events fence, and power off.
    for event in &events {
        let (code, report) = handle(s, &[], event)?;
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    }
    assert_eq!(machine_state(&ec2, &hung.m).await?, "stopped");
    Ok(())
}

/// Runs `node-fencer --output json sweep` with `env` over the function's
/// environment; the exit status and the JSON report.
fn sweep(s: &Stack, env: &[(&str, &str)]) -> anyhow::Result<(i32, Value)> {
    let out = Command::new(env!("CARGO_BIN_EXE_node-fencer-full"))
        .args(["--output", "json", "sweep"])
        .envs(function_env(s))
        .envs(env.iter().copied())
        .env("LOG_FORMAT", "text")
        .output()?;
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    Ok((out.status.code().unwrap_or(-1), report))
}

/// [`sweep`] off the test's runtime, which serves the fault proxy the
/// command's EC2 calls go through.
async fn sweep_beside(s: &'static Stack, env: &[(&str, &str)]) -> anyhow::Result<(i32, Value)> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        sweep(s, &env)
    })
    .await?
}

/// The witness's failures in a sweep's report, as (node, reason) pairs.
fn witness_failing(report: &Value) -> Vec<(String, String)> {
    let mut failing: Vec<(String, String)> = report["witness"]["failing"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            let text = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
            (text("node"), text("reason"))
        })
        .collect();
    failing.sort();
    failing
}

/// How many Nodes' witness changed, in a sweep's report.
fn witness_changes(report: &Value) -> usize {
    report["witness"]["changes"].as_array().map_or(0, Vec::len)
}

/// Issue 48: the witness round that ends a sweep, on EC2. A Node whose
/// instance the region does not have, and a role that lost
/// `ec2:DetachVolume` (its dry run answered `UnauthorizedOperation` by the
/// fault proxy in front of moto, as EC2 answers a denied dry run), each
/// fail a Node's witness: a `WitnessFailing` Warning on the Node, told once
/// however many sweeps see it, and a `WitnessRestored` once mended. The
/// Nodes are Ready: nothing else is written to them.
#[tokio::test]
async fn a_sweep_ends_with_the_witness_and_tells_each_change_once() -> anyhow::Result<()> {
    use node_fencer_tests::faults::FaultProxy;
    let _g = serial().await;
    let s = stack();
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let m = launch(&ec2).await?;
    let ready = |provider_id: String| NodeSpec {
        provider_id: Some(provider_id),
        ready: "True",
        taints: Vec::new(),
        ..NodeSpec::for_machine(&m)
    };
    let live = ready(m.provider_id());
    // A well-formed id no instance of the region has.
    let gone = ready(format!("aws:///{}/i-0deaddeaddeaddead", m.az));
    let _cleanup = s.delete_on_drop(&[live.name.as_str(), gone.name.as_str()]);
    let label = unique("witness");
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin.clone());
    for spec in [&live, &gone] {
        create_node(&admin, spec).await?;
        let labelled =
            serde_json::json!({"metadata": {"labels": {"node-fencer.io/witness-test": label}}});
        nodes
            .patch(
                &spec.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&labelled),
            )
            .await?;
    }
    let proxy = FaultProxy::to_http(s.var("AWS_ENDPOINT_URL")).await?;
    let selector = format!("node-fencer.io/witness-test={label}");
    let env = [
        ("NODE_SELECTOR", selector.as_str()),
        ("AWS_ENDPOINT_URL", proxy.url.as_str()),
    ];
    let (live_n, gone_n) = (live.name.clone(), gone.name.clone());
    let pair = |node: &str, reason: &str| (node.to_owned(), reason.to_owned());

    let (code, report) = sweep_beside(s, &env).await?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["witness"]["machines"], 2, "{report:#}");
    assert_eq!(
        witness_failing(&report),
        [pair(&gone_n, "not_found")],
        "{report:#}"
    );
    assert_eq!(witness_changes(&report), 1, "{report:#}");
    assert_eq!(
        count_node_events(&admin, &gone_n, "WitnessFailing").await?,
        1
    );
    assert_eq!(
        count_node_events(&admin, &live_n, "WitnessFailing").await?,
        0
    );

    // The role loses ec2:DetachVolume: every fencing on EC2 would fail.
    proxy.deny_ec2_dry_run("DetachVolume");
    for round in 0..2 {
        let (code, report) = sweep_beside(s, &env).await?;
        assert_eq!(code, 0, "{report:#}");
        let mut want = vec![pair(&gone_n, "not_found"), pair(&live_n, "forbidden")];
        want.sort();
        assert_eq!(witness_failing(&report), want, "{report:#}");
        let changes = if round == 0 { 1 } else { 0 };
        assert_eq!(
            witness_changes(&report),
            changes,
            "round {round}: {report:#}"
        );
        let failing = report["witness"]["failing"].to_string();
        assert!(failing.contains("ec2:DetachVolume"), "{failing}");
        assert!(failing.contains("aws_actions"), "the fix: {failing}");
    }
    assert_eq!(
        count_node_events(&admin, &live_n, "WitnessFailing").await?,
        1,
        "told once"
    );
    assert_eq!(
        count_node_events(&admin, &gone_n, "WitnessFailing").await?,
        1,
        "told once"
    );
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(admin.clone(), "kube-system");
    let record = leases.get("node-fencer-witness").await?;
    let kept = record
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("node-fencer.io/witness-failing")
        .unwrap_or_default();
    // Small, it stays JSON a person can read: the failing Nodes under their
    // reason.
    let kept: Value = serde_json::from_str(&kept)?;
    assert_eq!(
        kept,
        serde_json::json!({"forbidden": [live_n], "not_found": [gone_n]}),
        "{kept}"
    );

    // Mended: told once, and the Node untouched all along.
    proxy.heal();
    let (code, report) = sweep_beside(s, &env).await?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        witness_failing(&report),
        [pair(&gone_n, "not_found")],
        "{report:#}"
    );
    assert_eq!(witness_changes(&report), 1, "{report:#}");
    assert_eq!(
        count_node_events(&admin, &live_n, "WitnessRestored").await?,
        1
    );
    let node = get_node(&admin, &live_n).await?;
    // Kubernetes' own not-ready taint may come (the Node's heartbeat is
    // old); node-fencer's never does.
    let taints = taints(&node);
    assert!(!taints.contains(&OUT_OF_SERVICE.into()), "{taints:?}");
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.keys().any(|k| k.starts_with("node-fencer.io/")),
        "{annotations:?}"
    );
    assert_eq!(machine_state(&ec2, &m).await?, "running");
    Ok(())
}
