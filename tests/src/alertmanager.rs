//! A real Alertmanager (built by `make setup`), configured from the shipped
//! example with the function's Function URL and a token file filled in, as a
//! user deploys it. Stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::repo_root;

/// Alertmanager's counter of webhook requests that failed, retries included.
pub const FAILED_REQUESTS: &str = "alertmanager_notification_requests_failed_total";

/// A running Alertmanager.
pub struct Alertmanager {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    dir: PathBuf,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn binary() -> anyhow::Result<String> {
    std::env::var("NODE_FENCER_ALERTMANAGER")
        .context("NODE_FENCER_ALERTMANAGER is not set: run `make setup` and source its env.sh")
}

impl Alertmanager {
    /// Starts Alertmanager with `infra/examples/alertmanager/alertmanager.yaml`,
    /// its webhook sent to `url` with the bearer token `token` read from a
    /// credentials file, as the example says.
    pub async fn start(url: &str, token: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "node-fencer-alertmanager-{}-{}",
            std::process::id(),
            crate::fixtures::unique("am")
        ));
        std::fs::create_dir_all(dir.join("data"))?;
        let token_file = dir.join("token");
        std::fs::write(&token_file, token)?;
        let example = std::fs::read_to_string(
            repo_root().join("infra/examples/alertmanager/alertmanager.yaml"),
        )?;
        let placeholder_url = "https://<url-id>.lambda-url.<region>.on.aws/";
        let placeholder_file = "/etc/alertmanager/secrets/node-fencer-webhook/token";
        if !example.contains(placeholder_url) || !example.contains(placeholder_file) {
            bail!(
                "the example no longer has the URL and token-file placeholders this harness fills in"
            );
        }
        let config = example
            .replace(placeholder_url, url)
            .replace(placeholder_file, &token_file.display().to_string());
        let config_file = dir.join("alertmanager.yaml");
        std::fs::write(&config_file, config)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.join("alertmanager.log"))?;
        let child = Command::new(binary()?)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // A single instance: no gossip with peers.
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting alertmanager")?;
        let am = Self {
            url: format!("http://127.0.0.1:{port}"),
            child,
            dir,
        };
        crate::scene::wait_until("Alertmanager ready", Duration::from_secs(30), || async {
            Ok(curl(&["-fsS", &format!("{}/-/ready", am.url)]).ok())
        })
        .await
        .with_context(|| format!("see {}", am.dir.join("alertmanager.log").display()))?;
        Ok(am)
    }

    /// Posts alerts to Alertmanager's API, as Prometheus does.
    pub fn post_alerts(&self, alerts: &Value) -> anyhow::Result<()> {
        curl(&[
            "-fsS",
            "-H",
            "content-type: application/json",
            "--data-binary",
            &alerts.to_string(),
            &format!("{}/api/v2/alerts", self.url),
        ])
        .map(|_| ())
    }

    /// Waits until Alertmanager has counted a failed webhook request (any
    /// answer but 2xx; it retries them).
    pub async fn wait_for_failed_request(&self, what: &str) -> anyhow::Result<()> {
        crate::scene::wait_until(what, Duration::from_secs(60), || async {
            Ok((self.webhook_counter(FAILED_REQUESTS)? >= 1.0).then_some(()))
        })
        .await
    }

    /// The sum of a counter of Alertmanager's own metrics over the series
    /// whose labels include `integration="webhook"`.
    pub fn webhook_counter(&self, name: &str) -> anyhow::Result<f64> {
        let text = curl(&["-fsS", &format!("{}/metrics", self.url)])?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l.contains("integration=\"webhook\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

fn curl(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("curl")
        .args(["--max-time", "10"])
        .args(args)
        .output()
        .context("running curl")?;
    if !out.status.success() {
        bail!(
            "curl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
