//! The Kubernetes side: the [`Cluster`] trait the pipeline talks to, and its
//! implementation over `kube`. Only the calls in `infra/kubernetes/rbac.yaml`.

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
use kube::{Api, Client};
use tokio::sync::OnceCell;

use crate::core::control::{self, KillSwitch, LeaseFacts, LeaseStep};
use crate::core::events::NodeEvent;
pub use crate::core::facts::PodRef;
use crate::core::facts::{AttachmentFacts, NodeFacts, PvFacts};
use crate::core::kube_model::{
    self, ConfirmPatch, Ending, PowerStamp, Stamp, TaintPatch, UntaintPatch,
};
pub use crate::core::kube_model::{ConfirmOutcome, TaintOutcome, UntaintOutcome};
use crate::core::mode::ServerVersion;
use crate::core::retry::{self, KUBERNETES};
use crate::core::view::Census;
use crate::shell::slim;

/// How often a taint patch is retried after a conflict before giving up.
pub const CONFLICT_RETRIES: usize = 5;
/// Namespace of Node events, as the kubelet and `kubectl describe node` use.
const EVENT_NAMESPACE: &str = "default";
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
    /// Another invocation held the Lease for longer than node-fencer waits.
    #[error("the fencing lease is held by {holder} for longer than {}s; retry later", control::LEASE_WAIT.as_secs())]
    LeaseBusy {
        /// The holder.
        holder: String,
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

/// The fencing Lease as taken.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTaken {
    /// It had to wait (another holder, or a writer racing it).
    pub waited: bool,
    /// When the time written into the Lease was read: its duration runs
    /// from here, however long the wait before it took.
    pub stamped: Instant,
}

/// The Kubernetes calls node-fencer makes.
#[async_trait]
pub trait Cluster: Send + Sync {
    /// Lists every Node once.
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError>;
    /// Reads one Node by name; `None` when there is none.
    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError>;
    /// Lists the Nodes that carry node-fencer's label.
    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError>;
    /// How many Nodes the cluster has, from a list of one.
    async fn count_nodes(&self) -> Result<usize, ClusterError>;
    /// The last sweep's census, from the census Lease in `namespace`.
    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError>;
    /// Leaves `census` in the census Lease in `namespace`, as `holder`.
    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        holder: &str,
    ) -> Result<(), ClusterError>;
    /// Adds the out-of-service taint and annotations, guarded by resourceVersion.
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError>;
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
    /// Records an Event on a Node under the object name `name`; one that
    /// exists already counts as recorded.
    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError>;
    /// The API server's version.
    async fn server_version(&self) -> Result<ServerVersion, ClusterError>;
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
    async fn confirm_recovery(&self, node: &str) -> Result<ConfirmOutcome, ClusterError>;
    /// Records on the Node that node-fencer powered its machine off (active
    /// fencing); `Ok(false)` when the Node is gone.
    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError>;
    /// The pods bound to a Node (legacy mode).
    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodRef>, ClusterError>;
    /// Force-deletes a pod if it is still the object `pod.uid`: grace period 0
    /// (legacy mode). A pod already gone, or replaced, is fine.
    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError>;
    /// Deletes the VolumeAttachment `name` if it is still the object `uid`
    /// (legacy mode). One already gone, or replaced, is fine.
    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError>;
    /// Reads the kill switch in `namespace`.
    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError>;
    /// Takes the fencing Lease in `namespace` for `holder`, waiting up to
    /// [`control::LEASE_WAIT`] for another holder to release it.
    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
    ) -> Result<LeaseTaken, ClusterError>;
    /// Releases the Lease if `holder` still holds it.
    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError>;
    /// Renews the fencing Lease `holder` holds: `Ok(false)` when it is not
    /// theirs any more (taken over, or gone).
    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError>;
}

/// [`Cluster`] over a `kube::Client`.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    instance: String,
    /// The server version, asked once.
    version: Arc<OnceCell<ServerVersion>>,
    /// The Lease as this handle last wrote it, so releasing needs no read.
    held: Arc<Mutex<Option<Lease>>>,
}

impl Kube {
    /// Wraps a client; `instance` names this reporter in Events (function name or host).
    pub fn new(client: Client, instance: impl Into<String>) -> Self {
        Self {
            client,
            instance: instance.into(),
            version: Arc::default(),
            held: Arc::default(),
        }
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
            .filter_map(|n| kube_model::node_facts(&Node::from(n)))
            .collect())
    }
}

/// What a guarded write of a Node does, given the Node as just read.
enum Write<T> {
    /// Send this merge patch (it carries the resourceVersion read); `T` on success.
    Patch(serde_json::Value, T),
    /// Nothing to write: answer `T`.
    Answer(T),
    /// No write can be made safe.
    Refuse,
}

impl Kube {
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
            let (patch, done) = match plan(&current, sent) {
                Write::Patch(patch, done) => (patch, done),
                Write::Answer(answer) => return Ok(answer),
                Write::Refuse => return Err(ClusterError::UnsafeWrite { node: node.into() }),
            };
            let params = PatchParams::default();
            let merge = Patch::Merge(&patch);
            match retrying("patch node", || nodes.patch(node, &params, &merge)).await {
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
async fn retrying<T, F, Fut>(call: &'static str, mut attempt: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let started = Instant::now();
    let mut failed = 0;
    loop {
        match attempt().await {
            Err(e) if is_transient(&e) => {
                failed += 1;
                let Some(pause) = KUBERNETES.pause(failed, started.elapsed(), fastrand::f64())
                else {
                    return Err(e);
                };
                tracing::warn!(
                    call,
                    failed,
                    pause_ms = pause.as_millis() as u64,
                    error = %e,
                    "transient Kubernetes failure; retrying"
                );
                tokio::time::sleep(pause).await;
            }
            done => return done,
        }
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_conflict())
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_not_found())
}

#[async_trait]
impl Cluster for Kube {
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.node_facts(&ListParams::default()).await
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError> {
        let node: Option<slim::SlimNode> = self
            .get_slim(slim::NODES, name, "get node")
            .await
            .map_err(|source| ClusterError::GetNode {
                node: name.into(),
                source,
            })?;
        Ok(node.and_then(|n| kube_model::node_facts(&Node::from(n))))
    }

    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        let selector = format!("{}=true", kube_model::LABEL_FENCED);
        self.node_facts(&ListParams::default().labels(&selector))
            .await
    }

    async fn count_nodes(&self) -> Result<usize, ClusterError> {
        let params = ListParams::default().limit(1);
        let page: slim::List<slim::SlimNode> =
            retrying("count nodes", || self.list_with(slim::NODES, &params))
                .await
                .map_err(ClusterError::ListNodes)?;
        let more = usize::try_from(page.metadata.remaining_item_count.unwrap_or(0)).unwrap_or(0);
        Ok(page.items.len() + more)
    }

    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let found = retrying("get census", || api.get_opt(control::CENSUS_NAME))
            .await
            .map_err(|source| ClusterError::Lease {
                namespace: namespace.into(),
                source,
            })?;
        Ok(found.as_ref().and_then(census_of))
    }

    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        holder: &str,
    ) -> Result<(), ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let counted_at = k8s_openapi::jiff::Timestamp::from_second(census.counted_at)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
        let fill = |lease: &mut Lease| {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(control::CENSUS_OTHERS.into(), census.others.to_string());
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(counted_at)),
                ..LeaseSpec::default()
            });
        };
        let params = PostParams::default();
        // A sweep that meets another's write (a conflict, or a create that
        // finds the object) reads once more and writes its newer count.
        for _ in 0..2 {
            let found = retrying("get census", || api.get_opt(control::CENSUS_NAME))
                .await
                .map_err(failed)?;
            let written = match found {
                Some(mut lease) => {
                    fill(&mut lease);
                    retrying("replace census", || {
                        api.replace(control::CENSUS_NAME, &params, &lease)
                    })
                    .await
                }
                None => {
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(control::CENSUS_NAME.into()),
                            namespace: Some(namespace.into()),
                            ..ObjectMeta::default()
                        },
                        spec: None,
                    };
                    fill(&mut lease);
                    retrying("create census", || api.create(&params, &lease)).await
                }
            };
            match written {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        // Two sweeps kept writing at once: the other's count, as recent as
        // this one, stands.
        Ok(())
    }

    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        self.guarded_patch(
            node,
            TaintOutcome::NodeGone,
            // A taint whose answer was lost shows as this run's own.
            |current, _| match kube_model::taint_patch(current, stamp) {
                TaintPatch::Apply(patch) => Write::Patch(patch, TaintOutcome::Applied),
                TaintPatch::AlreadyPresent => Write::Answer(TaintOutcome::AlreadyPresent),
                TaintPatch::AppliedByThisRun => Write::Answer(TaintOutcome::Applied),
                TaintPatch::NodeReady => Write::Answer(TaintOutcome::NodeReady),
                TaintPatch::NoResourceVersion | TaintPatch::Unrepresentable => Write::Refuse,
            },
        )
        .await
    }

    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        let vas: Vec<slim::SlimVolumeAttachment> = self
            .list_all(
                slim::VOLUME_ATTACHMENTS,
                &ListParams::default(),
                "list volumeattachments",
            )
            .await
            .map_err(ClusterError::ListVolumeAttachments)?;
        Ok(vas
            .into_iter()
            .filter_map(|va| kube_model::attachment_facts(&VolumeAttachment::from(va)))
            .collect())
    }

    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        let pvs: Vec<slim::SlimPersistentVolume> = self
            .list_all(
                slim::PERSISTENT_VOLUMES,
                &ListParams::default(),
                "list persistentvolumes",
            )
            .await
            .map_err(ClusterError::ListPersistentVolumes)?;
        Ok(pvs
            .into_iter()
            .filter_map(|pv| kube_model::pv_facts(&PersistentVolume::from(pv)))
            .collect())
    }

    async fn get_volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<AttachmentFacts>, ClusterError> {
        let va: Option<slim::SlimVolumeAttachment> = self
            .get_slim(slim::VOLUME_ATTACHMENTS, name, "get volumeattachment")
            .await
            .map_err(|source| ClusterError::GetVolume {
                kind: "volumeattachment",
                name: name.into(),
                source,
            })?;
        Ok(va.and_then(|va| kube_model::attachment_facts(&VolumeAttachment::from(va))))
    }

    async fn get_persistent_volume(&self, name: &str) -> Result<Option<PvFacts>, ClusterError> {
        let pv: Option<slim::SlimPersistentVolume> = self
            .get_slim(slim::PERSISTENT_VOLUMES, name, "get persistentvolume")
            .await
            .map_err(|source| ClusterError::GetVolume {
                kind: "persistentvolume",
                name: name.into(),
                source,
            })?;
        Ok(pv.and_then(|pv| kube_model::pv_facts(&PersistentVolume::from(pv))))
    }

    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), EVENT_NAMESPACE);
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(EVENT_NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            action: Some(event.reason.action().into()),
            reason: Some(event.reason.as_str().into()),
            note: Some(truncate(&event.note, 1024)),
            type_: Some(
                if event.reason.warning() {
                    "Warning"
                } else {
                    "Normal"
                }
                .into(),
            ),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(format!("{MANAGER}.io/{MANAGER}")),
            reporting_instance: Some(truncate(&self.instance, 128)),
            ..Event::default()
        };
        // The name is fixed by the occasion, so a repeat after a lost answer
        // (or a retried invocation) meets AlreadyExists: recorded once.
        let params = PostParams::default();
        match retrying("create event", || api.create(&params, &ev)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
            Err(source) => Err(ClusterError::CreateEvent {
                node: node.into(),
                source,
            }),
        }
    }

    async fn server_version(&self) -> Result<ServerVersion, ClusterError> {
        let ask = || async {
            let info = retrying("get version", || self.client.apiserver_version())
                .await
                .map_err(|e| ClusterError::Version(e.to_string()))?;
            ServerVersion::parse(&info.major, &info.minor).ok_or_else(|| {
                ClusterError::Version(format!(
                    "unreadable version major={:?} minor={:?}",
                    info.major, info.minor
                ))
            })
        };
        self.version.get_or_try_init(ask).await.copied()
    }

    async fn untaint_node(
        &self,
        node: &str,
        ending: &Ending<'_>,
    ) -> Result<UntaintOutcome, ClusterError> {
        self.guarded_patch(node, UntaintOutcome::NodeGone, |current, sent| {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            match kube_model::untaint_patch(current, ending, now) {
                UntaintPatch::Apply {
                    patch,
                    removes_taint,
                } => Write::Patch(
                    patch,
                    UntaintOutcome::Ended {
                        taint_removed: removes_taint,
                    },
                ),
                // Also what our own patch looks like once its answer was
                // lost: then it is what that patch did.
                UntaintPatch::NotOurs => Write::Answer(sent.unwrap_or(UntaintOutcome::NotOurs)),
                UntaintPatch::NodeNotReady => Write::Answer(UntaintOutcome::NodeNotReady),
                UntaintPatch::NotSettled { remaining_secs } => {
                    Write::Answer(UntaintOutcome::NotSettled { remaining_secs })
                }
                UntaintPatch::NotConfirmed => Write::Answer(UntaintOutcome::NotConfirmed),
                UntaintPatch::NoResourceVersion | UntaintPatch::Unrepresentable => Write::Refuse,
            }
        })
        .await
    }

    async fn confirm_recovery(&self, node: &str) -> Result<ConfirmOutcome, ClusterError> {
        self.guarded_patch(node, ConfirmOutcome::NodeGone, |current, _| {
            match kube_model::confirm_patch(current) {
                ConfirmPatch::Apply(patch) => Write::Patch(patch, ConfirmOutcome::Confirmed),
                ConfirmPatch::Already => Write::Answer(ConfirmOutcome::Confirmed),
                ConfirmPatch::NotFenced => Write::Answer(ConfirmOutcome::NotFenced),
                ConfirmPatch::NoResourceVersion => Write::Refuse,
            }
        })
        .await
    }

    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = kube_model::power_mark_patch(stamp);
        let params = PatchParams::default();
        let merge = Patch::Merge(&patch);
        // Annotations only, merged: repeating it writes the same values.
        match retrying("patch node", || nodes.patch(node, &params, &merge)).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(source) => Err(ClusterError::PatchNode {
                node: node.into(),
                source,
            }),
        }
    }

    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodRef>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = retrying("list pods", || api.list(&params))
            .await
            .map_err(|source| ClusterError::Pods {
                what: format!("listing the pods of node {node}"),
                source,
            })?;
        Ok(list.items.iter().filter_map(kube_model::pod_ref).collect())
    }

    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match retrying("delete pod", || api.delete(&pod.name, &params)).await {
            Ok(_) => Ok(()),
            // Gone, or another pod holds the name now (a retry after a lost
            // answer, a StatefulSet's replacement): the pod we meant is gone.
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            Err(source) => Err(ClusterError::Pods {
                what: format!("force-deleting pod {}/{}", pod.namespace, pod.name),
                source,
            }),
        }
    }

    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match retrying("delete volumeattachment", || api.delete(name, &params)).await {
            Ok(_) => Ok(()),
            // Gone, or re-created for another attach under the same name.
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            Err(source) => Err(ClusterError::DeleteVolumeAttachment {
                name: name.into(),
                source,
            }),
        }
    }

    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let found = retrying("get configmap", || api.get_opt(control::OBJECT_NAME))
            .await
            .map_err(|source| ClusterError::KillSwitch {
                namespace: namespace.into(),
                source,
            })?;
        let value = found
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get(control::KILL_SWITCH_KEY))
            .map(String::as_str);
        Ok(KillSwitch::from_value(value))
    }

    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
    ) -> Result<LeaseTaken, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let deadline = Instant::now() + control::LEASE_WAIT;
        let params = PostParams::default();
        let mut waited = false;
        loop {
            // The time written into the Lease, and the same moment on this
            // clock: the Lease's duration runs from here.
            let now = k8s_openapi::jiff::Timestamp::now();
            let stamped = Instant::now();
            let found = retrying("get lease", || api.get_opt(control::OBJECT_NAME))
                .await
                .map_err(failed)?;
            let written = match found {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(control::OBJECT_NAME.into()),
                            namespace: Some(namespace.into()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(held_by(holder, now)),
                    };
                    // Retried like every call; a lost answer makes the
                    // repeat meet AlreadyExists, and the next look finds the
                    // Lease held by us, which `lease_step` accepts.
                    retrying("create lease", || api.create(&params, &lease)).await
                }
                Some(mut lease) => {
                    let spec = lease.spec.clone().unwrap_or_default();
                    let facts = LeaseFacts {
                        renewed: spec
                            .renew_time
                            .or(spec.acquire_time)
                            .map(|t| t.0.as_second()),
                        holder: spec.holder_identity,
                        duration_secs: spec.lease_duration_seconds,
                    };
                    match control::lease_step(&facts, holder, now.as_second()) {
                        LeaseStep::Take => {
                            lease.spec = Some(held_by(holder, now));
                            // Carries the resourceVersion read: two takers
                            // cannot both win.
                            retrying("replace lease", || {
                                api.replace(control::OBJECT_NAME, &params, &lease)
                            })
                            .await
                        }
                        LeaseStep::Wait(pause) => {
                            if Instant::now() + pause > deadline {
                                return Err(ClusterError::LeaseBusy {
                                    holder: facts.holder.unwrap_or_default(),
                                });
                            }
                            waited = true;
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                }
            };
            match written {
                Ok(lease) => {
                    if let Ok(mut held) = self.held.lock() {
                        *held = Some(lease);
                    }
                    return Ok(LeaseTaken { waited, stamped });
                }
                Err(kube::Error::Api(status))
                    if status.is_conflict() || status.is_already_exists() =>
                {
                    if Instant::now() > deadline {
                        return Err(ClusterError::LeaseBusy {
                            holder: "another invocation".into(),
                        });
                    }
                    waited = true;
                }
                // Transient failures were retried, bounded, by `retrying`.
                Err(e) => return Err(failed(e)),
            }
        }
    }

    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        // Released: the Lease as last written is no longer ours to keep.
        let mut found = self
            .last_written(&api, namespace, true)
            .await
            .map_err(failed)?;
        let params = PostParams::default();
        // Twice at most: a conflict comes from a write of ours that moved the
        // resourceVersion (a renewal, or a release whose answer was lost),
        // read back as still ours, or from a taker after expiry: not ours.
        for _ in 0..2 {
            let Some(mut lease) = found.filter(|l| held_by_holder(l, holder)) else {
                return Ok(());
            };
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            match retrying("release lease", || {
                api.replace(control::OBJECT_NAME, &params, &lease)
            })
            .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    found = retrying("get lease", || api.get_opt(control::OBJECT_NAME))
                        .await
                        .map_err(failed)?;
                }
                Err(e) => return Err(failed(e)),
            }
        }
        // Still ours after two tries: it expires on its own.
        Ok(())
    }

    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let found = self
            .last_written(&api, namespace, false)
            .await
            .map_err(failed)?;
        let Some(mut lease) = found else {
            return Ok(false);
        };
        let params = PostParams::default();
        // Twice at most: a conflict after our own renewal whose answer was
        // lost reads back as still ours.
        for _ in 0..2 {
            if !held_by_holder(&lease, holder) {
                return Ok(false);
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            }
            match retrying("renew lease", || {
                api.replace(control::OBJECT_NAME, &params, &lease)
            })
            .await
            {
                Ok(renewed) => {
                    if let Ok(mut held) = self.held.lock() {
                        *held = Some(renewed);
                    }
                    return Ok(true);
                }
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    match retrying("get lease", || api.get_opt(control::OBJECT_NAME))
                        .await
                        .map_err(failed)?
                    {
                        Some(fresh) => lease = fresh,
                        None => return Ok(false),
                    }
                }
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(false)
    }
}

impl Kube {
    /// The Lease as this handle last wrote it (taken out of the cache when
    /// `take`), else as read now: its resourceVersion guards the next write
    /// as well as a fresh read would.
    async fn last_written(
        &self,
        api: &Api<Lease>,
        namespace: &str,
        take: bool,
    ) -> Result<Option<Lease>, kube::Error> {
        let kept = self
            .held
            .lock()
            .ok()
            .and_then(|mut held| if take { held.take() } else { held.clone() })
            .filter(|l| l.metadata.namespace.as_deref() == Some(namespace));
        match kept {
            Some(lease) => Ok(Some(lease)),
            None => retrying("get lease", || api.get_opt(control::OBJECT_NAME)).await,
        }
    }
}

/// The census a Lease carries: its count, and its `renewTime` as the time
/// of the count.
fn census_of(lease: &Lease) -> Option<Census> {
    let others = lease
        .metadata
        .annotations
        .as_ref()?
        .get(control::CENSUS_OTHERS)?
        .parse()
        .ok()?;
    let counted_at = lease.spec.as_ref()?.renew_time.as_ref()?.0.as_second();
    Some(Census { others, counted_at })
}

fn held_by_holder(lease: &Lease, holder: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(holder)
}

fn held_by(holder: &str, now: k8s_openapi::jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(control::LEASE_SECONDS),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..LeaseSpec::default()
    }
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

/// Whether `client` may do `verb` on `resource` of `group`: cluster-wide, or
/// in a namespace (and on a named object) given by `scope`. A
/// SelfSubjectAccessReview, which every authenticated user may create.
pub async fn can(
    client: &Client,
    group: &str,
    resource: &str,
    verb: &str,
    scope: Option<(&str, Option<&str>)>,
) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
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
