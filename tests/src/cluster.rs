//! The second stack: a control plane with its controllers
//! (`tests/stack/up.sh --controllers`: kube-controller-manager,
//! kube-scheduler, kwok) plus the CSI attach chain of [`crate::attacher`]
//! (the real external-attacher sidecar in front of each driver's controller)
//! and the fake Compute Engine of [`crate::gce`], for the end-to-end scenarios
//! where real controllers move pods and volumes.
//!
//! The bare [`crate::stack`] stays for the tests that create Nodes by hand:
//! the node lifecycle controller would change those under them.
//!
//! Set `NODE_FENCER_CLUSTER_STACK_DIR` to reuse a stack started with
//! `tests/stack/up.sh DIR --controllers`; otherwise a private one is started
//! and torn down by a watchdog when the process exits.
//!
//! Before use, the stack is checked for what the scenarios rely on: a node
//! whose Lease kwok lost keeps its pods, like a node whose kubelet died. Now
//! and then (seen in about one start in ten, more under CPU load) kwok v0.8.0
//! starts in a state where it keeps playing pod stages on such nodes, deleting
//! their pods at once; a private stack is then restarted.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::bail;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::scene::{SCENE_LABEL, stop_heartbeats, wait_until};
use crate::{Stack, apply_rbac, attacher, late_build, repo_root};

static CLUSTER: OnceLock<Result<Stack, String>> = OnceLock::new();
/// The drivers whose attach chains the controller stack runs, when not all.
static CLUSTER_DRIVERS: OnceLock<Vec<attacher::Driver>> = OnceLock::new();
static OLD_CLUSTER: OnceLock<Result<Stack, String>> = OnceLock::new();
static OLDEST_CLUSTER: OnceLock<Result<Stack, String>> = OnceLock::new();

/// The controller stack of this process, started on first use, with
/// `infra/kubernetes/rbac.yaml` applied, the CSIDriver objects
/// (`ebs.csi.aws.com`, `cstor.csi.openebs.io`, `pd.csi.storage.gke.io`)
/// registered, the fake Compute Engine and the CSI attach chain running.
///
/// # Panics
/// When the stack cannot be started: the message says what to install.
pub fn cluster_stack() -> &'static Stack {
    crate::started(&CLUSTER, start, "the controller test stack")
}

/// The same on the old control plane (`up.sh --old-control-plane`: the
/// Kubernetes version setup.sh builds from `tests/stack/gomod/kubernetes-legacy`,
/// where the out-of-service taint is not on), for the legacy mode's
/// scenarios: the attach/detach controller of a cluster node-fencer's legacy
/// mode serves. The CSI attach chain of the EBS and cStor drivers runs in
/// front of it; Compute Engine's is not needed there.
///
/// # Panics
/// When the stack cannot be started: the message says what to install.
pub fn old_cluster_stack() -> &'static Stack {
    crate::started(
        &OLD_CLUSTER,
        start_old,
        "the controller test stack on the old control plane",
    )
}

/// The same on the oldest Kubernetes node-fencer supports (`up.sh
/// --oldest-control-plane`: 1.15, built from `tests/stack/gomod/kubernetes-1.15`),
/// with kwok nodes and the cStor driver's attach chain behind the
/// external-attacher of 1.15's day ([`attacher::OLDEST_ATTACHER`]): the
/// other stacks' attacher needs `storage.k8s.io/v1` CSINodes, which 1.15 does not
/// serve. No CSIDriver object is registered there (1.15 serves it at
/// v1beta1 only): a CSI driver without one needs attaching, as these do.
///
/// # Panics
/// When the stack cannot be started: the message says what to install.
pub fn oldest_cluster_stack() -> &'static Stack {
    crate::started(
        &OLDEST_CLUSTER,
        start_oldest,
        "the controller test stack on the oldest supported control plane",
    )
}

/// Runs only `drivers`' attach chains in the controller stack this process
/// starts, so that a run that needs one driver (`make run`'s scene) needs
/// only its binaries; the tests run them all. Called before the first
/// [`cluster_stack`]; false when too late.
pub fn cluster_stack_drivers(drivers: &[attacher::Driver]) -> bool {
    CLUSTER.get().is_none() && CLUSTER_DRIVERS.set(drivers.to_vec()).is_ok()
}

/// How many times a private stack is started before giving up on kwok.
const KWOK_ATTEMPTS: usize = 5;

fn start() -> anyhow::Result<Stack> {
    start_private(
        "NODE_FENCER_CLUSTER_STACK_DIR",
        "cluster",
        &[],
        CLUSTER_DRIVERS
            .get()
            .map_or(&attacher::Driver::ALL[..], Vec::as_slice),
    )
}

fn start_oldest() -> anyhow::Result<Stack> {
    late_build::wait_for(&late_build::oldest_plane()?, "the oldest control plane")?;
    start_private(
        "NODE_FENCER_OLDEST_CLUSTER_STACK_DIR",
        "oldest-cluster",
        &["--oldest-control-plane"],
        &[attacher::Driver::Cstor],
    )
}

fn start_old() -> anyhow::Result<Stack> {
    late_build::wait_for(&late_build::old_plane()?, "the old control plane")?;
    start_private(
        "NODE_FENCER_OLD_CLUSTER_STACK_DIR",
        "old-cluster",
        &["--old-control-plane"],
        &[attacher::Driver::Ebs, attacher::Driver::Cstor],
    )
}

/// A controller stack: the one in `$reuse_var`'s directory, or a private one
/// in a temporary directory named by `tag`, started with `extra` options
/// and checked for kwok, with `drivers`' attach chains in front of it.
fn start_private(
    reuse_var: &str,
    tag: &str,
    extra: &[&str],
    drivers: &[attacher::Driver],
) -> anyhow::Result<Stack> {
    if let Some(dir) = std::env::var_os(reuse_var) {
        let stack = open(PathBuf::from(dir))?;
        if !set_up(&stack)? {
            bail!(
                "kwok in {dir} keeps playing pod stages on nodes whose Lease it lost (kwok v0.8.0 \
                 sometimes starts its pod controller ahead of its lease controller), so a \
                 node whose heartbeats stop would not keep its pods; restart the stack: \
                 tests/stack/down.sh {dir} && tests/stack/up.sh {dir} --controllers",
                dir = stack.dir.display()
            );
        }
        spawn_attacher(&stack, drivers)?;
        return Ok(stack);
    }
    let dir = std::env::temp_dir().join(format!("node-fencer-{tag}-{}", std::process::id()));
    let options: Vec<&str> = std::iter::once("--controllers")
        .chain(extra.iter().copied())
        .collect();
    for attempt in 1..=KWOK_ATTEMPTS {
        crate::up(&dir, &options)?;
        let stack = open(dir.clone())?;
        if set_up(&stack)? {
            spawn_attacher(&stack, drivers)?;
            return Ok(stack);
        }
        eprintln!(
            "kwok started its pod controller ahead of its lease controller (attempt \
             {attempt}/{KWOK_ATTEMPTS}): restarting the stack"
        );
        let _ = Command::new("bash")
            .arg(repo_root().join("tests/stack/down.sh"))
            .arg(&dir)
            .status();
    }
    bail!("kwok ignored lost node Leases in {KWOK_ATTEMPTS} starts of the stack")
}

/// Starts the fake Compute Engine (once per process) and the CSI attach
/// chain of `drivers`: the real external-attacher sidecar in front of each
/// controller, the real PD CSI driver's against that fake.
fn spawn_attacher(stack: &Stack, drivers: &[attacher::Driver]) -> anyhow::Result<()> {
    if drivers.is_empty() {
        return Ok(());
    }
    let fake = crate::gce::started_fake(&stack.dir)?;
    attacher::spawn(stack, fake, drivers)
}

fn open(dir: PathBuf) -> anyhow::Result<Stack> {
    let stack = Stack::open(dir)?;
    if stack
        .vars
        .get("NODE_FENCER_STACK_CONTROLLERS")
        .map(String::as_str)
        != Some("1")
    {
        bail!(
            "{} was started without --controllers: the scenarios need kube-controller-manager, \
             kube-scheduler and kwok",
            stack.dir.display()
        );
    }
    Ok(stack)
}

/// Applies the RBAC manifest, registers the CSI driver and checks kwok;
/// false when kwok does not treat a node whose Lease it lost as dead.
fn set_up(stack: &Stack) -> anyhow::Result<bool> {
    crate::on_own_thread("setting up the controller stack", || async {
        apply_rbac(stack).await?;
        let admin = stack.admin().await?;
        if stack.serves_csi_v1() {
            attacher::register_drivers(&admin).await?;
        }
        kwok_keeps_dead_nodes_pods(&admin).await
    })
}

/// Whether kwok leaves the pods of a node whose Lease it lost alone, as a
/// dead kubelet would: a pod deleted there must stay `Terminating`.
///
/// kwok v0.8.0 starts its stage controllers in Go map order; when the pod
/// controller comes before the node lease controller, it captures no
/// read-only check and keeps deleting pods on such nodes at once, so a dead
/// node's pods would vanish and their volumes detach without any fencing.
async fn kwok_keeps_dead_nodes_pods(admin: &Client) -> anyhow::Result<bool> {
    let name = crate::fixtures::unique("kwok-probe");
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": name}}
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": name, "containers": [{"name": "c", "image": "probe"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let probe = async {
        wait_until(
            "the kwok probe pod to run",
            Duration::from_secs(30),
            || async {
                let phase = pods.get(&name).await?.status.and_then(|s| s.phase);
                Ok((phase.as_deref() == Some("Running")).then_some(()))
            },
        )
        .await?;
        stop_heartbeats(admin, &name).await?;
        // Let kwok's lease informer see the new holder.
        tokio::time::sleep(Duration::from_millis(500)).await;
        pods.delete(&name, &DeleteParams::default()).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok::<bool, anyhow::Error>(pods.get_opt(&name).await?.is_some())
    }
    .await;
    let _ = pods
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await;
    let _ = nodes.delete(&name, &DeleteParams::default()).await;
    probe
}

/// Scenarios on the controller stack take this lock: they share the cap on
/// out-of-service nodes and the controllers' attention. It is not the lock of
/// [`crate::serial`], so they run beside the tests of the bare stack.
///
/// A scenario that fails before its teardown leaves its nodes behind,
/// NotReady and perhaps fenced; the next ones would count them under the
/// cap and the partition guard and fail for it. So whoever takes the lock
/// first removes what an earlier scenario left: under the lock, every scene
/// node and test namespace still there is a leftover.
pub async fn cluster_serial() -> tokio::sync::MutexGuard<'static, ()> {
    serial_on(cluster_stack()).await
}

/// [`cluster_serial`] for the scenarios on [`oldest_cluster_stack`].
pub async fn oldest_cluster_serial() -> tokio::sync::MutexGuard<'static, ()> {
    serial_on(oldest_cluster_stack()).await
}

/// [`cluster_serial`] for the scenarios on [`old_cluster_stack`]: the same
/// lock, so that two control planes' scenarios never share the cores at
/// once (their timings would suffer), and the old stack's leftovers removed.
pub async fn old_cluster_serial() -> tokio::sync::MutexGuard<'static, ()> {
    serial_on(old_cluster_stack()).await
}

async fn serial_on(stack: &Stack) -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = LOCK.lock().await;
    if let Err(e) = remove_leftovers(stack).await {
        panic!("could not remove what an earlier scenario left: {e:#}");
    }
    guard
}

/// Deletes the scene nodes and test namespaces on the controller stack and
/// waits for the nodes to be gone, saying what it found.
async fn remove_leftovers(stack: &Stack) -> anyhow::Result<()> {
    let admin = stack.admin().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let scenes = ListParams::default().labels(SCENE_LABEL);
    let left: Vec<String> = nodes
        .list_metadata(&scenes)
        .await?
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let tests = ListParams::default().labels("node-fencer.io/test=true");
    for ns in namespaces.list_metadata(&tests).await? {
        let deleting = ns.metadata.deletion_timestamp.is_some();
        if let Some(name) = ns.metadata.name.filter(|_| !deleting) {
            eprintln!("removing namespace {name}, left by an earlier scenario");
            namespaces
                .delete(&name, &DeleteParams::background())
                .await?;
        }
    }
    if left.is_empty() {
        return Ok(());
    }
    eprintln!("removing nodes left by an earlier scenario: {left:?}");
    for name in &left {
        nodes.delete(name, &DeleteParams::background()).await?;
    }
    wait_until(
        "the leftover scene nodes to be gone",
        Duration::from_secs(30),
        || async {
            let still = nodes.list_metadata(&scenes).await?.items.len();
            Ok((still == 0).then_some(()))
        },
    )
    .await
}

/// Applies `infra/kubernetes/rbac.yaml` again (after a test changed the role).
pub async fn restore_rbac(stack: &Stack) -> anyhow::Result<()> {
    apply_rbac(stack).await
}

/// Whether `client` may do `verb` on the cluster-scoped `resource` of `group`
/// (a SelfSubjectAccessReview, which every authenticated user may create).
pub async fn can(client: &Client, verb: &str, group: &str, resource: &str) -> anyhow::Result<bool> {
    Ok(node_fencer::shell::cluster::can(client, group, resource, verb, None).await?)
}

/// Waits until the authorizer gives `client` the expected answer for `verb`
/// on `resource` (RBAC changes reach the authorizer through an informer).
pub async fn wait_for_rbac(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    allowed: bool,
) -> anyhow::Result<()> {
    wait_until(
        &format!("RBAC to answer allowed={allowed} for `{verb} {resource}`"),
        Duration::from_secs(30),
        || async { Ok((can(client, verb, group, resource).await? == allowed).then_some(())) },
    )
    .await
}
