//! The Kubernetes side: the traits the pipeline talks to, split by what a
//! stage needs ([`ClusterReads`], [`FencingWrites`], [`Coordination`]; a
//! [`Cluster`] is all three), and their implementation over `kube`, one file
//! each. Only the calls in `infra/kubernetes/rbac.yaml`.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, PersistentVolume, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use tokio::sync::OnceCell;

pub use crate::core::model::facts::PodRef;
use crate::core::model::facts::{AttachmentFacts, NodeFacts, PvFacts, SeenOff};
use crate::core::model::instance::InstanceId;
use crate::core::model::kube_read;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::kube_patch::{
    self, ConfirmPatch, Ending, PowerStamp, Stamp, TaintPatch, UntaintPatch,
};
pub use crate::core::outbound::kube_patch::{ConfirmOutcome, TaintOutcome, UntaintOutcome};
use crate::core::rules::compat::{self, EventsApi};
use crate::core::rules::control::{self, KillSwitch, LeaseFacts, LeaseStep};
use crate::core::rules::in_use::{self, ReleaseOutcome, ReleasePatch};
use crate::core::rules::mode::ServerVersion;
use crate::core::rules::retry::{self, KUBERNETES};
use crate::core::rules::silence::{self, LeaseRead, MarkPatch};
use crate::core::rules::view::Census;
use crate::core::settings::grants::Grant;
use crate::core::settings::redfish::Inventory;
use crate::shell::slim;

mod coordination;
mod reads;
mod writes;

/// How often a taint patch is retried after a conflict before giving up.
pub const CONFLICT_RETRIES: usize = 5;
pub use crate::core::settings::permissions::NODE_LEASE_NAMESPACE;
/// Field manager and reporting controller name.
pub const MANAGER: &str = "node-fencer";

/// A failed Kubernetes call, named after the operation.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Listing Nodes failed.
    #[error("listing nodes failed: {0}")]
    ListNodes(#[source] kube::Error),
    /// Reading one Node failed.
    #[error("reading node {node} failed: {source}")]
    GetNode {
        /// The node.
        node: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The taint patch failed (other than by a conflict that a retry fixed).
    #[error("patching node {node} failed: {source}")]
    PatchNode {
        /// The node.
        node: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Every retry met a conflicting writer.
    #[error("patching node {node}: still conflicting after {CONFLICT_RETRIES} attempts")]
    PatchConflict {
        /// The node.
        node: String,
    },
    /// The write could not be made safe (no resourceVersion to guard it, or
    /// an existing taint that cannot be restated).
    #[error("node {node}: refusing a write that could lose another writer's change")]
    UnsafeWrite {
        /// The node.
        node: String,
    },
    /// Listing VolumeAttachments failed.
    #[error("listing volumeattachments failed: {0}")]
    ListVolumeAttachments(#[source] kube::Error),
    /// Listing PersistentVolumes failed.
    #[error("listing persistentvolumes failed: {0}")]
    ListPersistentVolumes(#[source] kube::Error),
    /// Reading one object of the node's volumes by name failed.
    #[error("reading {kind} {name} failed: {source}")]
    GetVolume {
        /// `volumeattachment` or `persistentvolume`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The server version could not be read or understood.
    #[error("reading the server version failed: {0}")]
    Version(String),
    /// Listing or force-deleting the pods of a node failed (legacy mode).
    #[error("{what} failed: {source}")]
    Pods {
        /// What was attempted.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Deleting a VolumeAttachment failed (legacy mode).
    #[error("deleting volumeattachment {name} failed: {source}")]
    DeleteVolumeAttachment {
        /// The VolumeAttachment.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Reading the kill-switch ConfigMap failed.
    #[error("reading the kill switch configmap {namespace}/node-fencer failed: {source}")]
    KillSwitch {
        /// Its namespace.
        namespace: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A call on the fencing Lease failed.
    #[error("the fencing lease {namespace}/node-fencer: {source}")]
    Lease {
        /// Its namespace.
        namespace: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Another invocation held the Lease for longer than node-fencer waits
    /// (at most [`control::LEASE_WAIT`], and never past the request's end).
    #[error("the fencing lease is held by {holder} for longer than this invocation may wait (at most {}s); retry later", control::LEASE_WAIT.as_secs())]
    LeaseBusy {
        /// The holder.
        holder: String,
    },
    /// Reading a Node's kubelet Lease in `kube-node-lease` failed.
    #[error("reading the kubelet lease kube-node-lease/{node} failed: {source}")]
    GetNodeLease {
        /// The node.
        node: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Writing a Node's `Ready` condition (`nodes/status`) failed.
    #[error("marking node {node} Ready=Unknown failed: {source}")]
    PatchNodeStatus {
        /// The node.
        node: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Creating an Event failed.
    #[error("creating an event on node {node} failed: {source}")]
    CreateEvent {
        /// The node.
        node: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// What marking a Node `Ready=Unknown` came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkOutcome {
    /// Written.
    Marked,
    /// The Node of that name is not the one judged (another uid, another
    /// machine): nothing written.
    AnotherNode,
    /// The Node was not `Ready=True` at patch time: nothing written.
    AlreadyNotReady,
    /// Another writer changed the Node between the read and the write.
    Conflict,
    /// No such Node.
    NodeGone,
}

/// The Node a write is meant for, as it was judged: a Node of the same
/// name read at write time is held to it.
#[derive(Clone, Copy, Debug)]
pub struct JudgedNode<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its `metadata.uid`, when it was read.
    pub uid: Option<&'a str>,
    /// The machine it was judged on.
    pub machine: &'a InstanceId,
    /// The resourceVersion it had when read before the proof the write
    /// rests on (the fast path's mark): a Node written since (its kubelet
    /// back, or another one adopting it) is proven again first. `None`:
    /// any version.
    pub version: Option<&'a str>,
}

impl JudgedNode<'_> {
    /// True when `now`, the Node of that name read at write time, is the
    /// same object as the one judged: the same uid (when both are known),
    /// and the machine judged when it names one. A Node with no provider
    /// id names none in its facts (its machine was found by its address
    /// in the cluster's VPC when it was judged): the uid holds it.
    pub fn is_same_object(&self, now: Option<&NodeFacts>) -> bool {
        now.is_some_and(|n| {
            let uid = match (self.uid, n.uid.as_deref()) {
                (Some(judged), Some(now)) => judged == now,
                _ => true,
            };
            uid && n.instance.as_ref().is_none_or(|m| m == self.machine)
        })
    }

    /// True when `now`, the Node of that name read at write time, is the
    /// one judged: the same uid (when both are known) and the same machine.
    pub fn is(&self, now: Option<&NodeFacts>) -> bool {
        self.is_same_object(now) && now.is_some_and(|n| n.instance.as_ref() == Some(self.machine))
    }

    /// True when `now`, the Node read at write time, has not been written
    /// since it was read before the proof (when that version is known).
    pub fn unchanged(&self, now: Option<&NodeFacts>) -> bool {
        self.version
            .is_none_or(|judged| now.is_some_and(|n| n.version.as_deref() == Some(judged)))
    }
}

/// The fencing Lease as taken.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTaken {
    /// It had to wait (another holder, or a writer racing it).
    pub waited: bool,
    /// When the time written into the Lease was read: its duration runs
    /// from here, however long the wait before it took.
    pub stamped: Instant,
}

/// What node-fencer reads of the cluster: Nodes, volumes, pods, the
/// server version. Nothing here writes.
#[async_trait]
pub trait ClusterReads: Send + Sync {
    /// Lists every Node once.
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError>;
    /// Reads one Node by name; `None` when there is none.
    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError>;
    /// Lists the Nodes that carry node-fencer's label.
    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError>;
    /// How many Nodes the cluster has, from a list of one.
    async fn count_nodes(&self) -> Result<usize, ClusterError>;
    /// Lists every VolumeAttachment (no field selector exists for `spec.nodeName`).
    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError>;
    /// Lists every PersistentVolume.
    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError>;
    /// Reads one VolumeAttachment; `None` if there is none of that name.
    async fn get_volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<AttachmentFacts>, ClusterError>;
    /// Reads one PersistentVolume; `None` if there is none of that name.
    async fn get_persistent_volume(&self, name: &str) -> Result<Option<PvFacts>, ClusterError>;
    /// The API server's version.
    async fn server_version(&self) -> Result<ServerVersion, ClusterError>;
    /// The Node's kubelet Lease (`kube-node-lease/<node>`), as the proof
    /// of a silent kubelet reads it: with the apiserver's time of the read.
    async fn node_lease(&self, node: &str, uid: Option<&str>) -> Result<LeaseRead, ClusterError>;
    /// The pods bound to a Node (legacy mode).
    async fn pods_on_node(
        &self,
        node: &str,
        out_of_service: &[String],
    ) -> Result<Vec<PodRef>, ClusterError>;
}

/// What fencing and recovery write: the taint and its end, the marks, the
/// legacy deletions, the Events. Each write is guarded (resourceVersion, or
/// the uid of the object it names).
#[async_trait]
pub trait FencingWrites: Send + Sync {
    /// Adds the out-of-service taint and annotations, guarded by resourceVersion.
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError>;
    /// Records an Event on a Node under the object name `name`; one that
    /// exists already counts as recorded.
    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError>;
    /// Ends the fencing `ending` names, if the Node as read at patch time
    /// meets its settle rule: removes node-fencer's taint and annotations,
    /// guarded by resourceVersion.
    async fn untaint_node(
        &self,
        node: &str,
        ending: &Ending<'_>,
    ) -> Result<UntaintOutcome, ClusterError>;
    /// Records an operator's confirmation that the Node, fenced by
    /// node-fencer, is healthy (manual recovery), guarded by resourceVersion.
    async fn confirm_recovery(
        &self,
        node: &str,
        fenced_at: Option<&str>,
    ) -> Result<ConfirmOutcome, ClusterError>;
    /// Sets the Node's `Ready` condition to `Unknown` with `message`, if it
    /// is `True` as read at patch time and is still the Node judged (its
    /// uid, its machine), guarded by that resourceVersion (`nodes/status`).
    /// A conflict is answered, not retried: the caller proves the kubelet
    /// silent again before another attempt.
    async fn mark_not_ready(
        &self,
        judged: &JudgedNode<'_>,
        message: &str,
    ) -> Result<MarkOutcome, ClusterError>;
    /// Notes on the Node judged that node-fencer saw its machine off;
    /// `Ok(false)` when the Node is gone or another object.
    async fn note_machine_off(
        &self,
        judged: &JudgedNode<'_>,
        note: &SeenOff,
    ) -> Result<bool, ClusterError>;
    /// Records on the Node that node-fencer powered its machine off (active
    /// fencing); `Ok(false)` when the Node is gone.
    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError>;
    /// Takes back the power-off mark (the stop was refused); a Node gone is
    /// fine.
    async fn clear_power_mark(&self, node: &str) -> Result<(), ClusterError>;
    /// Force-deletes a pod if it is still the object `pod.uid`: grace period 0
    /// (legacy mode). A pod already gone, or replaced, is fine.
    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError>;
    /// Deletes the VolumeAttachment `name` if it is still the object `uid`
    /// (legacy mode). One already gone, or replaced, is fine.
    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError>;
    /// Takes `names` out of the Node's `status.volumesInUse` (legacy mode,
    /// once its machine is confirmed off and its pods force-deleted),
    /// guarded by the resourceVersion read; a conflict is read and decided
    /// again. Only on the Node object judged (`uid`, when it was read): a
    /// Node registered again under the name is another, and is left alone.
    async fn release_volumes_in_use(
        &self,
        node: &str,
        uid: Option<&str>,
        names: &[String],
    ) -> Result<ReleaseOutcome, ClusterError>;
}

/// The objects that coordinate invocations: the fencing Lease, the
/// census of the Nodes others put out of service, the kill switch.
#[async_trait]
pub trait Coordination: Send + Sync {
    /// The last sweep's census, from the census Lease in `namespace`.
    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError>;
    /// Leaves `census` in the census Lease in `namespace`, as `holder`.
    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        holder: &str,
    ) -> Result<(), ClusterError>;
    /// Reads the kill switch in `namespace`.
    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError>;
    /// Takes the fencing Lease in `namespace` for `holder`, waiting up to
    /// [`control::LEASE_WAIT`], and never past `until` (the request's end,
    /// its answer's reserve kept), for another holder to release it.
    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
        until: Option<Instant>,
    ) -> Result<LeaseTaken, ClusterError>;
    /// Releases the Lease if `holder` still holds it.
    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError>;
    /// Renews the fencing Lease `holder` holds: `Ok(false)` when it is not
    /// theirs any more (taken over, or gone).
    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError>;
}

/// Every Kubernetes call node-fencer makes (only those in
/// `infra/kubernetes/rbac.yaml`), as one handle.
pub trait Cluster: ClusterReads + FencingWrites + Coordination {}

impl<T: ClusterReads + FencingWrites + Coordination> Cluster for T {}

/// [`Cluster`] over a `kube::Client`.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    instance: String,
    /// The server version, asked once.
    version: Arc<OnceCell<ServerVersion>>,
    /// The Lease as this handle last wrote it, so releasing needs no read.
    held: Arc<Mutex<Option<Lease>>>,
    /// Which on-premises machine backs which Node, when there are some.
    inventory: Option<Arc<Inventory>>,
}

impl Kube {
    /// Wraps a client; `instance` names this reporter in Events (function name or host).
    pub fn new(client: Client, instance: impl Into<String>) -> Self {
        Self {
            client,
            instance: instance.into(),
            version: Arc::default(),
            held: Arc::default(),
            inventory: None,
        }
    }

    /// Gives each Node without a cloud machine the on-premises machine the
    /// inventory says backs it.
    pub fn placing(mut self, inventory: Option<Arc<Inventory>>) -> Self {
        self.inventory = inventory;
        self
    }

    /// A Node read into facts, its machine placed. A Node whose provider id
    /// names a cloud machine is the cloud's: the inventory is not asked.
    fn facts(&self, node: Node) -> Option<NodeFacts> {
        let mut facts = kube_read::node_facts(&node)?;
        if facts.instance.is_none()
            && let Some(inventory) = &self.inventory
        {
            facts.instance = inventory.machine_of(&facts.name, &facts.labels);
        }
        Some(facts)
    }

    /// Shares `version` as the cache of the server version: an execution
    /// environment asks once, not on every invocation.
    pub fn sharing_version(mut self, version: Arc<OnceCell<ServerVersion>>) -> Self {
        self.version = version;
        self
    }
}

/// The objects a list asks for per page. Pages keep each response, and the
/// apiserver's work per request, small on a large cluster; the continue
/// token keeps the pages one consistent snapshot.
const LIST_PAGE: u32 = 500;

impl Kube {
    /// Every object at `path` that `params` select, decoded into the slim
    /// shape `T`, page by page. The list is a consistent read (no
    /// resourceVersion): the recount under the Lease must see the taints the
    /// previous holder wrote, which a read from the watch cache at
    /// `resourceVersion=0` need not.
    async fn list_all<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        params: &ListParams,
        call: &'static str,
    ) -> Result<Vec<T>, kube::Error> {
        let mut params = params.clone().limit(LIST_PAGE);
        let mut items = Vec::new();
        loop {
            let page: slim::List<T> = retrying(call, || self.list_with(path, &params)).await?;
            items.extend(page.items);
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(items),
            }
        }
    }

    /// Reads the object `name` at `path` in the slim shape `T`; `None` if
    /// there is none of that name.
    async fn get_slim<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        name: &str,
        call: &'static str,
    ) -> Result<Option<T>, kube::Error> {
        let request = kube::core::Request::new(path)
            .get(name, &kube::api::GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        match retrying(call, || self.client.request::<T>(request.clone())).await {
            Ok(object) => Ok(Some(object)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the kubelet Lease of `node` with the apiserver's `Date` of the
    /// answer (Unix seconds): the proof of a silent kubelet times the
    /// Lease's last write on the apiserver's clock, not the kubelet's.
    /// `None` for no Lease of that name.
    async fn get_dated_lease(
        &self,
        node: &str,
    ) -> Result<(Option<Lease>, Option<i64>), kube::Error> {
        let request = kube::core::Request::new(format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"
        ))
        .get(node, &kube::api::GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await?;
        let status = response.status();
        let server_now = response
            .headers()
            .get(http::header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(silence::lease::http_date);
        let body = response.into_body().collect_bytes().await?;
        if status.is_success() {
            let lease = serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
            return Ok((Some(lease), server_now));
        }
        let code = status.as_u16();
        let failure = match serde_json::from_slice::<kube::core::Status>(&body) {
            Ok(s) if s.code != 0 => s,
            Ok(s) => s.with_code(code),
            Err(_) => {
                let text = String::from_utf8_lossy(&body);
                kube::core::Status::failure(&truncate(text.trim(), 512), "unparsable error body")
                    .with_code(code)
            }
        };
        let error = kube::Error::Api(failure.boxed());
        if is_not_found(&error) {
            return Ok((None, server_now));
        }
        Err(error)
    }

    /// One request for the objects at `path` that `params` select.
    async fn list_with<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        params: &ListParams,
    ) -> Result<T, kube::Error> {
        let request = kube::core::Request::new(path)
            .list(params)
            .map_err(kube::Error::BuildRequest)?;
        self.client.request(request).await
    }

    /// Lists the Nodes that `params` select, as facts.
    async fn node_facts(&self, params: &ListParams) -> Result<Vec<NodeFacts>, ClusterError> {
        let nodes: Vec<slim::SlimNode> = self
            .list_all(slim::NODES, params, "list nodes")
            .await
            .map_err(ClusterError::ListNodes)?;
        Ok(nodes
            .into_iter()
            .filter_map(|n| self.facts(Node::from(n)))
            .collect())
    }
}

/// What a guarded write of a Node does, given the Node as just read.
enum Write<T> {
    /// Send this merge patch (it carries the resourceVersion read); `T` on success.
    Patch(serde_json::Value, T),
    /// The same, of the `status` subresource.
    PatchStatus(serde_json::Value, T),
    /// Nothing to write: answer `T`.
    Answer(T),
    /// No write can be made safe.
    Refuse,
}

impl Kube {
    /// Merges `patch` into the Node `node`, unguarded (what it writes is
    /// the same when repeated): `Ok(false)` when the apiserver's refusal is
    /// one `nothing` names (the Node gone, or another object of the name).
    async fn merge_into_node(
        &self,
        node: &str,
        patch: &serde_json::Value,
        nothing: impl Fn(&kube::Error) -> bool,
    ) -> Result<bool, ClusterError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = PatchParams::default();
        let merge = Patch::Merge(patch);
        match retrying("patch node", || nodes.patch(node, &params, &merge)).await {
            Ok(_) => Ok(true),
            Err(e) if nothing(&e) => Ok(false),
            Err(source) => Err(ClusterError::PatchNode {
                node: node.into(),
                source,
            }),
        }
    }

    /// Reads the Node, lets `plan` decide, and sends the patch guarded by
    /// the resourceVersion read; on a conflict (another writer in between)
    /// reads and decides again. `plan` also gets what the patch sent last
    /// would have answered: a conflict may follow our own write whose answer
    /// was lost (its repeat carries a stale resourceVersion). A Node that is
    /// gone answers `gone`.
    async fn guarded_patch<T: Copy>(
        &self,
        node: &str,
        gone: T,
        plan: impl Fn(&Node, Option<T>) -> Write<T>,
    ) -> Result<T, ClusterError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut sent = None;
        for attempt in 0..CONFLICT_RETRIES {
            let current = match retrying("get node", || nodes.get(node)).await {
                Ok(n) => n,
                Err(e) if is_not_found(&e) => return Ok(gone),
                Err(source) => {
                    return Err(ClusterError::GetNode {
                        node: node.into(),
                        source,
                    });
                }
            };
            let (patch, done, status) = match plan(&current, sent) {
                Write::Patch(patch, done) => (patch, done, false),
                Write::PatchStatus(patch, done) => (patch, done, true),
                Write::Answer(answer) => return Ok(answer),
                Write::Refuse => return Err(ClusterError::UnsafeWrite { node: node.into() }),
            };
            let params = PatchParams::default();
            let merge = Patch::Merge(&patch);
            let sent_patch = retrying("patch node", || async {
                if status {
                    nodes.patch_status(node, &params, &merge).await
                } else {
                    nodes.patch(node, &params, &merge).await
                }
            });
            match sent_patch.await {
                Ok(_) => return Ok(done),
                Err(e) if is_conflict(&e) => {
                    sent = Some(done);
                    tracing::info!(node, attempt, "node changed under us; re-reading");
                    // Short, growing pause: conflicts come from a live writer
                    // (kubelet, node controller) that settles within milliseconds.
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                }
                Err(e) if is_not_found(&e) => return Ok(gone),
                Err(source) => {
                    return Err(ClusterError::PatchNode {
                        node: node.into(),
                        source,
                    });
                }
            }
        }
        Err(ClusterError::PatchConflict { node: node.into() })
    }
}

/// The `nodes/status` patch that marks `current` `Ready=Unknown` now with
/// `message`; `None` when it is not `Ready=True`, nothing to write.
pub(crate) fn mark_patch_now(
    node: &str,
    current: &Node,
    message: &str,
) -> Result<Option<serde_json::Value>, ClusterError> {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    match silence::mark_patch(current, message, now) {
        MarkPatch::Apply(patch) => Ok(Some(patch)),
        MarkPatch::NotReady => Ok(None),
        MarkPatch::NoResourceVersion => Err(ClusterError::UnsafeWrite { node: node.into() }),
    }
}

/// Failures a later attempt can fix: throttling, an overloaded or restarting
/// apiserver, a connection refused, dropped or timed out.
fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => retry::is_transient_status(status.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs one Kubernetes call, retrying transient failures under
/// [`KUBERNETES`]. Every call retried here is safe to repeat: reads, the
/// resourceVersion-guarded taint patch (a repeat of a write that landed gets
/// 409 and is re-read), and Event creation under a fixed name.
async fn retrying<T, F, Fut>(call: &'static str, attempt: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    crate::shell::retrying::retrying(&KUBERNETES, attempt, is_transient, |failed, pause, e| {
        tracing::warn!(
            call,
            failed,
            pause_ms = pause.as_millis() as u64,
            error = %e,
            "transient Kubernetes failure; retrying"
        );
    })
    .await
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_conflict())
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_not_found())
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Whether `client` may do `verb` on `resource` of `group` (a subresource
/// after a slash, as in `nodes/status`): cluster-wide, or in a namespace
/// (and on a named object) given by `scope`. A SelfSubjectAccessReview,
/// which every authenticated user may create.
pub async fn can(
    client: &Client,
    group: &str,
    resource: &str,
    verb: &str,
    scope: Option<(&str, Option<&str>)>,
) -> Result<bool, kube::Error> {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                verb: Some(verb.into()),
                namespace: scope.map(|(ns, _)| ns.to_owned()),
                name: scope.and_then(|(_, n)| n.map(str::to_owned)),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// How many SelfSubjectAccessReviews a witness round sends at once.
const ASKED_AT_ONCE: usize = 8;

/// Of `grants`, those Kubernetes denies `client`, in their order; the first
/// error when one could not be asked.
pub async fn denied<'g>(
    client: &Client,
    grants: &'g [Grant],
) -> Result<Vec<&'g Grant>, kube::Error> {
    use futures::StreamExt as _;
    let answers: Vec<Result<bool, kube::Error>> = futures::stream::iter(grants)
        .map(|g| can(client, g.group, g.resource, g.verb, g.scope()))
        .buffered(ASKED_AT_ONCE)
        .collect()
        .await;
    let mut denied = Vec::new();
    for (grant, answer) in grants.iter().zip(answers) {
        if !answer? {
            denied.push(grant);
        }
    }
    Ok(denied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::Readiness;

    /// Issue 58, item 3: the taint is held to the object judged, its uid,
    /// and its machine where the Node names one; a Node without a provider
    /// id (its machine found by its address in the cluster's VPC) is held
    /// by its uid alone.
    #[test]
    fn a_write_is_held_to_the_object_judged() {
        let machine = InstanceId::parse("i-0123456789abcdef0").unwrap();
        let other = InstanceId::parse("i-0fedcba9876543210").unwrap();
        let judged = JudgedNode {
            name: "worker-2",
            uid: Some("uid-1"),
            machine: &machine,
            version: None,
        };
        let node = |uid: &str, on: Option<&InstanceId>| {
            let mut n = NodeFacts::bare("worker-2", Readiness::Unknown);
            n.uid = Some(uid.into());
            n.instance = on.cloned();
            n
        };
        assert!(judged.is_same_object(Some(&node("uid-1", Some(&machine)))));
        assert!(judged.is_same_object(Some(&node("uid-1", None))));
        assert!(!judged.is_same_object(Some(&node("uid-2", None))));
        assert!(!judged.is_same_object(Some(&node("uid-1", Some(&other)))));
        assert!(!judged.is_same_object(None));
        // The mark still wants the machine named.
        assert!(!judged.is(Some(&node("uid-1", None))));
    }
}
