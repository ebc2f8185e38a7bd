//! The fencing policy: every setting the pipeline acts on, validated once
//! (by the configuration, which holds a `Policy`) and passed to every stage as it is.

use std::time::Duration;

use crate::core::rules::control::LeaseTiming;
use crate::core::rules::decide::{self, Settings};
use crate::core::rules::mode::ModeSetting;
use crate::core::rules::ownership::ClusterIdentity;
use crate::core::rules::power::ActiveFencing;
use crate::core::rules::reach::Reach;
use crate::core::rules::recovery::RecoveryPolicy;
use crate::core::rules::resolve::ClusterScope;

/// How node-fencer fences and recovers, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Plan only, change nothing.
    pub dry_run: bool,
    /// How many Nodes may be out of service at once.
    pub max_out_of_service: usize,
    /// The same cap as a share of all Nodes, in percent, when set.
    pub max_out_of_service_percent: Option<u8>,
    /// Taint, legacy, or by server version.
    pub mode: ModeSetting,
    /// Wait before the second EC2 confirmation (zero: right away).
    pub confirm_again_after: Duration,
    /// How long a fenced node must be Ready again before its fencing ends.
    pub recovery_settle: Duration,
    /// Whether an operator must also confirm a fenced node healthy.
    pub recovery: RecoveryPolicy,
    /// Also apply the `NoSchedule` out-of-service taint (Rook/Ceph's pair);
    /// such a fencing ends only with proof of a power cycle.
    pub no_schedule_too: bool,
    /// Active fencing's settings; `None` while it is off.
    pub active_fencing: Option<ActiveFencing>,
    /// How long to wait, within the invocation, for a Node whose instance
    /// is confirmed off to turn NotReady (zero: fail at once for a retry).
    pub not_ready_wait: Duration,
    /// Where the fencing Lease and the kill switch live.
    pub control_namespace: String,
    /// Bound on the wait for detached volumes to become `available`.
    pub detach_wait: Duration,
    /// How often to look while waiting (for detached volumes, for a Node
    /// to turn NotReady).
    pub poll_interval: Duration,
    /// Take an instance stopped by hibernation for off.
    pub fence_hibernated: bool,
    /// Mark a Node `Ready=Unknown` on the proof that its kubelet has been
    /// silent since the machine's recorded stop, rather than wait for the
    /// node controller ([`crate::core::rules::silence`]).
    pub fast_not_ready: bool,
    /// For Nodes without a provider id: what proves an instance is one of
    /// the cluster's machines. Unset, such Nodes are never fenced.
    pub scope: Option<ClusterScope>,
    /// How the fencing Lease is kept while held.
    pub lease: LeaseTiming,
    /// What tells another cluster's instance from this one's.
    pub identity: ClusterIdentity,
    /// The Nodes node-fencer may act on (`NODE_SELECTOR`, the opt-out
    /// label).
    pub reach: Reach,
}

impl Default for Policy {
    /// The configuration's defaults.
    fn default() -> Self {
        Self {
            dry_run: false,
            max_out_of_service: 3,
            max_out_of_service_percent: None,
            mode: ModeSetting::Auto,
            confirm_again_after: Duration::ZERO,
            recovery_settle: Duration::from_secs(30),
            recovery: RecoveryPolicy::Auto,
            active_fencing: None,
            no_schedule_too: false,
            not_ready_wait: Duration::from_secs(60),
            control_namespace: "kube-system".into(),
            detach_wait: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            fence_hibernated: false,
            fast_not_ready: true,
            scope: None,
            lease: LeaseTiming::default(),
            identity: ClusterIdentity::default(),
            reach: Reach::default(),
        }
    }
}

impl Policy {
    /// The cap in force for a cluster of `nodes` Nodes: the count, and the
    /// share when one is set.
    pub fn cap(&self, nodes: usize) -> usize {
        decide::effective_cap(
            self.max_out_of_service,
            self.max_out_of_service_percent,
            nodes,
        )
    }

    /// What the per-node decision needs, for a cluster of `nodes` Nodes;
    /// `dry_run` is this invocation's (the policy's, or the kill switch's).
    pub fn decision(&self, dry_run: bool, nodes: usize) -> Settings<'_> {
        Settings {
            dry_run,
            max_out_of_service: self.cap(nodes),
            fence_hibernated: self.fence_hibernated,
            reach: &self.reach,
        }
    }
}
