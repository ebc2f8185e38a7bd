//! The witness of each Node's machine, looked at by `serve` on its sweep's
//! schedule before any node dies (issue 48), against sushy-tools' Redfish
//! emulator: a BMC whose password changed is reported within one round, as
//! a Warning Event on the Node and a metric, with nothing written to any
//! Node and no fencing; mended, it is told once more. `/metrics` is scraped
//! for real and checked by the real `promtool check metrics`.

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use node_fencer_tests::fixtures::{get_node, node_events, set_ready};
use node_fencer_tests::late_build;
use node_fencer_tests::redfish::{Bmc, SystemSpec};
use node_fencer_tests::scene::wait_until;
use node_fencer_tests::{serial, stack};

use crate::redfish::{bmc_dir, bmc_node, is_tainted, sweeping_serve};

/// A scrape of `/metrics` at `url`.
async fn scrape(url: &str) -> anyhow::Result<String> {
    let response = reqwest::get(url).await?;
    anyhow::ensure!(
        response.status().is_success(),
        "GET {url}: {}",
        response.status()
    );
    let kind = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    anyhow::ensure!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    Ok(response.text().await?)
}

/// The value of the sample `series` (name and labels, as exposed).
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

/// Waits until a scrape shows `series` at `value`; the last scrape.
async fn until_sample(
    url: &str,
    series: &str,
    value: &str,
    within: Duration,
) -> anyhow::Result<String> {
    wait_until(&format!("{series} {value}"), within, || async {
        let text = scrape(url).await?;
        Ok((sample(&text, series).as_deref() == Some(value)).then_some(text))
    })
    .await
}

/// `promtool check metrics` on `text`: its lint, as Prometheus' own
/// parser reads the exposition.
fn promtool_check_metrics(text: &str) -> anyhow::Result<()> {
    let promtool = late_build::checks_tool("NODE_FENCER_PROMTOOL")?;
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "promtool check metrics: {}\n{}{}\n--- the scrape:\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// What a witness round may never change: the Node's spec, labels and
/// annotations.
fn untouched(node: &Node) -> serde_json::Value {
    serde_json::json!({
        "spec": node.spec,
        "labels": node.metadata.labels,
        "annotations": node.metadata.annotations,
    })
}

#[tokio::test]
async fn a_bmc_whose_password_changed_is_reported_within_one_round() -> anyhow::Result<()> {
    // Built beside the tests by `make test`: waited for before taking the
    // stack's lock, which the other tests need meanwhile.
    late_build::checks_tool("NODE_FENCER_PROMTOOL")?;
    let _g = serial().await;
    let s = stack();
    let on = SystemSpec::new("rack4-witness", true);
    let bmc = Bmc::start(&bmc_dir(s), std::slice::from_ref(&on), false).await?;
    let (node, _c) = bmc_node(s, &on.name, &on.uuid).await?;
    let admin = s.admin().await?;
    set_ready(&admin, &node, "True").await?;
    let metrics_port = std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port()
        .to_string();
    let serve = sweeping_serve(s, &bmc, &on.name, &[("METRICS_PORT", &metrics_port)]).await?;
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let up = format!(
        "node_fencer_witness_up{{node=\"{node}\",machine=\"redfish://{}\"}}",
        on.name
    );
    let failing = format!(
        "node_fencer_witness_failing{{node=\"{node}\",machine=\"redfish://{}\",reason=\"unauthorized\"}}",
        on.name
    );
    let result = async {
        until_sample(&url, &up, "1", Duration::from_secs(20)).await?;
        let before = untouched(&get_node(&admin, &node).await?);

        // The password changed on the BMC's side: what the inventory's
        // credentials hold is refused from now on.
        bmc.credentials_dir(Some("a-password-the-bmc-refuses"))?;
        // One sweep interval (30 s) and the round's own time.
        let text = until_sample(&url, &failing, "1", Duration::from_secs(45)).await?;
        assert_eq!(sample(&text, &up).as_deref(), Some("0"), "{text}");
        let events = node_events(&admin, &node).await?;
        let warned: Vec<&(String, String)> = events
            .iter()
            .filter(|(r, _)| r == "WitnessFailing")
            .collect();
        anyhow::ensure!(warned.len() == 1, "one WitnessFailing Event: {events:?}");
        anyhow::ensure!(
            warned[0].1.contains("unauthorized") && warned[0].1.contains("REDFISH_CREDENTIALS_DIR"),
            "the Event names the reason and the fix: {:?}",
            warned[0]
        );
        promtool_check_metrics(&text)?;

        // Mended: served again, told once, and still nothing written.
        bmc.credentials_dir(None)?;
        until_sample(&url, &up, "1", Duration::from_secs(45)).await?;
        // The round sets the metric before it writes the Event.
        let restored =
            |events: &[(String, String)]| events.iter().any(|(r, _)| r == "WitnessRestored");
        let events = wait_until(
            "the WitnessRestored Event",
            Duration::from_secs(10),
            || async {
                let events = node_events(&admin, &node).await?;
                Ok(restored(&events).then_some(events))
            },
        )
        .await?;
        let count = |reason: &str| events.iter().filter(|(r, _)| r == reason).count();
        anyhow::ensure!(
            count("WitnessFailing") == 1 && count("WitnessRestored") == 1,
            "a failure and a restoration, each told once: {events:?}"
        );
        anyhow::ensure!(!is_tainted(s, &node).await?, "the witness never fences");
        let after = untouched(&get_node(&admin, &node).await?);
        anyhow::ensure!(before == after, "the Node changed: {before} -> {after}");
        anyhow::ensure!(bmc.resets_of(&on.name)? == 0, "no power change was sent");
        anyhow::Ok(())
    }
    .await;
    result.map_err(|e| anyhow::anyhow!("{e:#}; serve's log:\n{}", serve.logged()))
}
