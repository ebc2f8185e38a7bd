//! `FAST_NOT_READY`: a Node still Ready on a machine the cloud calls off
//! is marked `Ready=Unknown` as soon as its kubelet is proven dead
//! ([`crate::core::rules::silence`]): silent since the machine's recorded
//! stop and past a renewal it was due to make, on a clock node-fencer
//! trusts, instead of waiting out the node controller's grace period. The
//! proof is made twice: in the decision, on the first look and the
//! kubelet's Lease ([`Pending::prove`]); then at admission, under the
//! fencing Lease and after the cap's recount, on the second look and the
//! Lease read again right before the `nodes/status` write and the taint
//! ([`Pending::mark`]). A Node the recount refuses is never marked: the
//! node controller marks a Node's pods NotReady only on a Ready
//! transition it sees itself, so a mark with no fencing after it would
//! keep dead pods as Ready endpoints until their eviction. A renewal not
//! yet overdue is looked at again when it will be. Nothing here fails the
//! invocation: whatever is not proven, or not written, is left to the
//! wait (in the decision) or to the retry (at admission).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use tokio::time::Instant;

use tracing::{info, warn};

use crate::core::inbound::suspect::Suspect;
use crate::core::model::facts::{Confirmation, Readiness, SeenOff};
use crate::core::model::instance::InstanceId;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::decide::Skip;
use crate::core::rules::plan::{NodeRun, Stage};
use crate::core::rules::silence::{self, Proof, Silence, Watched};
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::looks::Looks;
use crate::shell::cluster::{JudgedNode, MarkOutcome};

/// How often one Node's mark may meet a conflicting writer before it is
/// left to the retry.
const MARK_ATTEMPTS: u8 = 3;

/// How the decision's proof of one Node ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Marking {
    /// Proven dead: decided as if marked, the mark written at admission.
    Proven,
    /// Silent since the stop, but no renewal overdue yet: try again after
    /// this long.
    Later(Duration),
    /// Not proven, or heard after the stop: the wait, as without the setting.
    Wait,
}

/// The Nodes the decision proved dead, each with the uid judged and its
/// machine, waiting for their mark at admission; and the evidence both
/// proofs weigh.
pub(crate) struct Pending {
    evidence: Evidence,
    proven: HashMap<String, (Option<String>, InstanceId)>,
    /// Marked at admission: their Events wait until the Lease is free.
    marked: Vec<(String, InstanceId, Proof)>,
}

impl Pending {
    /// Nothing proven yet, over one invocation's policy and suspects.
    pub(crate) fn new(policy: &Policy, suspects: &[Suspect]) -> Self {
        Self {
            evidence: Evidence::new(policy, suspects),
            proven: HashMap::new(),
            marked: Vec::new(),
        }
    }

    /// `view` as the Nodes proven dead would read once marked: the
    /// decision fences them, and the taint writes the mark first. Only the
    /// object judged (its uid) reads so; node-fencer's view alone, never
    /// written back.
    pub(crate) fn as_marked(&self, view: &mut NodeView) {
        for node in &mut view.nodes {
            if let Some((uid, _)) = self.proven.get(&node.name)
                && node.uid == *uid
                && node.readiness == Readiness::Ready
            {
                node.readiness = Readiness::Unknown;
            }
        }
    }

    /// The decision's proof of each of `nodes` (name, machine) on the first
    /// look, each held to the Node as judged in `judged` (its uid).
    pub(crate) async fn prove(
        &mut self,
        ctx: &Ctx<'_>,
        looks: &Looks,
        (nodes, judged): (&[(String, InstanceId)], Option<&NodeView>),
    ) -> HashMap<String, Marking> {
        let mut out = HashMap::new();
        for (node, id) in nodes {
            let facts = judged.and_then(|v| v.nodes.iter().find(|n| n.name == *node));
            let uid = facts.and_then(|n| n.uid.clone());
            let note = facts.and_then(|n| n.seen_off.as_ref());
            let marking = match looks.get(id) {
                Some(answer) => {
                    let target = JudgedNode {
                        name: node,
                        uid: uid.as_deref(),
                        machine: id,
                        version: None,
                    };
                    match (
                        answer,
                        prove(ctx, &mut self.evidence, (&target, Some(note)), answer).await,
                    ) {
                        // Only a machine the cloud described is marked: its
                        // second look is held to the first.
                        (Confirmation::Seen(_), Judged::Proven(_)) => Marking::Proven,
                        (_, judged) => judged.marking(),
                    }
                }
                None => Marking::Wait,
            };
            if marking == Marking::Proven {
                self.proven.insert(node.clone(), (uid, id.clone()));
            }
            out.insert(node.clone(), marking);
        }
        out
    }

    /// Marks each admitted run's Node the decision proved dead, proven
    /// again on `again` (the second look) and the Lease read again, right
    /// before its taint and only while `held` says the fencing Lease is
    /// still ours. A Node not proven again, or not marked, is skipped as
    /// still Ready, for the retry.
    pub(crate) async fn mark(
        &mut self,
        ctx: &Ctx<'_>,
        again: &HashMap<InstanceId, Confirmation>,
        held: impl Fn() -> bool,
        runs: &mut [NodeRun],
    ) {
        for run in runs.iter_mut().filter(|r| *r.stage() == Stage::Admitted) {
            let Some(node) = run.node().map(str::to_owned) else {
                continue;
            };
            let Some((uid, id)) = self.proven.get(&node).cloned() else {
                continue;
            };
            if !held() {
                // The taint reports the Lease lost; a mark alone would be
                // a mark with no fencing after it.
                continue;
            }
            // The second look, held to the machine first judged.
            let answer = again.get(&id).cloned().unwrap_or(Confirmation::NotFound);
            let target = JudgedNode {
                name: &node,
                uid: uid.as_deref(),
                machine: &id,
                version: None,
            };
            match self.mark_one(ctx, &target, &answer).await {
                Some(Some(proof)) => self.marked.push((node, id, proof)),
                // No longer Ready, or gone: the taint sees which.
                Some(None) => {}
                None => run.skip(Skip::NodeReady),
            }
        }
    }

    /// Reads the Node, proves `target` again, and writes its mark over the
    /// version read before that proof, so that a Node written in between
    /// (its kubelet back, or a kubelet on another machine adopting it: each
    /// writes the Node's status as it starts) is read and proven again, as
    /// is one that raced the write: the proof of a Node marked, `Some(None)`
    /// for one that needed no mark, `None` for one not proven or not
    /// marked.
    async fn mark_one(
        &mut self,
        ctx: &Ctx<'_>,
        target: &JudgedNode<'_>,
        answer: &Confirmation,
    ) -> Option<Option<Proof>> {
        for _ in 0..MARK_ATTEMPTS {
            let read = match ctx.reads.get_node(target.name).await {
                Ok(Some(read)) => read,
                // Gone: the taint sees it.
                Ok(None) => return Some(None),
                Err(e) => {
                    ctx.meter.error(Dependency::Kubernetes);
                    warn!(node = target.name, error = %e, "could not read the node to mark: left for the retry");
                    return None;
                }
            };
            let target = &JudgedNode {
                version: read.version.as_deref(),
                ..*target
            };
            let Judged::Proven(proof) =
                prove(ctx, &mut self.evidence, (target, None), answer).await
            else {
                return None;
            };
            match write(ctx, target, &proof).await {
                Written::Marked => return Some(Some(proof)),
                Written::NoNeed => return Some(None),
                Written::Again => continue,
                Written::No => return None,
            }
        }
        warn!(
            node = target.name,
            "the Node kept changing under the mark: left for the retry"
        );
        None
    }

    /// The Events of the marks written, once the Lease is free.
    pub(crate) async fn record(&self, ctx: &Ctx<'_>) {
        for (node, id, proof) in &self.marked {
            ctx.record(node, NodeEvent::marked_not_ready(id, proof))
                .await;
        }
    }
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
/// contradiction is reported with a Warning Event and, in the decision
/// (`note`: the one the Node carries as it was judged; `None` at admission),
/// noted on the Node: a later write of the Lease, the machine not started
/// since, is a kubelet on another machine ([`silence::elsewhere`]).
async fn prove(
    ctx: &Ctx<'_>,
    evidence: &mut Evidence,
    (judged, note): (&JudgedNode<'_>, Option<Option<&SeenOff>>),
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
    let now = ctx.now().as_second();
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
            if let Some(note) =
                note.and_then(|n| silence::elsewhere::note(n, id, answer, (reported, now)))
            {
                note_seen_off(ctx, judged, &note).await;
            }
            Judged::No
        }
        Silence::Unproven { .. } => Judged::No,
    }
}

/// Notes on the Node that node-fencer saw its machine off. Not written,
/// the Node is judged as before: the note only ever refuses.
async fn note_seen_off(ctx: &Ctx<'_>, judged: &JudgedNode<'_>, note: &SeenOff) {
    let node = judged.name;
    match ctx.writes.note_machine_off(judged, note).await {
        Ok(true) => info!(node, seen_off_at = note.at, "noted the machine seen off"),
        Ok(false) => info!(node, "not noted: the Node is gone or another object"),
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node, error = %e, "the machine seen off could not be noted");
        }
    }
}

/// How one mark's write ended.
enum Written {
    /// Marked.
    Marked,
    /// Found no longer `Ready`, or gone.
    NoNeed,
    /// A writer changed the Node between the read and the write.
    Again,
    /// Not written: another Node of that name, or an error.
    No,
}

/// Writes `Ready=Unknown` on `node`; its Event is recorded later.
async fn write(ctx: &Ctx<'_>, judged: &JudgedNode<'_>, proof: &Proof) -> Written {
    let node = judged.name;
    let message = silence::mark_message(proof);
    match ctx.writes.mark_not_ready(judged, &message).await {
        Ok(MarkOutcome::Marked) => {
            info!(
                node,
                "marked Ready=Unknown: the kubelet is silent since the stop"
            );
            Written::Marked
        }
        Ok(MarkOutcome::AlreadyNotReady | MarkOutcome::NodeGone) => Written::NoNeed,
        Ok(MarkOutcome::AnotherNode) => {
            warn!(
                node,
                "the Node of that name is no longer the one judged (another uid or machine): not marked"
            );
            Written::No
        }
        Ok(MarkOutcome::Conflict) => Written::Again,
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node, error = %e, "could not mark the node: left for the retry");
            Written::No
        }
    }
}
