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
