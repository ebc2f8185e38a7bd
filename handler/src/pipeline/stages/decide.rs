//! The decision: every suspect resolved to its Node and machine, the cloud
//! asked once about every machine of the invocation, and each node judged
//! by [`crate::core::rules::decide`] against the room the cap leaves. A cap that
//! would refuse asks first whether the Nodes filling it are dead for good,
//! and over a partial view decides again over every Node. A machine the
//! cloud reports off on a Node still Ready is waited for, within the
//! invocation, until Kubernetes notices; with `FAST_NOT_READY`, one whose
//! kubelet is proven silent since the stop is decided as marked at once,
//! and marked at admission ([`super::hasten`]).

use std::collections::HashMap;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::core::inbound::suspect::{Intent, Suspect};
use crate::core::model::facts::{Confirmation, NodeFacts, Readiness};
use crate::core::model::instance::InstanceId;
use crate::core::model::redfish::SystemUuid;
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::cap;
use crate::core::rules::decide::{self, Case, Settings, Verdict};
use crate::core::rules::identity;
use crate::core::rules::namesake;
use crate::core::rules::plan::{self, Target};
use crate::core::rules::resolve::{self, Resolution};
use crate::core::rules::silence;
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::looks::Looks;
use crate::pipeline::{nodes, wait};

use super::hasten::{Marking, Pending};

/// Decides every suspect; waits for Nodes still Ready on machines off, or
/// decides as marked those whose kubelet is proven silent (the mark is
/// written at admission, [`super::hasten`]).
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    if inv.suspects.is_empty() {
        return Ok(());
    }
    let policy = inv.policy;
    let dry_run = inv.switch.is_on();
    let deadline = inv.until(Instant::now() + policy.not_ready_wait);
    let Invocation {
        switch,
        looks,
        suspects,
        view,
        decision,
        pending,
        ..
    } = inv;
    let proven = pending.insert(Pending::new(policy, suspects));
    let mut first = true;
    // When each Node silent so far may be proven again; a Node proven, or
    // not proven, is not tried again.
    let mut attempts: HashMap<String, Attempt> = HashMap::new();
    // EC2's `stopped` comes before the node controller's grace period is
    // over: rather than fail and wait for Lambda's retries (1 and 2 minutes
    // later), look again until Kubernetes notices.
    let ns = &policy.control_namespace;
    let every = policy.poll_interval;
    loop {
        let mut to_prove: Vec<(String, InstanceId)> = Vec::new();
        wait::poll(
            ctx,
            switch,
            ns,
            (deadline, every),
            "the Node turning NotReady",
            async || {
                let Some(current) = view.as_mut() else {
                    return Ok::<_, PipelineError>(true);
                };
                if !std::mem::take(&mut first) {
                    *current = nodes::refresh(ctx, policy, current).await?;
                }
                let (targets, verdicts) =
                    decide_whole(ctx, policy, dry_run, suspects, (current, &*proven), looks)
                        .await?;
                let waiting = ready_but_off(&targets, &verdicts, current);
                decision.targets = targets;
                decision.verdicts = verdicts;
                if dry_run || waiting.is_empty() {
                    return Ok(true);
                }
                if policy.fast_not_ready {
                    to_prove =
                        worth_proving(policy, &decision.targets, (current, looks), &attempts);
                    if !to_prove.is_empty() {
                        return Ok(true);
                    }
                }
                let names: Vec<&str> = waiting.iter().map(|(n, _)| n.as_str()).collect();
                info!(
                    nodes = names.join(","),
                    "instance off, Node still Ready: waiting for Kubernetes to notice"
                );
                Ok(false)
            },
        )
        .await?;
        // The switch is read again after every wait: on, nothing is proven
        // (and admission marks nothing).
        if to_prove.is_empty() || switch.is_on() {
            return Ok(());
        }
        let markings = proven.prove(ctx, looks, (&to_prove, view.as_ref())).await;
        count_attempts(&mut attempts, &to_prove, &markings);
        // Decided again over the same read, the Nodes proven as marked.
        first = true;
    }
}

/// The Nodes whose silence is worth proving now ([`fenced_once_not_ready`],
/// less those proven, or not due again yet).
fn worth_proving(
    policy: &Policy,
    targets: &[Target],
    (view, looks): (&NodeView, &Looks),
    attempts: &HashMap<String, Attempt>,
) -> Vec<(String, InstanceId)> {
    let settings = policy.decision(false, view.cluster_size());
    let mut nodes = fenced_once_not_ready(targets, view, looks.answers(), &settings);
    nodes.retain(|(n, _)| attempts.get(n).is_none_or(Attempt::may_try));
    nodes
}

/// When one Node silent so far may be proven again.
#[derive(Clone, Copy, Debug, Default)]
struct Attempt {
    /// Proven, or not proven: not tried again.
    done: bool,
    /// Silent so far: not tried again before its renewal is overdue.
    not_before: Option<Instant>,
}

impl Attempt {
    fn may_try(&self) -> bool {
        !self.done && self.not_before.is_none_or(|t| t <= Instant::now())
    }
}

/// Records when each Node silent so far may be proven again; a Node
/// proven, or not proven, is not tried again.
fn count_attempts(
    attempts: &mut HashMap<String, Attempt>,
    tried: &[(String, InstanceId)],
    markings: &HashMap<String, Marking>,
) {
    for (node, _) in tried {
        let attempt = match markings.get(node) {
            Some(Marking::Later(after)) => Attempt {
                done: false,
                not_before: Some(Instant::now() + *after),
            },
            _ => Attempt {
                done: true,
                not_before: None,
            },
        };
        attempts.insert(node.clone(), attempt);
    }
}

/// The Nodes to fence, with their machines, whose machine is off but that
/// Kubernetes still calls Ready.
fn ready_but_off(
    targets: &[Target],
    verdicts: &[Verdict],
    view: &NodeView,
) -> Vec<(String, InstanceId)> {
    targets
        .iter()
        .zip(verdicts)
        .filter(|(t, v)| {
            t.intent == Intent::Fence
                && matches!(
                    v,
                    Verdict::Skip {
                        reason: decide::Skip::NodeReady
                    }
                )
        })
        .filter_map(|(t, _)| Some((view.nodes[t.node?].name.clone(), t.instance.clone()?)))
        .collect()
}

/// The Nodes still Ready on machines off that the decision would fence
/// once NotReady: only those are worth marking, so that a Node the cap
/// would refuse is not written to at all.
fn fenced_once_not_ready(
    targets: &[Target],
    view: &NodeView,
    answers: &HashMap<InstanceId, Confirmation>,
    settings: &Settings,
) -> Vec<(String, InstanceId)> {
    let ready = |v: &Verdict| {
        matches!(
            v,
            Verdict::Skip {
                reason: decide::Skip::NodeReady
            }
        )
    };
    let now = decide_all(targets, view, answers, settings);
    let mut marked = view.clone();
    for (t, _) in targets.iter().zip(&now).filter(|(_, v)| ready(v)) {
        if let Some(i) = t.node {
            marked.nodes[i].readiness = Readiness::Unknown;
        }
    }
    let then = decide_all(targets, &marked, answers, settings);
    targets
        .iter()
        .zip(now.iter().zip(&then))
        .filter(|(t, (now, then))| {
            t.intent == Intent::Fence && ready(now) && matches!(then, Verdict::Fence { .. })
        })
        .filter_map(|(t, _)| Some((view.nodes[t.node?].name.clone(), t.instance.clone()?)))
        .collect()
}

/// [`decide`] over `view`, the Nodes `proven` dead read as marked; a refusal by the cap over a partial view (which
/// only admits) is decided again over the whole cluster, as it always was.
async fn decide_whole(
    ctx: &Ctx<'_>,
    policy: &Policy,
    dry_run: bool,
    suspects: &[Suspect],
    (view, proven): (&mut NodeView, &Pending),
    looks: &mut Looks,
) -> Result<(Vec<Target>, Vec<Verdict>), PipelineError> {
    loop {
        proven.as_marked(view);
        let (targets, verdicts) = decide(ctx, policy, dry_run, suspects, view, looks).await;
        if view.is_partial() && verdicts.iter().any(by_cap) {
            info!("the cap would refuse: deciding again over every Node");
            *view = nodes::full(ctx).await?;
            continue;
        }
        return Ok((targets, verdicts));
    }
}

/// Resolves, confirms (asking the cloud only about machines not asked
/// about yet) and decides every suspect against `view`.
async fn decide(
    ctx: &Ctx<'_>,
    policy: &Policy,
    dry_run: bool,
    suspects: &[Suspect],
    view: &NodeView,
    looks: &mut Looks,
) -> (Vec<Target>, Vec<Verdict>) {
    let nodes = &view.nodes;
    let resolutions: Vec<Resolution> = suspects
        .iter()
        .map(|s| resolve::resolve(&s.target, nodes))
        .collect();
    // Out of band, one batched call for every machine of the invocation.
    looks
        .first(ctx, &plan::instances_to_confirm(&resolutions, nodes))
        .await;
    if !dry_run {
        report_unidentified(ctx, &resolutions, nodes, looks).await;
    }
    looks.disown_replaced(nodes);
    let targets = plan::targets(
        suspects.to_vec(),
        resolutions,
        nodes,
        looks.answers(),
        policy.scope.as_ref(),
    );
    let settings = policy.decision(dry_run, view.cluster_size());
    let mut verdicts = decide_all(&targets, view, looks.answers(), &settings);
    // Before refusing, ask whether the Nodes filling the cap are dead for
    // good (terminated or gone): those take no room. A partial view does not
    // hold them all: the caller decides again over every Node.
    if verdicts.iter().any(by_cap) && !view.is_partial() {
        let ids = cap::worth_asking(nodes, looks.answers());
        if !ids.is_empty() {
            looks.first(ctx, &ids).await;
            looks.disown_replaced(nodes);
            verdicts = decide_all(&targets, view, looks.answers(), &settings);
        }
    }
    let decided = (&targets[..], &mut verdicts[..]);
    refuse_beyond_the_core(ctx, (policy, &settings), decided, view, looks).await;
    (targets, verdicts)
}

/// The refusals the decision makes after the core's verdict, from what it
/// reads after it: a kubelet on another machine, a name another machine
/// carries. Every verdict that would fence is held to them, whoever made
/// it (the first decision, or the one after a power-off). A refused Node
/// gives back the room it took under the cap: the core decides again
/// without it, until no Node it lets through is refused.
pub(crate) async fn refuse_beyond_the_core(
    ctx: &Ctx<'_>,
    (policy, settings): (&Policy, &Settings<'_>),
    (targets, verdicts): (&[Target], &mut [Verdict]),
    view: &NodeView,
    looks: &mut Looks,
) {
    let mut refusals = 0;
    loop {
        refuse_kubelets_elsewhere(ctx, (targets, verdicts), view, looks).await;
        refuse_names_taken(ctx, policy, (targets, verdicts), view, looks).await;
        let now = verdicts
            .iter()
            .filter(|v| refused_beyond_the_core(v))
            .count();
        if now == refusals || !verdicts.iter().any(by_cap) {
            return;
        }
        refusals = now;
        decide_again(targets, verdicts, view, looks.answers(), settings);
    }
}

/// Decides again every target but those refused after the core's verdict
/// ([`refused_beyond_the_core`]): no verdict of the core alone lifts such a
/// refusal, and its Node takes no room under the cap.
pub(crate) fn decide_again(
    targets: &[Target],
    verdicts: &mut [Verdict],
    view: &NodeView,
    answers: &HashMap<InstanceId, Confirmation>,
    settings: &Settings,
) {
    let kept: Vec<usize> = (0..targets.len())
        .filter(|&k| !refused_beyond_the_core(&verdicts[k]))
        .collect();
    let rest: Vec<Target> = kept.iter().map(|&k| targets[k].clone()).collect();
    for (k, verdict) in kept
        .into_iter()
        .zip(decide_all(&rest, view, answers, settings))
    {
        verdicts[k] = verdict;
    }
}

/// True for the refusals the decision makes after the core's verdict, from
/// what it reads after it: a kubelet on another machine, a name another
/// machine carries.
fn refused_beyond_the_core(verdict: &Verdict) -> bool {
    matches!(
        verdict,
        Verdict::Skip {
            reason: decide::Skip::KubeletElsewhere { .. }
                | decide::Skip::NameTaken { .. }
                | decide::Skip::AddressTaken { .. }
        }
    )
}

/// The verdicts that would fence, each with its Node's index and machine:
/// what the refusals after the core's verdict look at.
fn to_fence<'a>(
    targets: &'a [Target],
    verdicts: &'a mut [Verdict],
) -> impl Iterator<Item = (usize, &'a InstanceId, &'a mut Verdict)> {
    targets
        .iter()
        .zip(verdicts)
        .filter_map(|(target, verdict)| {
            let (Some(i), Some(id)) = (target.node, target.instance.as_ref()) else {
                return None;
            };
            if matches!(*verdict, Verdict::Fence { .. }) {
                Some((i, id, verdict))
            } else {
                None
            }
        })
}

/// Refuses each EC2 Node the decision would fence whose name another
/// machine that may run carries, or one of whose addresses such a machine
/// holds ([`namesake`]): that machine's kubelet may have adopted the Node.
/// A question that fails leaves the Node for the retry.
async fn refuse_names_taken(
    ctx: &Ctx<'_>,
    policy: &Policy,
    (targets, verdicts): (&[Target], &mut [Verdict]),
    view: &NodeView,
    looks: &mut Looks,
) {
    let cluster_vpc = policy.scope.as_ref().map(|s| s.vpc.as_str());
    for (i, id, verdict) in to_fence(targets, verdicts) {
        if !namesake::must_ask(id) {
            continue;
        }
        let node = &view.nodes[i];
        let vpc = namesake::vpc(looks.get(id), cluster_vpc).map(str::to_owned);
        let refusal = match taken(ctx, (node, id), vpc.as_deref(), view, looks).await {
            Ok(refusal) => refusal,
            Err(error) => Some(decide::Skip::LookupFailed { error }),
        };
        if let Some(reason) = refusal {
            *verdict = Verdict::Skip { reason };
        }
    }
}

/// The refusal, if any, of the Node `node` on `id` for a machine that may
/// run under its name or at one of its addresses; the error of a question
/// that failed.
async fn taken(
    ctx: &Ctx<'_>,
    (node, id): (&NodeFacts, &InstanceId),
    vpc: Option<&str>,
    view: &NodeView,
    looks: &mut Looks,
) -> Result<Option<decide::Skip>, String> {
    let named = looks.named(ctx, &node.name, vpc).await.map_err(|e| {
        format!("the machines that carry the Node's name could not be asked for: {e}")
    })?;
    if let Some(by) = namesake::judge(id, named) {
        warn!(
            node = node.name,
            machine = %id,
            namesake = by.machine,
            state = by.state,
            "another machine carries the Node's name: not fenced"
        );
        let machine = id.as_str().to_owned();
        return Ok(Some(decide::Skip::NameTaken { machine, by }));
    }
    let asked = namesake::addresses_to_ask(node, looks.get(id));
    if asked.is_empty() {
        return Ok(None);
    }
    let holding = looks.holding(ctx, &asked, vpc).await.map_err(|e| {
        format!("the machines that hold the Node's addresses could not be asked for: {e}")
    })?;
    let Some(by) = namesake::judge_addresses((node, id), &asked, holding, &view.nodes) else {
        return Ok(None);
    };
    warn!(
        node = node.name,
        machine = %id,
        holder = by.by.machine,
        address = %by.address,
        state = by.by.state,
        "another machine holds the Node's address: not fenced"
    );
    let machine = id.as_str().to_owned();
    Ok(Some(decide::Skip::AddressTaken { machine, by }))
}

/// Refuses each Node the decision would fence whose kubelet's Lease was
/// written after node-fencer saw its machine off, the machine not started
/// since ([`silence::elsewhere`]): that kubelet runs on another machine. Only
/// a Node carrying the note that applies is read; a Lease that cannot be
/// read leaves the Node for the retry, never fenced unread.
async fn refuse_kubelets_elsewhere(
    ctx: &Ctx<'_>,
    (targets, verdicts): (&[Target], &mut [Verdict]),
    view: &NodeView,
    looks: &Looks,
) {
    for (i, id, verdict) in to_fence(targets, verdicts) {
        let node = &view.nodes[i];
        let Some(answer) = looks.get(id) else {
            continue;
        };
        let note = node.seen_off.as_ref();
        if !silence::elsewhere::must_check(note, id, answer) {
            continue;
        }
        let read = match ctx.reads.node_lease(&node.name, node.uid.as_deref()).await {
            Ok(read) => read,
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                *verdict = Verdict::Skip {
                    reason: decide::Skip::LookupFailed {
                        error: format!(
                            "the kubelet's Lease, to be held to node-fencer's note of the machine seen off, could not be read: {e}"
                        ),
                    },
                };
                continue;
            }
        };
        if let Some(elsewhere) = silence::elsewhere::judge(note, id, answer, read.written_at) {
            warn!(
                node = node.name,
                machine = %id,
                seen_off_at = elsewhere.seen_off_at,
                written_at = elsewhere.written_at,
                "the Node's kubelet runs on another machine: not fenced"
            );
            *verdict = Verdict::Skip {
                reason: decide::Skip::KubeletElsewhere {
                    machine: id.as_str().to_owned(),
                    seen_off_at: elsewhere.seen_off_at,
                    written_at: elsewhere.written_at,
                },
            };
        }
    }
}

/// A Warning on each Node the suspects name whose machine's answer is
/// about to be disowned for a UUID that names no one machine (a
/// placeholder, or one shared by Nodes or by Systems): the machine counts
/// as unidentified, which a person should hear of with the reason.
async fn report_unidentified(
    ctx: &Ctx<'_>,
    resolutions: &[Resolution],
    nodes: &[NodeFacts],
    looks: &Looks,
) {
    for resolution in resolutions {
        let Resolution::Node(i) = resolution else {
            continue;
        };
        let node = &nodes[*i];
        let Some(id) = node.instance.as_ref() else {
            continue;
        };
        let Some(Confirmation::Seen(facts)) = looks.get(id) else {
            continue;
        };
        if facts.identity.system_uuid == SystemUuid::Unread {
            continue;
        }
        if let Some(doubt) = identity::doubt(node, facts.identity.system_uuid) {
            warn!(node = node.name, machine = %id, reason = doubt.code(), "unidentified machine: {doubt}");
            ctx.record(&node.name, NodeEvent::unidentified_machine(id, doubt))
                .await;
        }
    }
}

/// True for a refusal by the cap.
pub(crate) fn by_cap(verdict: &Verdict) -> bool {
    matches!(
        verdict,
        Verdict::Skip {
            reason: decide::Skip::CapReached { .. }
        }
    )
}

/// The verdict for every target, against the room the cap has left.
pub(crate) fn decide_all(
    targets: &[Target],
    view: &NodeView,
    answers: &HashMap<InstanceId, Confirmation>,
    settings: &Settings,
) -> Vec<Verdict> {
    let nodes = &view.nodes;
    let shared: Vec<Vec<String>> = targets
        .iter()
        .map(|t| {
            t.node
                .map(|i| view.others_naming(&nodes[i]))
                .unwrap_or_default()
        })
        .collect();
    let cases: Vec<Case<'_>> = targets
        .iter()
        .zip(&shared)
        .map(|(t, shared_with)| Case {
            intent: t.intent,
            node: t.node.map(|i| &nodes[i]),
            confirmation: t.instance.as_ref().and_then(|id| answers.get(id)),
            shared_with,
        })
        .collect();
    decide::decide_batch(&cases, settings, (view.taken(answers), answers))
}
