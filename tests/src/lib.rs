//! The integration harness: brings up the real components (moto for EC2,
//! etcd + kube-apiserver for Kubernetes) once per test process through
//! `tests/stack/up.sh`, and gives tests clients and fixtures for them; the
//! controller stack adds the fake Compute Engine ([`gce`]).
//!
//! Set `NODE_FENCER_STACK_DIR` to reuse a stack started by hand; otherwise a
//! private one is started and torn down by a watchdog when the process exits.
//! A missing component is a loud failure, never a skip.

pub mod alertmanager;
pub mod attacher;
pub mod bench;
pub mod cluster;
pub mod faults;
pub mod fixtures;
pub mod gce;
pub mod http_stub;
pub mod kubelet;
pub mod lambda;
pub mod late_build;
pub mod package;
pub mod process;
pub mod recovery_timeline;
pub mod redfish;
pub mod rie;
pub mod runtime_api;
pub mod scene;
pub mod timing;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use node_fencer::shell::connect::{self, Timeouts};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A running stack: its directory and the variables `up.sh` wrote.
#[derive(Debug)]
pub struct Stack {
    /// The state directory.
    pub dir: PathBuf,
    /// The `export` lines of `STATE_DIR/env`.
    pub vars: BTreeMap<String, String>,
}

/// Timeouts of the harness's own clients: a moto holding hundreds of
/// instances can take seconds to answer, which is no fault under test.
const HARNESS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    attempt: Duration::from_secs(60),
    call: Duration::from_secs(180),
};

static STACK: OnceLock<Result<Stack, String>> = OnceLock::new();

/// The stack of this test process, started on first use.
///
/// # Panics
/// When the stack cannot be started: the message says what to install.
pub fn stack() -> &'static Stack {
    started(&STACK, start, "the test stack")
}

/// The stack in `cell`, started by `start` on first use; a failed start is
/// kept, so every test after it fails with the same message.
pub(crate) fn started(
    cell: &'static OnceLock<Result<Stack, String>>,
    start: fn() -> anyhow::Result<Stack>,
    what: &str,
) -> &'static Stack {
    match cell.get_or_init(|| start().map_err(|e| format!("{e:#}"))) {
        Ok(stack) => stack,
        Err(e) => panic!("{what} is not available: {e}"),
    }
}

fn start() -> anyhow::Result<Stack> {
    let dir = match std::env::var_os("NODE_FENCER_STACK_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir =
                std::env::temp_dir().join(format!("node-fencer-stack-{}", std::process::id()));
            up(&dir, &[])?;
            dir
        }
    };
    ready(dir)
}

/// The stack in `dir`, with node-fencer's ClusterRole applied.
fn ready(dir: PathBuf) -> anyhow::Result<Stack> {
    let stack = Stack::open(dir)?;
    on_own_thread("applying rbac.yaml", || apply_rbac(&stack))?;
    Ok(stack)
}

/// A stack of its own (moto, etcd, kube-apiserver) for a test that breaks
/// it, such as restarting the apiserver; `tag` names its directory. Stopped
/// by its watchdog when this process exits.
pub fn private_stack(tag: &str) -> anyhow::Result<Stack> {
    let dir = std::env::temp_dir().join(format!("node-fencer-{tag}-{}", std::process::id()));
    up(&dir, &[])?;
    ready(dir)
}

/// Starts a stack in `dir` with `tests/stack/up.sh` (plus `extra` options),
/// watched by a watchdog that stops it when this process exits.
pub(crate) fn up(dir: &Path, extra: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("bash")
        .arg(repo_root().join("tests/stack/up.sh"))
        .arg(dir)
        .args(extra)
        .arg("--watch-pid")
        .arg(std::process::id().to_string())
        .status()
        .context("running tests/stack/up.sh")?;
    if !status.success() {
        bail!(
            "tests/stack/up.sh {} failed ({status}); run `make setup` (tests/stack/setup.sh) \
             first, logs are in {}",
            extra.join(" "),
            dir.join("logs").display()
        );
    }
    Ok(())
}

/// Runs an async set-up to its end on a thread and runtime of its own:
/// callers may be inside a test's runtime, which must not block.
pub(crate) fn on_own_thread<T, F, Fut>(what: &str, make: F) -> anyhow::Result<T>
where
    T: Send,
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(make())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("{what} panicked"))?
    })
}

/// Parses `export NAME=value` lines (values optionally single-quoted).
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let v = v
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .map(|v| v.replace("'\\''", "'"))
                .unwrap_or_else(|| v.to_owned());
            (k.to_owned(), v)
        })
        .collect()
}

/// Applies `infra/kubernetes/rbac.yaml` as it is: the tests run node-fencer
/// under the very role that production gets.
/// Creates `obj`, or replaces the object of its name with it: what a
/// server-side apply does here, on every Kubernetes version (1.15 has no
/// server-side apply).
async fn put<K>(api: &Api<K>, mut obj: K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let name = obj
        .meta()
        .name
        .clone()
        .context("an object without a name")?;
    match api.get_opt(&name).await? {
        None => drop(api.create(&PostParams::default(), &obj).await?),
        Some(current) => {
            obj.meta_mut().resource_version = current.meta().resource_version.clone();
            api.replace(&name, &PostParams::default(), &obj).await?;
        }
    }
    Ok(())
}

async fn apply_rbac(stack: &Stack) -> anyhow::Result<()> {
    let admin = stack.admin().await?;
    let path = repo_root().join("infra/kubernetes/rbac.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple(&text).context("parsing rbac.yaml")?;
    for doc in docs {
        match doc["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(doc)?;
                put(&Api::all(admin.clone()), role).await?;
            }
            Some("ClusterRoleBinding") => {
                let binding: ClusterRoleBinding = serde_json::from_value(doc)?;
                put(&Api::all(admin.clone()), binding).await?;
            }
            Some("Role") => {
                let role: Role = serde_json::from_value(doc)?;
                let (_, ns) = named(&role.metadata)?;
                put(&Api::namespaced(admin.clone(), &ns), role).await?;
            }
            Some("RoleBinding") => {
                let binding: RoleBinding = serde_json::from_value(doc)?;
                let (_, ns) = named(&binding.metadata)?;
                put(&Api::namespaced(admin.clone(), &ns), binding).await?;
            }
            other => bail!("unexpected kind {other:?} in rbac.yaml"),
        }
    }
    Ok(())
}

fn named(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> anyhow::Result<(String, String)> {
    match (&meta.name, &meta.namespace) {
        (Some(name), Some(ns)) => Ok((name.clone(), ns.clone())),
        _ => bail!("a namespaced object in rbac.yaml lacks a name or namespace"),
    }
}

impl Stack {
    /// The stack whose state directory is `dir`, from the variables `up.sh`
    /// wrote there.
    pub(crate) fn open(dir: PathBuf) -> anyhow::Result<Self> {
        let env = std::fs::read_to_string(dir.join("env"))
            .with_context(|| format!("reading {}", dir.join("env").display()))?;
        Ok(Self {
            vars: parse_env(&env),
            dir,
        })
    }

    /// Whether the stack runs the oldest control plane, 1.15.
    pub fn is_oldest(&self) -> bool {
        self.vars
            .get("NODE_FENCER_STACK_OLDEST_CONTROL_PLANE")
            .map(String::as_str)
            == Some("1")
    }

    /// Whether the stack's Kubernetes serves the CSI objects at
    /// `storage.k8s.io/v1` (CSINode, CSIDriver: from 1.17 and 1.18; not
    /// the oldest control plane, 1.15).
    pub fn serves_csi_v1(&self) -> bool {
        !self.is_oldest()
    }

    /// A variable of the stack's env file.
    pub fn var(&self, name: &str) -> &str {
        self.vars
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{name} missing from {}/env", self.dir.display()))
    }

    async fn client_from(&self, path: &str) -> anyhow::Result<Client> {
        client_of(Kubeconfig::read_from(path)?, HARNESS).await
    }

    /// node-fencer's kubeconfig (the ClusterRole of `infra/`), pointing at
    /// `server` (a proxy) instead of the apiserver.
    pub fn fencer_kubeconfig_via(&self, server: &str) -> anyhow::Result<Kubeconfig> {
        let mut kc = Kubeconfig::read_from(self.var("NODE_FENCER_KUBECONFIG_RESTRICTED"))?;
        for named in &mut kc.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.server = Some(server.to_owned());
            }
        }
        Ok(kc)
    }

    /// [`Stack::fencer_kubeconfig_via`] written to a file of the stack's
    /// directory named after `what` and this process; its path.
    pub fn fencer_kubeconfig_file_via(&self, server: &str, what: &str) -> anyhow::Result<PathBuf> {
        let path = self
            .dir
            .join(format!("kubeconfig-{what}-{}", std::process::id()));
        std::fs::write(
            &path,
            serde_json::to_string(&self.fencer_kubeconfig_via(server)?)?,
        )?;
        Ok(path)
    }

    /// A client as node-fencer that reaches the apiserver through `server`
    /// (a fault proxy), with these timeouts.
    pub async fn fencer_via(&self, server: &str, timeouts: Timeouts) -> anyhow::Result<Client> {
        client_of(self.fencer_kubeconfig_via(server)?, timeouts).await
    }

    /// Restarts one of the stack's processes (`tests/stack/restart.sh`).
    pub fn restart(&self, name: &str) -> anyhow::Result<()> {
        let status = Command::new("bash")
            .arg(repo_root().join("tests/stack/restart.sh"))
            .arg(&self.dir)
            .arg(name)
            .status()
            .context("running tests/stack/restart.sh")?;
        if !status.success() {
            bail!("restarting {name} failed ({status})");
        }
        Ok(())
    }

    /// A client with every right, for setting scenes up.
    pub async fn admin(&self) -> anyhow::Result<Client> {
        self.client_from(self.var("KUBECONFIG")).await
    }

    /// A client as node-fencer, holding only the ClusterRole of `infra/`.
    pub async fn fencer(&self) -> anyhow::Result<Client> {
        self.client_from(self.var("NODE_FENCER_KUBECONFIG_RESTRICTED"))
            .await
    }

    /// An EC2 client pointed at moto.
    pub async fn ec2(&self) -> aws_sdk_ec2::Client {
        aws_sdk_ec2::Client::new(&self.sdk_config().await)
    }

    /// AWS SDK configuration for moto, built the way the function builds it.
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        self.sdk_config_via(self.var("AWS_ENDPOINT_URL"), HARNESS)
            .await
    }

    /// [`Stack::sdk_config`] reaching moto through `endpoint` (a fault
    /// proxy), with these timeouts.
    pub async fn sdk_config_via(
        &self,
        endpoint: &str,
        timeouts: Timeouts,
    ) -> aws_config::SdkConfig {
        let creds = aws_credential_types::Credentials::new(
            self.var("AWS_ACCESS_KEY_ID"),
            self.var("AWS_SECRET_ACCESS_KEY"),
            None,
            None,
            "node-fencer-tests",
        );
        let base = connect::sdk_config_with(timeouts).await;
        base.into_builder()
            .endpoint_url(endpoint)
            .region(aws_config::Region::new(self.var("AWS_REGION").to_owned()))
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(creds),
            )
            .build()
    }
}

/// A client built the way the function builds its own, with these timeouts.
async fn client_of(kc: Kubeconfig, timeouts: Timeouts) -> anyhow::Result<Client> {
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(connect::kube_client_with(config, timeouts)?)
}

/// Deletes test Nodes when dropped, at the end of a test or while a failed
/// one unwinds, so no Node a test made outlives it to count against the next
/// test's cap. A drop cannot await, so it runs `kubectl` (the one `make setup`
/// built) and waits for nothing.
#[derive(Debug)]
#[must_use = "the Nodes are deleted when the guard is dropped"]
pub struct NodeCleanup {
    kubeconfig: String,
    names: Vec<String>,
}

impl Stack {
    /// A guard that deletes these Nodes when it is dropped.
    pub fn delete_on_drop(&self, names: &[&str]) -> NodeCleanup {
        NodeCleanup {
            kubeconfig: self.var("KUBECONFIG").to_owned(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }
}

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        if self.names.is_empty() {
            return;
        }
        let kubectl = std::env::var_os("NODE_FENCER_KUBE_BIN").map_or_else(
            || PathBuf::from("kubectl"),
            |d| PathBuf::from(d).join("kubectl"),
        );
        // Best effort: a Node already gone, or a stack already stopped, is fine.
        let _ = Command::new(kubectl)
            .args(["--kubeconfig", &self.kubeconfig, "delete", "node"])
            .args(["--ignore-not-found", "--wait=false"])
            .args(&self.names)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Tests that change cluster-wide state (taints count against the cap) take
/// this lock, so they can run in one process without seeing each other.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines() {
        let vars = parse_env("export A=1\nexport B='x y'\n# c\nexport C='it'\\''s'\n");
        assert_eq!(vars["A"], "1");
        assert_eq!(vars["B"], "x y");
        assert_eq!(vars["C"], "it's");
    }
}
