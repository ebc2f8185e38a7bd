//! The CSI attach chain of the controller stack: for each driver of the
//! scenes, the real external-attacher sidecar
//! (`github.com/kubernetes-csi/external-attacher/v4`, `csi-attacher`) in
//! front of a CSI controller plugin over a unix socket:
//!
//! - `pd.csi.storage.gke.io`: the real PD CSI driver
//!   (`sigs.k8s.io/gcp-compute-persistent-disk-csi-driver`, its controller
//!   service alone), its Compute Engine client pointed at the fake of
//!   [`crate::gce`] (`--compute-endpoint`), with a cloud config naming the
//!   project, the zone and the fake's token stand-in;
//! - `ebs.csi.aws.com`: our controller (`tests/csi`, `-driver ebs`) making the
//!   EBS driver's EC2 calls against moto (that driver's module is not served
//!   by the Go module proxy);
//! - `cstor.csi.openebs.io`: our controller (`-driver cstor`), a storage
//!   system with no cloud that publishes a single-node volume to one node at
//!   a time; which node holds which volume is kept in
//!   `STATE_DIR/csi/cstor-published.json`, so it outlives the process.
//!
//! The sidecars run as admin (`STATE_DIR/kubeconfig`), without leader
//! election, with the attacher's own defaults for resync and retries
//! (1 s doubling up to 5 min); `--timeout` is the PD driver's own manifest's
//! (250 s) for PD, 60 s for the others. They add their finalizers
//! (`external-attacher/<driver>`) to VolumeAttachments and PersistentVolumes,
//! read each node's id from its CSINode (the scenes create them, as a kubelet
//! would), call `ControllerPublishVolume` and set `status.attached`, or save
//! the driver's error in `status.attachError`; on deletion they call
//! `ControllerUnpublishVolume` and take their finalizer off.
//!
//! Every process is started by this test process in a session of its own
//! and ended with it. Logs: `STATE_DIR/logs/csi-<driver>-<pid>.log` (the
//! controller) and `csi-attacher-<driver>-<pid>.log` (the sidecar).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::Stack;
use crate::gce::{FakeCompute, PD_DRIVER, PROJECT, ZONE};

/// The EBS CSI driver (and attacher) name.
pub const DRIVER: &str = "ebs.csi.aws.com";
/// The finalizer the external-attacher puts on the VolumeAttachments it handles.
pub const FINALIZER: &str = "external-attacher/ebs-csi-aws-com";

/// A CSI driver of the scenes, each behind its own external-attacher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// `ebs.csi.aws.com`, against moto.
    Ebs,
    /// `cstor.csi.openebs.io`: iSCSI-like, no cloud call.
    Cstor,
    /// `pd.csi.storage.gke.io`, against the fake Compute Engine.
    Pd,
}

impl Driver {
    /// Every one.
    pub const ALL: [Driver; 3] = [Driver::Ebs, Driver::Cstor, Driver::Pd];

    /// The driver (and attacher) name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ebs => DRIVER,
            Self::Cstor => "cstor.csi.openebs.io",
            Self::Pd => PD_DRIVER,
        }
    }

    /// The external-attacher's finalizer.
    pub fn finalizer(self) -> &'static str {
        match self {
            Self::Ebs => FINALIZER,
            Self::Cstor => "external-attacher/cstor-csi-openebs-io",
            Self::Pd => "external-attacher/pd-csi-storage-gke-io",
        }
    }

    /// Whether its volumes live in Compute Engine (the nodes are VMs).
    pub fn on_gce(self) -> bool {
        self == Self::Pd
    }

    /// A short name, for files.
    pub fn short(self) -> &'static str {
        match self {
            Self::Ebs => "ebs",
            Self::Cstor => "cstor",
            Self::Pd => "pd",
        }
    }

    /// The sidecar's `--timeout`: the PD driver's manifest's, else a minute.
    fn timeout(self) -> &'static str {
        match self {
            Self::Pd => "250s",
            Self::Ebs | Self::Cstor => "60s",
        }
    }
}

/// The external-attacher of the oldest control plane, 1.15: v2.0.0, the
/// newest release the Go module proxy serves that reads VolumeAttachments
/// and CSINodes at `storage.k8s.io/v1beta1` (v3 and later read CSINodes at
/// v1, which 1.15 does not serve), built with that plane
/// (`tests/stack/gomod/kubernetes-1.15`).
pub const OLDEST_ATTACHER: &str = "NODE_FENCER_CSI_ATTACHER_OLDEST";

/// A binary `tests/stack/setup.sh` builds, named by `var` in `env.sh`.
pub(crate) fn tool(var: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(var).map(PathBuf::from).with_context(|| {
        format!("{var} is not set: run `make setup` (tests/stack/setup.sh) and source its env.sh")
    })?;
    if !path.is_file() {
        bail!(
            "{var}={} does not exist: run `make setup` (tests/stack/setup.sh)",
            path.display()
        );
    }
    Ok(path)
}

/// Starts the attach chain of each of `drivers` for `stack` (the PD driver
/// against `fake`): the controller, then its sidecar; returns once every
/// sidecar has found its driver and handles VolumeAttachments with it.
pub fn spawn(stack: &Stack, fake: &FakeCompute, drivers: &[Driver]) -> anyhow::Result<()> {
    let dir = stack.dir.join("csi");
    std::fs::create_dir_all(&dir)?;
    let attacher = tool(if stack.serves_csi_v1() {
        "NODE_FENCER_CSI_ATTACHER"
    } else {
        OLDEST_ATTACHER
    })?;
    let mut sidecars = Vec::new();
    for &driver in drivers {
        let socket = dir.join(format!("{}-{}.sock", driver.short(), std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let mut controller = match driver {
            Driver::Pd => {
                let config = dir.join("pd-cloud-config.ini");
                std::fs::write(
                    &config,
                    format!(
                        "[Global]\ntoken-url = {endpoint}/_fake/token\nproject-id = {PROJECT}\nzone = {ZONE}\n",
                        endpoint = fake.endpoint()
                    ),
                )?;
                let mut c = Command::new(tool("NODE_FENCER_PD_CSI_DRIVER")?);
                c.arg(format!("--endpoint=unix:{}", socket.display()))
                    .arg("--run-node-service=false")
                    .arg(format!("--compute-endpoint={}", fake.endpoint()))
                    .arg(format!("--cloud-config={}", config.display()))
                    .arg("--v=4")
                    // Its token-url is called with a token of the metadata
                    // server's, which the fake also stands in for.
                    .env("GCE_METADATA_HOST", format!("127.0.0.1:{}", fake.port));
                c
            }
            Driver::Ebs | Driver::Cstor => {
                let mut c = Command::new(tool("NODE_FENCER_CSI_CONTROLLER")?);
                c.arg(format!("-driver={}", driver.short()))
                    .arg(format!("-endpoint=unix://{}", socket.display()));
                if driver == Driver::Cstor {
                    c.arg(format!(
                        "-state={}",
                        dir.join("cstor-published.json").display()
                    ));
                }
                for var in [
                    "AWS_ENDPOINT_URL",
                    "AWS_REGION",
                    "AWS_DEFAULT_REGION",
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_EC2_METADATA_DISABLED",
                ] {
                    c.env(var, stack.var(var));
                }
                c
            }
        };
        let log = start(stack, &format!("csi-{}", driver.short()), &mut controller)?;
        wait_for(
            &format!("the {} controller's socket", driver.name()),
            &log,
            || socket.exists(),
        )?;
        let mut sidecar = Command::new(&attacher);
        sidecar
            .arg(format!(
                "--kubeconfig={}",
                stack.dir.join("kubeconfig").display()
            ))
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--timeout={}", driver.timeout()))
            .arg("--leader-election=false")
            .arg("--v=5");
        let log = start(
            stack,
            &format!("csi-attacher-{}", driver.short()),
            &mut sidecar,
        )?;
        sidecars.push((driver, log));
    }
    for (driver, log) in sidecars {
        wait_for(
            &format!("the external-attacher of {}", driver.name()),
            &log,
            || {
                std::fs::read_to_string(&log)
                    .is_ok_and(|text| text.contains("using real CSI handler"))
            },
        )?;
    }
    Ok(())
}

/// Starts `command` in a session of its own beside a shell that ends that
/// session once this process is gone (as the fake Compute Engine is run),
/// its output appended to `STATE_DIR/logs/NAME-<pid>.log`; returns the log.
fn start(stack: &Stack, name: &str, command: &mut Command) -> anyhow::Result<PathBuf> {
    let logs = stack.dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let pid = std::process::id();
    let log = logs.join(format!("{name}-{pid}.log"));
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
    let envs: Vec<_> = command
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let status = Command::new("setsid")
        .arg("bash")
        .arg("-c")
        .arg(format!(
            "\"$@\" >>'{log}' 2>&1 & while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -- -$$",
            log = log.display()
        ))
        .arg("csi")
        .arg(program)
        .args(args)
        .envs(envs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    status.with_context(|| format!("starting {name} (setsid bash)"))?;
    Ok(log)
}

/// Waits up to 60 s for `ready`; the error quotes the end of `log`.
fn wait_for(what: &str, log: &Path, ready: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        if Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            bail!(
                "{what} not ready within 60 s; the end of {}:\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
/// Registers a `CSIDriver` object for each driver: attachment required,
/// so the attach/detach controller creates VolumeAttachments for their
/// volumes.
pub async fn register_drivers(admin: &Client) -> anyhow::Result<()> {
    for d in Driver::ALL {
        let driver: CSIDriver = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": d.name()},
            "spec": {"attachRequired": true, "podInfoOnMount": false,
                     "volumeLifecycleModes": ["Persistent"]}
        }))?;
        Api::<CSIDriver>::all(admin.clone())
            .patch(
                d.name(),
                &PatchParams::apply("node-fencer-tests").force(),
                &Patch::Apply(&driver),
            )
            .await?;
    }
    Ok(())
}
