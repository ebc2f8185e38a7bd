//! Scenes on the controller stack ([`crate::cluster::cluster_stack`]): kwok
//! worker nodes, each backed by a moto instance; EBS volumes behind static
//! PersistentVolumes of `ebs.csi.aws.com` (or cStor volumes of
//! `cstor.csi.openebs.io`, attached without any cloud call; or, on Compute
//! Engine, nodes backed by VMs of the fake of [`crate::gce`] and Persistent
//! Disks of `pd.csi.storage.gke.io`); and the seed
//! scenario's workloads, a one-replica StatefulSet (a database) and a
//! one-replica Deployment, each with a ReadWriteOnce claim, running on node
//! 2. Then what the scenarios observe: a node dying, pods stuck, pods and
//! volumes recovered.
//!
//! Every scene labels its nodes with [`SCENE_LABEL`] and its pods select on
//! it, so scenes in one cluster never share nodes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Stack;
use crate::attacher::{DRIVER, Driver};
use crate::fixtures::{
    Machine, create_volume, ebs_attachment_name, launch, record_volumes, unique, volume,
};
use crate::gce::{
    INSTANCE_ID_ANNOTATION, PD_DRIVER, PD_TOPOLOGY_KEY, ZONE, fake_compute, fake_compute_on,
    users_in,
};
use crate::kubelet::{DEFAULT_LEASE_SECONDS, Kubelet, KubeletSpec, lease_seconds};
use crate::redfish::SystemSpec;

/// The label that ties a scene's pods to its nodes.
pub const SCENE_LABEL: &str = "node-fencer.io/scene";
/// The StorageClass of the scenes' EBS volumes.
pub const STORAGE_CLASS: &str = "ebs-sc";
/// The StorageClass of the scenes' cStor volumes.
pub const CSTOR_STORAGE_CLASS: &str = "cstor-sc";
/// The StorageClass of the scenes' Persistent Disks.
pub const PD_STORAGE_CLASS: &str = "pd-sc";

/// The StorageClass of a driver's volumes.
pub fn storage_class(driver: Driver) -> &'static str {
    match driver {
        Driver::Ebs => STORAGE_CLASS,
        Driver::Cstor => CSTOR_STORAGE_CLASS,
        Driver::Pd => PD_STORAGE_CLASS,
    }
}
/// How long the pods tolerate `unreachable`/`not-ready` (Kubernetes adds 300 s
/// by default). Short, so that Kubernetes' own eviction, and the stuck state
/// it leads to, happen within a test's observation window; node-fencer's path
/// does not depend on it (pods do not tolerate the out-of-service taint).
pub const TOLERATION_SECONDS: i64 = 5;
pub use crate::fixtures::OUT_OF_SERVICE;

/// Polls `probe` every 200 ms until it yields a value, or fails after `timeout`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create<K>(api: &Api<K>, value: Value) -> anyhow::Result<K>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value)?;
    Ok(api.create(&PostParams::default(), &object).await?)
}

fn is_status(err: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(err, kube::Error::Api(status) if check(status))
}

/// One worker and its instance.
#[derive(Clone, Debug)]
pub struct Worker {
    /// The Node name (also its `kubernetes.io/hostname`).
    pub name: String,
    /// The moto instance (or the fake Compute Engine's VM) behind it.
    pub machine: Machine,
    /// Its hollow kubelet; none for a kwok node.
    pub kubelet: Option<Arc<Kubelet>>,
}

/// Who plays a scene's kubelets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kubelets {
    /// kwok, for every worker.
    Kwok,
    /// A hollow kubelet for the worker of this index (node 2 is 1), kwok
    /// for the others.
    Real(usize),
    /// [`Self::Real`], its Lease at the kubelet's default (40 s, renewed
    /// every 10 s) whatever the stack's grace period, its status posted
    /// every 2 s so that the stack's short grace period never finds it
    /// late: a live kubelet as the fast path's proof meets it.
    DefaultLease(usize),
}

impl Kubelets {
    /// Node 2, the node that dies, a real kubelet (of the stack's
    /// Kubernetes version); the others kwok.
    pub const NODE2: Self = Self::Real(1);
}

/// Creates `count` kwok nodes labelled for `scene`, each backed by a new moto
/// instance (`spec.providerID = aws:///<az>/<id>`) with its CSINode; node `i`
/// is created cordoned when `cordoned(i)`. Returns once all are Ready and kwok
/// holds their Leases.
pub async fn add_workers(
    stack: &Stack,
    scene: &str,
    count: usize,
    cordoned: impl Fn(usize) -> bool,
) -> anyhow::Result<Vec<Worker>> {
    add_workers_on(stack, Hosts::Ec2, scene, count, cordoned).await
}

/// What the workers' machines are.
#[derive(Clone, Copy, Debug)]
pub enum Hosts<'a> {
    /// EC2 instances in moto.
    Ec2,
    /// VMs of the fake Compute Engine.
    Gce,
    /// These Systems of a Redfish BMC, one per worker: a Node with no
    /// provider id (no cloud provider on-premises), the System's UUID as
    /// its kubelet's `systemUUID`, and the cStor-like driver only.
    Bmc(&'a [SystemSpec]),
}

/// [`add_workers`] on `hosts`. On Compute Engine, each node is backed by a
/// new VM of the fake, named as the node (as on GKE), with
/// `spec.providerID = gce://<project>/<zone>/<name>`, the VM's numeric id
/// in the `container.googleapis.com/instance_id` annotation, and the PD CSI
/// driver in its CSINode.
pub async fn add_workers_on(
    stack: &Stack,
    hosts: Hosts<'_>,
    scene: &str,
    count: usize,
    cordoned: impl Fn(usize) -> bool,
) -> anyhow::Result<Vec<Worker>> {
    add_workers_with(stack, hosts, Kubelets::Kwok, scene, count, cordoned).await
}

/// [`add_workers_on`], with `kubelets` saying which worker, if any, runs a
/// hollow kubelet ([`hollow_worker`]) rather than kwok.
pub async fn add_workers_with(
    stack: &Stack,
    hosts: Hosts<'_>,
    kubelets: Kubelets,
    scene: &str,
    count: usize,
    cordoned: impl Fn(usize) -> bool,
) -> anyhow::Result<Vec<Worker>> {
    let admin = stack.admin().await?;
    let ec2 = stack.ec2().await;
    // The fake Compute Engine, started beside this stack unless it runs:
    // the older planes' scenes start no other stack for it.
    let compute = fake_compute_on(stack).client();
    let nodes: Api<Node> = Api::all(admin.clone());
    let csinodes: Api<CSINode> = Api::all(admin.clone());
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("{scene}-w{}", i + 1);
        let system = match hosts {
            Hosts::Bmc(systems) => Some(systems.get(i).context("a System per worker")?),
            Hosts::Ec2 | Hosts::Gce => None,
        };
        let machine = match (hosts, system) {
            (Hosts::Gce, _) => Machine::of_vm(compute.create_instance(ZONE, &name).await?),
            (_, Some(system)) => Machine::of_system(&system.name),
            _ => launch(&ec2).await?,
        };
        let real = match kubelets {
            Kubelets::Real(j) if j == i => Some(false),
            Kubelets::DefaultLease(j) if j == i => Some(true),
            _ => None,
        };
        if let Some(default_lease) = real {
            let mut kubelet = hollow_spec(stack, &name, scene, &machine, system);
            if default_lease {
                kubelet.lease_seconds = DEFAULT_LEASE_SECONDS;
                kubelet.status_every = Some(2);
            }
            let kubelet = Kubelet::start(stack, kubelet)?;
            workers.push(Worker {
                name,
                machine,
                kubelet: Some(Arc::new(kubelet)),
            });
            continue;
        }
        let mut node = json!({
            "metadata": {
                "name": name,
                "annotations": {
                    "kwok.x-k8s.io/node": "fake",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                    "node.alpha.kubernetes.io/ttl": "0"
                },
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "type": "kwok",
                    "topology.kubernetes.io/zone": machine.az,
                    "node-fencer.io/test": "true",
                    SCENE_LABEL: scene
                }
            },
            "spec": {"providerID": machine.provider_id(), "unschedulable": cordoned(i)}
        });
        // What the kubelet registers for the drivers; the external-attacher
        // reads the node id from here and hands it to the driver.
        let drivers = match &machine.vm {
            _ if system.is_some() => {
                if let Some(spec) = node["spec"].as_object_mut() {
                    spec.remove("providerID");
                }
                json!([{"name": Driver::Cstor.name(), "nodeID": name}])
            }
            Some(vm) => {
                node["metadata"]["annotations"][INSTANCE_ID_ANNOTATION] = json!(vm.id);
                node["metadata"]["labels"][PD_TOPOLOGY_KEY] = json!(machine.az);
                json!([{
                    "name": PD_DRIVER,
                    "nodeID": vm.path(),
                    "topologyKeys": [PD_TOPOLOGY_KEY],
                    "allocatable": {"count": 127}
                }])
            }
            None => {
                node["metadata"]["labels"]["topology.ebs.csi.aws.com/zone"] = json!(machine.az);
                json!([{
                    "name": DRIVER,
                    "nodeID": machine.instance,
                    "topologyKeys": ["topology.ebs.csi.aws.com/zone"],
                    "allocatable": {"count": 25}
                }, {
                    "name": Driver::Cstor.name(),
                    "nodeID": name
                }])
            }
        };
        if !stack.serves_csi_v1() {
            // 1.15's kubelet writes each driver's node id here as well as
            // in a v1beta1 CSINode; the external-attacher of its day (v2)
            // reads it here when it finds no CSINode.
            node["metadata"]["annotations"][NODE_ID_ANNOTATION] =
                json!(node_ids(&drivers).to_string());
            create::<Node>(&nodes, node).await?;
            workers.push(Worker {
                name,
                machine,
                kubelet: None,
            });
            continue;
        }
        let node: Node = create(&nodes, node).await?;
        create(
            &csinodes,
            json!({
                "metadata": {
                    "name": name,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                         "uid": node.metadata.uid}]
                },
                "spec": {"drivers": drivers}
            }),
        )
        .await?;
        workers.push(Worker {
            name,
            machine,
            kubelet: None,
        });
    }
    let names: Vec<String> = workers.iter().map(|w| w.name.clone()).collect();
    wait_until("the workers to be Ready", Duration::from_secs(60), || {
        let admin = admin.clone();
        let names = names.clone();
        async move {
            for name in &names {
                if !registered(&admin, name).await?
                    || ready(&admin, name).await?.as_deref() != Some("True")
                    || lease_holder(&admin, name).await?.is_none()
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await?;
    for (i, w) in workers.iter().enumerate() {
        if w.kubelet.is_some() {
            adopt_hollow(&admin, w, cordoned(i)).await?;
        }
    }
    if let Hosts::Bmc(systems) = hosts {
        // What the kubelet reads from the machine's SMBIOS when it
        // registers: written once kwok's initializing stage, which writes
        // the whole status, is done; later stages keep it. A hollow
        // kubelet reports its own.
        for (w, system) in workers
            .iter()
            .zip(systems)
            .filter(|(w, _)| w.kubelet.is_none())
        {
            nodes
                .patch_status(
                    &w.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"nodeInfo": {"systemUUID": system.uuid}}})),
                )
                .await?;
        }
    }
    Ok(workers)
}

/// The Node annotation of the kubelets before CSINode: each driver's node id.
const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// `{driver: nodeID}` of a CSINode's drivers, as [`NODE_ID_ANNOTATION`] holds them.
fn node_ids(drivers: &Value) -> Value {
    let ids: serde_json::Map<String, Value> = drivers
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["name"].as_str()?.to_owned(), d["nodeID"].clone())))
        .collect();
    Value::Object(ids)
}

/// The hollow kubelet of a worker on `machine`: it registers the Node as
/// kwok's are labelled, with the machine's provider id (none on-premises)
/// and, on-premises, the System's UUID; it serves the CSI node of the
/// drivers a kwok worker's CSINode names there.
fn hollow_spec(
    stack: &Stack,
    name: &str,
    scene: &str,
    machine: &Machine,
    system: Option<&SystemSpec>,
) -> KubeletSpec {
    let mut spec = KubeletSpec {
        name: name.into(),
        lease_seconds: lease_seconds(stack),
        labels: [
            ("type", "hollow"),
            ("topology.kubernetes.io/zone", machine.az.as_str()),
            ("node-fencer.io/test", "true"),
            (SCENE_LABEL, scene),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec(),
        ..KubeletSpec::default()
    };
    let cstor = (Driver::Cstor.name().to_string(), name.to_string());
    let zone = |key: &str| (key.to_string(), machine.az.clone());
    match (system, &machine.vm) {
        (Some(system), _) => {
            spec.system_uuid = Some(system.uuid.clone());
            spec.drivers.push(cstor);
        }
        (None, Some(vm)) => {
            spec.provider_id = Some(machine.provider_id());
            spec.labels.push(zone(PD_TOPOLOGY_KEY));
            spec.topology.push(zone(PD_TOPOLOGY_KEY));
            spec.drivers.push((PD_DRIVER.into(), vm.path()));
        }
        (None, None) => {
            spec.provider_id = Some(machine.provider_id());
            spec.labels.push(zone("topology.ebs.csi.aws.com/zone"));
            spec.topology.push(zone("topology.ebs.csi.aws.com/zone"));
            spec.drivers.push((DRIVER.into(), machine.instance.clone()));
            spec.drivers.push(cstor);
        }
    }
    spec
}

/// What a cloud controller manager (or GKE's kubelet) adds to a Node once
/// it registered: on Compute Engine, the VM's numeric id; and the cordon a
/// scene asks for.
async fn adopt_hollow(admin: &Client, w: &Worker, cordoned: bool) -> anyhow::Result<()> {
    let mut patch = json!({"spec": {"unschedulable": cordoned}});
    if let Some(vm) = &w.machine.vm {
        patch["metadata"] = json!({"annotations": {INSTANCE_ID_ANNOTATION: vm.id}});
    }
    Api::<Node>::all(admin.clone())
        .patch(&w.name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Whether the Node exists (a hollow kubelet registers it a moment after
/// it starts).
async fn registered(admin: &Client, node: &str) -> anyhow::Result<bool> {
    Ok(Api::<Node>::all(admin.clone())
        .get_opt(node)
        .await?
        .is_some())
}

/// The node's `Ready` condition status (`True`, `False`, `Unknown`).
pub async fn ready(admin: &Client, node: &str) -> anyhow::Result<Option<String>> {
    Ok(ready_condition(admin, node).await?.map(|c| c.status))
}

/// The Node's `Ready` condition.
async fn ready_condition(
    admin: &Client,
    node: &str,
) -> anyhow::Result<Option<k8s_openapi::api::core::v1::NodeCondition>> {
    let node = Api::<Node>::all(admin.clone()).get(node).await?;
    Ok(node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready")))
}

async fn lease_holder(admin: &Client, node: &str) -> anyhow::Result<Option<String>> {
    Ok(node_lease(admin, node)
        .await?
        .and_then(|s| s.holder_identity))
}

/// The spec of the Node's kubelet Lease in `kube-node-lease`, if any.
async fn node_lease(
    admin: &Client,
    node: &str,
) -> anyhow::Result<Option<k8s_openapi::api::coordination::v1::LeaseSpec>> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-node-lease");
    Ok(leases.get_opt(node).await?.and_then(|l| l.spec))
}

/// Stops the node's heartbeats: its Lease is taken away from kwok, which then
/// treats the Node and its Pods as a dead kubelet would (see tests/stack/README.md).
pub async fn stop_heartbeats(admin: &Client, node: &str) -> anyhow::Result<()> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-node-lease");
    leases
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "stopped-by-test",
                                          "leaseDurationSeconds": 86400}})),
        )
        .await?;
    Ok(())
}

/// Waits until every node's `Ready` condition is no longer `True`.
pub async fn wait_not_ready(
    admin: &Client,
    nodes: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until("the nodes to turn NotReady", timeout, || async {
        for n in nodes {
            if ready(admin, n).await?.as_deref() == Some("True") {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// Cordons or uncordons a node.
pub async fn set_unschedulable(admin: &Client, node: &str, on: bool) -> anyhow::Result<()> {
    Api::<Node>::all(admin.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await?;
    Ok(())
}

/// Plays the kubelet's part after a pod left a live node: the kubelet
/// reports its volumes unmounted (`status.volumesInUse`), and the Node update
/// lets the attach/detach controller detach them. kwok reports no
/// `volumesInUse` and leaves the Node alone, so the controller would assume
/// the volume still mounted; any change to the Node makes it look again.
pub async fn report_volumes_unmounted(admin: &Client, node: &str) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    Api::<Node>::all(admin.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "node-fencer.io/volumes-unmounted-at": now}}})),
        )
        .await?;
    Ok(())
}

/// Plays the kubelet's part while the node is alive and its pods have
/// mounted their volumes: the Node's `status.volumesInUse` lists them (kwok
/// reports none). It is what a dead node leaves behind, and why the
/// attach/detach controller, once such a node's pods are deleted, waits for
/// an unmount that never comes (`maxWaitForUnmountDuration`, 6 minutes)
/// unless the node carries the out-of-service taint.
pub async fn report_volumes_in_use(
    admin: &Client,
    node: &str,
    volumes: &[(Driver, &str)],
) -> anyhow::Result<()> {
    let in_use = in_use_names(volumes);
    Api::<Node>::all(admin.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesInUse": in_use}})),
        )
        .await?;
    Ok(())
}

/// The Node's `status.volumesInUse`.
pub async fn volumes_in_use(admin: &Client, node: &str) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Node>::all(admin.clone())
        .get(node)
        .await?
        .status
        .and_then(|s| s.volumes_in_use)
        .unwrap_or_default())
}

/// The names the kubelet gives CSI volumes in `status.volumesInUse`.
fn in_use_names(volumes: &[(Driver, &str)]) -> Vec<String> {
    volumes
        .iter()
        .map(|(d, v)| format!("kubernetes.io/csi/{}^{v}", d.name()))
        .collect()
}

/// The node's taints as `key:effect`.
pub async fn node_taints(admin: &Client, node: &str) -> anyhow::Result<Vec<String>> {
    Ok(crate::fixtures::taints(
        &Api::<Node>::all(admin.clone()).get(node).await?,
    ))
}

/// Whether the node carries node-fencer's taint.
pub async fn is_fenced(admin: &Client, node: &str) -> anyhow::Result<bool> {
    Ok(node_taints(admin, node)
        .await?
        .contains(&OUT_OF_SERVICE.to_owned()))
}

/// Creates the scenes' StorageClasses (one per driver) if they are missing.
pub async fn ensure_storage_class(admin: &Client) -> anyhow::Result<()> {
    let api: Api<StorageClass> = Api::all(admin.clone());
    for driver in Driver::ALL {
        let name = storage_class(driver);
        if api.get_opt(name).await?.is_some() {
            continue;
        }
        let parameters = match driver {
            Driver::Ebs => json!({"type": "gp3"}),
            Driver::Cstor => json!({"cstorPoolCluster": "cstor-pool", "replicaCount": "3"}),
            Driver::Pd => json!({"type": "pd-balanced"}),
        };
        let made = create(
            &api,
            json!({
                "metadata": {"name": name},
                "provisioner": driver.name(),
                "reclaimPolicy": "Retain",
                "volumeBindingMode": "WaitForFirstConsumer",
                "parameters": parameters
            }),
        )
        .await;
        match made {
            Err(e)
                if e.downcast_ref::<kube::Error>()
                    .is_some_and(|e| is_status(e, kube::core::Status::is_already_exists)) => {}
            other => {
                other?;
            }
        }
    }
    Ok(())
}

/// Creates a namespace and its `default` ServiceAccount if the service
/// account controller has not made it yet.
pub async fn create_namespace(admin: &Client, name: &str) -> anyhow::Result<()> {
    create(
        &Api::<Namespace>::all(admin.clone()),
        json!({"metadata": {"name": name, "labels": {"node-fencer.io/test": "true"}}}),
    )
    .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), name);
    if let Err(e) = sas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
        )
        .await
        && !is_status(&e, kube::core::Status::is_already_exists)
    {
        return Err(e.into());
    }
    Ok(())
}

/// Creates a static CSI PersistentVolume for an EBS volume, optionally
/// pre-bound to a claim (`namespace/name`), pinned to the zone like the
/// driver's provisioned volumes.
pub async fn create_ebs_pv(
    admin: &Client,
    name: &str,
    volume: &str,
    az: &str,
    claim: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let csi = (STORAGE_CLASS, DRIVER, volume);
    let zone = Some(("topology.ebs.csi.aws.com/zone", az));
    create_csi_pv(admin, name, csi, zone, claim).await
}

/// Creates a static cStor PersistentVolume (no zone: the iSCSI target is
/// reachable from every node), pre-bound to a claim (`namespace/name`).
pub async fn create_cstor_pv(
    admin: &Client,
    name: &str,
    handle: &str,
    claim: (&str, &str),
) -> anyhow::Result<()> {
    let csi = (CSTOR_STORAGE_CLASS, Driver::Cstor.name(), handle);
    create_csi_pv(admin, name, csi, None, Some(claim)).await
}

/// Creates a static CSI PersistentVolume for a Persistent Disk (its PD CSI
/// volume handle), pre-bound to a claim (`namespace/name`) when given,
/// pinned to the zone like the driver's provisioned volumes.
pub async fn create_pd_pv(
    admin: &Client,
    name: &str,
    handle: &str,
    zone: &str,
    claim: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let csi = (PD_STORAGE_CLASS, PD_DRIVER, handle);
    create_csi_pv(admin, name, csi, Some((PD_TOPOLOGY_KEY, zone)), claim).await
}

/// Creates a static CSI PersistentVolume of `(storage class, driver,
/// volume handle)`, pinned by `(topology key, zone)` when given, pre-bound
/// to a claim (`namespace/name`) when given.
async fn create_csi_pv(
    admin: &Client,
    name: &str,
    (class, driver, handle): (&str, &str, &str),
    zone: Option<(&str, &str)>,
    claim: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let mut spec = json!({
        "capacity": {"storage": "10Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": class,
        "csi": {"driver": driver, "volumeHandle": handle, "fsType": "ext4"},
    });
    if let Some((key, zone)) = zone {
        spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": [zone]}
        ]}]}});
    }
    if let Some((ns, claim)) = claim {
        spec["claimRef"] = json!({"namespace": ns, "name": claim});
    }
    create(
        &Api::<PersistentVolume>::all(admin.clone()),
        json!({"metadata": {"name": name, "labels": {"node-fencer.io/test": "true"}}, "spec": spec}),
    )
    .await?;
    Ok(())
}

/// A workload of the seed scenario and its storage.
#[derive(Clone, Debug)]
pub struct Workload {
    /// `StatefulSet` or `Deployment`.
    pub kind: &'static str,
    /// Its name, also its `app` label.
    pub name: String,
    /// Its claim.
    pub pvc: String,
    /// The PersistentVolume bound to the claim.
    pub pv: String,
    /// Its driver.
    pub driver: Driver,
    /// The volume behind it: the EBS volume, or the volume handle (cStor,
    /// or the Persistent Disk's `projects/P/zones/Z/disks/D`).
    pub volume: String,
}

/// The seed scenario, set up and running.
#[derive(Clone, Debug)]
pub struct Seed {
    /// The scene (namespace and node label).
    pub namespace: String,
    /// Three workers; `workers[1]` is node 2, where the workloads run.
    pub workers: Vec<Worker>,
    /// The database: a StatefulSet of one replica.
    pub db: Workload,
    /// The application: a Deployment of one replica.
    pub app: Workload,
}

impl Seed {
    /// Node 2: where the workloads run at first.
    pub fn node2(&self) -> &Worker {
        &self.workers[1]
    }

    /// The worker of a node name.
    pub fn worker(&self, node: &str) -> Option<&Worker> {
        self.workers.iter().find(|w| w.name == node)
    }

    /// The Node names.
    pub fn node_names(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.name.clone()).collect()
    }
}

fn pod_template(scene: &str, app: &str, image: &str, claim: Option<&str>) -> Value {
    let mut spec = json!({
        "nodeSelector": {SCENE_LABEL: scene},
        "tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": TOLERATION_SECONDS},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": TOLERATION_SECONDS}
        ],
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": app,
            "image": image,
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]
        }]
    });
    if let Some(claim) = claim {
        spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    }
    json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

/// Builds the seed scenario: three workers (1 and 3 cordoned until the
/// workloads run on node 2, then uncordoned), two EBS volumes behind static
/// PVs pre-bound to their claims, a StatefulSet `db` and a Deployment `app`
/// of one replica each; returns once both pods run on node 2 with their
/// volumes attached to its instance, and node 2 reports them in use.
pub async fn seed(stack: &Stack) -> anyhow::Result<Seed> {
    seed_with(stack, Driver::Ebs).await
}

/// [`seed`] with the volumes of `driver`.
pub async fn seed_with(stack: &Stack, driver: Driver) -> anyhow::Result<Seed> {
    let hosts = if driver.on_gce() {
        Hosts::Gce
    } else {
        Hosts::Ec2
    };
    seed_on(stack, driver, hosts).await
}

/// [`seed`] with the volumes of `driver`, on `hosts`, node 2 a real
/// kubelet ([`Kubelets::NODE2`]) where one is built for the stack's
/// Kubernetes: not for 1.15, where all are kwok's.
pub async fn seed_on(stack: &Stack, driver: Driver, hosts: Hosts<'_>) -> anyhow::Result<Seed> {
    let kubelets = if stack.is_oldest() {
        Kubelets::Kwok
    } else {
        Kubelets::NODE2
    };
    seed_on_with(stack, driver, hosts, kubelets).await
}

/// [`seed_on`] with the kubelets of `kubelets`.
pub async fn seed_on_with(
    stack: &Stack,
    driver: Driver,
    hosts: Hosts<'_>,
    kubelets: Kubelets,
) -> anyhow::Result<Seed> {
    let admin = stack.admin().await?;
    let ec2 = stack.ec2().await;
    let scene = unique(match driver {
        Driver::Ebs => "seed",
        Driver::Cstor => "seed-cstor",
        Driver::Pd => "seed-gce",
    });
    let class = storage_class(driver);
    create_namespace(&admin, &scene).await?;
    ensure_storage_class(&admin).await?;
    let workers = add_workers_with(stack, hosts, kubelets, &scene, 3, |i| i != 1).await?;
    let az = workers[1].machine.az.clone();

    let mut made = Vec::new();
    for (kind, name, pvc) in [
        ("StatefulSet", "db", "data-db-0"),
        ("Deployment", "app", "app-data"),
    ] {
        let pv = format!("{scene}-{name}");
        let volume = match driver {
            Driver::Ebs => {
                let volume = create_volume(&ec2, &az).await?;
                create_ebs_pv(&admin, &pv, &volume, &az, Some((&scene, pvc))).await?;
                volume
            }
            Driver::Cstor => {
                let handle = format!("pvc-{}", unique(name));
                create_cstor_pv(&admin, &pv, &handle, (&scene, pvc)).await?;
                handle
            }
            Driver::Pd => {
                let handle = fake_compute().client().create_disk(&az, &pv).await?;
                create_pd_pv(&admin, &pv, &handle, &az, Some((&scene, pvc))).await?;
                handle
            }
        };
        create(
            &Api::<PersistentVolumeClaim>::namespaced(admin.clone(), &scene),
            json!({
                "metadata": {"name": pvc},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                         "volumeName": pv, "resources": {"requests": {"storage": "10Gi"}}}
            }),
        )
        .await?;
        made.push(Workload {
            kind,
            name: name.into(),
            pvc: pvc.into(),
            pv,
            driver,
            volume,
        });
    }
    let app = made.pop().context("app workload")?;
    let db = made.pop().context("db workload")?;

    create(
        &Api::<StatefulSet>::namespaced(admin.clone(), &scene),
        json!({
            "metadata": {"name": "db"},
            "spec": {
                "replicas": 1,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": pod_template(&scene, "db", "postgres:16", None),
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                             "resources": {"requests": {"storage": "10Gi"}}}
                }]
            }
        }),
    )
    .await?;
    create(
        &Api::<Deployment>::namespaced(admin.clone(), &scene),
        json!({
            "metadata": {"name": "app"},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app": "app"}},
                "template": pod_template(&scene, "app", "registry.example/app:1", Some("app-data"))
            }
        }),
    )
    .await?;

    let seed = Seed {
        namespace: scene,
        workers,
        db,
        app,
    };
    let node2 = seed.node2().name.clone();
    wait_until(
        "db and app to run on node 2 with their volumes attached",
        Duration::from_secs(60),
        || async {
            for w in [&seed.db, &seed.app] {
                match running_with_volume(stack, &seed, w, None).await? {
                    Some(node) if node == node2 => {}
                    Some(other) => bail!("{} started on {other}, not on node 2", w.name),
                    None => return Ok(None),
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let in_use = [
        (driver, seed.db.volume.as_str()),
        (driver, &seed.app.volume),
    ];
    if seed.node2().kubelet.is_some() {
        let want = in_use_names(&in_use);
        wait_until(
            "node 2's kubelet to report both volumes in use",
            Duration::from_secs(30),
            || async {
                let have = volumes_in_use(&admin, &node2).await?;
                Ok(want.iter().all(|v| have.contains(v)).then_some(()))
            },
        )
        .await?;
    } else {
        report_volumes_in_use(&admin, &node2, &in_use).await?;
    }
    for w in [&seed.workers[0], &seed.workers[2]] {
        set_unschedulable(&admin, &w.name, false).await?;
    }
    Ok(seed)
}

/// A pod as the scenarios look at it.
#[derive(Clone, Debug)]
pub struct PodView {
    /// Name.
    pub name: String,
    /// Node it is bound to.
    pub node: Option<String>,
    /// `status.phase`.
    pub phase: String,
    /// Whether it is being deleted.
    pub terminating: bool,
}

/// The pods of a workload (by its `app` label).
pub async fn pods(admin: &Client, namespace: &str, app: &str) -> anyhow::Result<Vec<PodView>> {
    let list = Api::<Pod>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|p| PodView {
            name: p.metadata.name.unwrap_or_default(),
            node: p.spec.and_then(|s| s.node_name),
            phase: p.status.and_then(|s| s.phase).unwrap_or_default(),
            terminating: p.metadata.deletion_timestamp.is_some(),
        })
        .collect())
}

/// How many of the seed's pods are still bound to node 2.
pub async fn pods_left_on_node2(admin: &Client, seed: &Seed) -> anyhow::Result<usize> {
    let node2 = seed.node2().name.as_str();
    let mut left = 0;
    for app in ["db", "app"] {
        left += pods(admin, &seed.namespace, app)
            .await?
            .iter()
            .filter(|p| p.node.as_deref() == Some(node2))
            .count();
    }
    Ok(left)
}

/// A VolumeAttachment as the scenarios look at it.
#[derive(Clone, Debug)]
pub struct AttachmentView {
    /// Name.
    pub name: String,
    /// Node.
    pub node: String,
    /// `status.attached`.
    pub attached: bool,
    /// Being deleted.
    pub deleting: bool,
    /// `status.attachError.message`.
    pub attach_error: Option<String>,
}

/// The VolumeAttachments of a PersistentVolume.
pub async fn attachments(admin: &Client, pv: &str) -> anyhow::Result<Vec<AttachmentView>> {
    let list = Api::<VolumeAttachment>::all(admin.clone())
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .map(|va| AttachmentView {
            name: va.metadata.name.unwrap_or_default(),
            node: va.spec.node_name,
            attached: va.status.as_ref().is_some_and(|s| s.attached),
            deleting: va.metadata.deletion_timestamp.is_some(),
            attach_error: va
                .status
                .and_then(|s| s.attach_error)
                .and_then(|e| e.message),
        })
        .collect())
}

/// Where the workload runs with its volume, avoiding `not_on` if given: a pod
/// Running (not being deleted) on a node whose VolumeAttachment of the PV is
/// attached, and whose instance holds the EBS volume in moto (for PD: whose
/// VM is the disk's one user in the fake Compute Engine; for cStor: no
/// other node's attachment is attached, the target has one initiator).
/// kwok marks a pod Running as soon as it is bound, so the attachment is
/// what proves the volume followed.
pub async fn running_with_volume(
    stack: &Stack,
    seed: &Seed,
    w: &Workload,
    not_on: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let admin = stack.admin().await?;
    let vas = attachments(&admin, &w.pv).await?;
    for pod in pods(&admin, &seed.namespace, &w.name).await? {
        let Some(node) = pod.node else { continue };
        if pod.terminating || pod.phase != "Running" || Some(node.as_str()) == not_on {
            continue;
        }
        let attached = vas
            .iter()
            .any(|va| va.node == node && va.attached && !va.deleting);
        let Some(worker) = seed.worker(&node) else {
            continue;
        };
        let only_here = match w.driver {
            Driver::Ebs => {
                let (_, holders) = volume(&stack.ec2().await, &w.volume).await?;
                holders == vec![worker.machine.instance.clone()]
            }
            Driver::Cstor => vas.iter().all(|va| va.node == node || !va.attached),
            Driver::Pd => {
                let state = fake_compute().client().state().await?;
                let vm = worker.machine.vm.as_ref().map(crate::gce::Vm::path);
                users_in(&state, &w.volume).unwrap_or_default() == Vec::from_iter(vm)
            }
        };
        if attached && only_here {
            return Ok(Some(node));
        }
    }
    Ok(None)
}

/// `FailedAttachVolume` events of the namespace: (pod, message).
pub async fn failed_attach_events(
    admin: &Client,
    namespace: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let list = Api::<Event>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedAttachVolume"))
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect())
}

/// What is stuck in the seed scenario after node 2 died.
#[derive(Clone, Debug, Default)]
pub struct Stuck {
    /// db's pod is still bound to node 2 and no db pod runs elsewhere.
    pub db_stuck_on_node2: bool,
    /// db's pod on node 2 is Terminating.
    pub db_terminating: bool,
    /// app's replacement exists on another node, without its volume.
    pub app_replacement_without_volume: bool,
    /// `FailedAttachVolume` Multi-Attach events of the replacement.
    pub multi_attach: Vec<String>,
    /// The VolumeAttachments on node 2 are still attached.
    pub node2_attachments_kept: bool,
}

/// Waits until the seed shows the stuck state without node-fencer: db's pod
/// Terminating on node 2 and app's replacement refused its volume
/// (Multi-Attach); returns what [`stuck`] saw then.
pub async fn wait_stuck(stack: &Stack, seed: &Seed, timeout: Duration) -> anyhow::Result<Stuck> {
    wait_until(
        "db Terminating on node 2 and app's replacement refused (Multi-Attach)",
        timeout,
        || async {
            let st = stuck(stack, seed).await?;
            Ok((st.db_terminating && !st.multi_attach.is_empty()).then_some(st))
        },
    )
    .await
}

/// Looks at the seed scenario for the stuck state.
pub async fn stuck(stack: &Stack, seed: &Seed) -> anyhow::Result<Stuck> {
    let admin = stack.admin().await?;
    let node2 = seed.node2().name.as_str();
    let db = pods(&admin, &seed.namespace, "db").await?;
    let app = pods(&admin, &seed.namespace, "app").await?;
    let db_on_2: Vec<&PodView> = db
        .iter()
        .filter(|p| p.node.as_deref() == Some(node2))
        .collect();
    let mut out = Stuck {
        db_stuck_on_node2: !db_on_2.is_empty()
            && running_with_volume(stack, seed, &seed.db, Some(node2))
                .await?
                .is_none(),
        db_terminating: db_on_2.iter().any(|p| p.terminating),
        ..Stuck::default()
    };
    let replacements: Vec<&PodView> = app
        .iter()
        .filter(|p| !p.terminating && p.node.is_some() && p.node.as_deref() != Some(node2))
        .collect();
    out.app_replacement_without_volume = !replacements.is_empty()
        && running_with_volume(stack, seed, &seed.app, Some(node2))
            .await?
            .is_none();
    out.multi_attach = failed_attach_events(&admin, &seed.namespace)
        .await?
        .into_iter()
        .filter(|(pod, msg)| {
            msg.contains("Multi-Attach") && replacements.iter().any(|p| &p.name == pod)
        })
        .map(|(_, msg)| msg)
        .collect();
    let mut kept = true;
    for w in [&seed.db, &seed.app] {
        kept &= attachments(&admin, &w.pv)
            .await?
            .iter()
            .any(|va| va.node == node2 && va.attached);
    }
    out.node2_attachments_kept = kept;
    Ok(out)
}

/// Stops node 2 of the seed: its heartbeats (a hollow kubelet is killed
/// with its machine, or frozen, hung, when `keep_instance`), then its
/// instance in moto (a VM: `TERMINATED` in the fake Compute Engine) unless
/// `keep_instance`: a machine that is off has stopped renewing its Lease by
/// the time the cloud records it stopped.
pub async fn kill_node2(stack: &Stack, seed: &Seed, keep_instance: bool) -> anyhow::Result<()> {
    let machine = &seed.node2().machine;
    if !keep_instance && machine.is_system() {
        bail!("a BMC's System is powered off through its BMC (crate::redfish::Bmc::reset)");
    }
    match &seed.node2().kubelet {
        Some(kubelet) if keep_instance => {
            if kubelet.is_running()? {
                kubelet.freeze()?;
                kill_on_power_off(stack, seed.node2()).await;
            }
        }
        _ => silence(stack, seed.node2()).await?,
    }
    match (&machine.vm, keep_instance) {
        (_, true) => Ok(()),
        (Some(vm), false) => fake_compute().client().set_status(vm, "TERMINATED").await,
        (None, false) => crate::fixtures::stop(&stack.ec2().await, machine).await,
    }
}

/// The worker's kubelet falls silent for good: a hollow kubelet is killed,
/// a kwok node's Lease taken from kwok.
pub async fn silence(stack: &Stack, worker: &Worker) -> anyhow::Result<()> {
    match &worker.kubelet {
        Some(kubelet) => kubelet.kill(),
        None => stop_heartbeats(&stack.admin().await?, &worker.name).await,
    }
}

/// The machine's fate is its kubelet's: once the cloud says the hung
/// machine of `worker` is stopping or off (active fencing's power-off), its
/// frozen kubelet is killed, as the power cut would kill it. Watches in the
/// background until then, or until the kubelet is dropped.
async fn kill_on_power_off(stack: &Stack, worker: &Worker) {
    let Some(kubelet) = worker.kubelet.as_ref().map(Arc::downgrade) else {
        return;
    };
    let machine = worker.machine.clone();
    let ec2 = stack.ec2().await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Some(kubelet) = kubelet.upgrade() else {
                return;
            };
            let state = match &machine.vm {
                Some(vm) => fake_compute().client().status(vm).await.ok().flatten(),
                None => crate::fixtures::instance_state(&ec2, &machine.instance)
                    .await
                    .ok(),
            };
            if state.is_some_and(|s| !matches!(s.as_str(), "running" | "RUNNING" | "")) {
                let _ = kubelet.kill();
                return;
            }
        }
    });
}

/// [`kill_node2`] as a machine whose kubelet died more than `margin_secs`
/// before the cloud recorded the stop (a kubelet dead before its machine
/// is stopped), and long enough before it that its next renewal is overdue
/// (a quarter of the Lease's duration, the margin for a late one and a
/// second for the apiserver's rounding): what `FAST_NOT_READY`'s proof
/// asks for, all of it there at the stop.
pub async fn kill_node2_after_its_kubelet(
    stack: &Stack,
    seed: &Seed,
    margin_secs: i64,
) -> anyhow::Result<()> {
    use node_fencer::core::rules::silence::{LATE_RENEWAL_MARGIN_SECS, lease};
    silence(stack, seed.node2()).await?;
    let admin = stack.admin().await?;
    let spec = node_lease(&admin, &seed.node2().name)
        .await?
        .context("node 2 has no Lease")?;
    let last = spec
        .renew_time
        .map(|t| t.0.as_second())
        .context("node 2's Lease was never renewed")?;
    let every = lease::renew_every(spec.lease_duration_seconds);
    let wait = margin_secs.max(every + LATE_RENEWAL_MARGIN_SECS + 1);
    while k8s_openapi::jiff::Timestamp::now().as_second() <= last + wait {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kill_node2(stack, seed, false).await
}

/// When the Node's kubelet Lease was last renewed, in Unix seconds.
pub async fn renewed_at(admin: &Client, node: &str) -> anyhow::Result<Option<i64>> {
    Ok(node_lease(admin, node)
        .await?
        .and_then(|s| s.renew_time)
        .map(|t| t.0.as_second()))
}

/// The reason on the Node's `Ready` condition.
pub async fn ready_reason(admin: &Client, node: &str) -> anyhow::Result<Option<String>> {
    Ok(ready_condition(admin, node).await?.and_then(|c| c.reason))
}

/// [`kill_node2`], then waits up to `timeout` until node 2 is NotReady;
/// returns the time from the stop to NotReady.
pub async fn kill_node2_until_not_ready(
    stack: &Stack,
    seed: &Seed,
    keep_instance: bool,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let stopped = std::time::Instant::now();
    kill_node2(stack, seed, keep_instance).await?;
    wait_not_ready(
        &stack.admin().await?,
        std::slice::from_ref(&seed.node2().name),
        timeout,
    )
    .await?;
    Ok(stopped.elapsed())
}

/// When each workload of the seed ran again elsewhere with its volume.
#[derive(Clone, Debug)]
pub struct Recovery {
    /// db's new node.
    pub db_node: String,
    /// app's new node.
    pub app_node: String,
}

/// Waits until both workloads run away from node 2 with their volumes.
pub async fn wait_recovered(
    stack: &Stack,
    seed: &Seed,
    timeout: Duration,
) -> anyhow::Result<Recovery> {
    let node2 = seed.node2().name.clone();
    wait_until(
        "db and app to run on another node with their volumes",
        timeout,
        || async {
            let db = running_with_volume(stack, seed, &seed.db, Some(&node2)).await?;
            let app = running_with_volume(stack, seed, &seed.app, Some(&node2)).await?;
            Ok(db
                .zip(app)
                .map(|(db_node, app_node)| Recovery { db_node, app_node }))
        },
    )
    .await
}

/// Removes a scene's namespace and nodes (best effort, without waiting):
/// nodes left tainted would count against later scenes' cap.
pub async fn teardown(admin: &Client, namespace: Option<&str>, nodes: &[String]) {
    if let Some(ns) = namespace {
        let _ = Api::<Namespace>::all(admin.clone())
            .delete(ns, &DeleteParams::background())
            .await;
    }
    let api: Api<Node> = Api::all(admin.clone());
    for n in nodes {
        let _ = api.delete(n, &DeleteParams::background()).await;
    }
}

/// [`teardown`] of a seed, whose VMs are then deleted from the fake Compute
/// Engine (an EC2 seed's instances are left to moto): that frees their
/// disks (the PD CSI driver takes a VM gone as its disks detached), so the
/// external-attacher lets the VolumeAttachments of the deleted nodes go.
pub async fn teardown_seed(admin: &Client, seed: &Seed) {
    for kubelet in seed.workers.iter().filter_map(|w| w.kubelet.as_ref()) {
        let _ = kubelet.kill();
    }
    teardown(admin, Some(&seed.namespace), &seed.node_names()).await;
    for vm in seed.workers.iter().filter_map(|w| w.machine.vm.as_ref()) {
        let _ = fake_compute().client().delete_instance(vm).await;
    }
}

/// Removes a fleet: its VolumeAttachments (the external-attacher has them
/// detached) and
/// its nodes (best effort, without waiting).
pub async fn teardown_fleet(admin: &Client, fleet: &Fleet) {
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    for (w, v) in fleet.workers.iter().zip(&fleet.volumes) {
        let Some((_, vol)) = v else { continue };
        let _ = vas
            .delete(
                &ebs_attachment_name(vol, &w.name),
                &DeleteParams::background(),
            )
            .await;
    }
    let names: Vec<String> = fleet.workers.iter().map(|w| w.name.clone()).collect();
    teardown(admin, None, &names).await;
}

/// Many workers, some with one EBS volume attached through a
/// VolumeAttachment, for the storm.
#[derive(Clone, Debug)]
pub struct Fleet {
    /// The scene label.
    pub scene: String,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Per worker: its PersistentVolume and EBS volume, if it has one.
    pub volumes: Vec<Option<(String, String)>>,
}

/// Creates `count` workers; those with `with_volume(i)` get an EBS volume
/// behind a PV and a VolumeAttachment, attached through the external-attacher.
pub async fn fleet(
    stack: &Stack,
    count: usize,
    with_volume: impl Fn(usize) -> bool,
) -> anyhow::Result<Fleet> {
    let admin = stack.admin().await?;
    let ec2 = stack.ec2().await;
    let scene = unique("storm");
    ensure_storage_class(&admin).await?;
    let workers = add_workers(stack, &scene, count, |_| false).await?;
    let mut volumes = Vec::with_capacity(count);
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    for (i, w) in workers.iter().enumerate() {
        if !with_volume(i) {
            volumes.push(None);
            continue;
        }
        let vol = create_volume(&ec2, &w.machine.az).await?;
        let pv = format!("{}-pv", w.name);
        create_ebs_pv(&admin, &pv, &vol, &w.machine.az, None).await?;
        // As the attach/detach controller attaches a volume: the attachment
        // under the name Kubernetes gives it, the volume recorded on the Node.
        create(
            &vas,
            json!({
                "metadata": {"name": ebs_attachment_name(&vol, &w.name)},
                "spec": {"attacher": DRIVER, "nodeName": w.name,
                         "source": {"persistentVolumeName": pv}}
            }),
        )
        .await?;
        record_volumes(&admin, &w.name, &[&vol]).await?;
        volumes.push(Some((pv, vol)));
    }
    wait_until(
        "the fleet's volumes to be attached",
        Duration::from_secs(60),
        || async {
            for (w, v) in workers.iter().zip(&volumes) {
                let Some((pv, _)) = v else { continue };
                let attached = attachments(&admin, pv)
                    .await?
                    .iter()
                    .any(|va| va.node == w.name && va.attached);
                if !attached {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    Ok(Fleet {
        scene,
        workers,
        volumes,
    })
}

/// The EventBridge `EC2 Instance State-change Notification` for an instance.
pub fn eventbridge_event(instance: &str, state: &str) -> Value {
    json!({
        "version": "0",
        "id": uuid_like(),
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": k8s_openapi::jiff::Timestamp::now().to_string(),
        "region": "us-east-1",
        "resources": [format!("arn:aws:ec2:us-east-1:123456789012:instance/{instance}")],
        "detail": {"instance-id": instance, "state": state}
    })
}

/// An Alertmanager webhook (version 4) with one firing `KubeNodeNotReady`
/// alert per node, as kube-prometheus' rule sends it.
pub fn kube_node_not_ready(nodes: &[&str]) -> Value {
    let alerts: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "status": "firing",
                "labels": {"alertname": "KubeNodeNotReady", "node": n, "severity": "warning",
                           "job": "kube-state-metrics", "condition": "Ready", "status": "true"},
                "annotations": {"description": format!("{n} has been unready for more than 15 minutes."),
                                "summary": "Node is not ready."},
                "startsAt": k8s_openapi::jiff::Timestamp::now().to_string(),
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus.monitoring:9090/graph",
                "fingerprint": uuid_like()[..16].to_owned()
            })
        })
        .collect();
    json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"KubeNodeNotReady\"}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "node-fencer",
        "groupLabels": {"alertname": "KubeNodeNotReady"},
        "commonLabels": {"alertname": "KubeNodeNotReady"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.monitoring:9093",
        "alerts": alerts
    })
}

/// A Lambda Function URL request carrying `body`, as Alertmanager posts it.
pub fn function_url_event(body: &str, authorization: &str) -> Value {
    json!({
        "version": "2.0", "rawPath": "/", "rawQueryString": "",
        "headers": {"content-type": "application/json", "authorization": authorization,
                    "user-agent": "Alertmanager/0.28.1"},
        "requestContext": {
            "accountId": "123456789012", "apiId": "bench", "domainName": "bench.lambda-url.us-east-1.on.aws",
            "domainPrefix": "bench", "requestId": uuid_like(), "routeKey": "$default", "stage": "$default",
            "time": "23/Nov/2026:10:00:00 +0000", "timeEpoch": 1795431600000i64,
            "http": {"method": "POST", "path": "/", "protocol": "HTTP/1.1", "sourceIp": "203.0.113.9",
                     "userAgent": "Alertmanager/0.28.1"}
        },
        "body": body, "isBase64Encoded": false
    })
}

fn uuid_like() -> String {
    let u = unique("e");
    let digits: String = u.chars().filter(char::is_ascii_digit).collect();
    format!("{digits:0>32}")
}
