//! On-premises machines through their BMCs, against a Redfish service no
//! one here wrote (sushy-tools' emulator, fake systems driver, over TLS
//! with its own CA and basic auth): only a System the BMC reports `Off`,
//! and whose UUID is the one the Node's kubelet read, is taken for the
//! Node's machine off; a BMC that times out or answers 401 or 500 changes
//! nothing and leaves the work to a retry; active fencing forces a System
//! off through `ComputerSystem.Reset` behind the same guards as on EC2.
//! The command line runs the decisions here (`serve` runs the seed
//! scenario in `scenario.rs`, and the sweep below).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use node_fencer_tests::faults::{Fault, FaultProxy, Match};
use node_fencer_tests::fixtures::{
    NodeSpec, create_node, get_node, node_events, set_ready, taints, unique,
};
use node_fencer_tests::lambda::function_env;
use node_fencer_tests::redfish::{Bmc, Inventory, NODE_LABEL, Serve, SystemSpec};
use node_fencer_tests::scene::wait_until;
use node_fencer_tests::{NodeCleanup, Stack, serial, stack};
use serde_json::{Value, json};

const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service:NoExecute";

/// A NotReady Node (silent since long ago) whose kubelet read `uuid`, with
/// no provider id, labelled with `machine` for the inventory's label.
pub(crate) async fn bmc_node(
    s: &Stack,
    machine: &str,
    uuid: &str,
) -> anyhow::Result<(String, NodeCleanup)> {
    let admin = s.admin().await?;
    let mut spec = NodeSpec::for_machine(&node_fencer_tests::fixtures::Machine::of_system(machine));
    spec.provider_id = None;
    create_node(&admin, &spec).await?;
    let cleanup = s.delete_on_drop(&[&spec.name]);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin);
    let params = kube::api::PatchParams::default();
    nodes
        .patch(
            &spec.name,
            &params,
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {NODE_LABEL: machine}}})),
        )
        .await?;
    nodes
        .patch_status(
            &spec.name,
            &params,
            &kube::api::Patch::Merge(json!({"status": {"nodeInfo": {"systemUUID": uuid}}})),
        )
        .await?;
    Ok((spec.name, cleanup))
}

/// Where a test's BMC keeps its state.
pub(crate) fn bmc_dir(s: &Stack) -> PathBuf {
    s.dir.join(unique("bmc"))
}

/// Runs `node-fencer ARGS` with the inventory and credentials given, and
/// active fencing's settings (`ACTIVE_FENCING` itself as `active`); the
/// exit status and the JSON report.
fn cli(
    s: &Stack,
    inventory: &std::path::Path,
    credentials: &std::path::Path,
    active: bool,
    args: &[&str],
) -> anyhow::Result<(i32, Value)> {
    cli_with(s, (inventory, credentials), active, args, &[])
}

/// [`cli`] with more of the environment set.
fn cli_with(
    s: &Stack,
    (inventory, credentials): (&std::path::Path, &std::path::Path),
    active: bool,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<(i32, Value)> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node-fencer-full"));
    cmd.args(["--output", "json"])
        .args(args)
        .envs(function_env(s))
        .envs(env.iter().copied())
        .env("REDFISH_INVENTORY", inventory)
        .env("REDFISH_CREDENTIALS_DIR", credentials)
        .env("LOG_FORMAT", "text");
    if active {
        cmd.env("ACTIVE_FENCING", "on")
            .env("POWER_OFF_AFTER_SECONDS", "60")
            .env("POWER_OFF_WAIT_SECONDS", "30")
            // The bare stack's other tests leave NotReady Nodes about.
            .env("PARTITION_PERCENT", "100");
    }
    let out = cmd.output()?;
    // Shown with a failing test's output: what the run logged.
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    anyhow::ensure!(
        report != Value::Null,
        "no report: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code().unwrap_or(-1), report))
}

pub(crate) async fn is_tainted(s: &Stack, node: &str) -> anyhow::Result<bool> {
    Ok(taints(&get_node(&s.admin().await?, node).await?).contains(&OUT_OF_SERVICE.to_owned()))
}

/// A System its BMC reports `Off`, the Node's by name or by label, is
/// fenced; one it reports `On` is not, and nothing is sent to the BMC but
/// reads, whatever the Node says.
#[tokio::test]
async fn only_a_system_its_bmc_reports_off_is_fenced() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (off, on) = (
        SystemSpec::new("rack1-off", false),
        SystemSpec::new("rack1-on", true),
    );
    let bmc = Bmc::start(&bmc_dir(s), &[off.clone(), on.clone()], false).await?;
    let (off_node, _c1) = bmc_node(s, &off.name, &off.uuid).await?;
    let (on_node, _c2) = bmc_node(s, &on.name, &on.uuid).await?;
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc, &off.name, &bmc.url, Some(&off_node))?
        .machine(&bmc, &on.name, &bmc.url, None)?
        .write(&inventory)?;
    let credentials = bmc.credentials_dir(None)?;

    let (code, report) = cli(s, &inventory, &credentials, false, &["fence", &off_node])?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert_eq!(
        report["results"][0]["instance_id"],
        format!("redfish://{}", off.name),
        "{report:#}"
    );
    assert!(is_tainted(s, &off_node).await?);

    let (_, report) = cli(s, &inventory, &credentials, false, &["fence", &on_node])?;
    assert_ne!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert!(!is_tainted(s, &on_node).await?);
    assert!(bmc.reads_of(&on.name)? > 0, "the BMC was asked");
    assert_eq!(bmc.resets_of(&on.name)? + bmc.resets_of(&off.name)?, 0);
    assert_eq!(bmc.power(&on.name).await?, "On");
    Ok(())
}

/// A System on behind a NotReady Node is powered off only with active
/// fencing on and once the Node has been NotReady for
/// `POWER_OFF_AFTER_SECONDS`: then `ForceOff`, the wait for the BMC to
/// report it `Off`, and the fencing.
#[tokio::test]
async fn a_hung_node_is_forced_off_only_with_active_fencing_after_the_wait() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let hung = SystemSpec::new("rack1-hung", true);
    let bmc = Bmc::start(&bmc_dir(s), std::slice::from_ref(&hung), false).await?;
    let (node, _c) = bmc_node(s, &hung.name, &hung.uuid).await?;
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc, &hung.name, &bmc.url, None)?
        .write(&inventory)?;
    let credentials = bmc.credentials_dir(None)?;

    let (_, report) = cli(
        s,
        &inventory,
        &credentials,
        false,
        &["fence", "--power-off", &node],
    )?;
    assert_ne!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert_eq!(
        bmc.resets_of(&hung.name)?,
        0,
        "no power-off without active fencing"
    );

    // NotReady from now on: not long enough.
    set_ready(&s.admin().await?, &node, "Unknown").await?;
    let (_, report) = cli(
        s,
        &inventory,
        &credentials,
        true,
        &["fence", "--power-off", &node],
    )?;
    assert_ne!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert_eq!(
        bmc.resets_of(&hung.name)?,
        0,
        "no power-off before the wait: {report:#}"
    );

    // NotReady since long ago: forced off, then fenced.
    bmc_node_silent_since_long(s, &node).await?;
    let (code, report) = cli(
        s,
        &inventory,
        &credentials,
        true,
        &["fence", "--power-off", &node],
    )?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert_eq!(bmc.resets_of(&hung.name)?, 1, "{report:#}");
    assert_eq!(bmc.power(&hung.name).await?, "Off");
    assert!(is_tainted(s, &node).await?);
    Ok(())
}

/// The Node's Ready condition, silent since a time long past.
async fn bmc_node_silent_since_long(s: &Stack, node: &str) -> anyhow::Result<()> {
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "Test",
        "lastHeartbeatTime": "2026-11-22T10:00:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z"}]}});
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(s.admin().await?)
        .patch_status(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&patch),
        )
        .await?;
    Ok(())
}

/// A BMC that answers 500, that does not answer in time, or that refuses
/// the credentials (401) changes nothing: the run reports the failed look
/// and exits 1 for a retry, which fences once the BMC answers.
#[tokio::test]
async fn a_bmc_that_fails_changes_nothing_and_is_retried() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let off = SystemSpec::new("rack1-flaky", false);
    let bmc = Bmc::start(&bmc_dir(s), std::slice::from_ref(&off), true).await?;
    let proxy = FaultProxy::to_http(&bmc.url).await?;
    let (node, _c) = bmc_node(s, &off.name, &off.uuid).await?;
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc, &off.name, &proxy.url, Some(&node))?
        .write(&inventory)?;
    let right = bmc.credentials_dir(None)?;

    let error = Fault::Respond {
        status: 500,
        content_type: "application/json",
        body: json!({"error": {"code": "Base.1.8.GeneralError", "message": "injected"}})
            .to_string(),
    };
    for (fault, code) in [
        (error, "ServerError"),
        (Fault::Delay(Duration::from_secs(12)), "Timeout"),
    ] {
        proxy.inject(Match::any(), fault, 100);
        let (exit, report) = cli(s, &inventory, &right, false, &["fence", &node])?;
        proxy.heal();
        assert_eq!(exit, 1, "left for a retry: {report:#}");
        assert_ne!(report["results"][0]["outcome"], "fenced", "{report:#}");
        let reason = report["results"][0]["reason"].to_string();
        assert!(reason.contains("Redfish"), "{code}: {report:#}");
        assert!(!is_tainted(s, &node).await?);
    }
    // The BMC itself from here on, no proxy between.
    Inventory::default()
        .machine(&bmc, &off.name, &bmc.url, Some(&node))?
        .write(&inventory)?;
    let wrong = bmc.credentials_dir(Some("not-the-password"))?;
    let (exit, report) = cli(s, &inventory, &wrong, false, &["fence", &node])?;
    assert_eq!(exit, 1, "{report:#}");
    assert!(report.to_string().contains("401"), "{report:#}");
    assert!(
        !report.to_string().contains("not-the-password"),
        "the password is never written out"
    );
    assert!(!is_tainted(s, &node).await?);

    // The retry, the BMC answering again.
    let right = bmc.credentials_dir(None)?;
    let (exit, report) = cli(s, &inventory, &right, false, &["fence", &node])?;
    assert_eq!(exit, 0, "{report:#}");
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    Ok(())
}

/// A System whose UUID is not the one the Node's kubelet read (a board
/// swapped, an inventory entry pointing at the wrong BMC) is never the
/// Node's machine: off, it is not fenced; on, it is not forced off.
#[tokio::test]
async fn a_system_of_another_identity_is_never_acted_on() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (off, on) = (
        SystemSpec::new("rack2-off", false),
        SystemSpec::new("rack2-on", true),
    );
    let bmc = Bmc::start(&bmc_dir(s), &[off.clone(), on.clone()], false).await?;
    let other = uuid::Uuid::new_v4().to_string();
    let (off_node, _c1) = bmc_node(s, &off.name, &other).await?;
    let (on_node, _c2) = bmc_node(s, &on.name, &other).await?;
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc, &off.name, &bmc.url, None)?
        .machine(&bmc, &on.name, &bmc.url, None)?
        .write(&inventory)?;
    let credentials = bmc.credentials_dir(None)?;
    for node in [&off_node, &on_node] {
        let (_, report) = cli(
            s,
            &inventory,
            &credentials,
            true,
            &["fence", "--power-off", node],
        )?;
        assert_ne!(report["results"][0]["outcome"], "fenced", "{report:#}");
        assert_eq!(
            report["results"][0]["skip"]["reason"], "instance_not_found",
            "{report:#}"
        );
        assert!(!is_tainted(s, node).await?);
    }
    assert!(bmc.reads_of(&on.name)? > 0);
    assert_eq!(bmc.resets_of(&on.name)?, 0);
    assert_eq!(bmc.power(&on.name).await?, "On");
    Ok(())
}

/// Issue 45, item 3: a host whose environment names a proxy (here one
/// that refuses every connection) still reaches its BMCs directly: a BMC's
/// Basic credentials never go to a proxy. The BMC is a loopback tunnel's
/// plain `http://localhost`, which `HTTP_PROXY` covers and `NO_PROXY`
/// (the stack's 127.0.0.1, for the other clients) does not.
#[tokio::test]
async fn a_bmc_is_never_reached_through_a_proxy() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let off = SystemSpec::new("rack5-off", false);
    let bmc = Bmc::start(&bmc_dir(s), std::slice::from_ref(&off), true).await?;
    let (node, _c) = bmc_node(s, &off.name, &off.uuid).await?;
    let inventory = bmc.dir.join("inventory.json");
    let by_name = bmc.url.replace("127.0.0.1", "localhost");
    anyhow::ensure!(by_name.starts_with("http://localhost:"), "{by_name}");
    Inventory::default()
        .machine(&bmc, &off.name, &by_name, Some(&node))?
        .write(&inventory)?;
    let credentials = bmc.credentials_dir(None)?;
    let dead = "http://127.0.0.1:9";
    let (code, report) = cli_with(
        s,
        (&inventory, &credentials),
        false,
        &["fence", &node],
        &[
            ("HTTP_PROXY", dead),
            ("http_proxy", dead),
            ("NO_PROXY", "127.0.0.1"),
            ("no_proxy", "127.0.0.1"),
        ],
    )?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert!(bmc.reads_of(&off.name)? > 0, "the BMC itself was asked");
    Ok(())
}

/// Issue 45, item 2: two boards with one UUID (cloned firmware), each behind
/// its own BMC. The Node runs on the one that is on, but the inventory
/// (two entries swapped) maps it to the one that is off. The UUID matches,
/// and is no identity: another System of the inventory serves it too. Not
/// fenced, and a Warning says why. With the other board out of the
/// inventory, the same System ties the Node to it again.
#[tokio::test]
async fn a_uuid_two_systems_serve_ties_a_node_to_neither() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let shared = uuid::Uuid::new_v4().to_string();
    let off = SystemSpec {
        uuid: shared.clone(),
        ..SystemSpec::new("rack4-off", false)
    };
    let on = SystemSpec {
        uuid: shared.clone(),
        ..SystemSpec::new("rack4-on", true)
    };
    let bmc_off = Bmc::start(&bmc_dir(s), std::slice::from_ref(&off), false).await?;
    let bmc_on = Bmc::start(&bmc_dir(s), std::slice::from_ref(&on), false).await?;
    let (node, _c) = bmc_node(s, &off.name, &shared).await?;
    let inventory = bmc_off.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc_off, &off.name, &bmc_off.url, None)?
        .machine(&bmc_on, &on.name, &bmc_on.url, None)?
        .write(&inventory)?;
    let credentials = bmc_off.credentials_dir(None)?;

    let (code, report) = cli(s, &inventory, &credentials, false, &["fence", &node])?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        report["results"][0]["skip"]["reason"], "instance_not_found",
        "{report:#}"
    );
    assert!(!is_tainted(s, &node).await?);
    assert!(bmc_on.reads_of(&on.name)? > 0, "the other System was read");
    let events = node_events(&s.admin().await?, &node).await?;
    let unidentified: Vec<&String> = events
        .iter()
        .filter(|(reason, _)| reason == "UnidentifiedMachine")
        .map(|(_, note)| note)
        .collect();
    assert_eq!(unidentified.len(), 1, "{events:?}");
    assert!(
        unidentified[0].contains("another System"),
        "{unidentified:?}"
    );
    // Preflight fails that BMC, for the same reason.
    let (_, preflight) = cli(s, &inventory, &credentials, false, &["preflight"])?;
    let row = preflight["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["check"] == json!(format!("BMC redfish://{}", off.name)))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(row["status"], "fail", "{preflight:#}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("another System"),
        "{row:#}"
    );

    Inventory::default()
        .machine(&bmc_off, &off.name, &bmc_off.url, None)?
        .write(&inventory)?;
    let (code, report) = cli(s, &inventory, &credentials, false, &["fence", &node])?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["results"][0]["outcome"], "fenced", "{report:#}");
    assert_eq!(bmc_on.power(&on.name).await?, "On");
    Ok(())
}

/// Issue 58, item 2: one BMC of the inventory dark from the start (a closed
/// port) and one refusing the credentials. Neither is a veto over the
/// other machines: each Node whose System is `Off` with a UUID of its own
/// is fenced, by one process and then by another (a restart between), and
/// preflight fails the two BMCs that cannot serve their own machines. Before
/// the fix, every such Node was refused `instance_not_found`. The sweep of
/// the command line ends with the witness round over the BMCs, as every
/// sweep does: each of the two gets its own `WitnessFailing` Warning, told
/// once over two sweeps (kept in the witness Lease across processes).
#[tokio::test]
async fn a_dark_bmc_holds_back_only_its_own_machine() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let (first, second) = (
        SystemSpec::new("rack5-first", false),
        SystemSpec::new("rack5-second", false),
    );
    let (dark, refusing) = (
        SystemSpec::new("rack5-dark", true),
        SystemSpec::new("rack5-refusing", true),
    );
    let bmc = Bmc::start(&bmc_dir(s), &[first.clone(), second.clone()], false).await?;
    let bmc_dark = Bmc::start(&bmc_dir(s), std::slice::from_ref(&dark), false).await?;
    let bmc_refusing = Bmc::start(&bmc_dir(s), std::slice::from_ref(&refusing), false).await?;
    // A port nothing listens on: the dark BMC's.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let (node_1, _c1) = bmc_node(s, &first.name, &first.uuid).await?;
    let (node_2, _c2) = bmc_node(s, &second.name, &second.uuid).await?;
    // The Nodes of the two machines whose BMCs cannot answer.
    let (node_3, _c3) = bmc_node(s, &dark.name, &dark.uuid).await?;
    let (node_4, _c4) = bmc_node(s, &refusing.name, &refusing.uuid).await?;
    let credentials = bmc.credentials_dir(None)?;
    bmc_refusing.credentials_in(&credentials, "refusing", Some("a-password-it-refuses"))?;
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc, &first.name, &bmc.url, None)?
        .machine(&bmc, &second.name, &bmc.url, None)?
        .machine(
            &bmc_dark,
            &dark.name,
            &format!("https://127.0.0.1:{closed}"),
            None,
        )?
        .machine_with(
            &bmc_refusing,
            &refusing.name,
            (&bmc_refusing.url, "refusing"),
            None,
        )?
        .write(&inventory)?;
    drop(bmc_dark);

    for node in [&node_1, &node_2] {
        let (code, report) = cli(s, &inventory, &credentials, false, &["fence", node])?;
        assert_eq!(code, 0, "{node}: {report:#}");
        assert_eq!(
            report["results"][0]["outcome"], "fenced",
            "{node}: {report:#}"
        );
        assert!(is_tainted(s, node).await?, "{node}");
    }

    let (_, preflight) = cli(s, &inventory, &credentials, false, &["preflight"])?;
    let status = |machine: &str| {
        preflight["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["check"] == json!(format!("BMC redfish://{machine}")))
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(status(&dark.name), "fail", "{preflight:#}");
    assert_eq!(status(&refusing.name), "fail", "{preflight:#}");
    // Only the failing BMCs have a row of their own; the others answered.
    assert_eq!(status(&first.name), Value::Null, "{preflight:#}");
    assert!(
        preflight.to_string().contains("2 of 4 Node(s)"),
        "{preflight:#}"
    );

    // Only this test's Nodes: the bare stack's others leave Nodes about.
    let selector = format!(
        "{NODE_LABEL} in ({},{},{},{})",
        first.name, second.name, dark.name, refusing.name
    );
    let env = [("NODE_SELECTOR", selector.as_str())];
    let sweep = || cli_with(s, (&inventory, &credentials), false, &["sweep"], &env);
    let (_, first_sweep) = sweep()?;
    let (_, second_sweep) = sweep()?;
    let failing = |report: &Value| -> Vec<(String, String)> {
        report["witness"]["failing"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| (f["node"].to_string(), f["reason"].to_string()))
            .collect()
    };
    let expected = vec![
        (json!(node_3).to_string(), json!("unreachable").to_string()),
        (json!(node_4).to_string(), json!("unauthorized").to_string()),
    ];
    let mut seen = failing(&first_sweep);
    seen.sort();
    assert_eq!(seen, expected, "{first_sweep:#}");
    assert_eq!(
        first_sweep["witness"]["changes"].as_array().map(Vec::len),
        Some(2),
        "{first_sweep:#}"
    );
    assert_eq!(
        second_sweep["witness"]["changes"],
        json!([]),
        "told once: {second_sweep:#}"
    );
    let admin = s.admin().await?;
    for (node, reason) in [(&node_3, "unreachable"), (&node_4, "unauthorized")] {
        let events = node_events(&admin, node).await?;
        let warned: Vec<_> = events
            .iter()
            .filter(|(r, _)| r == "WitnessFailing")
            .collect();
        assert_eq!(warned.len(), 1, "{node}: {events:?}");
        assert!(warned[0].1.contains(reason), "{node}: {warned:?}");
    }
    for node in [&node_1, &node_2] {
        let events = node_events(&admin, node).await?;
        assert!(
            !events.iter().any(|(r, _)| r == "WitnessFailing"),
            "{node}: {events:?}"
        );
    }
    Ok(())
}

/// `serve` off-cluster sweeps on its own schedule: a NotReady Node whose
/// BMC reports its System off is fenced with no request made, and the
/// fencing ends once the machine runs and the Node is Ready again.
#[tokio::test]
async fn serve_sweeps_on_its_own_schedule() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let off = SystemSpec::new("rack3-off", false);
    let bmc = Bmc::start(&bmc_dir(s), std::slice::from_ref(&off), false).await?;
    let (node, _c) = bmc_node(s, &off.name, &off.uuid).await?;
    let serve = sweeping_serve(s, &bmc, &off.name, &[("RECOVERY_SETTLE_SECONDS", "0")]).await?;
    let fenced = wait_until(
        "the first sweep to fence",
        Duration::from_secs(30),
        || async { Ok(is_tainted(s, &node).await?.then_some(())) },
    )
    .await;
    // Back: the machine on, the Node Ready; the next sweep ends the fencing.
    let recovered = async {
        bmc.reset(&off.name, "On").await?;
        bmc.wait_power(&off.name, "On").await?;
        set_ready(&s.admin().await?, &node, "True").await?;
        wait_until(
            "a later sweep to end the fencing",
            Duration::from_secs(75),
            || async { Ok((!is_tainted(s, &node).await?).then_some(())) },
        )
        .await
    };
    let recovered = match fenced {
        Ok(()) => recovered.await,
        Err(e) => Err(e),
    };
    let log = serve.logged();
    recovered.map_err(|e| anyhow::anyhow!("{e}; serve's log:\n{log}"))?;
    assert!(log.contains("sweep done"), "{log}");
    Ok(())
}

/// Issue 58, item 5: `serve` bounds each request by the caller's timeout
/// (`REQUEST_TIMEOUT_SECONDS`, which the Cloud Run module sets), as Lambda
/// does by its deadline. A Node still Ready on a System its BMC reports
/// off, under a 60 s `NOT_READY_WAIT_SECONDS`: the alert's request answers
/// before its 15 s are up, its work left for the redelivery, and nothing
/// is written. Before, the request waited the whole 60 s, long after its
/// caller had given up.
#[tokio::test]
async fn serve_ends_each_request_before_its_timeout() -> anyhow::Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(15);
    let _g = serial().await;
    let s = stack();
    let off = SystemSpec::new("rack5-off", false);
    let bmc = Bmc::start(&bmc_dir(s), std::slice::from_ref(&off), false).await?;
    let (node, _c) = bmc_node(s, &off.name, &off.uuid).await?;
    set_ready(&s.admin().await?, &node, "True").await?;
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(&bmc, &off.name, &bmc.url, None)?
        .write(&inventory)?;
    let credentials = bmc.credentials_dir(None)?;
    let selector = format!("{NODE_LABEL}={}", off.name);
    let timeout = TIMEOUT.as_secs().to_string();
    let serve = Serve::start(
        env!("CARGO_BIN_EXE_node-fencer-full"),
        s,
        bmc.dir.join("serve.log"),
        &[
            ("REDFISH_INVENTORY", path(&inventory)?),
            ("REDFISH_CREDENTIALS_DIR", path(&credentials)?),
            ("NODE_SELECTOR", selector.as_str()),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
            ("NOT_READY_WAIT_SECONDS", "60"),
            ("REQUEST_TIMEOUT_SECONDS", timeout.as_str()),
        ],
    )
    .await?;
    let sent = std::time::Instant::now();
    let (status, report) = serve
        .alert(&node_fencer_tests::scene::kube_node_not_ready(&[&node]))
        .await?;
    let took = sent.elapsed();
    let log = serve.logged();
    assert!(
        took < TIMEOUT,
        "answered after {took:?}, its caller gone at {TIMEOUT:?}; serve's log:\n{log}"
    );
    assert_eq!(status, 500, "left for the redelivery: {report:#}");
    assert_eq!(
        report["results"][0]["skip"]["reason"], "node_ready",
        "{report:#}"
    );
    assert!(!is_tainted(s, &node).await?, "nothing written");
    Ok(())
}

/// `serve` sweeping every 30 s on its own, with an inventory of `bmc`'s
/// System `machine` (backing the Node labelled for it) and `env` beside.
pub(crate) async fn sweeping_serve(
    s: &Stack,
    bmc: &Bmc,
    machine: &str,
    env: &[(&str, &str)],
) -> anyhow::Result<Serve> {
    let inventory = bmc.dir.join("inventory.json");
    Inventory::default()
        .machine(bmc, machine, &bmc.url, None)?
        .write(&inventory)?;
    let credentials = bmc.credentials_dir(None)?;
    let selector = format!("{NODE_LABEL}={machine}");
    let mut all = vec![
        ("REDFISH_INVENTORY", path(&inventory)?),
        ("REDFISH_CREDENTIALS_DIR", path(&credentials)?),
        ("SWEEP_INTERVAL_SECONDS", "30"),
        // The bare stack is shared: this sweep looks at this test's Node
        // alone, and asks no EC2 about the other tests' machines.
        ("NODE_SELECTOR", selector.as_str()),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
    ];
    all.extend_from_slice(env);
    Serve::start(
        env!("CARGO_BIN_EXE_node-fencer-full"),
        s,
        bmc.dir.join("serve.log"),
        &all,
    )
    .await
}

pub(crate) fn path(p: &std::path::Path) -> anyhow::Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", p.display()))
}
