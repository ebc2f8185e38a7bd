//! The normal form every trigger is reduced to: which node or instance is
//! suspected, what the trigger asks for, and where it came from.

use std::net::IpAddr;

use serde::Serialize;

use crate::core::model::instance::InstanceId;
use crate::core::model::names::NodeName;

/// How a trigger names the machine it is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "by", content = "value")]
pub enum NodeRef {
    /// An EC2 instance id (from EventBridge, a label, or a provider id).
    Instance(InstanceId),
    /// A Kubernetes node name, or a host name that may be the node's private DNS name.
    Name(NodeName),
    /// An address, matched against the Node's `InternalIP`.
    Address(IpAddr),
}

impl NodeRef {
    /// True when the reference is safe to resolve and to print: instance ids
    /// and addresses are valid by construction, a name must be a DNS
    /// subdomain (as Node names are). Every parser upholds it; the fuzz
    /// targets check it.
    pub fn is_well_formed(&self) -> bool {
        match self {
            Self::Name(name) => crate::core::model::names::is_dns_subdomain(name.as_str()),
            Self::Instance(_) | Self::Address(_) => true,
        }
    }
}

impl std::fmt::Display for NodeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Instance(id) => write!(f, "instance {id}"),
            Self::Name(name) => write!(f, "node {name}"),
            Self::Address(ip) => write!(f, "address {ip}"),
        }
    }
}

/// What the trigger asks node-fencer to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// Fence the node if it is safe.
    Fence,
    /// As [`Self::Fence`], and should the cloud still call the machine
    /// running, power it off first if active fencing's rules allow
    /// (`fence --power-off`).
    PowerOff,
    /// Work out what fencing would do, change nothing.
    Check,
    /// The machine is back (EventBridge `running`, a resolved alert, a
    /// direct `recover`): end node-fencer's fencing once it is safe.
    Recover,
    /// An operator confirms the node healthy (`recover --confirm`): record
    /// the confirmation manual recovery waits for, then as [`Self::Recover`].
    Confirm,
}

/// Where a suspect came from, for the report and the logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Origin {
    /// An EventBridge `EC2 Instance State-change Notification`.
    Ec2StateChange {
        /// The event id.
        event_id: Option<String>,
        /// The state the event reported (not trusted for the decision).
        reported_state: String,
        /// The event's `time`: when the instance reached that state (for a
        /// `stopped` event, the end of the shutdown, not the stop request),
        /// in Unix seconds. Only `FAST_NOT_READY`'s proof reads it.
        #[serde(
            rename = "time",
            serialize_with = "crate::core::model::values::serialize_rfc3339",
            skip_serializing_if = "Option::is_none"
        )]
        reported_at: Option<i64>,
    },
    /// One alert of an Alertmanager webhook.
    Alert {
        /// The `alertname` label.
        alertname: Option<String>,
        /// Alertmanager's fingerprint of the alert.
        fingerprint: Option<String>,
    },
    /// A direct invocation or the command line.
    Direct,
    /// The sweep: a NotReady Node not fenced yet, found by listing the Nodes
    /// rather than by an event (one missed, dead-lettered, or handled while
    /// the kill switch was on).
    Sweep,
    /// A Cloud Audit Log entry about a Compute Engine VM.
    #[serde(rename = "gce_audit_log")]
    AuditLog(AuditOrigin),
}

impl Origin {
    /// The trigger's name, as in the report's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Ec2StateChange { .. } => "ec2_state_change",
            Self::Alert { .. } => "alert",
            Self::Direct => "direct",
            Self::Sweep => "sweep",
            Self::AuditLog(_) => "gce_audit_log",
        }
    }
}

/// How the entry was delivered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "via")]
pub enum Delivery {
    /// A Pub/Sub push request.
    PubSub {
        /// The message id: a redelivery carries the same.
        message_id: Option<String>,
        /// The subscription that pushed it.
        subscription: Option<String>,
    },
    /// An Eventarc CloudEvent.
    Eventarc {
        /// The CloudEvent's `ce-id`.
        id: Option<String>,
    },
}

/// Where a suspect named by a Cloud Audit Log entry came from: the
/// entry and its delivery, as the report shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditOrigin {
    /// The audit log's `methodName`.
    pub method: String,
    /// The entry's `insertId`.
    pub(crate) insert_id: Option<String>,
    /// The entry's `timestamp`, on the last entry of a `stop` or `delete`
    /// call only: when the operation finished, the VM down, after the
    /// last renewal its kubelet could make. In Unix seconds; only
    /// `FAST_NOT_READY`'s proof reads it.
    #[serde(
        rename = "time",
        serialize_with = "crate::core::model::values::serialize_rfc3339",
        skip_serializing_if = "Option::is_none"
    )]
    pub reported_at: Option<i64>,
    /// How it arrived.
    pub delivery: Delivery,
}

/// One machine suspected dead, in normal form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Suspect {
    /// The machine.
    pub target: NodeRef,
    /// What is asked.
    pub intent: Intent,
    /// Where it came from.
    pub origin: Origin,
}

/// A part of a trigger that names no machine, reported and otherwise ignored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ignored {
    /// Where it came from.
    pub origin: Origin,
    /// Why it was ignored.
    pub reason: String,
}

/// Everything one invocation carries, after parsing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Batch {
    /// The machines to look at.
    pub suspects: Vec<Suspect>,
    /// What named no machine.
    pub ignored: Vec<Ignored>,
    /// Also look for NotReady Nodes to fence that no event named (the
    /// scheduled invocation, `{"action": "sweep"}`, `node-fencer sweep`).
    pub sweep: bool,
    /// The fencing an operator's confirmation names (the time on the
    /// Node's mark, as `check` shows it): another fencing is not confirmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fenced_at: Option<String>,
}
