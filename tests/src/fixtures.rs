//! Scene building on the real components: EC2 instances and volumes in moto,
//! Nodes, PersistentVolumes and VolumeAttachments in the API server.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::{Context, anyhow};
use aws_sdk_ec2::types::{Filter, InstanceType};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use node_fencer::core::inbound::suspect::Batch;
use node_fencer::core::model::facts::CsiVolume;
use node_fencer::core::model::instance::EBS_CSI_DRIVER;
use node_fencer::core::model::kube_read::{ANNOTATION_CONTROLLER_MANAGED, csi_unique_name};
use node_fencer::core::outbound::metrics::{Measured, Meter};
use node_fencer::core::outbound::report::Report;
use node_fencer::core::rules::volumes::attachment_name;
use node_fencer::core::settings::policy::Policy;
use node_fencer::pipeline::{self, Ctx};
use node_fencer::shell::cloud::Cloud;
use node_fencer::shell::cloud::aws::Ec2;
use node_fencer::shell::cluster::{Cluster, ClusterReads, Kube};

use crate::gce::{Compute, PD_DRIVER, Vm, ZONE};
use crate::{NodeCleanup, Stack};

static COUNTER: AtomicU32 = AtomicU32::new(1);

/// A name unique within this process (and across processes, by pid).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id() % 100_000)
}

/// A unique private address for a Node.
pub fn unique_ip() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff)
}

/// An EC2 instance in moto, or a VM in the fake Compute Engine.
#[derive(Clone, Debug)]
pub struct Machine {
    /// Instance id; for a VM, its provider id (`gce://P/Z/N`), as
    /// node-fencer names the machine in its report.
    pub instance: String,
    /// Its root EBS volume (a VM's boot disk, as a PD volume handle).
    pub root_volume: String,
    /// Its root device name (a VM's boot device name).
    pub root_device: String,
    /// Its private DNS name (a VM's name).
    pub private_dns: String,
    /// Its availability zone (a VM's zone).
    pub az: String,
    /// Its primary private address, where the cloud gave one (an EC2
    /// instance's): what its kubelet reports as the Node's InternalIP.
    pub private_ip: Option<String>,
    /// The Compute Engine VM, when it is one.
    pub vm: Option<Vm>,
}

impl Machine {
    /// The Node `spec.providerID` for it.
    pub fn provider_id(&self) -> String {
        match &self.vm {
            Some(vm) => vm.provider_id(),
            None => format!("aws:///{}/{}", self.az, self.instance),
        }
    }

    /// The machine of a BMC's System, as the inventory names it
    /// (`redfish://NAME`): no disks of its own, no zone of a cloud.
    pub fn of_system(name: &str) -> Self {
        Self {
            instance: format!("redfish://{name}"),
            root_volume: String::new(),
            root_device: String::new(),
            private_dns: name.to_owned(),
            az: "rack-1".to_owned(),
            private_ip: None,
            vm: None,
        }
    }

    /// True for a BMC's System.
    pub fn is_system(&self) -> bool {
        self.instance.starts_with("redfish://")
    }

    /// The machine of a Compute Engine VM.
    pub fn of_vm(vm: Vm) -> Self {
        Self {
            instance: vm.provider_id(),
            root_volume: vm.boot_disk.clone(),
            root_device: vm.boot_device.clone(),
            private_dns: vm.name.clone(),
            az: vm.zone.clone(),
            private_ip: None,
            vm: Some(vm),
        }
    }
}

/// An AMI id; moto's images are the same on every server, and listing them
/// is its slowest call, so the answer is kept.
async fn any_ami(ec2: &aws_sdk_ec2::Client) -> anyhow::Result<String> {
    static AMI: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    AMI.get_or_try_init(|| async {
        let images = ec2.describe_images().send().await?;
        images
            .images()
            .iter()
            .filter_map(|i| i.image_id())
            .next()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("moto offers no AMI"))
    })
    .await
    .cloned()
}

/// Launches `n` running instances, as few calls as moto takes; their ids,
/// in launch order.
pub async fn launch_many(ec2: &aws_sdk_ec2::Client, n: usize) -> anyhow::Result<Vec<String>> {
    let ami = any_ami(ec2).await?;
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let k = (n - ids.len()).min(500) as i32;
        let out = ec2
            .run_instances()
            .image_id(&ami)
            .instance_type(InstanceType::M5Large)
            .min_count(k)
            .max_count(k)
            .send()
            .await?;
        ids.extend(
            out.instances()
                .iter()
                .filter_map(|i| i.instance_id())
                .map(str::to_owned),
        );
    }
    Ok(ids)
}

/// Launches a running instance with its root volume.
pub async fn launch(ec2: &aws_sdk_ec2::Client) -> anyhow::Result<Machine> {
    let ami = any_ami(ec2).await?;
    let out = ec2
        .run_instances()
        .image_id(ami)
        .instance_type(InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .send()
        .await?;
    let inst = out.instances().first().context("no instance launched")?;
    let id = inst.instance_id().context("no id")?.to_owned();
    let root_device = inst.root_device_name().unwrap_or("/dev/sda1").to_owned();
    let root_volume = inst
        .block_device_mappings()
        .iter()
        .find(|m| m.device_name() == Some(root_device.as_str()))
        .and_then(|m| m.ebs())
        .and_then(|e| e.volume_id())
        .context("no root volume")?
        .to_owned();
    Ok(Machine {
        instance: id,
        root_volume,
        root_device,
        private_dns: inst.private_dns_name().unwrap_or_default().to_owned(),
        az: inst
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or("us-east-1a")
            .to_owned(),
        private_ip: inst.private_ip_address().map(str::to_owned),
        vm: None,
    })
}

/// Creates a data volume and attaches it to the machine at `device`.
pub async fn attach_new_volume(
    ec2: &aws_sdk_ec2::Client,
    m: &Machine,
    device: &str,
) -> anyhow::Result<String> {
    let vol = create_volume(ec2, &m.az).await?;
    ec2.attach_volume()
        .volume_id(&vol)
        .instance_id(&m.instance)
        .device(device)
        .send()
        .await?;
    Ok(vol)
}

/// Creates an empty EBS volume in the zone (`available`).
pub async fn create_volume(ec2: &aws_sdk_ec2::Client, az: &str) -> anyhow::Result<String> {
    Ok(ec2
        .create_volume()
        .availability_zone(az)
        .size(10)
        .send()
        .await?
        .volume_id()
        .context("no volume id")?
        .to_owned())
}

/// Stops the instance.
pub async fn stop(ec2: &aws_sdk_ec2::Client, m: &Machine) -> anyhow::Result<()> {
    ec2.stop_instances()
        .instance_ids(&m.instance)
        .send()
        .await?;
    Ok(())
}

/// The state EC2 reports for the instance (`running`, `stopped`, ...);
/// empty when it reports none.
pub async fn instance_state(ec2: &aws_sdk_ec2::Client, id: &str) -> anyhow::Result<String> {
    let out = ec2.describe_instances().instance_ids(id).send().await?;
    let state = out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find_map(|i| i.state()?.name().map(|n| n.as_str().to_owned()));
    Ok(state.unwrap_or_default())
}

/// The volume's state and the instances it is attached to.
pub async fn volume(ec2: &aws_sdk_ec2::Client, id: &str) -> anyhow::Result<(String, Vec<String>)> {
    let out = ec2
        .describe_volumes()
        .filters(Filter::builder().name("volume-id").values(id).build())
        .send()
        .await?;
    let v = out.volumes().first().context("volume not found")?;
    Ok((
        v.state().map(|s| s.as_str().to_owned()).unwrap_or_default(),
        v.attachments()
            .iter()
            .filter_map(|a| a.instance_id().map(str::to_owned))
            .collect(),
    ))
}

/// How a test Node looks.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Name.
    pub name: String,
    /// `spec.providerID`.
    pub provider_id: Option<String>,
    /// `Ready` condition status: `True`, `False` or `Unknown`.
    pub ready: &'static str,
    /// InternalIP.
    pub ip: String,
    /// InternalDNS / Hostname.
    pub hostname: Option<String>,
    /// Initial taints.
    pub taints: Vec<Value>,
}

impl NodeSpec {
    /// A NotReady-by-silence node (`Ready=Unknown`) for a machine.
    pub fn for_machine(m: &Machine) -> Self {
        Self {
            name: unique("node"),
            provider_id: Some(m.provider_id()),
            ready: "Unknown",
            ip: m.private_ip.clone().unwrap_or_else(unique_ip),
            hostname: None,
            taints: vec![json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"})],
        }
    }
}

/// Creates the Node and sets its status.
pub async fn create_node(admin: &Client, spec: &NodeSpec) -> anyhow::Result<Node> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": spec.name, "labels": {"node-fencer.io/test": "true"}},
        "spec": {"providerID": spec.provider_id, "taints": spec.taints}
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let mut addresses = vec![json!({"type": "InternalIP", "address": spec.ip})];
    if let Some(h) = &spec.hostname {
        addresses.push(json!({"type": "InternalDNS", "address": h}));
        addresses.push(json!({"type": "Hostname", "address": h}));
    }
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": spec.ready, "reason": "Test",
                        "lastHeartbeatTime": "2026-11-22T10:00:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z"}],
        "addresses": addresses
    }});
    Ok(nodes
        .patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&status))
        .await?)
}

/// Reads a Node.
pub async fn get_node(admin: &Client, name: &str) -> anyhow::Result<Node> {
    Ok(Api::<Node>::all(admin.clone()).get(name).await?)
}

/// The node's taints as `key:effect` strings.
pub fn taints(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

/// Creates a CSI PersistentVolume for an EBS volume.
pub async fn create_pv(admin: &Client, name: &str, volume: &str) -> anyhow::Result<()> {
    create_pv_with(
        admin,
        name,
        json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": volume}}),
    )
    .await
}

/// Creates a PersistentVolume with the given source (e.g. in-tree, another driver).
pub async fn create_pv_with(admin: &Client, name: &str, source: Value) -> anyhow::Result<()> {
    let mut spec = json!({
        "capacity": {"storage": "10Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain"
    });
    if let (Some(spec), Some(src)) = (spec.as_object_mut(), source.as_object()) {
        spec.extend(src.clone());
    }
    let pv: PersistentVolume =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await?;
    Ok(())
}

/// Creates a VolumeAttachment of `pv` to `node` by `attacher`.
pub async fn create_va(
    admin: &Client,
    node: &str,
    pv: &str,
    attacher: &str,
) -> anyhow::Result<String> {
    create_va_named(admin, &unique("csi"), node, pv, attacher).await
}

/// Creates the VolumeAttachment `name` of `pv` to `node` by `attacher`.
pub async fn create_va_named(
    admin: &Client,
    name: &str,
    node: &str,
    pv: &str,
    attacher: &str,
) -> anyhow::Result<String> {
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": attacher, "nodeName": node, "source": {"persistentVolumeName": pv}}
    }))?;
    Api::<VolumeAttachment>::all(admin.clone())
        .create(&PostParams::default(), &va)
        .await?;
    Ok(name.into())
}

/// Records `volumes` (EBS volume ids) on the Node as a kubelet and the
/// attach/detach controller do: the annotation that the controller manages
/// its attachments, and the volumes in `status.volumesAttached`.
pub async fn record_volumes(admin: &Client, node: &str, volumes: &[&str]) -> anyhow::Result<()> {
    let volumes: Vec<CsiVolume> = volumes.iter().map(|v| ebs(v)).collect();
    record_csi_volumes(admin, node, &volumes).await
}

/// [`record_volumes`] for CSI volumes of any driver.
async fn record_csi_volumes(
    admin: &Client,
    node: &str,
    volumes: &[CsiVolume],
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let annotate = json!({"metadata": {"annotations": {ANNOTATION_CONTROLLER_MANAGED: "true"}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&annotate))
        .await?;
    let attached: Vec<Value> = volumes
        .iter()
        .map(|v| json!({"name": csi_unique_name(v), "devicePath": ""}))
        .collect();
    let status = json!({"status": {"volumesAttached": attached}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// The EBS volume `volume` as a CSI volume.
fn ebs(volume: &str) -> CsiVolume {
    CsiVolume {
        driver: EBS_CSI_DRIVER.into(),
        handle: volume.into(),
    }
}

/// The name Kubernetes gives the attachment of EBS volume `volume` to `node`.
pub fn ebs_attachment_name(volume: &str, node: &str) -> String {
    attachment_name(&ebs(volume), node)
}

/// Sets the Node's `Ready` condition, as a kubelet would, transition time now.
pub async fn set_ready(admin: &Client, node: &str, status: &str) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    Api::<Node>::all(admin.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

/// Deletes the test Nodes (best effort), so later tests see a clean cap.
pub async fn delete_nodes(admin: &Client, names: &[&str]) {
    let nodes: Api<Node> = Api::all(admin.clone());
    for name in names {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
}

/// The taint node-fencer applies, as [`taints`] lists it (`key:effect`);
/// `the_harness_names_the_taint_the_code_applies` ties it to the code's constants.
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service:NoExecute";

/// The policy of the in-process tests: room under the cap, no dry run, no
/// settle delay, detached volumes looked at every 100 ms for up to 10 s.
pub fn settings() -> Policy {
    Policy {
        dry_run: false,
        max_out_of_service: 1000,
        recovery_settle: Duration::ZERO,
        detach_wait: Duration::from_secs(10),
        // Nothing turns a Node NotReady on the bare stack but a test.
        not_ready_wait: Duration::ZERO,
        poll_interval: Duration::from_millis(100),
        ..Policy::default()
    }
}

/// Runs the pipeline in-process against the stack, as node-fencer (restricted RBAC).
pub async fn fence(stack: &Stack, batch: Batch, settings: Policy) -> anyhow::Result<Report> {
    let cloud = Ec2::new(stack.ec2().await);
    let cluster = Kube::new(stack.fencer().await?, "node-fencer-tests");
    fence_with(&cloud, &cluster, batch, settings).await
}

/// How many Nodes take room under the cap now, counted as the pipeline
/// counts them (a Node whose machine is dead for good takes none): the
/// baseline for a test that sets the cap just above it.
pub async fn room_taken(stack: &Stack) -> anyhow::Result<usize> {
    use node_fencer::core::model::facts::Confirmation;
    let nodes = Kube::new(stack.fencer().await?, "tests")
        .list_nodes()
        .await?;
    let ids = node_fencer::core::rules::cap::worth_asking(&nodes, &Default::default());
    let seen = if ids.is_empty() {
        Vec::new()
    } else {
        Ec2::new(stack.ec2().await).describe_instances(&ids).await?
    };
    let known = ids
        .into_iter()
        .map(|id| {
            let c = seen
                .iter()
                .find(|f| f.id == id)
                .map_or(Confirmation::NotFound, |f| Confirmation::Seen(f.clone()));
            (id, c)
        })
        .collect();
    Ok(node_fencer::core::rules::cap::taken(&nodes, &known))
}

/// Runs the pipeline with the given handles.
pub async fn fence_with(
    cloud: &dyn Cloud,
    cluster: &dyn Cluster,
    batch: Batch,
    settings: Policy,
) -> anyhow::Result<Report> {
    Ok(fence_measured(cloud, cluster, batch, settings).await?.0)
}

/// Runs the pipeline with the given handles; also returns what its meter
/// recorded (stage latencies, failed calls).
pub async fn fence_measured(
    cloud: &dyn Cloud,
    cluster: &dyn Cluster,
    batch: Batch,
    settings: Policy,
) -> anyhow::Result<(Report, Measured)> {
    let detach_wait = settings.detach_wait;
    fence_within(cloud, cluster, batch, settings, detach_wait).await
}

/// [`fence_measured`] with another bound on the wait for detached volumes.
pub async fn fence_within(
    cloud: &dyn Cloud,
    cluster: &dyn Cluster,
    batch: Batch,
    settings: Policy,
    detach_wait: Duration,
) -> anyhow::Result<(Report, Measured)> {
    let policy = Policy {
        detach_wait,
        ..settings
    };
    run_as(cloud, cluster, batch, &policy, &unique("test")).await
}

/// One invocation under `correlation_id`; a Lambda retry of it keeps the id.
pub async fn run_as(
    cloud: &dyn Cloud,
    cluster: &dyn Cluster,
    batch: Batch,
    policy: &Policy,
    correlation_id: &str,
) -> anyhow::Result<(Report, Measured)> {
    let meter = Meter::default();
    let ctx = Ctx::new(cloud, cluster, &meter, correlation_id);
    let report = pipeline::run(&ctx, policy, batch).await?;
    Ok((report, meter.measured()))
}

/// Events recorded on a Node: where node-fencer writes them, events.k8s.io/v1
/// in `default`, or on a server that does not serve it (1.15),
/// events.k8s.io/v1beta1 in `kube-system`.
pub async fn node_events(admin: &Client, node: &str) -> anyhow::Result<Vec<(String, String)>> {
    Ok(events_of_node(admin, node)
        .await?
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

async fn events_of_node(
    admin: &Client,
    node: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::namespaced(admin.clone(), "default");
    let items = match api.list(&Default::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => v1beta1_events(admin).await?,
        Err(e) => return Err(e.into()),
    };
    Ok(items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .collect())
}

/// The `events.k8s.io/v1beta1` Events of `kube-system`, where node-fencer
/// writes them on a server older than 1.19, read as v1's: the fields the
/// tests read are the same in both.
pub async fn v1beta1_events(
    admin: &Client,
) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("events.k8s.io", "v1beta1", "Event"),
        "events",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "kube-system", &resource);
    api.list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|e| {
            let mut value = serde_json::to_value(e)?;
            value["apiVersion"] = json!("events.k8s.io/v1");
            Ok(serde_json::from_value(value)?)
        })
        .collect()
}

/// When node-fencer fenced the node, from its `fenced-at` annotation
/// (written with the taint, or the legacy mark), on the wall clock.
pub async fn fenced_at(admin: &Client, node: &str) -> anyhow::Result<Option<SystemTime>> {
    let node = Api::<Node>::all(admin.clone()).get(node).await?;
    Ok(node
        .metadata
        .annotations
        .and_then(|a| {
            a.get(node_fencer::core::model::kube_read::ANNOTATION_FENCED_AT)
                .cloned()
        })
        .and_then(|at| at.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(SystemTime::from))
}

/// When the first Event of `reason` was recorded on the node (its
/// `eventTime`), on the wall clock.
pub async fn event_time(
    admin: &Client,
    node: &str,
    reason: &str,
) -> anyhow::Result<Option<SystemTime>> {
    Ok(events_of_node(admin, node)
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.event_time.map(|t| SystemTime::from(t.0)))
        .min())
}

/// The notes of the Events of `reason` recorded on a Node.
pub async fn node_event_notes(
    admin: &Client,
    node: &str,
    reason: &str,
) -> anyhow::Result<Vec<String>> {
    Ok(node_events(admin, node)
        .await?
        .into_iter()
        .filter(|(r, _)| r == reason)
        .map(|(_, note)| note)
        .collect())
}

/// How many Events of `reason` the Node `node` carries.
pub async fn count_node_events(admin: &Client, node: &str, reason: &str) -> anyhow::Result<usize> {
    Ok(node_events(admin, node)
        .await?
        .iter()
        .filter(|(r, _)| r == reason)
        .count())
}

/// Asserts that the Node carries an Event of each of the `reasons`.
pub async fn assert_node_events(
    admin: &Client,
    node: &str,
    reasons: &[&str],
) -> anyhow::Result<()> {
    let seen: Vec<String> = node_events(admin, node)
        .await?
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    for reason in reasons {
        assert!(
            seen.iter().any(|r| r == reason),
            "{node}: no {reason} Event among {seen:?}"
        );
    }
    Ok(())
}

/// A machine with one CSI volume behind a PV and a VolumeAttachment, and its
/// NotReady Node.
#[derive(Debug)]
pub struct Target {
    /// The machine.
    pub m: Machine,
    /// The Node's name.
    pub node: String,
    /// The CSI volume attached to the machine.
    pub volume: String,
    /// Deletes the Node when the target goes out of scope.
    pub cleanup: NodeCleanup,
}

/// Starts the machine again.
pub async fn start_instance(ec2: &aws_sdk_ec2::Client, m: &Machine) -> anyhow::Result<()> {
    ec2.start_instances()
        .instance_ids(&m.instance)
        .send()
        .await?;
    Ok(())
}

/// The names of the node's VolumeAttachments.
pub async fn vas_of(admin: &Client, node: &str) -> anyhow::Result<Vec<String>> {
    let api: Api<VolumeAttachment> = Api::all(admin.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|va| va.spec.node_name == node)
        .filter_map(|va| va.metadata.name)
        .collect())
}

/// Deletes the node's VolumeAttachments, as the attach/detach controller does.
pub async fn delete_vas_of(admin: &Client, node: &str) -> anyhow::Result<usize> {
    let api: Api<VolumeAttachment> = Api::all(admin.clone());
    let names = vas_of(admin, node).await?;
    for name in &names {
        api.delete(name, &DeleteParams::default()).await?;
    }
    Ok(names.len())
}

/// Creates a [`Target`], its instance stopped unless `running`.
pub async fn target(stack: &Stack, running: bool) -> anyhow::Result<Target> {
    let ec2 = stack.ec2().await;
    let m = launch(&ec2).await?;
    let volume = attach_new_volume(&ec2, &m, "/dev/xvdba").await?;
    if !running {
        stop(&ec2, &m).await?;
    }
    let mut spec = NodeSpec::for_machine(&m);
    spec.ready = "Unknown";
    node_of(stack, m, ebs(&volume), &spec, false).await
}

/// A [`Target`] on Compute Engine: a VM of the fake (`TERMINATED` unless
/// `running`) with one Persistent Disk of the PD CSI driver attached, under
/// its own name as device name, as the driver attaches it.
pub async fn gce_target(stack: &Stack, compute: &Compute, running: bool) -> anyhow::Result<Target> {
    let vm = compute.create_instance(ZONE, &unique("vm")).await?;
    let disk = compute.create_disk(ZONE, &unique("pd")).await?;
    compute.attach_disk(&vm, &disk).await?;
    if !running {
        compute.set_status(&vm, "TERMINATED").await?;
    }
    let m = Machine::of_vm(vm);
    let spec = NodeSpec::for_machine(&m);
    let volume = CsiVolume {
        driver: PD_DRIVER.into(),
        handle: disk,
    };
    node_of(stack, m, volume, &spec, false).await
}

/// Creates the Node `spec` for the machine, with its volume behind a PV
/// and a VolumeAttachment; `recorded`, the Node records its volume and the
/// attachment has the name Kubernetes gives it, as on a cluster whose
/// attach/detach controller attached it.
async fn node_of(
    stack: &Stack,
    m: Machine,
    volume: CsiVolume,
    spec: &NodeSpec,
    recorded: bool,
) -> anyhow::Result<Target> {
    let admin = stack.admin().await?;
    create_node(&admin, spec).await?;
    let cleanup = stack.delete_on_drop(&[&spec.name]);
    let pv = unique("pv");
    let source = json!({"csi": {"driver": volume.driver, "volumeHandle": volume.handle}});
    create_pv_with(&admin, &pv, source).await?;
    if recorded {
        record_csi_volumes(&admin, &spec.name, std::slice::from_ref(&volume)).await?;
        let name = attachment_name(&volume, &spec.name);
        create_va_named(&admin, &name, &spec.name, &pv, &volume.driver).await?;
    } else {
        create_va(&admin, &spec.name, &pv, &volume.driver).await?;
    }
    Ok(Target {
        m,
        node: spec.name.clone(),
        volume: volume.handle,
        cleanup,
    })
}

/// A stopped machine whose NotReady Node is named after its private DNS
/// name, as on EKS, with one CSI volume that the Node records as attached;
/// the Node's provider id names `owner` (the machine itself, unless a test
/// says otherwise).
pub async fn named_target(stack: &Stack, owner: Option<&Machine>) -> anyhow::Result<Target> {
    named_target_as(stack, owner, true).await
}

/// [`named_target`], its Node recording its volume only if `recorded`.
pub async fn named_target_as(
    stack: &Stack,
    owner: Option<&Machine>,
    recorded: bool,
) -> anyhow::Result<Target> {
    let ec2 = stack.ec2().await;
    let m = launch(&ec2).await?;
    let volume = attach_new_volume(&ec2, &m, "/dev/xvdba").await?;
    stop(&ec2, &m).await?;
    let mut spec = NodeSpec::for_machine(owner.unwrap_or(&m));
    spec.name = m.private_dns.clone();
    anyhow::ensure!(!spec.name.is_empty(), "moto gave no private DNS name");
    node_of(stack, m, ebs(&volume), &spec, recorded).await
}

/// What moto reports of the machine's state.
pub async fn machine_state(ec2: &aws_sdk_ec2::Client, m: &Machine) -> anyhow::Result<String> {
    let out = ec2
        .describe_instances()
        .instance_ids(&m.instance)
        .send()
        .await?;
    Ok(out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find_map(|i| i.state()?.name().map(|n| n.as_str().to_owned()))
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use node_fencer::core::model::facts::{OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY};

    #[test]
    fn the_harness_names_the_taint_the_code_applies() {
        assert_eq!(
            super::OUT_OF_SERVICE,
            format!("{OUT_OF_SERVICE_KEY}:{OUT_OF_SERVICE_EFFECT}")
        );
    }
}
