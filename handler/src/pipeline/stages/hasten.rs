//! `FAST_NOT_READY`: a Node still Ready on a machine the cloud calls off
//! is marked `Ready=Unknown` as soon as its kubelet is proven dead
//! ([`crate::core::rules::silence`]): silent since the machine's recorded
//! stop and past a renewal it was due to make, on a clock node-fencer
//! trusts, instead of waiting out the node controller's grace period. The
//! proof is made twice: on the first look and the kubelet's Lease, then on
//! a fresh look and the Lease read again right before the `nodes/status`
//! write. A renewal not yet overdue is looked at again when it will be.
//! Nothing here fails the invocation: whatever is not proven, or not
//! written, is left to the wait as without the setting.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use tokio::time::Instant;

use tracing::{info, warn};

use crate::core::inbound::suspect::Suspect;
use crate::core::model::facts::{Confirmation, NodeFacts};
use crate::core::model::instance::InstanceId;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::silence::{self, Proof, Silence, Watched};
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
    /// Silent since the stop, but no renewal overdue yet: try again after
    /// this long.
    Later(Duration),
    /// Not proven, or heard after the stop: the wait, as without the setting.
    Wait,
}

/// What the proof weighs beside the cloud's look and the Lease: whether a
/// hibernated stop counts as off, the stops the triggers reported, and the
/// first version of each Node's Lease this invocation read, with when, on
/// node-fencer's own monotonic clock.
pub(crate) struct Evidence {
    fence_hibernated: bool,
    reported: HashMap<InstanceId, i64>,
    first_read: HashMap<String, (String, Instant)>,
}

impl Evidence {
    /// The evidence of one invocation's policy and suspects.
    pub(crate) fn new(policy: &Policy, suspects: &[Suspect]) -> Self {
        Self {
            fence_hibernated: policy.fence_hibernated,
            reported: silence::reported_stops(suspects),
            first_read: HashMap::new(),
        }
    }

    /// What node-fencer's clock has seen of `node`'s Lease, now read at
    /// `version`. The first read comes after the cloud confirmed the
    /// machine off, so any later version is a write after the stop.
    fn watch(&mut self, node: &str, version: Option<&str>) -> Watched {
        let Some(version) = version else {
            return Watched::Nothing;
        };
        let now = Instant::now();
        match self.first_read.entry(node.to_owned()) {
            Entry::Vacant(e) => {
                e.insert((version.to_owned(), now));
                Watched::Unchanged(Duration::ZERO)
            }
            Entry::Occupied(e) if e.get().0 == version => {
                Watched::Unchanged(now.saturating_duration_since(e.get().1))
            }
            Entry::Occupied(_) => Watched::Renewed,
        }
    }
}

/// Tries to mark each of `nodes` (name, machine) `Ready=Unknown`, each
/// write held to the Node as judged in `judged` (its uid).
pub(crate) async fn mark(
    ctx: &Ctx<'_>,
    evidence: &mut Evidence,
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
            (Confirmation::Seen(first), Judged::Proven(_)) => {
                proven.push((node, id, first.clone()))
            }
            (_, judged) => {
                out.insert(node.clone(), judged.marking());
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
            Judged::Proven(proof) => write(ctx, &target, &proof).await,
            judged => judged.marking(),
        };
        out.insert(node.clone(), marking);
    }
    out
}

/// How one proof ended.
enum Judged {
    /// Dead, by this evidence.
    Proven(Proof),
    /// Silent so far: look again after this long.
    NotYetDue(Duration),
    /// Not proven, or heard.
    No,
}

impl Judged {
    /// The marking of a Node not (yet) proven.
    fn marking(&self) -> Marking {
        match self {
            Self::NotYetDue(after) => Marking::Later(*after),
            Self::Proven(_) | Self::No => Marking::Wait,
        }
    }
}

/// Reads the kubelet's Lease and judges `node` against `answer`. A
/// contradiction is reported with a Warning Event.
async fn prove(
    ctx: &Ctx<'_>,
    evidence: &mut Evidence,
    judged: &JudgedNode<'_>,
    answer: &Confirmation,
) -> Judged {
    let (node, id) = (judged.name, judged.machine);
    let read = match ctx.reads.node_lease(node, judged.uid).await {
        Ok(read) => read,
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node, error = %e, "kubelet lease unreadable: waiting for the node controller");
            return Judged::No;
        }
    };
    let watched = evidence.watch(node, read.version.as_deref());
    let reported = evidence.reported.get(id).copied();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let silence = silence::judge(
        answer,
        evidence.fence_hibernated,
        (&read, watched),
        (reported, now),
    );
    info!(
        node,
        proof = silence.code(),
        "kubelet silence since the stop"
    );
    match silence {
        Silence::Silent(proof) => Judged::Proven(proof),
        Silence::NotYetDue { after } => Judged::NotYetDue(after),
        Silence::HeardAfterStop {
            stopped_at,
            renewed_at,
            heard,
        } => {
            warn!(
                node,
                stopped_at, renewed_at, "the kubelet was heard after the recorded stop"
            );
            ctx.record(
                node,
                NodeEvent::heard_after_stop(id, (stopped_at, renewed_at), heard),
            )
            .await;
            Judged::No
        }
        Silence::Unproven { .. } => Judged::No,
    }
}

/// Writes `Ready=Unknown` on `node`.
async fn write(ctx: &Ctx<'_>, judged: &JudgedNode<'_>, proof: &Proof) -> Marking {
    let (node, id) = (judged.name, judged.machine);
    let message = silence::mark_message(proof);
    match ctx.writes.mark_not_ready(judged, &message).await {
        Ok(MarkOutcome::Marked) => {
            info!(
                node,
                "marked Ready=Unknown: the kubelet is silent since the stop"
            );
            ctx.record(node, NodeEvent::marked_not_ready(id, proof))
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
