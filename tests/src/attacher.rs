//! CSI attacher stand-ins. For driver `ebs.csi.aws.com` it plays the parts of
//! the external-attacher sidecar and of the EBS CSI controller
//! (`ControllerPublishVolume` / `ControllerUnpublishVolume`) against moto.
//! For `pd.csi.storage.gke.io` it plays the same parts against the fake
//! Compute Engine of [`crate::gce`].
//! For `cstor.csi.openebs.io` (OpenEBS cStor over iSCSI, the non-EBS driver
//! of older self-managed clusters) it plays the same sidecar in front of a
//! storage system that attaches without any cloud call: a volume is
//! "published" to one node at a time, as an iSCSI target with one
//! initiator, and what is published is read back from the
//! VolumeAttachments themselves (`status.attached`), so it survives a
//! restart of the stand-in.
//!
//! A background task polls VolumeAttachments (every 200 ms, as admin). For each
//! one of the EBS driver:
//!
//! - it adds the finalizer `external-attacher/ebs-csi-aws-com`;
//! - it maps the PersistentVolume to its EBS volume (the CSI `volumeHandle`, or
//!   the in-tree `awsElasticBlockStore` volume id) and the Node to its instance
//!   (`spec.providerID`), calls `AttachVolume` and sets `status.attached` with
//!   the device path, through the status subresource;
//! - like EBS, it refuses a volume still attached to another instance: the
//!   error (`VolumeInUse`) goes to `status.attachError`, from where the
//!   attach/detach controller raises `FailedAttachVolume`. moto does not refuse
//!   by itself (it moves the attachment), so the stand-in looks first;
//! - when the VolumeAttachment is deleted, it detaches the volume (not forced,
//!   as the driver does; a stopped instance allows it), treats a volume no
//!   longer attached to that instance as detached, then removes the finalizer.
//!
//! For each one of the cStor driver: the same finalizer dance
//! (`external-attacher/cstor-csi-openebs-io`); it refuses to publish a
//! volume still published to another node (`FailedPrecondition`, in
//! `status.attachError`), and unpublishes on deletion.
//!
//! For each one of the PD driver: the finalizer
//! `external-attacher/pd-csi-storage-gke-io`; it maps the PersistentVolume
//! to its disk (the volume handle `projects/P/zones/Z/disks/D`) and the Node
//! to its VM (`spec.providerID = gce://P/Z/N`), refuses a disk in use by
//! another VM (Compute Engine's `already being used by` error, in
//! `status.attachError`) and attaches it through the fake's control action
//! `attach_disk`, under the disk's name as device name, as the driver does.
//! When the VolumeAttachment is deleted it does not detach by itself: it
//! waits until the VM no longer lists the disk (node-fencer's `detachDisk`,
//! or the VM deleted at a scene's teardown), then removes the finalizer. So
//! every `detachDisk` the fake serves is node-fencer's, which the scenarios
//! count. It reads the fake through its control API only, never its
//! Compute Engine API.
//!
//! What it did goes to `STATE_DIR/logs/csi-attacher.log`.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::VolumeAttachmentState;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::Stack;
use crate::gce::{Compute, PD_DRIVER, users_in};

/// The EBS CSI driver (and attacher) name.
pub const DRIVER: &str = "ebs.csi.aws.com";
/// The finalizer the external-attacher puts on the VolumeAttachments it handles.
pub const FINALIZER: &str = "external-attacher/ebs-csi-aws-com";

/// A CSI driver the stand-in plays.
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
}
/// How often VolumeAttachments are listed.
const POLL: Duration = Duration::from_millis(200);
/// How long a VolumeAttachment that failed waits before the next try.
const RETRY: Duration = Duration::from_secs(1);

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

/// Starts the stand-ins of every driver for `stack` (the PD one against the
/// fake Compute Engine `compute`) on a thread of its own (with its own
/// runtime, so it outlives any one test's runtime); returns once they run.
pub fn spawn(stack: &Stack, compute: Compute) -> anyhow::Result<()> {
    let stack = Stack {
        dir: stack.dir.clone(),
        vars: stack.vars.clone(),
    };
    let (tx, rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    std::thread::Builder::new()
        .name("csi-attacher".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                    return;
                }
            };
            runtime.block_on(async move {
                let (ebs, cstor, pd) = tokio::join!(
                    Attacher::new(&stack, Driver::Ebs, compute.clone()),
                    Attacher::new(&stack, Driver::Cstor, compute.clone()),
                    Attacher::new(&stack, Driver::Pd, compute)
                );
                let (mut ebs, mut cstor, mut pd) = match (ebs, cstor, pd) {
                    (Ok(a), Ok(b), Ok(c)) => (a, b, c),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let first = async {
                    ebs.pass().await?;
                    cstor.pass().await?;
                    pd.pass().await
                }
                .await;
                let _ = tx.send(first);
                tokio::join!(ebs.run(), cstor.run(), pd.run());
            });
        })
        .context("starting the CSI attacher thread")?;
    rx.recv_timeout(Duration::from_secs(60))
        .map_err(|_| anyhow!("the CSI attacher did not start within 60 s"))?
}

/// The stand-in's state, for one driver.
pub struct Attacher {
    driver: Driver,
    vas: Api<VolumeAttachment>,
    pvs: Api<PersistentVolume>,
    nodes: Api<Node>,
    ec2: aws_sdk_ec2::Client,
    compute: Compute,
    /// VolumeAttachments that failed, and when to try them again.
    retry_at: HashMap<String, Instant>,
    /// Deleted PD VolumeAttachments whose disk the VM still lists (noted once).
    waiting: HashSet<String>,
    /// What each attachment was made of, for detaching after the Node is gone.
    targets: HashMap<String, Target>,
    log: PathBuf,
}

/// The EBS volume and the instance of one VolumeAttachment (for PD: the
/// disk's volume handle and the VM's path, `projects/P/zones/Z/instances/N`).
#[derive(Clone, Debug)]
struct Target {
    volume: String,
    instance: String,
}

impl Attacher {
    /// Connects to the stack as admin, to moto and to the fake Compute Engine.
    pub async fn new(stack: &Stack, driver: Driver, compute: Compute) -> anyhow::Result<Self> {
        let admin = stack.admin().await?;
        Ok(Self {
            driver,
            vas: Api::all(admin.clone()),
            pvs: Api::all(admin.clone()),
            nodes: Api::all(admin),
            ec2: stack.ec2().await,
            compute,
            retry_at: HashMap::new(),
            waiting: HashSet::new(),
            targets: HashMap::new(),
            log: stack.dir.join("logs").join("csi-attacher.log"),
        })
    }

    /// Polls for ever.
    pub async fn run(mut self) {
        loop {
            if let Err(e) = self.pass().await {
                self.note(&format!("pass failed: {e:#}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn note(&self, line: &str) {
        let now = k8s_openapi::jiff::Timestamp::now();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
        {
            let _ = writeln!(f, "{now} {}: {line}", self.driver.name());
        }
    }

    /// One look at every VolumeAttachment of the driver.
    pub async fn pass(&mut self) -> anyhow::Result<()> {
        let list = self.vas.list(&ListParams::default()).await?;
        let now = Instant::now();
        let mut seen = Vec::new();
        let mine: Vec<&VolumeAttachment> = list
            .items
            .iter()
            .filter(|va| va.spec.attacher == self.driver.name())
            .collect();
        let mut published = self.published(&mine).await;
        for va in mine.iter().copied() {
            let Some(name) = va.metadata.name.clone() else {
                continue;
            };
            seen.push(name.clone());
            if self.retry_at.get(&name).is_some_and(|at| now < *at) {
                continue;
            }
            let result = match (self.driver, va.metadata.deletion_timestamp.is_some()) {
                (Driver::Ebs, true) => self.detach(&name, va).await,
                (Driver::Ebs, false) => self.attach(&name, va).await,
                (Driver::Cstor, true) => self.unpublish(&name, va).await,
                (Driver::Cstor, false) => self.publish(&name, va, &mut published).await,
                (Driver::Pd, true) => self.pd_detach(&name, va).await,
                (Driver::Pd, false) => self.pd_attach(&name, va).await,
            };
            match result {
                Ok(()) => {
                    self.retry_at.remove(&name);
                }
                Err(e) => {
                    if !e.is::<Waiting>() || self.waiting.insert(name.clone()) {
                        self.note(&format!("{name}: {e:#} (retrying in {RETRY:?})"));
                    }
                    self.retry_at.insert(name, now + RETRY);
                }
            }
        }
        self.retry_at.retain(|name, _| seen.contains(name));
        self.waiting.retain(|name| seen.contains(name));
        self.targets.retain(|name, _| seen.contains(name));
        Ok(())
    }

    /// Puts the external-attacher's finalizer on, as it does before any
    /// attach.
    async fn hold(&self, name: &str, va: &VolumeAttachment) -> anyhow::Result<()> {
        if !holds(va, self.driver.finalizer()) {
            let mut with = va.metadata.finalizers.clone().unwrap_or_default();
            with.push(self.driver.finalizer().to_owned());
            self.vas
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": with}})),
                )
                .await?;
        }
        Ok(())
    }

    /// Takes the external-attacher's finalizer off once the volume is
    /// unpublished, and clears the status; false when it was not there.
    async fn release(&self, name: &str, va: &VolumeAttachment) -> anyhow::Result<bool> {
        if !holds(va, self.driver.finalizer()) {
            return Ok(false);
        }
        let finalizers = va.metadata.finalizers.clone().unwrap_or_default();
        let patch = json!({"status": {"attached": false, "detachError": Value::Null}});
        let _ = self
            .vas
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let rest: Vec<String> = finalizers
            .into_iter()
            .filter(|f| f != self.driver.finalizer())
            .collect();
        self.vas
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
            )
            .await?;
        Ok(true)
    }

    /// cStor: which node each volume handle is published to, from the
    /// VolumeAttachments still `attached` (a deleted one holds its volume
    /// until it is unpublished).
    async fn published(&self, mine: &[&VolumeAttachment]) -> HashMap<String, String> {
        let mut out = HashMap::new();
        if self.driver != Driver::Cstor {
            return out;
        }
        for va in mine {
            if va.status.as_ref().is_some_and(|s| s.attached)
                && let Ok(handle) = self.handle(va).await
            {
                out.insert(handle, va.spec.node_name.clone());
            }
        }
        out
    }

    /// The volume handle of a VolumeAttachment's PersistentVolume (cStor, PD).
    async fn handle(&self, va: &VolumeAttachment) -> anyhow::Result<String> {
        let pv = va
            .spec
            .source
            .persistent_volume_name
            .as_deref()
            .context("the VolumeAttachment names no PersistentVolume")?;
        let spec = self
            .pvs
            .get(pv)
            .await
            .with_context(|| format!("persistentvolume {pv}"))?
            .spec
            .unwrap_or_default();
        spec.csi
            .filter(|c| c.driver == self.driver.name())
            .map(|c| c.volume_handle)
            .with_context(|| format!("{pv} is not a volume of {}", self.driver.name()))
    }

    /// cStor's `ControllerPublishVolume`: the volume's target accepts the
    /// node as its one initiator, unless another node holds it.
    async fn publish(
        &mut self,
        name: &str,
        va: &VolumeAttachment,
        published: &mut HashMap<String, String>,
    ) -> anyhow::Result<()> {
        self.hold(name, va).await?;
        if va.status.as_ref().is_some_and(|s| s.attached) {
            return Ok(());
        }
        let node = &va.spec.node_name;
        let handle = match self.handle(va).await {
            Ok(h) => h,
            Err(e) => {
                let message = format!("rpc error: code = NotFound desc = {e:#}");
                self.attach_error(name, va, &message).await?;
                bail!("{message}");
            }
        };
        if let Some(holder) = published.get(&handle).filter(|h| *h != node) {
            let message = format!(
                "rpc error: code = FailedPrecondition desc = volume {handle} is published to node {holder}"
            );
            self.attach_error(name, va, &message).await?;
            bail!("{message}");
        }
        let patch = json!({"status": {
            "attached": true,
            "attachmentMetadata": {"iqn": format!("iqn.2016-09.com.openebs.cstor:{handle}"),
                                   "targetPortal": "10.96.0.42:3260"},
            "attachError": Value::Null,
        }});
        self.vas
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.note(&format!("{name}: published {handle} to {node}"));
        published.insert(handle, node.clone());
        Ok(())
    }

    /// cStor's `ControllerUnpublishVolume`: the target lets the node go.
    async fn unpublish(&mut self, name: &str, va: &VolumeAttachment) -> anyhow::Result<()> {
        if self.release(name, va).await? {
            let handle = self.handle(va).await.unwrap_or_default();
            self.note(&format!(
                "{name}: unpublished {handle} from {}",
                va.spec.node_name
            ));
        }
        Ok(())
    }

    async fn attach(&mut self, name: &str, va: &VolumeAttachment) -> anyhow::Result<()> {
        self.hold(name, va).await?;
        let status = va.status.as_ref();
        if status.is_some_and(|s| s.attached) {
            return Ok(());
        }
        let target = match self.target(va).await {
            Ok(t) => t,
            Err(e) => {
                let message = format!("rpc error: code = NotFound desc = {e:#}");
                self.attach_error(name, va, &message).await?;
                bail!("{message}");
            }
        };
        match self.ec2_attach(&target).await {
            Ok(device) => {
                let patch = json!({"status": {
                    "attached": true,
                    "attachmentMetadata": {"devicePath": device},
                    "attachError": Value::Null,
                }});
                self.vas
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                self.note(&format!(
                    "{name}: attached {} to {} at {device} (node {})",
                    target.volume, target.instance, va.spec.node_name
                ));
                self.targets.insert(name.to_owned(), target);
                Ok(())
            }
            Err(ec2_error) => {
                let message = format!(
                    "rpc error: code = Internal desc = Could not attach volume {:?} to node {:?}: {ec2_error}",
                    target.volume, target.instance
                );
                self.attach_error(name, va, &message).await?;
                bail!("{message}");
            }
        }
    }

    /// Records an attach error, once per distinct message.
    async fn attach_error(
        &self,
        name: &str,
        va: &VolumeAttachment,
        message: &str,
    ) -> anyhow::Result<()> {
        let current = va
            .status
            .as_ref()
            .and_then(|s| s.attach_error.as_ref())
            .and_then(|e| e.message.as_deref());
        if current == Some(message) {
            return Ok(());
        }
        let patch = json!({"status": {
            "attached": false,
            "attachError": {"message": message, "time": Time(k8s_openapi::jiff::Timestamp::now())},
        }});
        self.vas
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn detach(&mut self, name: &str, va: &VolumeAttachment) -> anyhow::Result<()> {
        if !holds(va, self.driver.finalizer()) {
            return Ok(());
        }
        let looked_up = self.target(va).await;
        if let Some(target) = &self.target_or_known(name, looked_up) {
            match self.ec2_detach(target).await {
                Ok(true) => self.note(&format!(
                    "{name}: detached {} from {}",
                    target.volume, target.instance
                )),
                Ok(false) => self.note(&format!(
                    "{name}: {} was no longer attached to {}",
                    target.volume, target.instance
                )),
                Err(ec2_error) => {
                    let patch = json!({"status": {"detachError": {
                        "message": format!("rpc error: code = Internal desc = {ec2_error}"),
                        "time": Time(k8s_openapi::jiff::Timestamp::now()),
                    }}});
                    let _ = self
                        .vas
                        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    bail!("detaching {}: {ec2_error}", target.volume);
                }
            }
        }
        self.release(name, va).await?;
        self.targets.remove(name);
        Ok(())
    }

    /// The disk and machine a detach is about: as looked up now, else as
    /// remembered from the attach (the PersistentVolume or the Node may be
    /// gone by now); `None`, noted, when neither is known.
    fn target_or_known(&self, name: &str, looked_up: anyhow::Result<Target>) -> Option<Target> {
        match looked_up {
            Ok(t) => Some(t),
            Err(e) => {
                let known = self.targets.get(name).cloned();
                if known.is_none() {
                    self.note(&format!(
                        "{name}: {e:#}; nothing known to detach, releasing it"
                    ));
                }
                known
            }
        }
    }

    /// The EBS volume (from the PersistentVolume) and the instance (from the
    /// Node's provider id) of a VolumeAttachment.
    async fn target(&self, va: &VolumeAttachment) -> anyhow::Result<Target> {
        let spec = match &va.spec.source.persistent_volume_name {
            Some(pv) => self
                .pvs
                .get(pv)
                .await
                .with_context(|| format!("persistentvolume {pv}"))?
                .spec
                .unwrap_or_default(),
            None => va
                .spec
                .source
                .inline_volume_spec
                .clone()
                .context("the VolumeAttachment names no volume")?,
        };
        let volume = match (&spec.csi, &spec.aws_elastic_block_store) {
            (Some(csi), _) if csi.driver == DRIVER => csi.volume_handle.clone(),
            (_, Some(ebs)) => ebs
                .volume_id
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
            _ => bail!("the volume is not an EBS volume of {DRIVER}"),
        };
        let node_name = &va.spec.node_name;
        let node = self
            .nodes
            .get(node_name)
            .await
            .with_context(|| format!("node {node_name}"))?;
        let provider_id = node
            .spec
            .and_then(|s| s.provider_id)
            .with_context(|| format!("node {node_name} has no providerID"))?;
        let instance = provider_id
            .rsplit('/')
            .next()
            .filter(|id| id.starts_with("i-"))
            .with_context(|| format!("node {node_name}: no instance in {provider_id:?}"))?
            .to_owned();
        Ok(Target { volume, instance })
    }

    /// `ControllerPublishVolume`: the device path, or EC2's error.
    async fn ec2_attach(&self, target: &Target) -> Result<String, String> {
        let out = self
            .ec2
            .describe_volumes()
            .volume_ids(&target.volume)
            .send()
            .await
            .map_err(|e| ec2_message(&e))?;
        let volume = out.volumes().first().ok_or_else(|| {
            format!(
                "InvalidVolume.NotFound: The volume '{}' does not exist.",
                target.volume
            )
        })?;
        let live = |a: &&aws_sdk_ec2::types::VolumeAttachment| {
            matches!(
                a.state(),
                Some(
                    VolumeAttachmentState::Attached
                        | VolumeAttachmentState::Attaching
                        | VolumeAttachmentState::Busy
                ) | None
            )
        };
        if let Some(a) = volume.attachments().iter().find(live) {
            if a.instance_id() == Some(target.instance.as_str()) {
                return Ok(a.device().unwrap_or_default().to_owned());
            }
            return Err(format!(
                "VolumeInUse: {} is already attached to an instance",
                target.volume
            ));
        }
        let device = self.free_device(&target.instance).await?;
        self.ec2
            .attach_volume()
            .volume_id(&target.volume)
            .instance_id(&target.instance)
            .device(&device)
            .send()
            .await
            .map_err(|e| ec2_message(&e))?;
        Ok(device)
    }

    /// A device name not used on the instance: `/dev/xvdba` .. `/dev/xvdbz`.
    async fn free_device(&self, instance: &str) -> Result<String, String> {
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(instance)
            .send()
            .await
            .map_err(|e| ec2_message(&e))?;
        let used: Vec<String> = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .flat_map(|i| i.block_device_mappings())
            .filter_map(|m| m.device_name().map(str::to_owned))
            .collect();
        ('a'..='z')
            .map(|c| format!("/dev/xvdb{c}"))
            .find(|d| !used.contains(d))
            .ok_or_else(|| format!("AttachmentLimitExceeded: no free device on {instance}"))
    }

    /// `ControllerUnpublishVolume`: true when it detached, false when the
    /// volume was not attached to the instance any more.
    async fn ec2_detach(&self, target: &Target) -> Result<bool, String> {
        let out = self
            .ec2
            .describe_volumes()
            .volume_ids(&target.volume)
            .send()
            .await;
        let attached_here = match &out {
            Ok(out) => out.volumes().first().is_some_and(|v| {
                v.attachments()
                    .iter()
                    .any(|a| a.instance_id() == Some(target.instance.as_str()))
            }),
            Err(e) if e.code() == Some("InvalidVolume.NotFound") => false,
            Err(e) => return Err(ec2_message(e)),
        };
        if !attached_here {
            return Ok(false);
        }
        match self
            .ec2
            .detach_volume()
            .volume_id(&target.volume)
            .instance_id(&target.instance)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.code(),
                    Some("IncorrectState" | "InvalidAttachment.NotFound")
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(ec2_message(&e)),
        }
    }
}

/// A deleted PD VolumeAttachment whose disk the VM still lists.
#[derive(Debug)]
struct Waiting(String);

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Waiting {}

impl Attacher {
    /// The PD CSI driver's `ControllerPublishVolume` against the fake.
    async fn pd_attach(&mut self, name: &str, va: &VolumeAttachment) -> anyhow::Result<()> {
        self.hold(name, va).await?;
        if va.status.as_ref().is_some_and(|s| s.attached) {
            return Ok(());
        }
        let target = match self.pd_target(va).await {
            Ok(t) => t,
            Err(e) => {
                let message = format!("rpc error: code = NotFound desc = {e:#}");
                self.attach_error(name, va, &message).await?;
                bail!("{message}");
            }
        };
        let state = self.compute.state().await?;
        let users = users_in(&state, &target.volume).unwrap_or_default();
        let refusal = if users.contains(&target.instance) {
            None
        } else if let Some(holder) = users.first() {
            Some(format!(
                "The disk resource '{}' is already being used by '{holder}'",
                target.volume
            ))
        } else {
            self.compute
                .attach(&target.instance, &target.volume)
                .await
                .err()
                .map(|e| format!("{e:#}"))
        };
        if let Some(why) = refusal {
            let message = format!(
                "rpc error: code = Internal desc = Failed to Attach: failed cloud service attach                  disk call: {why}"
            );
            self.attach_error(name, va, &message).await?;
            bail!("{message}");
        }
        let patch = json!({"status": {"attached": true, "attachError": Value::Null}});
        self.vas
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.note(&format!(
            "{name}: attached {} to {} (node {})",
            target.volume, target.instance, va.spec.node_name
        ));
        self.targets.insert(name.to_owned(), target);
        Ok(())
    }

    /// `ControllerUnpublishVolume`, as the stand-in plays it: released once
    /// the VM no longer lists the disk (see the module's notes).
    async fn pd_detach(&mut self, name: &str, va: &VolumeAttachment) -> anyhow::Result<()> {
        if !holds(va, self.driver.finalizer()) {
            return Ok(());
        }
        let looked_up = self.pd_target(va).await;
        if let Some(target) = &self.target_or_known(name, looked_up) {
            let users = users_in(&self.compute.state().await?, &target.volume).unwrap_or_default();
            if users.contains(&target.instance) {
                return Err(Waiting(format!(
                    "waiting for {} to let {} go",
                    target.instance, target.volume
                ))
                .into());
            }
            self.note(&format!(
                "{name}: {} no longer lists {}",
                target.instance, target.volume
            ));
        }
        self.release(name, va).await?;
        self.targets.remove(name);
        Ok(())
    }

    /// The disk (its PD CSI volume handle, from the PersistentVolume) and
    /// the VM (its path, from the Node's provider id) of a VolumeAttachment.
    async fn pd_target(&self, va: &VolumeAttachment) -> anyhow::Result<Target> {
        let volume = self.handle(va).await?;
        let node_name = &va.spec.node_name;
        let node = self
            .nodes
            .get(node_name)
            .await
            .with_context(|| format!("node {node_name}"))?;
        let provider_id = node
            .spec
            .and_then(|s| s.provider_id)
            .with_context(|| format!("node {node_name} has no providerID"))?;
        let parts: Vec<&str> = provider_id
            .strip_prefix("gce://")
            .map(|rest| rest.split('/').collect())
            .unwrap_or_default();
        let [project, zone, vm] = parts[..] else {
            bail!("node {node_name}: no VM in {provider_id:?}");
        };
        Ok(Target {
            volume,
            instance: format!("projects/{project}/zones/{zone}/instances/{vm}"),
        })
    }
}

fn ec2_message<E>(err: &aws_sdk_ec2::error::SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match (err.code(), err.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        _ => format!("{err}"),
    }
}

/// True when the attachment carries this finalizer: the stand-in holds it,
/// and only it may release it.
fn holds(va: &VolumeAttachment, finalizer: &str) -> bool {
    va.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == finalizer))
}
