//! The Kubernetes side: the [`Cluster`] trait the pipeline talks to, and its
//! implementation over `kube`. Only the calls in `infra/kubernetes/rbac.yaml`.

use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::facts::{AttachmentFacts, NodeFacts, PvFacts};
use crate::kube_model::{self, Stamp, TaintPatch};
use crate::retry::{self, KUBERNETES};

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

/// What the taint step found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintOutcome {
    /// The taint was added by this call.
    Applied,
    /// The taint was already there.
    AlreadyPresent,
    /// The Node became Ready since the decision; nothing was written.
    NodeReady,
    /// The Node no longer exists.
    NodeGone,
}

/// An Event to record on a Node.
#[derive(Clone, Debug)]
pub struct NodeEvent {
    /// `Normal` or `Warning`.
    pub warning: bool,
    /// CamelCase reason, e.g. `OutOfServiceTaintApplied`.
    pub reason: &'static str,
    /// The action, e.g. `Fence`.
    pub action: &'static str,
    /// The human-readable note.
    pub note: String,
}

/// The Kubernetes calls node-fencer makes.
#[async_trait]
pub trait Cluster: Send + Sync {
    /// Lists every Node once.
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError>;
    /// Adds the out-of-service taint and annotations, guarded by resourceVersion.
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError>;
    /// Lists every VolumeAttachment (no field selector exists for `spec.nodeName`).
    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError>;
    /// Lists every PersistentVolume.
    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError>;
    /// Records an Event on a Node.
    async fn node_event(&self, node: &str, event: &NodeEvent) -> Result<(), ClusterError>;
}

/// [`Cluster`] over a `kube::Client`.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    instance: String,
}

impl Kube {
    /// Wraps a client; `instance` names this reporter in Events (function name or host).
    pub fn new(client: Client, instance: impl Into<String>) -> Self {
        Self {
            client,
            instance: instance.into(),
        }
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
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = ListParams::default();
        let list = retrying("list nodes", || nodes.list(&params))
            .await
            .map_err(ClusterError::ListNodes)?;
        Ok(list
            .items
            .iter()
            .filter_map(kube_model::node_facts)
            .collect())
    }

    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for attempt in 0..CONFLICT_RETRIES {
            let current = match retrying("get node", || nodes.get(node)).await {
                Ok(n) => n,
                Err(e) if is_not_found(&e) => return Ok(TaintOutcome::NodeGone),
                Err(source) => {
                    return Err(ClusterError::GetNode {
                        node: node.into(),
                        source,
                    });
                }
            };
            let patch = match kube_model::taint_patch(&current, stamp) {
                TaintPatch::Apply(patch) => patch,
                TaintPatch::AlreadyPresent => return Ok(TaintOutcome::AlreadyPresent),
                TaintPatch::AppliedByThisRun => return Ok(TaintOutcome::Applied),
                TaintPatch::NodeReady => return Ok(TaintOutcome::NodeReady),
                TaintPatch::NoResourceVersion | TaintPatch::Unrepresentable => {
                    return Err(ClusterError::UnsafeWrite { node: node.into() });
                }
            };
            let params = PatchParams::default();
            let merge = Patch::Merge(&patch);
            let sent = retrying("patch node", || nodes.patch(node, &params, &merge)).await;
            match sent {
                Ok(_) => return Ok(TaintOutcome::Applied),
                Err(e) if is_conflict(&e) => {
                    tracing::info!(node, attempt, "node changed under us; re-reading");
                    // Short, growing pause: conflicts come from a live writer
                    // (kubelet, node controller) that settles within milliseconds.
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                }
                Err(e) if is_not_found(&e) => return Ok(TaintOutcome::NodeGone),
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

    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let params = ListParams::default();
        let list = retrying("list volumeattachments", || api.list(&params))
            .await
            .map_err(ClusterError::ListVolumeAttachments)?;
        Ok(list
            .items
            .iter()
            .filter_map(kube_model::attachment_facts)
            .collect())
    }

    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let params = ListParams::default();
        let list = retrying("list persistentvolumes", || api.list(&params))
            .await
            .map_err(ClusterError::ListPersistentVolumes)?;
        Ok(list.items.iter().filter_map(kube_model::pv_facts).collect())
    }

    async fn node_event(&self, node: &str, event: &NodeEvent) -> Result<(), ClusterError> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), EVENT_NAMESPACE);
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(event_name(node)),
                namespace: Some(EVENT_NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            action: Some(event.action.into()),
            reason: Some(event.reason.into()),
            note: Some(truncate(&event.note, 1024)),
            type_: Some(if event.warning { "Warning" } else { "Normal" }.into()),
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
        // The name is fixed before the first attempt, so a retry after a lost
        // answer meets AlreadyExists instead of recording the Event twice.
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
}

/// `<node>.<unique suffix>`, the kubelet's naming; the node part is cut so
/// the whole stays a valid object name.
fn event_name(node: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{}.{}", truncate(node, 253 - 1 - 16), &suffix[..16])
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
