//! The handles one invocation works with, as in controller-rs: the cloud,
//! the cluster (its reads, its fencing writes and its coordination objects
//! apart), the wall clock, where failures and latencies are counted, and
//! the id that names the invocation. No state of the run lives here: that
//! is the invocation's, which each stage receives beside these handles.

use k8s_openapi::jiff::Timestamp;
use tracing::warn;

use crate::core::outbound::events::{self, NodeEvent};
use crate::core::outbound::metrics::Meter;
use crate::shell::cloud::Cloud;
use crate::shell::cluster::{Cluster, ClusterReads, Coordination, FencingWrites};

/// How many nodes are worked on at once within one invocation.
pub(crate) const PARALLEL_NODES: usize = 8;

/// The wall clock the pipeline reads: the times it writes on Nodes (the
/// taint's, the marks') and holds against the cloud's and the apiserver's
/// records (a stop, a Lease's renewal, a census' age, a settle delay).
/// Waits and deadlines are measured on tokio's monotonic clock, not here.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock: what every invocation reads unless
/// [`Ctx::with_clock`] gives it another.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The handles of one invocation.
pub struct Ctx<'a> {
    /// The cloud (every provider this build can ask).
    pub cloud: &'a dyn Cloud,
    /// What the stages read of the cluster.
    pub reads: &'a dyn ClusterReads,
    /// What fencing and recovery write to it.
    pub writes: &'a dyn FencingWrites,
    /// The objects that coordinate invocations: the Lease, the census, the
    /// kill switch.
    pub control: &'a dyn Coordination,
    /// The wall clock.
    pub clock: &'a dyn Clock,
    /// Where stage latencies and failed calls are counted.
    pub meter: &'a Meter,
    /// Names this invocation in logs, Events and the Node's annotations.
    pub correlation_id: String,
}

impl<'a> Ctx<'a> {
    /// The handles over one cluster client.
    pub fn new(
        cloud: &'a dyn Cloud,
        cluster: &'a dyn Cluster,
        meter: &'a Meter,
        correlation_id: impl Into<String>,
    ) -> Self {
        Self {
            cloud,
            reads: cluster,
            writes: cluster,
            control: cluster,
            clock: &SystemClock,
            meter,
            correlation_id: correlation_id.into(),
        }
    }

    /// The same handles, reading the wall clock from `clock`.
    pub fn with_clock(self, clock: &'a dyn Clock) -> Self {
        Self { clock, ..self }
    }

    /// Now, on the wall clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Records an Event on a Node, once per occasion (the fencing it ends,
    /// else this invocation); a failure to record is logged, never fatal to
    /// fencing.
    pub(crate) async fn record(&self, node: &str, event: NodeEvent) {
        let occasion = event.occasion.as_deref().unwrap_or(&self.correlation_id);
        let name = events::event_name(node, event.reason, occasion);
        if let Err(e) = self.writes.node_event(node, &event, &name).await {
            self.meter
                .error(crate::core::outbound::metrics::Dependency::Kubernetes);
            warn!(error = %e, reason = event.reason.as_str(), "could not record the event");
        }
    }
}
