//! Active fencing, between the decision and the plan: a candidate whose
//! machine the cloud still calls running is judged by
//! [`crate::core::rules::power::judge`]; one it allows is judged again under the
//! Lease (the Nodes listed and the cloud asked again first), marked on its
//! Node, powered off, and waited for until the cloud reports it stopped;
//! then every target is decided again, as if the cloud had reported the
//! machine stopped on its own. The fence that follows is the usual one,
//! with its own confirmations: nothing here taints or detaches.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::core::inbound::suspect::Origin;
use crate::core::model::facts::{Confirmation, InstanceFacts, NodeFacts, StatusChecks};
use crate::core::model::instance::{InstanceId, InstanceState};
use crate::core::outbound::events::NodeEvent;
use crate::core::outbound::kube_patch::PowerStamp;
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::decide::{Skip, Verdict};
use crate::core::rules::plan::Target;
use crate::core::rules::power::{
    self, ActiveFencing, Candidate, PowerOutcome, PowerReport, PowerVerdict, Refusal, Scope,
    Surroundings,
};
use crate::core::rules::stuck::Stranding;
use crate::core::rules::view::NodeView;
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::error::PipelineError;
use crate::pipeline::invocation::Invocation;
use crate::pipeline::lease::{self, Hold};
use crate::pipeline::stages::decide::{decide_again, refuse_beyond_the_core};
use crate::pipeline::stages::stuck;
use crate::pipeline::{nodes, wait};
use crate::shell::cloud::{CloudError, PowerOff, PowerOffAnswer};

/// How often the cloud is asked while a powered-off machine is stopping: a
/// forced stop takes tens of seconds, and each look is a describe call.
const POLL: Duration = Duration::from_secs(2);

/// One power-off the first judgement allowed: the target, its Node, the
/// machine as the cloud described it then (every later look, and the
/// power-off itself, is held to it), how long it was NotReady, the status
/// checks recorded with it, and what was read stuck on it.
struct Allowed {
    target: usize,
    node: String,
    machine: InstanceFacts,
    not_ready_for: u64,
    checks: Option<StatusChecks>,
    stranding: Option<Stranding>,
}

/// What was read stuck on each Node, by name.
type Strandings = HashMap<String, Stranding>;

/// Judges the candidates, powers off those the rules allow, and decides
/// every target again once a machine was powered off.
pub(crate) async fn run(ctx: &Ctx<'_>, inv: &mut Invocation<'_>) -> Result<(), PipelineError> {
    let picked = candidates(&inv.decision.targets, &inv.decision.verdicts);
    let Some(settings) = inv.policy.active_fencing else {
        // Off: only an operator's explicit request hears why nothing happened.
        for k in picked {
            if inv.decision.targets[k].origins.contains(&Origin::Direct) {
                let report = PowerReport::refused(Refusal::Disabled, None, None);
                inv.decision.power.insert(k, report);
            }
        }
        return Ok(());
    };
    let Some(view) = inv.view.as_ref().filter(|_| !picked.is_empty()) else {
        return Ok(());
    };
    let names: Vec<(usize, String)> = picked
        .iter()
        .filter_map(|k| {
            let i = inv.decision.targets[*k].node?;
            Some((*k, view.nodes[i].name.clone()))
        })
        .collect();
    let allowed = first_judgement(ctx, inv, &settings, &names).await?;
    if allowed.is_empty() {
        return Ok(());
    }
    let sent = lease::under_lease(ctx, inv, async |hold, inv| {
        power_off(ctx, inv, &settings, hold, &allowed).await
    })
    .await??;
    if sent.sent.is_empty() {
        return Ok(());
    }
    wait_stopped(ctx, inv, &sent).await;
    // A machine powered off is decided again, as if the cloud had reported
    // it stopped on its own; so are the others, whose room under the cap
    // it may take, but a refusal the decision made after the core's
    // verdict (a kubelet on another machine, the Node's name taken) stands.
    // Every verdict that now fences is held to those refusals again: one
    // whose question failed before is not fenced unasked.
    if let Some(view) = inv.view.as_ref() {
        // Held to the machines judged, and to the Nodes as first read.
        inv.looks.disown_replaced(&view.nodes);
        let settings = inv.policy.decision(inv.switch.is_on(), view.cluster_size());
        let d = &mut inv.decision;
        let answers = inv.looks.answers();
        decide_again(&d.targets, &mut d.verdicts, view, answers, &settings);
        let decided = (&d.targets[..], &mut d.verdicts[..]);
        let policy = (inv.policy, &settings);
        refuse_beyond_the_core(ctx, policy, decided, view, &mut inv.looks).await;
    }
    Ok(())
}

/// The targets this stage looks at: power-off candidates decided "machine
/// not off" because the cloud reports them running.
fn candidates(targets: &[Target], verdicts: &[Verdict]) -> Vec<usize> {
    targets
        .iter()
        .zip(verdicts)
        .enumerate()
        .filter(|(_, (t, v))| {
            t.power_off
                && t.node.is_some()
                && matches!(
                    v,
                    Verdict::Skip {
                        reason: Skip::InstanceNotOff {
                            state: InstanceState::Running
                        }
                    }
                )
        })
        .map(|(k, _)| k)
        .collect()
}

/// The stops the cloud took, as (target, machine) pairs, and the bound on
/// the wait for those machines to be off.
struct Sent {
    sent: Vec<(usize, InstanceId)>,
    until: Instant,
}

/// The first judgement, over every Node (the partition guard counts them
/// all): refusals and dry-run plans are reported, the rest returned.
async fn first_judgement(
    ctx: &Ctx<'_>,
    inv: &mut Invocation<'_>,
    settings: &ActiveFencing,
    names: &[(usize, String)],
) -> Result<Vec<Allowed>, PipelineError> {
    let full;
    let view = match inv.view.as_ref() {
        Some(view) if !view.is_partial() => view,
        _ => {
            full = nodes::full(ctx).await?;
            &full
        }
    };
    let ids: Vec<InstanceId> = names
        .iter()
        .filter_map(|(k, _)| inv.decision.targets[*k].instance.clone())
        .collect();
    let checks = status_checks(ctx, &ids).await;
    let only: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
    let (verdicts, stranding) = judge_reading_stuck(ctx, inv, (settings, view), &only).await;
    let dry_run = inv.switch.is_on();
    let mut allowed = Vec::new();
    for ((k, name), verdict) in names.iter().zip(verdicts) {
        tell_lapsed(ctx, name, &verdict, dry_run).await;
        let node = view.nodes.iter().find(|n| n.name == *name);
        let checks = node
            .and_then(|n| n.instance.as_ref())
            .and_then(|id| checks.get(id))
            .cloned();
        let report = match verdict {
            PowerVerdict::Refuse { refusal } => {
                info!(
                    node = name,
                    reason = refusal.code(),
                    "not powering off: {refusal}"
                );
                if !dry_run && records(&refusal) {
                    ctx.record(name, NodeEvent::power_off_refused(&refusal))
                        .await;
                }
                let dark_for = node.and_then(|n| power::not_ready_for(n, now(ctx)));
                PowerReport::refused(refusal, dark_for, checks)
            }
            PowerVerdict::PowerOff { not_ready_for, .. } if dry_run => PowerReport::new(
                PowerOutcome::Planned,
                format!(
                    "would power off: NotReady for {not_ready_for} s and the cloud reports it running"
                ),
                Some(not_ready_for),
                checks,
            ),
            PowerVerdict::PowerOff { not_ready_for, .. } => {
                let judged = node
                    .and_then(|n| n.instance.as_ref())
                    .and_then(|id| inv.looks.judged(id));
                let Some(machine) = judged.cloned() else {
                    // The judgement found it running, so the cloud described
                    // it: a node without that description is not powered off.
                    let report = PowerReport::refused(Refusal::LookupFailed, None, checks);
                    inv.decision.power.insert(*k, report);
                    continue;
                };
                allowed.push(Allowed {
                    target: *k,
                    node: name.clone(),
                    machine,
                    not_ready_for,
                    checks,
                    stranding: stranding.get(name).cloned(),
                });
                continue;
            }
        };
        inv.decision.power.insert(*k, report);
    }
    Ok(allowed)
}

/// The verdicts on the Nodes `names`, with what is stuck on them read
/// (`ACTIVE_FENCING=stuck`) only for those every other guard allows, then
/// judged again until every Node allowed has been read: each refused
/// frees room under the cap that may allow another. A partition reads
/// nothing.
async fn judge_reading_stuck(
    ctx: &Ctx<'_>,
    inv: &Invocation<'_>,
    (settings, view): (&ActiveFencing, &NodeView),
    names: &[&str],
) -> (Vec<PowerVerdict>, Strandings) {
    let at = now(ctx);
    let mut read = Strandings::new();
    loop {
        let answers = inv.looks.answers();
        let verdicts = judge(inv.policy, settings, view, answers, names, at, &read);
        let unread: Vec<&NodeFacts> = names
            .iter()
            .zip(&verdicts)
            .filter(|(name, v)| {
                settings.scope == Scope::Stuck
                    && matches!(v, PowerVerdict::PowerOff { .. })
                    && !read.contains_key(**name)
            })
            .filter_map(|(name, _)| view.nodes.iter().find(|n| n.name == *name))
            .collect();
        if unread.is_empty() {
            return (verdicts, read);
        }
        read.extend(stuck::read(ctx, &unread).await);
        for node in unread {
            read.entry(node.name.clone()).or_insert(Stranding::Unread);
        }
    }
}

/// A Warning on a Node whose earlier power-off mark lapsed: its stop never
/// came, so the mark no longer holds the machine back.
async fn tell_lapsed(ctx: &Ctx<'_>, name: &str, verdict: &PowerVerdict, dry_run: bool) {
    let PowerVerdict::PowerOff {
        lapsed: Some(at), ..
    } = verdict
    else {
        return;
    };
    warn!(
        node = name,
        marked_at = at,
        "an earlier power-off never took effect: the machine runs the boot it recorded and has not started since"
    );
    if !dry_run {
        ctx.record(name, NodeEvent::power_off_lapsed(at)).await;
    }
}

/// Refusals worth a Warning Event: a guard held back a node that was dead
/// long enough, or nothing stuck on it left it to Kubernetes. A node not
/// NotReady long enough yet is no news.
fn records(refusal: &Refusal) -> bool {
    matches!(
        refusal,
        Refusal::NothingStuck
            | Refusal::Partition { .. }
            | Refusal::ZoneDark { .. }
            | Refusal::CapReached { .. }
            | Refusal::PoweredOffBefore { .. }
            | Refusal::SharedMachine { .. }
            | Refusal::MachineReplaced { .. }
            | Refusal::ControlPlane
    )
}

/// The verdict for each named Node, over `view`, what the cloud said and
/// what was read stuck on the Nodes.
fn judge(
    policy: &Policy,
    settings: &ActiveFencing,
    view: &NodeView,
    answers: &HashMap<InstanceId, Confirmation>,
    names: &[&str],
    now: i64,
    stranding: &Strandings,
) -> Vec<PowerVerdict> {
    let found: Vec<Option<&NodeFacts>> = names
        .iter()
        .map(|name| view.nodes.iter().find(|n| n.name == *name))
        .collect();
    let candidates: Vec<Candidate<'_>> = found
        .iter()
        .flatten()
        .map(|node| Candidate {
            node,
            confirmation: node.instance.as_ref().and_then(|id| answers.get(id)),
            stranding: stranding.get(&node.name),
        })
        .collect();
    let around = Surroundings {
        nodes: &view.nodes,
        out_of_service: view.taken(answers),
        limit: policy.cap(view.cluster_size()),
        now,
        reach: &policy.reach,
    };
    let mut judged = power::judge(&candidates, &around, Some(settings)).into_iter();
    // One verdict per Node found, in order; a Node gone is not powered off.
    found
        .iter()
        .map(|node| {
            node.and_then(|_| judged.next())
                .unwrap_or(PowerVerdict::Refuse {
                    refusal: Refusal::NodeGone,
                })
        })
        .collect()
}

/// Under the Lease: lists the Nodes and asks the cloud again, judges once
/// more (a node may have turned Ready, another invocation may have taken
/// the cap's room), and for each node still allowed marks its Node, then
/// powers it off, while the hold lasts. The mark comes first: another
/// invocation counts it under the cap, and a mark without a stop is
/// harmless. Returns the (target, machine) pairs whose stop the cloud took.
async fn power_off(
    ctx: &Ctx<'_>,
    inv: &mut Invocation<'_>,
    settings: &ActiveFencing,
    hold: &Hold,
    allowed: &[Allowed],
) -> Result<Sent, PipelineError> {
    if inv.switch.is_on() {
        for a in allowed {
            warn!(
                node = a.node,
                "the kill switch turned on while waiting: not powering off"
            );
            inv.decision.power.insert(a.target, planned_after_switch());
        }
        return Ok(Sent {
            sent: Vec::new(),
            until: Instant::now(),
        });
    }
    let fresh = nodes::full(ctx).await?;
    let names: Vec<&str> = allowed.iter().map(|a| a.node.as_str()).collect();
    let ids: Vec<InstanceId> = names
        .iter()
        .filter_map(|name| fresh.nodes.iter().find(|n| n.name == *name))
        .filter_map(|n| n.instance.clone())
        .collect();
    // Held to the machines first judged (a name recreated since is not
    // found), and to the Nodes as they are now (a machine the Node no
    // longer records as its own is not found either).
    inv.looks.again(ctx, &ids).await;
    inv.looks.disown_replaced(&fresh.nodes);
    let (answers, at) = (inv.looks.answers(), now(ctx));
    let read = read_before(allowed);
    let verdicts = judge(inv.policy, settings, &fresh, answers, &names, at, &read);
    // One bound for the stops and the wait for the machines to be off.
    let until = inv.until(Instant::now() + settings.wait);
    let mut sent = Vec::new();
    for (a, verdict) in allowed.iter().zip(verdicts) {
        let node = fresh.nodes.iter().find(|n| n.name == a.node);
        let answer = node
            .and_then(|n| n.instance.as_ref())
            .and_then(|id| inv.looks.get(id));
        let verdict = match power::held_to_judged(
            &a.machine,
            node,
            answer,
            inv.looks.replaced(&a.machine.id),
        ) {
            Some(refusal) => PowerVerdict::Refuse { refusal },
            None => verdict,
        };
        let (PowerVerdict::PowerOff { .. }, Some(node)) = (&verdict, node) else {
            if let PowerVerdict::Refuse { refusal } = verdict {
                info!(node = a.node, "not powering off after all: {refusal}");
                if records(&refusal) {
                    ctx.record(&a.node, NodeEvent::power_off_refused(&refusal))
                        .await;
                }
                let dark_for = node.and_then(|n| power::not_ready_for(n, now(ctx)));
                let report = PowerReport::refused(refusal, dark_for, a.checks.clone());
                inv.decision.power.insert(a.target, report);
            }
            continue;
        };
        // The machine first judged, with its identity: the shell holds its
        // own last look to it, never to another machine of the same name.
        let report = stop(ctx, hold, a, node, until).await;
        if matches!(
            report.outcome,
            PowerOutcome::StopPending | PowerOutcome::FoundOff | PowerOutcome::Deleted
        ) {
            sent.push((a.target, a.machine.id.clone()));
        }
        inv.decision.power.insert(a.target, report);
    }
    Ok(Sent { sent, until })
}

/// What the first judgement read stuck on the Nodes it allowed.
fn read_before(allowed: &[Allowed]) -> Strandings {
    allowed
        .iter()
        .filter_map(|a| Some((a.node.clone(), a.stranding.clone()?)))
        .collect()
}

/// Marks one Node and powers its machine off, while `hold` lasts; a cloud
/// that follows the stop to its end follows it until `until`.
async fn stop(
    ctx: &Ctx<'_>,
    hold: &Hold,
    a: &Allowed,
    node: &NodeFacts,
    until: Instant,
) -> PowerReport {
    let machine = &a.machine;
    let acted = |outcome, reason: String| {
        PowerReport::new(outcome, reason, Some(a.not_ready_for), a.checks.clone())
    };
    let why = reason(a, &ctx.correlation_id);
    if hold.left().is_none() {
        // Another invocation may count now: a retry decides again.
        warn!(node = a.node, "the fencing Lease ran out: not powering off");
        return acted(
            PowerOutcome::Failed,
            "the fencing Lease ran out before the stop; a retry decides again".into(),
        );
    }
    let fencing = match mark(ctx, node, &why).await {
        Ok(at) => at,
        Err(e) => return acted(PowerOutcome::Failed, e),
    };
    if hold.left().is_none() {
        // The mark names a power-off that was never sent: taken back, or the
        // never-twice rule would refuse every retry and the cap would count
        // a machine that runs as before.
        warn!(node = a.node, "the fencing Lease ran out: not powering off");
        return acted(
            PowerOutcome::Failed,
            unmark(
                ctx,
                &a.node,
                "the fencing Lease ran out before the stop; a retry decides again".into(),
            )
            .await,
        );
    }
    let order = PowerOff {
        machine,
        fencing: &fencing,
        until,
    };
    let answer = ctx.cloud.power_off(&order).await;
    answered(ctx, a, &why, answer).await
}

/// What the cloud's answer to the power-off of `a` makes of it: reported,
/// recorded, and its mark taken back when nothing of node-fencer's was
/// powered off.
async fn answered(
    ctx: &Ctx<'_>,
    a: &Allowed,
    why: &str,
    answer: Result<PowerOffAnswer, CloudError>,
) -> PowerReport {
    let id = &a.machine.id;
    let acted = |outcome, reason: String| {
        PowerReport::new(outcome, reason, Some(a.not_ready_for), a.checks.clone())
    };
    match answer {
        Ok(PowerOffAnswer::Sent) => {
            info!(node = a.node, instance = %id, "powered off: {why}");
            ctx.record(&a.node, NodeEvent::powered_off(id, why)).await;
            acted(PowerOutcome::StopPending, format!("powered off; {why}"))
        }
        Ok(PowerOffAnswer::FoundOff) => {
            // Nothing was sent: the mark stays until the fencing that
            // follows, as for a power-off of ours, since the machine is off
            // and the never-twice rule costs nothing then.
            info!(node = a.node, instance = %id, "found off already: no power-off sent");
            ctx.record(&a.node, NodeEvent::found_off(id)).await;
            acted(
                PowerOutcome::FoundOff,
                "found off already when the power-off was to be sent: nothing sent".into(),
            )
        }
        Ok(PowerOffAnswer::Deleted) => {
            // Nothing of node-fencer's was powered off: the mark goes, so
            // neither the cap nor the never-twice rule counts it.
            info!(node = a.node, instance = %id, "deleted already: no power-off sent");
            ctx.record(&a.node, NodeEvent::found_deleted(id)).await;
            acted(
                PowerOutcome::Deleted,
                unmark(
                    ctx,
                    &a.node,
                    "deleted already when the power-off was to be sent: nothing sent".into(),
                )
                .await,
            )
        }
        Err(e) => {
            ctx.meter.error(e.dependency());
            warn!(node = a.node, error = %e, "could not power off");
            acted(
                PowerOutcome::Failed,
                unmark(ctx, &a.node, e.to_string()).await,
            )
        }
    }
}

/// Takes back the mark of a stop the cloud refused, so that the cap and the
/// never-twice rule do not count a machine that runs as before; `error` is
/// the refusal, with what is left to do when the mark stays.
async fn unmark(ctx: &Ctx<'_>, node: &str, error: String) -> String {
    match ctx.writes.clear_power_mark(node).await {
        Ok(()) => error,
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node, error = %e, "could not take back the power-off mark");
            format!(
                "{error}; the power-off mark stays on the Node (it could not be taken back: {e}), so node-fencer will not power it off again until it reboots: remove the node-fencer.io/powered-off-at annotation to allow it"
            )
        }
    }
}

fn planned_after_switch() -> PowerReport {
    PowerReport::new(
        PowerOutcome::Planned,
        "the kill switch turned on while waiting for the Lease: not powered off",
        None,
        None,
    )
}

/// Now, in Unix seconds.
fn now(ctx: &Ctx<'_>) -> i64 {
    ctx.now().as_second()
}

/// What the Node's annotation and Event say of a power-off.
fn reason(a: &Allowed, correlation_id: &str) -> String {
    let checks = a.checks.as_ref().map_or_else(
        || "status checks not reported".to_owned(),
        |c| format!("status checks: {c}"),
    );
    let stuck = match &a.stranding {
        Some(Stranding::Read(stuck)) => stuck
            .first()
            .map(|s| format!("; {} holds {}, stuck", s.pod, s.volume)),
        _ => None,
    };
    format!(
        "NotReady for {} s while the cloud reported it running{}; {checks}; run {correlation_id}",
        a.not_ready_for,
        stuck.unwrap_or_default()
    )
}

/// Records the power-off on the Node before the stop, so that it counts
/// under the cap for every other invocation and is never repeated before
/// the node boots and reports again. A mark that cannot be written stops
/// the power-off: without it, neither guard would know. Returns the time
/// on the mark, which names this power-off.
async fn mark(ctx: &Ctx<'_>, node: &NodeFacts, why: &str) -> Result<String, String> {
    let stamp = PowerStamp {
        at: ctx.now().to_string(),
        boot_id: node.power.boot_id.clone(),
        reason: why.to_owned(),
    };
    match ctx.writes.mark_powered_off(&node.name, &stamp).await {
        Ok(true) => Ok(stamp.at),
        Ok(false) => Err("the Node is gone: not powered off".into()),
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node = node.name, error = %e, "could not record the power-off on the Node: not powering off");
            Err(format!(
                "the power-off could not be recorded on the Node, so it was not sent: {e}"
            ))
        }
    }
}

/// Asks the cloud until every powered-off machine is reported stopped, or
/// the wait is over (then the switch is read again, like after any wait).
async fn wait_stopped(ctx: &Ctx<'_>, inv: &mut Invocation<'_>, sent: &Sent) {
    let Sent { sent, until } = sent;
    let ids: Vec<InstanceId> = sent.iter().map(|(_, id)| id.clone()).collect();
    let deadline = *until;
    let Invocation {
        switch,
        looks,
        policy,
        ..
    } = inv;
    let ns = &policy.control_namespace;
    let stopped = async || {
        let answers = looks.again(ctx, &ids).await;
        Ok::<_, std::convert::Infallible>(answers.values().all(Confirmation::confirms_off))
    };
    let _ = wait::poll(
        ctx,
        switch,
        ns,
        (deadline, POLL),
        "the powered-off machines stopping",
        stopped,
    )
    .await;
    for (k, id) in sent {
        let off = inv.looks.get(id).is_some_and(Confirmation::confirms_off);
        let Some(report) = inv.decision.power.get_mut(k) else {
            continue;
        };
        if off {
            if report.outcome == PowerOutcome::StopPending {
                report.outcome = PowerOutcome::Stopped;
            }
        } else {
            warn!(instance = %id, "not stopped within POWER_OFF_WAIT_SECONDS: no taint; a retry looks again");
            report
                .reason
                .push_str("; not reported stopped within POWER_OFF_WAIT_SECONDS");
        }
    }
}

/// The status checks the cloud reports; none when it cannot be asked (they
/// are recorded, never required).
async fn status_checks(ctx: &Ctx<'_>, ids: &[InstanceId]) -> HashMap<InstanceId, StatusChecks> {
    match ctx.cloud.status_checks(ids).await {
        Ok(found) => found.into_iter().collect(),
        Err(e) => {
            ctx.meter.error(e.dependency());
            warn!(error = %e, "could not read the status checks; powering off without them");
            HashMap::new()
        }
    }
}
