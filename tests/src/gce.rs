//! The fake Compute Engine (`tests/gce/fake_compute.py`) as a process of the
//! harness, and a small typed client of its control API (`/_fake/*`).
//!
//! No Compute Engine emulator exists; the fake serves the REST subset
//! node-fencer calls and is held to Google's description of the API by its
//! own checks (`make gce-test`). It needs only Python's standard library. It
//! is started once per test process, beside the controller stack (the real
//! PD CSI driver of [`crate::attacher`] calls it), and stopped when the
//! process exits. Its log is `STATE_DIR/logs/fake-compute-<pid>.log`.
//!
//! The scenes seed it through the control API; node-fencer reaches its API
//! through `COMPUTE_ENDPOINT` (plain http: anonymous credentials). The PD CSI
//! driver calls the same API (attachDisk, detachDisk, instances and disks);
//! `/_fake/requests` records each request's User-Agent, which tells the two
//! apart ([`Served::by_pd_driver`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::repo_root;

/// The project of the scenes' VMs and disks.
pub const PROJECT: &str = "proj-fencer";
/// The zone of the scenes' VMs and disks.
pub const ZONE: &str = "us-central1-a";
/// The Persistent Disk CSI driver.
pub const PD_DRIVER: &str = "pd.csi.storage.gke.io";
/// The Node annotation GKE sets to the VM's numeric id.
pub const INSTANCE_ID_ANNOTATION: &str = "container.googleapis.com/instance_id";
/// The PD CSI driver's topology key.
pub const PD_TOPOLOGY_KEY: &str = "topology.gke.io/zone";
/// How Compute Engine links its resources.
const LINK_BASE: &str = "https://www.googleapis.com/compute/v1/";

/// The running fake.
#[derive(Debug)]
pub struct FakeCompute {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl FakeCompute {
    /// What `COMPUTE_ENDPOINT` is set to: the client appends `/compute/v1/...`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A client of its control API.
    pub fn client(&self) -> Compute {
        Compute { port: self.port }
    }

    /// node-fencer's Compute Engine shell, pointed at it.
    pub async fn shell(&self) -> anyhow::Result<node_fencer::shell::cloud::gce::Gce> {
        node_fencer::shell::cloud::gce::Gce::new(&node_fencer::shell::cloud::gce::GceEndpoint {
            url: Some(self.endpoint()),
            timeouts: Default::default(),
        })
        .await
        .map_err(anyhow::Error::msg)
    }
}

static FAKE: OnceLock<Result<FakeCompute, String>> = OnceLock::new();

/// The fake of this process, started on first use with its log in `dir`.
pub(crate) fn started_fake(dir: &Path) -> anyhow::Result<&'static FakeCompute> {
    FAKE.get_or_init(|| start(dir).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("the fake Compute Engine is not available: {e}"))
}

/// The fake Compute Engine beside the controller stack (started with it).
///
/// # Panics
/// When it cannot be started: the message says why.
pub fn fake_compute() -> &'static FakeCompute {
    fake_compute_on(crate::cluster::cluster_stack())
}

/// The fake Compute Engine of this process, started beside `stack` (its
/// log in that stack's directory) unless it already runs: the in-process
/// tests need no controllers.
///
/// # Panics
/// When it cannot be started: the message says why.
pub fn fake_compute_on(stack: &crate::Stack) -> &'static FakeCompute {
    match started_fake(&stack.dir) {
        Ok(fake) => fake,
        Err(e) => panic!("{e:#}"),
    }
}

/// Starts `python3 tests/gce/fake_compute.py --port 0` in its own session,
/// beside a shell that ends the group once this process is gone (as the
/// Lambda emulator is run), and reads the port it prints.
fn start(dir: &Path) -> anyhow::Result<FakeCompute> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let pid = std::process::id();
    let log = logs.join(format!("fake-compute-{pid}.log"));
    let port_file = dir.join(format!("fake-compute-{pid}.port"));
    let _ = std::fs::remove_file(&port_file);
    let script = repo_root().join("tests/gce/fake_compute.py");
    let shell = format!(
        "python3 '{script}' --port 0 >'{port}' 2>>'{log}' & \
         while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -- -$$",
        script = script.display(),
        port = port_file.display(),
        log = log.display(),
    );
    Command::new("setsid")
        .arg("bash")
        .arg("-c")
        .arg(shell)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the fake Compute Engine (setsid bash)")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&port_file).unwrap_or_default();
        if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
            let port = line
                .trim()
                .parse()
                .with_context(|| format!("the fake printed {line:?}, not a port"))?;
            return Ok(FakeCompute { port, log });
        }
        if Instant::now() > deadline {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "python3 tests/gce/fake_compute.py printed no port within 30 s (is python3 on \
                 PATH?); its log {}:\n{err}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A VM in the fake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vm {
    /// Its project.
    pub project: String,
    /// Its zone.
    pub zone: String,
    /// Its name (also its Node's name, as on GKE).
    pub name: String,
    /// Its numeric id (a new one when it is recreated).
    pub id: String,
    /// Its boot disk, as a PD CSI volume handle names it.
    pub boot_disk: String,
    /// The boot disk's device name.
    pub boot_device: String,
}

impl Vm {
    /// The Node `spec.providerID` for it.
    pub fn provider_id(&self) -> String {
        format!("gce://{}/{}/{}", self.project, self.zone, self.name)
    }

    /// Its path: `projects/P/zones/Z/instances/N` (also the PD CSI node id).
    pub fn path(&self) -> String {
        format!(
            "projects/{}/zones/{}/instances/{}",
            self.project, self.zone, self.name
        )
    }

    /// Its `selfLink`, as a disk's `users` name it.
    pub fn self_link(&self) -> String {
        format!("{LINK_BASE}{}", self.path())
    }

    fn from_json(v: &Value) -> anyhow::Result<Self> {
        let text = |k: &str| {
            v[k].as_str()
                .map(str::to_owned)
                .with_context(|| format!("the fake's instance has no {k}: {v}"))
        };
        let zone_link = text("zone")?;
        let self_link = text("selfLink")?;
        let path = self_link
            .strip_prefix(LINK_BASE)
            .with_context(|| format!("selfLink {self_link}"))?;
        let project = path
            .split('/')
            .nth(1)
            .with_context(|| format!("selfLink {self_link}"))?;
        let boot = v["disks"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["boot"] == json!(true)))
            .with_context(|| format!("the fake's instance has no boot disk: {v}"))?;
        let boot_source = boot["source"].as_str().unwrap_or_default();
        Ok(Self {
            project: project.to_owned(),
            zone: zone_link.rsplit('/').next().unwrap_or_default().to_owned(),
            name: text("name")?,
            id: text("id")?,
            boot_disk: boot_source
                .strip_prefix(LINK_BASE)
                .unwrap_or(boot_source)
                .to_owned(),
            boot_device: boot["deviceName"].as_str().unwrap_or_default().to_owned(),
        })
    }
}

/// The PD CSI volume handle of a zonal disk.
pub fn disk_handle(project: &str, zone: &str, name: &str) -> String {
    format!("projects/{project}/zones/{zone}/disks/{name}")
}

/// One request the fake served on its API.
#[derive(Clone, Debug, Deserialize)]
pub struct Served {
    /// HTTP method.
    pub method: String,
    /// Path (`/compute/v1/projects/...`).
    pub path: String,
    /// Query parameters.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// The discovery method (`compute.instances.detachDisk`), if a route matched.
    pub method_id: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    /// The request's User-Agent.
    #[serde(default)]
    pub user_agent: Option<String>,
}

/// How the PD CSI driver names itself in its User-Agent (after Google's Go
/// client's own name).
pub const PD_DRIVER_AGENT: &str = "GCE CSI Driver/";

impl Served {
    /// Whether the PD CSI driver sent it (through the external-attacher),
    /// not node-fencer.
    pub fn by_pd_driver(&self) -> bool {
        self.user_agent
            .as_deref()
            .is_some_and(|a| a.contains(PD_DRIVER_AGENT))
    }

    /// Whether it was a call of `method` (e.g. `instances.detachDisk`) on `vm`.
    pub fn is(&self, method: &str, vm: &Vm) -> bool {
        self.method_id.as_deref() == Some(&format!("compute.{method}"))
            && (self.path.ends_with(&format!("/{}", vm.path()))
                || self.path.contains(&format!("/{}/", vm.path())))
    }
}

/// A client of the fake's control API.
#[derive(Clone, Debug)]
pub struct Compute {
    port: u16,
}

impl Compute {
    /// One HTTP/1.1 exchange (the connection closed after it): status and
    /// JSON body.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))
            .await
            .context("connecting to the fake Compute Engine")?;
        let payload = body.map(Value::to_string).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            payload.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(payload.as_bytes()).await?;
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
            .await
            .context("the fake Compute Engine did not answer within 30 s")??;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .with_context(|| format!("no HTTP answer from the fake: {text:?}"))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status in {head:?}"))?;
        let value = serde_json::from_str(body).with_context(|| format!("not JSON: {body:?}"))?;
        Ok((status, value))
    }

    /// A control action; an error carries the fake's message.
    async fn control(&self, action: &str, args: Value) -> anyhow::Result<Value> {
        let (status, body) = self
            .call("POST", &format!("/_fake/{action}"), Some(&args))
            .await?;
        if status != 200 {
            bail!(
                "{}",
                body["error"]
                    .as_str()
                    .map_or_else(|| body.to_string(), str::to_owned)
            );
        }
        Ok(body)
    }

    /// A running VM with its boot disk (device `persistent-disk-0`) and no
    /// data disk.
    pub async fn create_instance(&self, zone: &str, name: &str) -> anyhow::Result<Vm> {
        let v = self
            .control(
                "create_instance",
                json!({"project": PROJECT, "zone": zone, "name": name}),
            )
            .await?;
        Vm::from_json(&v)
    }

    /// An empty zonal disk (10 GB); returns its PD CSI volume handle.
    pub async fn create_disk(&self, zone: &str, name: &str) -> anyhow::Result<String> {
        self.control(
            "create_disk",
            json!({"project": PROJECT, "name": name, "zone": zone}),
        )
        .await?;
        Ok(disk_handle(PROJECT, zone, name))
    }

    /// Attaches the disk (a PD CSI volume handle) read-write, under its own
    /// name as device name, as the PD CSI driver does; the error is the
    /// fake's refusal, in Compute Engine's words.
    pub async fn attach_disk(&self, vm: &Vm, handle: &str) -> anyhow::Result<()> {
        self.attach(&vm.path(), handle).await
    }

    /// [`Compute::attach_disk`] to the VM of that path
    /// (`projects/P/zones/Z/instances/N`).
    pub async fn attach(&self, instance: &str, handle: &str) -> anyhow::Result<()> {
        let parts: Vec<&str> = instance.split('/').collect();
        let ["projects", project, "zones", zone, "instances", name] = parts[..] else {
            bail!("{instance:?} is not projects/P/zones/Z/instances/N");
        };
        self.control(
            "attach_disk",
            json!({"project": project, "zone": zone, "name": name, "disk": handle}),
        )
        .await?;
        Ok(())
    }

    /// Sets the VM's status (`TERMINATED`, `SUSPENDED`, `RUNNING`, ...), as
    /// the platform would.
    pub async fn set_status(&self, vm: &Vm, status: &str) -> anyhow::Result<()> {
        self.control(
            "set_status",
            json!({"project": vm.project, "zone": vm.zone, "name": vm.name, "status": status}),
        )
        .await?;
        Ok(())
    }

    /// How long the fake's operations take from now on (its default: 0.5 s).
    pub async fn set_operation_delay(&self, seconds: f64) -> anyhow::Result<()> {
        self.control("configure", json!({ "operation_delay": seconds }))
            .await?;
        Ok(())
    }

    /// Asks `instances.detachDisk` of the device on the VM through the
    /// fake's API, as another client would (the PD CSI driver's
    /// `ControllerUnpublishVolume`); returns the operation's name.
    pub async fn detach_disk(&self, vm: &Vm, device: &str) -> anyhow::Result<String> {
        let path = format!("/compute/v1/{}/detachDisk?deviceName={device}", vm.path());
        let (status, body) = self.call("POST", &path, None).await?;
        if status != 200 {
            bail!("POST {path}: {status} {body}");
        }
        body["name"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("POST {path}: no operation in {body}"))
    }

    /// From now on `testIamPermissions` denies these permissions to every
    /// caller; an empty list grants everything again.
    pub async fn deny_permissions(&self, permissions: &[&str]) -> anyhow::Result<()> {
        self.control("deny_permissions", json!({ "permissions": permissions }))
            .await?;
        Ok(())
    }

    /// Deletes the VM; its boot disk goes with it, its data disks are freed.
    pub async fn delete_instance(&self, vm: &Vm) -> anyhow::Result<()> {
        self.control(
            "delete_instance",
            json!({"project": vm.project, "zone": vm.zone, "name": vm.name}),
        )
        .await?;
        Ok(())
    }

    /// Deletes the VM and creates one of the same name with `status`, its
    /// data disks attached again: a new id, as a managed instance group's
    /// recreation gives.
    pub async fn recreate_instance(&self, vm: &Vm, status: &str) -> anyhow::Result<Vm> {
        let v = self
            .control(
                "recreate_instance",
                json!({"project": vm.project, "zone": vm.zone, "name": vm.name, "status": status}),
            )
            .await?;
        Vm::from_json(&v)
    }

    /// Every instance, disk and operation.
    pub async fn state(&self) -> anyhow::Result<Value> {
        let (status, body) = self.call("GET", "/_fake/state", None).await?;
        if status != 200 {
            bail!("GET /_fake/state: {status} {body}");
        }
        Ok(body)
    }

    /// A Pub/Sub topic of the fake's (`tests/gce/fake_pubsub.py`): its full
    /// name, `projects/PROJECT/topics/NAME`.
    pub async fn create_topic(&self, name: &str) -> anyhow::Result<String> {
        let topic = self
            .control("create_topic", json!({"project": PROJECT, "topic": name}))
            .await?;
        topic["name"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no topic name in {topic}"))
    }

    /// The next `count` Pub/Sub publish calls answer `status`.
    pub async fn inject_publish_fault(&self, status: u16, count: u32) -> anyhow::Result<()> {
        self.control(
            "inject_publish_fault",
            json!({"status": status, "count": count}),
        )
        .await
        .map(drop)
    }

    /// The messages published to `topic`, their data decoded (`text`).
    pub async fn published(&self, topic: &str) -> anyhow::Result<Vec<Value>> {
        let (status, body) = self.call("GET", "/_fake/published", None).await?;
        if status != 200 {
            bail!("GET /_fake/published: {status} {body}");
        }
        Ok(body[topic].as_array().cloned().unwrap_or_default())
    }

    /// The instance of that path (`projects/P/zones/Z/instances/N`) as the
    /// fake holds it now, if it exists.
    pub async fn instance(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let link = format!("{LINK_BASE}{path}");
        Ok(self.state().await?["instances"]
            .as_array()
            .and_then(|all| all.iter().find(|i| i["selfLink"] == json!(link)))
            .cloned())
    }

    /// The instances (paths) a disk is attached to, by its handle; `None`
    /// when no such disk exists.
    pub async fn disk_users(&self, handle: &str) -> anyhow::Result<Option<Vec<String>>> {
        Ok(users_in(&self.state().await?, handle))
    }

    /// The requests the fake served on its API, in order.
    pub async fn requests(&self) -> anyhow::Result<Vec<Served>> {
        let (status, body) = self.call("GET", "/_fake/requests", None).await?;
        if status != 200 {
            bail!("GET /_fake/requests: {status} {body}");
        }
        Ok(serde_json::from_value(body)?)
    }

    /// The detach operations the fake carried out, or is carrying out, on
    /// the VM: one per disk however often the same detach was asked (the
    /// same request id is the same operation).
    pub async fn detach_operations(&self, vm: &Vm) -> anyhow::Result<usize> {
        let state = self.state().await?;
        Ok(state["operations"].as_array().map_or(0, |ops| {
            ops.iter()
                .filter(|op| {
                    op["operationType"] == json!("detachDisk")
                        && op["targetLink"] == json!(vm.self_link())
                })
                .count()
        }))
    }

    /// The `instances.stop` requests the fake served for the VM's name.
    pub async fn stop_requests(&self, vm: &Vm) -> anyhow::Result<Vec<Served>> {
        Ok(self
            .requests()
            .await?
            .into_iter()
            .filter(|r| r.is("instances.stop", vm))
            .collect())
    }

    /// The stop operations the fake carried out, or is carrying out, on the
    /// VM: one however often the same stop was asked (the same request id
    /// is the same operation).
    pub async fn stop_operations(&self, vm: &Vm) -> anyhow::Result<usize> {
        let state = self.state().await?;
        Ok(state["operations"].as_array().map_or(0, |ops| {
            ops.iter()
                .filter(|op| op["operationType"] == json!("stop") && op["targetId"] == json!(vm.id))
                .count()
        }))
    }

    /// The VM's status as the fake holds it now.
    pub async fn status(&self, vm: &Vm) -> anyhow::Result<Option<String>> {
        Ok(self
            .instance(&vm.path())
            .await?
            .and_then(|i| i["status"].as_str().map(str::to_owned)))
    }

    /// The next `count` requests to the discovery method `method_id` are
    /// answered `status` (429, 500 or 503), as Compute Engine does under load.
    pub async fn inject_fault(
        &self,
        method_id: &str,
        status: u16,
        count: u32,
    ) -> anyhow::Result<()> {
        self.control(
            "inject_fault",
            json!({"method_id": method_id, "status": status, "count": count}),
        )
        .await?;
        Ok(())
    }

    /// node-fencer's `instances.detachDisk` requests for the VM: the PD CSI
    /// driver's own (its `ControllerUnpublishVolume` of a disk the VM still
    /// lists) are left out, told apart by their User-Agent.
    pub async fn detach_requests(&self, vm: &Vm) -> anyhow::Result<Vec<Served>> {
        Ok(self
            .requests()
            .await?
            .into_iter()
            .filter(|r| r.is("instances.detachDisk", vm) && !r.by_pd_driver())
            .collect())
    }

    /// The PD CSI driver's `instances.detachDisk` requests for the VM.
    pub async fn driver_detach_requests(&self, vm: &Vm) -> anyhow::Result<Vec<Served>> {
        Ok(self
            .requests()
            .await?
            .into_iter()
            .filter(|r| r.is("instances.detachDisk", vm) && r.by_pd_driver())
            .collect())
    }
}

/// The users (instance paths) of the disk of `handle` in a state dump.
pub fn users_in(state: &Value, handle: &str) -> Option<Vec<String>> {
    let link = format!("{LINK_BASE}{handle}");
    let disk = state["disks"]
        .as_array()?
        .iter()
        .find(|d| d["selfLink"] == json!(link))?;
    Some(
        disk["users"]
            .as_array()
            .map(|u| {
                u.iter()
                    .filter_map(Value::as_str)
                    .map(|l| l.strip_prefix(LINK_BASE).unwrap_or(l).to_owned())
                    .collect()
            })
            .unwrap_or_default(),
    )
}
