//! On-premises machines for the tests: a Redfish BMC no one here wrote,
//! sushy-tools' emulator with its fake systems driver, started by
//! `tests/redfish/bmc.py` (TLS with a CA of its own, HTTP basic auth), and
//! the inventory and credentials node-fencer reads to reach it.
//!
//! The emulator applies a power change one to eleven seconds after the
//! reset is taken, as a real BMC takes its time: a test that needs a
//! machine off waits for the BMC to say so.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::scene::wait_until;

/// The label the tests' inventories find a Node's machine by.
pub const NODE_LABEL: &str = "node-restriction.kubernetes.io/bmc";
/// The credentials' name in the tests' inventories.
pub const CREDENTIALS: &str = "lab";

/// One System of the emulator.
#[derive(Clone, Debug)]
pub struct SystemSpec {
    /// Its name in the emulator, also the machine's name in the inventory.
    pub name: String,
    /// Its SMBIOS UUID.
    pub uuid: String,
    /// Powered on at start.
    pub on: bool,
}

impl SystemSpec {
    /// A System named `name`, powered `on`, with a fresh UUID.
    pub fn new(name: &str, on: bool) -> Self {
        Self {
            name: name.to_owned(),
            uuid: uuid::Uuid::new_v4().to_string(),
            on,
        }
    }
}

/// A running emulator; it stops when dropped.
pub struct Bmc {
    child: Child,
    /// `https://127.0.0.1:PORT` (`http://` for a plain one).
    pub url: String,
    /// The CA its certificate chains to.
    pub ca: PathBuf,
    /// Its user and password.
    pub user: String,
    password: String,
    /// Each System's path, by name.
    pub systems: BTreeMap<String, String>,
    /// Its state directory; its log is `bmc.log` there.
    pub dir: PathBuf,
    http: reqwest::Client,
}

impl Drop for Bmc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bmc {
    /// Starts an emulator in `dir` serving `systems`, over TLS unless
    /// `plain` (for a fault proxy in front of it, which speaks HTTP).
    pub async fn start(dir: &Path, systems: &[SystemSpec], plain: bool) -> anyhow::Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let venv = std::env::var("NODE_FENCER_REDFISH_VENV").context(
            "NODE_FENCER_REDFISH_VENV is not set: run `make setup` (tests/stack/setup.sh) and source its env.sh",
        )?;
        std::fs::create_dir_all(dir)?;
        let spec: Vec<Value> = systems
            .iter()
            .map(|s| json!({"name": s.name, "uuid": s.uuid, "power_state": if s.on {"On"} else {"Off"}}))
            .collect();
        let systems_file = dir.join("systems.json");
        std::fs::write(&systems_file, serde_json::to_vec(&spec)?)?;
        let log = std::fs::File::create(dir.join("bmc.log"))?;
        let mut cmd = Command::new(Path::new(&venv).join("bin").join("python"));
        cmd.arg(crate::repo_root().join("tests/redfish/bmc.py"))
            .arg("--dir")
            .arg(dir)
            .arg("--systems")
            .arg(&systems_file)
            .stdout(Stdio::piped())
            .stderr(log);
        if plain {
            cmd.arg("--http");
        }
        let mut child = cmd.spawn().context("starting tests/redfish/bmc.py")?;
        let stdout = child.stdout.take().context("the launcher's stdout")?;
        // The launcher prints one line once the emulator answers.
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        let line = match tokio::time::timeout(Duration::from_secs(60), line).await {
            Ok(Ok(Ok(line))) if !line.trim().is_empty() => line,
            _ => {
                let _ = child.kill();
                bail!(
                    "the Redfish emulator did not start; its log: {}",
                    std::fs::read_to_string(dir.join("bmc.log")).unwrap_or_default()
                );
            }
        };
        let ready: Value = serde_json::from_str(&line).context("the launcher's line")?;
        let text = |k: &str| -> anyhow::Result<String> {
            ready[k]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("`{k}` in the launcher's line {line}"))
        };
        let ca = PathBuf::from(text("ca")?);
        let pem = std::fs::read(&ca)?;
        let http = reqwest::Client::builder()
            .tls_certs_only(reqwest::Certificate::from_pem_bundle(&pem)?)
            .timeout(Duration::from_secs(30))
            .build()?;
        let systems = ready["systems"]
            .as_object()
            .context("`systems` in the launcher's line")?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        Ok(Self {
            child,
            url: text("url")?,
            ca,
            user: text("user")?,
            password: text("password")?,
            systems,
            dir: dir.to_path_buf(),
            http,
        })
    }

    /// The path of the System `name`.
    pub fn system(&self, name: &str) -> anyhow::Result<&str> {
        self.systems
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("no System {name} on the emulator"))
    }

    /// The System `name` as the BMC describes it.
    pub async fn describe(&self, name: &str) -> anyhow::Result<Value> {
        let url = format!("{}{}", self.url, self.system(name)?);
        let response = self
            .http
            .get(&url)
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await?
            .error_for_status()?;
        Ok(serde_json::from_slice(&response.bytes().await?)?)
    }

    /// The System's `PowerState`.
    pub async fn power(&self, name: &str) -> anyhow::Result<String> {
        let system = self.describe(name).await?;
        Ok(system["PowerState"].as_str().unwrap_or_default().to_owned())
    }

    /// Sends a `ComputerSystem.Reset` of `kind` (`ForceOff`, `On`) to the
    /// System: the power cut of a scenario, or its repair.
    pub async fn reset(&self, name: &str, kind: &str) -> anyhow::Result<()> {
        let url = format!(
            "{}{}/Actions/ComputerSystem.Reset",
            self.url,
            self.system(name)?
        );
        self.http
            .post(&url)
            .basic_auth(&self.user, Some(&self.password))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(json!({"ResetType": kind}).to_string())
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Waits until the System reports `state` (the emulator applies a
    /// change within 11 s).
    pub async fn wait_power(&self, name: &str, state: &str) -> anyhow::Result<()> {
        wait_until(
            &format!("{name} to be {state}"),
            Duration::from_secs(30),
            || async { Ok((self.power(name).await? == state).then_some(())) },
        )
        .await
    }

    /// The resets the emulator was sent, from its access log (the lines of
    /// POSTs to a System's reset action), for the System `name`.
    pub fn resets_of(&self, name: &str) -> anyhow::Result<usize> {
        let path = format!("{}/Actions/ComputerSystem.Reset", self.system(name)?);
        let log = std::fs::read_to_string(self.dir.join("bmc.log"))?;
        Ok(log
            .lines()
            .filter(|l| l.contains("POST ") && l.contains(&path))
            .count())
    }

    /// How many times the System `name` was read, from the access log: what
    /// makes a count of resets of zero mean something.
    pub fn reads_of(&self, name: &str) -> anyhow::Result<usize> {
        let path = format!("GET {} ", self.system(name)?);
        let log = std::fs::read_to_string(self.dir.join("bmc.log"))?;
        Ok(log.lines().filter(|l| l.contains(&path)).count())
    }

    /// Writes the credentials directory (`DIR/lab/username`, `password`),
    /// as a Secret mounted as a volume lays it out; returns its path.
    pub fn credentials_dir(&self, password: Option<&str>) -> anyhow::Result<PathBuf> {
        let dir = self.dir.join("credentials");
        self.credentials_in(&dir, CREDENTIALS, password)?;
        Ok(dir)
    }

    /// Writes this BMC's user and `password` (its own when `None`) as the
    /// credentials `name` of the directory `dir`.
    pub fn credentials_in(
        &self,
        dir: &Path,
        name: &str,
        password: Option<&str>,
    ) -> anyhow::Result<()> {
        let at = dir.join(name);
        std::fs::create_dir_all(&at)?;
        std::fs::write(at.join("username"), format!("{}\n", self.user))?;
        std::fs::write(
            at.join("password"),
            format!("{}\n", password.unwrap_or(&self.password)),
        )?;
        Ok(())
    }
}

/// An inventory of machines on BMCs, as node-fencer reads it.
#[derive(Default)]
pub struct Inventory {
    machines: Vec<Value>,
}

impl Inventory {
    /// The machine `system` of `bmc`, reached at `endpoint` (the BMC's own
    /// URL, or a proxy's in front of it), backing the Node `node` (or, when
    /// `None`, the Node labelled [`NODE_LABEL`] with the System's name).
    pub fn machine(
        self,
        bmc: &Bmc,
        system: &str,
        endpoint: &str,
        node: Option<&str>,
    ) -> anyhow::Result<Self> {
        self.machine_with(bmc, system, (endpoint, CREDENTIALS), node)
    }

    /// [`Self::machine`], its BMC's credentials the ones named `credentials`.
    pub fn machine_with(
        mut self,
        bmc: &Bmc,
        system: &str,
        (endpoint, credentials): (&str, &str),
        node: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut machine = json!({
            "name": system,
            "endpoint": endpoint,
            "system": bmc.system(system)?,
            "credentials": credentials,
            "caBundle": bmc.ca,
        });
        if let Some(node) = node {
            machine["node"] = json!(node);
        }
        self.machines.push(machine);
        Ok(self)
    }

    /// Writes it to `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let doc = json!({"nodeLabel": NODE_LABEL, "machines": self.machines});
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)?;
        Ok(())
    }
}

/// `node-fencer serve` as it runs off-cluster: Alertmanager's route, the
/// inventory; it stops when dropped.
pub struct Serve {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its log (JSON lines).
    pub log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `binary serve` on the stack with the function's environment,
    /// `SERVE_ROUTES=alertmanager`, and `env`; returns once it answers.
    pub async fn start(
        binary: &str,
        stack: &crate::Stack,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
            .local_addr()?
            .port();
        let file = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .args(["serve", "--port", &port.to_string()])
            .envs(crate::lambda::function_env(stack))
            .env("SERVE_ROUTES", "alertmanager")
            .envs(env.iter().copied())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        let serve = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let health = format!("{}/healthz", serve.url);
        let ok = wait_until("serve to answer", Duration::from_secs(30), || async {
            Ok(reqwest::get(&health).await.is_ok().then_some(()))
        })
        .await;
        ok.map_err(|e| anyhow::anyhow!("{e}; its log:\n{}", serve.logged()))?;
        Ok(serve)
    }

    /// Posts an Alertmanager webhook with the test token: the status and
    /// the answer.
    pub async fn alert(&self, body: &Value) -> anyhow::Result<(u16, Value)> {
        let response = reqwest::Client::new()
            .post(format!("{}/alertmanager", self.url))
            .bearer_auth(crate::lambda::WEBHOOK_TOKEN)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .timeout(Duration::from_secs(180))
            .send()
            .await?;
        let status = response.status().as_u16();
        let body = response.bytes().await?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// What it logged so far.
    pub fn logged(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
