//! Real kubelets as the nodes that die: Kubernetes' hollow kubelet
//! (`tests/stack/gomod/kubernetes/hollow-kubelet`, over `pkg/kubemark`),
//! one process per Node, whose fate is its machine's:
//!
//! - the machine stopped or terminated: the process is killed (`SIGKILL`),
//!   so its Lease and status stop where they were;
//! - the machine hung while the cloud calls it running: the process is
//!   frozen (`SIGSTOP`); a power-off then kills it;
//! - the machine back: a new process on the same Node name and state
//!   directory, with a new boot id, which posts Ready itself.
//!
//! The kubelet registers its Node (providerID, labels, systemUUID) and,
//! through the CSI node service the process serves for the Node's drivers,
//! its CSINode; it mounts its pods' volumes through that service and
//! reports them in `status.volumesInUse`. Logs:
//! `STATE_DIR/logs/kubelet-<node>-<pid>.log`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use anyhow::Context;

use crate::Stack;
use crate::attacher::tool;
use crate::process::{signal, spawn_watched};

/// The kubelet's default Lease duration (renewed every 10 s), a fifth of
/// the node controller's default 50 s grace period.
pub const DEFAULT_LEASE_SECONDS: u32 = 40;

/// The Lease duration of a hollow kubelet on `stack`: the kubelet's
/// default under a grace period of 50 s or more (Kubernetes' default, as
/// `make bench` runs it), else the same ratio to the test stack's shorter
/// one (10 s: renewed every 2 s, as kwok renews its nodes'), so that a live
/// kubelet never looks late to the node controller.
pub fn lease_seconds(stack: &Stack) -> u32 {
    let grace = stack
        .vars
        .get("NODE_FENCER_NODE_MONITOR_GRACE_PERIOD")
        .and_then(|g| g.strip_suffix('s'))
        .and_then(|g| g.parse::<u32>().ok())
        .unwrap_or(10);
    (grace * 4 / 5).clamp(4, DEFAULT_LEASE_SECONDS)
}

/// What a hollow kubelet registers and serves.
#[derive(Clone, Debug, Default)]
pub struct KubeletSpec {
    /// The Node name.
    pub name: String,
    /// `spec.providerID`; none on-premises.
    pub provider_id: Option<String>,
    /// The machine's SMBIOS UUID, reported as `nodeInfo.systemUUID`.
    pub system_uuid: Option<String>,
    /// The labels it registers the Node with.
    pub labels: Vec<(String, String)>,
    /// The CSI drivers it serves: (driver name, node id).
    pub drivers: Vec<(String, String)>,
    /// The CSI node's accessible topology.
    pub topology: Vec<(String, String)>,
    /// The Lease's duration (renewed every quarter of it).
    pub lease_seconds: u32,
    /// How often it computes and posts its node status, changed or not
    /// (seconds); `None`: the kubelet's 10 s and kubemark's 5 minutes.
    pub status_every: Option<u32>,
}

/// One hollow kubelet process, ended when this is dropped.
#[derive(Debug)]
pub struct Kubelet {
    spec: KubeletSpec,
    /// The binary: the old control plane's on that stack.
    binary: PathBuf,
    /// The stack's state directory.
    dir: PathBuf,
    root: PathBuf,
    pid: Mutex<Option<u32>>,
}

impl Kubelet {
    /// Starts the kubelet of `spec` on `stack`; returns once the process
    /// runs (the Node registers a moment later).
    pub fn start(stack: &Stack, spec: KubeletSpec) -> anyhow::Result<Self> {
        let root = stack.dir.join("kubelets").join(&spec.name);
        // A kubelet is never newer than its apiserver.
        let binary = match stack.vars.get("NODE_FENCER_STACK_OLD_CONTROL_PLANE") {
            Some(old) if old == "1" => tool("NODE_FENCER_HOLLOW_KUBELET_LEGACY")?,
            _ => tool("NODE_FENCER_HOLLOW_KUBELET")?,
        };
        let kubelet = Self {
            spec,
            binary,
            dir: stack.dir.clone(),
            root,
            pid: Mutex::new(None),
        };
        kubelet.boot()?;
        Ok(kubelet)
    }

    /// The machine stopped: the process is killed where it stands.
    pub fn kill(&self) -> anyhow::Result<()> {
        if let Some(pid) = self.take_pid()? {
            signal(pid, "KILL")?;
        }
        Ok(())
    }

    /// The machine hung: the process is frozen, its Lease left unrenewed.
    pub fn freeze(&self) -> anyhow::Result<()> {
        signal(self.running_pid()?, "STOP")
    }

    /// The machine booted again: a new process on the same Node name and
    /// state, with a new boot id. Kills the old one first if it still runs.
    pub fn boot(&self) -> anyhow::Result<()> {
        self.kill()?;
        std::fs::create_dir_all(&self.root)?;
        let spec = &self.spec;
        let mut command = Command::new(&self.binary);
        command
            .arg(format!(
                "--kubeconfig={}",
                self.dir.join("kubeconfig").display()
            ))
            .arg(format!("--name={}", spec.name))
            .arg(format!("--root-dir={}", self.root.display()))
            .arg(format!("--node-lease-seconds={}", spec.lease_seconds))
            .arg("--v=2");
        if let Some(every) = spec.status_every {
            command
                .arg(format!("--node-status-update-seconds={every}"))
                .arg(format!("--node-status-report-seconds={every}"));
        }
        if let Some(id) = &spec.provider_id {
            command.arg(format!("--provider-id={id}"));
        }
        if let Some(uuid) = &spec.system_uuid {
            command.arg(format!("--system-uuid={uuid}"));
        }
        for (flag, pairs) in [
            ("node-labels", &spec.labels),
            ("csi-driver", &spec.drivers),
            ("csi-topology", &spec.topology),
        ] {
            for (k, v) in pairs {
                command.arg(format!("--{flag}={k}={v}"));
            }
        }
        let pid = spawn_watched(&self.dir, &format!("kubelet-{}", spec.name), &command)?.pid;
        *self
            .pid
            .lock()
            .map_err(|_| anyhow::anyhow!("kubelet lock"))? = Some(pid);
        Ok(())
    }

    /// Whether its process was started and not killed since.
    pub fn is_running(&self) -> anyhow::Result<bool> {
        Ok(self
            .pid
            .lock()
            .map_err(|_| anyhow::anyhow!("kubelet lock"))?
            .is_some())
    }

    fn take_pid(&self) -> anyhow::Result<Option<u32>> {
        Ok(self
            .pid
            .lock()
            .map_err(|_| anyhow::anyhow!("kubelet lock"))?
            .take())
    }

    fn running_pid(&self) -> anyhow::Result<u32> {
        self.pid
            .lock()
            .map_err(|_| anyhow::anyhow!("kubelet lock"))?
            .with_context(|| format!("the kubelet of {} is not running", self.spec.name))
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A live kubelet whose clock runs `behind` the true time, as its Lease
/// shows it: renewed every 2 s (an 8 s Lease, as the test stack's kubelets
/// have), each `renewTime` stamped `behind` early. Kubernetes' kubelet
/// takes its clock from the machine, which cannot be set back here, so this
/// writes the Lease as such a kubelet does, owned by its Node, until
/// dropped; the apiserver times each write on its own clock.
pub struct SkewedLease {
    task: tokio::task::JoinHandle<()>,
}

impl SkewedLease {
    /// Starts renewing the Lease of the Node `node`; returns once the first
    /// renewal is written.
    pub async fn start(
        admin: &kube::Client,
        node: &str,
        behind: std::time::Duration,
    ) -> anyhow::Result<Self> {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::core::v1::Node;
        let uid = kube::Api::<Node>::all(admin.clone())
            .get(node)
            .await?
            .metadata
            .uid
            .context("the Node has no uid")?;
        let leases: kube::Api<Lease> = kube::Api::namespaced(admin.clone(), "kube-node-lease");
        let skew = k8s_openapi::jiff::SignedDuration::try_from(behind)?;
        let name = node.to_owned();
        let owner = name.clone();
        let renew = move || -> anyhow::Result<Lease> {
            let at = k8s_openapi::jiff::Timestamp::now().checked_sub(skew)?;
            Ok(serde_json::from_value(serde_json::json!({
                "metadata": {"name": owner, "namespace": "kube-node-lease",
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": uid}]},
                "spec": {"holderIdentity": owner, "leaseDurationSeconds": 8,
                    "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(at)},
            }))?)
        };
        let params = kube::api::PatchParams::apply("skewed-kubelet").force();
        leases
            .patch(&name, &params, &kube::api::Patch::Apply(renew()?))
            .await?;
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                if let Ok(l) = renew() {
                    let _ = leases
                        .patch(&name, &params, &kube::api::Patch::Apply(l))
                        .await;
                }
            }
        });
        Ok(Self { task })
    }
}

impl Drop for SkewedLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}
