//! `FAST_NOT_READY`: a Node still Ready on a machine the cloud calls off
//! is marked `Ready=Unknown` at once when its kubelet is proven silent
//! since the machine's recorded stop ([`crate::core::rules::silence`]), instead of
//! waiting out the node controller's grace period. The proof is made twice:
//! on the first look and the kubelet's Lease, then on a fresh look and the
//! Lease read again right before the `nodes/status` write. Nothing here
//! fails the invocation: whatever is not proven, or not written, is left to
//! the wait as without the setting.

use std::collections::HashMap;

use tracing::{info, warn};

use crate::core::inbound::suspect::Suspect;
use crate::core::model::facts::{Confirmation, NodeFacts};
use crate::core::model::instance::InstanceId;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::silence::{self, Silence};
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::looks::Looks;
use crate::shell::cluster::{JudgedNode, MarkOutcome};

/// How one Node's marking ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Marking {
    /// Marked `Ready=Unknown` (or found no longer `Ready`): decide again.
    Done,
    /// A writer changed the Node between the read and the write: worth
    /// another attempt after the next look.
    Again,
    /// Not proven, or heard after the stop: the wait, as without the setting.
    Wait,
}

/// What the proof weighs beside the cloud's look and the Lease: whether a
/// hibernated stop counts as off, and the stops the triggers reported.
pub(crate) struct Evidence {
    fence_hibernated: bool,
    reported: HashMap<InstanceId, i64>,
}

impl Evidence {
    /// The evidence of one invocation's policy and suspects.
    pub(crate) fn new(policy: &Policy, suspects: &[Suspect]) -> Self {
        Self {
            fence_hibernated: policy.fence_hibernated,
            reported: silence::reported_stops(suspects),
        }
    }
}

/// Tries to mark each of `nodes` (name, machine) `Ready=Unknown`, each
/// write held to the Node as judged in `judged` (its uid).
pub(crate) async fn mark(
    ctx: &Ctx<'_>,
    evidence: &Evidence,
    looks: &mut Looks,
    (nodes, judged): (&[(String, InstanceId)], Option<&NodeView>),
) -> HashMap<String, Marking> {
    let mut out = HashMap::new();
    let mut proven = Vec::new();
    let judged: &[NodeFacts] = judged.map(|v| v.nodes.as_slice()).unwrap_or_default();
    let uid = |node: &str| {
        judged
            .iter()
            .find(|n| n.name == node)
            .and_then(|n| n.uid.as_deref())
    };
    for (node, id) in nodes {
        let Some(answer) = looks.get(id).cloned() else {
            out.insert(node.clone(), Marking::Wait);
            continue;
        };
        let target = JudgedNode {
            name: node,
            uid: uid(node),
            machine: id,
        };
        match (&answer, prove(ctx, evidence, &target, &answer).await) {
            (Confirmation::Seen(first), Some(_)) => proven.push((node, id, first.clone())),
            _ => {
                out.insert(node.clone(), Marking::Wait);
            }
        }
    }
    if proven.is_empty() {
        return out;
    }
    // The status write acts like the taint on what the controllers do with
    // the Node's pods: the machine is confirmed off again first.
    let ids: Vec<InstanceId> = proven.iter().map(|(_, id, _)| (*id).clone()).collect();
    let again = looks.again(ctx, &ids).await;
    for (node, id, first) in proven {
        // Another machine under the name (a recreated VM) is not the one
        // the first look judged: its stop proves nothing of this kubelet.
        let answer = again
            .get(id)
            .map_or(Confirmation::NotFound, |a| first.same_machine(a));
        let target = JudgedNode {
            name: node,
            uid: uid(node),
            machine: id,
        };
        let marking = match prove(ctx, evidence, &target, &answer).await {
            Some((stopped_at, renewed_at)) => write(ctx, &target, (stopped_at, renewed_at)).await,
            None => Marking::Wait,
        };
        out.insert(node.clone(), marking);
    }
    out
}

/// Reads the kubelet's Lease and judges `node` against `answer`: the stop
/// and the last renewal when it is proven silent. A contradiction is
/// reported with a Warning Event.
async fn prove(
    ctx: &Ctx<'_>,
    evidence: &Evidence,
    judged: &JudgedNode<'_>,
    answer: &Confirmation,
) -> Option<(i64, i64)> {
    let (node, id) = (judged.name, judged.machine);
    let lease = match ctx.reads.node_lease(node, judged.uid).await {
        Ok(lease) => lease,
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node, error = %e, "kubelet lease unreadable: waiting for the node controller");
            return None;
        }
    };
    let reported = evidence.reported.get(id).copied();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let silence = silence::judge(answer, evidence.fence_hibernated, lease, (reported, now));
    info!(
        node,
        proof = silence.code(),
        "kubelet silence since the stop"
    );
    match silence {
        Silence::Silent {
            stopped_at,
            renewed_at,
        } => Some((stopped_at, renewed_at)),
        Silence::HeardAfterStop {
            stopped_at,
            renewed_at,
        } => {
            warn!(
                node,
                stopped_at, renewed_at, "the kubelet renewed its lease after the recorded stop"
            );
            ctx.record(
                node,
                NodeEvent::heard_after_stop(id, stopped_at, renewed_at),
            )
            .await;
            None
        }
        Silence::Unproven { .. } => None,
    }
}

/// Writes `Ready=Unknown` on `node`.
async fn write(
    ctx: &Ctx<'_>,
    judged: &JudgedNode<'_>,
    (stopped_at, renewed_at): (i64, i64),
) -> Marking {
    let (node, id) = (judged.name, judged.machine);
    let message = silence::mark_message(stopped_at, renewed_at);
    match ctx.writes.mark_not_ready(judged, &message).await {
        Ok(MarkOutcome::Marked) => {
            info!(
                node,
                "marked Ready=Unknown: the kubelet is silent since the stop"
            );
            ctx.record(
                node,
                NodeEvent::marked_not_ready(id, stopped_at, renewed_at),
            )
            .await;
            Marking::Done
        }
        Ok(MarkOutcome::AlreadyNotReady | MarkOutcome::NodeGone) => Marking::Done,
        Ok(MarkOutcome::AnotherNode) => {
            warn!(
                node,
                "the Node of that name is no longer the one judged (another uid or machine): not marked"
            );
            Marking::Wait
        }
        Ok(MarkOutcome::Conflict) => Marking::Again,
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node, error = %e, "could not mark the node: waiting for the node controller");
            Marking::Wait
        }
    }
}
