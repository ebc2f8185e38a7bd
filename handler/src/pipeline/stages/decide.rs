//! The decision: every suspect resolved to its Node and machine, the cloud
//! asked once about every machine of the invocation, and each node judged
//! by [`crate::core::rules::decide`] against the room the cap leaves. A cap that
//! would refuse asks first whether the Nodes filling it are dead for good,
//! and over a partial view decides again over every Node. A machine the
//! cloud reports off on a Node still Ready is waited for, within the
//! invocation, until Kubernetes notices; with `FAST_NOT_READY`, one whose
//! kubelet is proven silent since the stop is marked so at once
//! ([`super::hasten`]).

use std::collections::HashMap;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::core::inbound::suspect::{Intent, Suspect};
use crate::core::model::facts::{Confirmation, NodeFacts, Readiness};
use crate::core::model::instance::InstanceId;
use crate::core::model::redfish::SystemUuid;
use crate::core::outbound::events::NodeEvent;
use crate::core::rules::cap;
use crate::core::rules::decide::{self, Case, Settings, Verdict};
use crate::core::rules::identity;
use crate::core::rules::plan::{self, Target};
use crate::core::rules::resolve::{self, Resolution};
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::looks::Looks;
use crate::pipeline::{nodes, wait};

use super::hasten::{self, Evidence, Marking};

/// How often one Node's marking may meet a conflicting writer before the
/// wait is left to the node controller.
const MARK_ATTEMPTS: u8 = 3;

/// Decides every suspect; waits for Nodes still Ready on machines off, or
/// marks them when their kubelet is proven silent.
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
        ..
    } = inv;
    let mut evidence = Evidence::new(policy, suspects);
    let mut first = true;
    // Attempts at marking each Node; a Node not proven is not tried again,
    // one silent so far not before its renewal is overdue.
    let mut attempts: HashMap<String, Attempt> = HashMap::new();
    // EC2's `stopped` comes before the node controller's grace period is
    // over: rather than fail and wait for Lambda's retries (1 and 2 minutes
    // later), look again until Kubernetes notices.
    let ns = &policy.control_namespace;
    let every = policy.poll_interval;
    loop {
        let mut to_mark: Vec<(String, InstanceId)> = Vec::new();
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
                    decide_whole(ctx, policy, dry_run, suspects, current, looks).await?;
                let waiting = ready_but_off(&targets, &verdicts, current);
                decision.targets = targets;
                decision.verdicts = verdicts;
                if dry_run || waiting.is_empty() {
                    return Ok(true);
                }
                if policy.fast_not_ready {
                    let settings = policy.decision(dry_run, current.cluster_size());
                    to_mark = fenced_once_not_ready(
                        &decision.targets,
                        current,
                        looks.answers(),
                        &settings,
                    );
                    to_mark.retain(|(n, _)| attempts.get(n).is_none_or(Attempt::may_try));
                    if !to_mark.is_empty() {
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
        // The switch is read again after every wait: on, nothing is marked.
        if to_mark.is_empty() || switch.is_on() {
            return Ok(());
        }
        let marked = hasten::mark(ctx, &mut evidence, looks, (&to_mark, view.as_ref())).await;
        count_attempts(&mut attempts, &to_mark, &marked);
        // The next look reads the Nodes again and decides over them.
        first = false;
    }
}

/// How far the marking of one Node has got.
#[derive(Clone, Copy, Debug, Default)]
struct Attempt {
    /// Writes that met a conflicting writer.
    tries: u8,
    /// Silent so far: not tried again before its renewal is overdue.
    not_before: Option<Instant>,
}

impl Attempt {
    fn may_try(&self) -> bool {
        self.tries < MARK_ATTEMPTS && self.not_before.is_none_or(|t| t <= Instant::now())
    }
}

/// Counts one more attempt at each Node to be marked again, and when a
/// Node silent so far may be tried; a Node marked, or not proven, is not
/// tried again.
fn count_attempts(
    attempts: &mut HashMap<String, Attempt>,
    tried: &[(String, InstanceId)],
    marked: &HashMap<String, Marking>,
) {
    for (node, _) in tried {
        let attempt = attempts.entry(node.clone()).or_default();
        *attempt = match marked.get(node) {
            Some(Marking::Again) => Attempt {
                tries: attempt.tries.saturating_add(1),
                not_before: None,
            },
            Some(Marking::Later(after)) => Attempt {
                not_before: Some(Instant::now() + *after),
                ..*attempt
            },
            _ => Attempt {
                tries: MARK_ATTEMPTS,
                not_before: None,
            },
        };
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

/// Resolves, confirms (asking the cloud only about machines not asked
/// about yet) and decides every suspect against `view`.
/// [`decide`] over `view`; a refusal by the cap over a partial view (which
/// only admits) is decided again over the whole cluster, as it always was.
async fn decide_whole(
    ctx: &Ctx<'_>,
    policy: &Policy,
    dry_run: bool,
    suspects: &[Suspect],
    view: &mut NodeView,
    looks: &mut Looks,
) -> Result<(Vec<Target>, Vec<Verdict>), PipelineError> {
    loop {
        let (targets, verdicts) = decide(ctx, policy, dry_run, suspects, view, looks).await;
        if view.is_partial() && verdicts.iter().any(by_cap) {
            info!("the cap would refuse: deciding again over every Node");
            *view = nodes::full(ctx).await?;
            continue;
        }
        return Ok((targets, verdicts));
    }
}

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
    (targets, verdicts)
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
    decide::decide_batch(&cases, settings, view.taken(answers))
}
