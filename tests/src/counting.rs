//! Call-counting wrappers around the real clients, to assert batching and
//! measure API calls per fenced node without faking any answer.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use node_fencer::facts::{AttachmentFacts, InstanceFacts, NodeFacts, PvFacts, VolumeFacts};
use node_fencer::instance::{InstanceId, VolumeId};
use node_fencer::kube_model::Stamp;
use node_fencer::shell::cloud::{Cloud, CloudError};
use node_fencer::shell::cluster::{Cluster, ClusterError, NodeEvent, TaintOutcome};

/// Counts calls by operation name.
#[derive(Default, Debug)]
pub struct Calls(Mutex<BTreeMap<&'static str, usize>>);

impl Calls {
    fn hit(&self, op: &'static str) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(op).or_default() += 1;
        }
    }

    /// Calls of one operation.
    pub fn get(&self, op: &str) -> usize {
        self.0
            .lock()
            .map(|m| m.get(op).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// All counts.
    pub fn snapshot(&self) -> BTreeMap<&'static str, usize> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Total calls.
    pub fn total(&self) -> usize {
        self.snapshot().values().sum()
    }
}

/// A [`Cloud`] that counts, then delegates.
pub struct CountingCloud<'a> {
    /// The real client.
    pub inner: &'a dyn Cloud,
    /// The counts.
    pub calls: Calls,
}

#[async_trait]
impl Cloud for CountingCloud<'_> {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.calls.hit("DescribeInstances");
        self.inner.describe_instances(ids).await
    }
    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        self.calls.hit("DescribeVolumes");
        self.inner.describe_volumes(ids).await
    }
    async fn detach_volume(
        &self,
        volume: &VolumeId,
        instance: &InstanceId,
    ) -> Result<(), CloudError> {
        self.calls.hit("DetachVolume");
        self.inner.detach_volume(volume, instance).await
    }
}

/// A [`Cluster`] that counts, then delegates.
pub struct CountingCluster<'a> {
    /// The real client.
    pub inner: &'a dyn Cluster,
    /// The counts.
    pub calls: Calls,
}

#[async_trait]
impl Cluster for CountingCluster<'_> {
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.calls.hit("ListNodes");
        self.inner.list_nodes().await
    }
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        self.calls.hit("TaintNode");
        self.inner.taint_node(node, stamp).await
    }
    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        self.calls.hit("ListVolumeAttachments");
        self.inner.list_volume_attachments().await
    }
    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        self.calls.hit("ListPersistentVolumes");
        self.inner.list_persistent_volumes().await
    }
    async fn node_event(&self, node: &str, event: &NodeEvent) -> Result<(), ClusterError> {
        self.calls.hit("CreateEvent");
        self.inner.node_event(node, event).await
    }
}
