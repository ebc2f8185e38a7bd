//! Recording wrappers around the real clients: every call node-fencer makes
//! is recorded with its start and end on one clock, to count calls (batching,
//! calls per fenced node) and split the pipeline's latency across them,
//! without faking any answer.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use node_fencer::core::model::facts::{
    AttachmentFacts, InstanceFacts, NodeFacts, PvFacts, SeenOff, StatusChecks, VolumeFacts,
};
use node_fencer::core::model::instance::{InstanceId, VolumeId};
use node_fencer::core::outbound::events::NodeEvent;
use node_fencer::core::outbound::kube_patch::{Ending, PowerStamp, Stamp};
use node_fencer::core::rules::control::KillSwitch;
use node_fencer::core::rules::in_use::ReleaseOutcome;
use node_fencer::core::rules::mode::ServerVersion;
use node_fencer::core::rules::silence::LeaseRead;
use node_fencer::core::rules::view::Census;
use node_fencer::shell::cloud::{Cloud, CloudError, Detach, PowerOff, PowerOffAnswer};
use node_fencer::shell::cluster::{
    Cluster, ClusterError, ClusterReads, ConfirmOutcome, Coordination, FencingWrites, JudgedNode,
    LeaseTaken, MarkOutcome, PodRef, TaintOutcome, UntaintOutcome,
};

/// One call.
#[derive(Clone, Debug)]
pub struct Span {
    /// The operation (`DescribeInstances`, `TaintNode`, ...).
    pub op: &'static str,
    /// When it started, from the timeline's origin.
    pub start: Duration,
    /// When it returned.
    pub end: Duration,
    /// Whether it succeeded.
    pub ok: bool,
}

/// Something a test does to the world once a call has returned, before the
/// code under test goes on (an instance started right after the taint).
pub type Hook = Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// The calls of one run, on one clock.
pub struct Timeline {
    origin: Instant,
    spans: Mutex<Vec<Span>>,
    hooks: Mutex<Vec<(&'static str, Hook)>>,
    /// The legacy recipe's `volumesInUse` release is not made (a benchmark's
    /// "before").
    without_release: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("spans", &self.spans())
            .finish_non_exhaustive()
    }
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Timeline {
    /// A timeline starting now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            spans: Mutex::new(Vec::new()),
            hooks: Mutex::new(Vec::new()),
            without_release: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on the legacy recipe's release of the freed volumes from
    /// the Node's `volumesInUse` is not made: it answers that none was
    /// listed, as on a Node whose kubelet reported nothing.
    pub fn without_release(&self) {
        self.without_release
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `hook` once, right after the first call of `op` returns.
    pub fn after(&self, op: &'static str, hook: Hook) {
        if let Ok(mut hooks) = self.hooks.lock() {
            hooks.push((op, hook));
        }
    }

    /// `cloud` and `cluster`, each call timed on this timeline.
    pub fn wrap<'a>(
        &'a self,
        cloud: &'a dyn Cloud,
        cluster: &'a dyn Cluster,
    ) -> (TimingCloud<'a>, TimingCluster<'a>) {
        (
            TimingCloud {
                inner: cloud,
                timeline: self,
            },
            TimingCluster {
                inner: cluster,
                timeline: self,
            },
        )
    }

    /// Time since the origin.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    async fn time<T, E>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let start = self.now();
        let out = call.await;
        let span = Span {
            op,
            start,
            end: self.now(),
            ok: out.is_ok(),
        };
        if let Ok(mut spans) = self.spans.lock() {
            spans.push(span);
        }
        let due: Vec<Hook> = match self.hooks.lock() {
            Ok(mut hooks) => {
                let (due, rest) = hooks.drain(..).partition(|(o, _)| *o == op);
                *hooks = rest;
                due.into_iter().map(|(_, h)| h).collect()
            }
            Err(_) => Vec::new(),
        };
        for hook in due {
            hook().await;
        }
        out
    }

    /// Every call so far, in the order they returned.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Calls and summed duration per operation.
    pub fn by_op(&self) -> BTreeMap<&'static str, (usize, Duration)> {
        let mut out: BTreeMap<&'static str, (usize, Duration)> = BTreeMap::new();
        for s in self.spans() {
            let e = out.entry(s.op).or_default();
            e.0 += 1;
            e.1 += s.end.saturating_sub(s.start);
        }
        out
    }

    /// Calls of one operation.
    pub fn count(&self, op: &str) -> usize {
        self.spans().iter().filter(|s| s.op == op).count()
    }

    /// Total number of calls.
    pub fn calls(&self) -> usize {
        self.spans().len()
    }

    /// When the first successful call of `op` returned.
    pub fn first_end(&self, op: &str) -> Option<Duration> {
        self.spans()
            .iter()
            .filter(|s| s.op == op && s.ok)
            .map(|s| s.end)
            .min()
    }

    /// When the last successful call of `op` returned.
    pub fn last_end(&self, op: &str) -> Option<Duration> {
        self.spans()
            .iter()
            .filter(|s| s.op == op && s.ok)
            .map(|s| s.end)
            .max()
    }
}

/// A [`Cloud`] that times each call, then delegates.
pub struct TimingCloud<'a> {
    /// The real client.
    pub inner: &'a dyn Cloud,
    /// Where the calls go.
    pub timeline: &'a Timeline,
}

#[async_trait]
impl Cloud for TimingCloud<'_> {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.timeline
            .time("DescribeInstances", self.inner.describe_instances(ids))
            .await
    }
    async fn machines_named(
        &self,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.timeline
            .time(
                "DescribeInstances by name",
                self.inner.machines_named(name, vpc),
            )
            .await
    }
    async fn machines_holding(
        &self,
        addresses: &[std::net::IpAddr],
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.timeline
            .time(
                "DescribeInstances by address",
                self.inner.machines_holding(addresses, vpc),
            )
            .await
    }
    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        self.timeline
            .time("DescribeVolumes", self.inner.describe_volumes(ids))
            .await
    }
    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError> {
        self.timeline
            .time("DetachVolume", self.inner.detach_volume(volume, order))
            .await
    }
    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        self.timeline
            .time("DescribeInstanceStatus", self.inner.status_checks(ids))
            .await
    }
    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        self.timeline
            .time("StopInstances", self.inner.power_off(order))
            .await
    }
}

/// A [`Cluster`] that times each call, then delegates.
pub struct TimingCluster<'a> {
    /// The real client.
    pub inner: &'a dyn Cluster,
    /// Where the calls go.
    pub timeline: &'a Timeline,
}

#[async_trait]
impl ClusterReads for TimingCluster<'_> {
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.timeline
            .time("ListNodes", self.inner.list_nodes())
            .await
    }
    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError> {
        self.timeline
            .time("GetNode", self.inner.get_node(name))
            .await
    }
    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.timeline
            .time("ListFencedNodes", self.inner.list_fenced_nodes())
            .await
    }
    async fn count_nodes(&self) -> Result<usize, ClusterError> {
        self.timeline
            .time("CountNodes", self.inner.count_nodes())
            .await
    }
    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        self.timeline
            .time(
                "ListVolumeAttachments",
                self.inner.list_volume_attachments(),
            )
            .await
    }
    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        self.timeline
            .time(
                "ListPersistentVolumes",
                self.inner.list_persistent_volumes(),
            )
            .await
    }
    async fn get_volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<AttachmentFacts>, ClusterError> {
        self.timeline
            .time(
                "GetVolumeAttachment",
                self.inner.get_volume_attachment(name),
            )
            .await
    }
    async fn get_persistent_volume(&self, name: &str) -> Result<Option<PvFacts>, ClusterError> {
        self.timeline
            .time(
                "GetPersistentVolume",
                self.inner.get_persistent_volume(name),
            )
            .await
    }
    async fn server_version(&self) -> Result<ServerVersion, ClusterError> {
        self.timeline
            .time("GetVersion", self.inner.server_version())
            .await
    }
    async fn pods_on_node(
        &self,
        node: &str,
        out_of_service: &[String],
    ) -> Result<Vec<PodRef>, ClusterError> {
        self.timeline
            .time("ListPods", self.inner.pods_on_node(node, out_of_service))
            .await
    }
    async fn node_lease(&self, node: &str, uid: Option<&str>) -> Result<LeaseRead, ClusterError> {
        self.timeline
            .time("GetNodeLease", self.inner.node_lease(node, uid))
            .await
    }
}

#[async_trait]
impl FencingWrites for TimingCluster<'_> {
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        self.timeline
            .time("TaintNode", self.inner.taint_node(node, stamp))
            .await
    }
    async fn mark_not_ready(
        &self,
        judged: &JudgedNode<'_>,
        message: &str,
    ) -> Result<MarkOutcome, ClusterError> {
        self.timeline
            .time("MarkNotReady", self.inner.mark_not_ready(judged, message))
            .await
    }
    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError> {
        self.timeline
            .time("CreateEvent", self.inner.node_event(node, event, name))
            .await
    }
    async fn untaint_node(
        &self,
        node: &str,
        ending: &Ending<'_>,
    ) -> Result<UntaintOutcome, ClusterError> {
        self.timeline
            .time("UntaintNode", self.inner.untaint_node(node, ending))
            .await
    }
    async fn confirm_recovery(
        &self,
        node: &str,
        fenced_at: Option<&str>,
    ) -> Result<ConfirmOutcome, ClusterError> {
        self.timeline
            .time(
                "ConfirmRecovery",
                self.inner.confirm_recovery(node, fenced_at),
            )
            .await
    }
    async fn note_machine_off(
        &self,
        judged: &JudgedNode<'_>,
        note: &SeenOff,
    ) -> Result<bool, ClusterError> {
        self.timeline
            .time("NoteMachineOff", self.inner.note_machine_off(judged, note))
            .await
    }
    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError> {
        self.timeline
            .time("MarkPoweredOff", self.inner.mark_powered_off(node, stamp))
            .await
    }
    async fn clear_power_mark(&self, node: &str) -> Result<(), ClusterError> {
        self.timeline
            .time("ClearPowerMark", self.inner.clear_power_mark(node))
            .await
    }
    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        self.timeline
            .time("DeletePod", self.inner.force_delete_pod(pod))
            .await
    }
    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError> {
        self.timeline
            .time(
                "DeleteVolumeAttachment",
                self.inner.delete_volume_attachment(name, uid),
            )
            .await
    }

    async fn release_volumes_in_use(
        &self,
        node: &str,
        uid: Option<&str>,
        names: &[String],
    ) -> Result<ReleaseOutcome, ClusterError> {
        if self
            .timeline
            .without_release
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(ReleaseOutcome::NoneListed);
        }
        self.timeline
            .time(
                "ReleaseVolumesInUse",
                self.inner.release_volumes_in_use(node, uid, names),
            )
            .await
    }
}

#[async_trait]
impl Coordination for TimingCluster<'_> {
    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError> {
        self.timeline
            .time("GetCensus", self.inner.read_census(namespace))
            .await
    }
    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        holder: &str,
    ) -> Result<(), ClusterError> {
        self.timeline
            .time(
                "WriteCensus",
                self.inner.write_census(namespace, census, holder),
            )
            .await
    }
    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError> {
        self.timeline
            .time("GetKillSwitch", self.inner.kill_switch(namespace))
            .await
    }
    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
        until: Option<std::time::Instant>,
    ) -> Result<LeaseTaken, ClusterError> {
        self.timeline
            .time(
                "AcquireLease",
                self.inner.acquire_lease(namespace, holder, until),
            )
            .await
    }
    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError> {
        self.timeline
            .time("ReleaseLease", self.inner.release_lease(namespace, holder))
            .await
    }
    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError> {
        self.timeline
            .time("RenewLease", self.inner.renew_lease(namespace, holder))
            .await
    }
}
