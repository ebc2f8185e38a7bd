//! The recovery check: every invocation looks at the nodes node-fencer
//! fenced (and at those a trigger asks to recover), and ends a fencing once
//! [`crate::core::recovery::decide`] says it is safe.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tracing::{info, warn};

use super::{Ctx, Switched, confirm};
use crate::core::events::NodeEvent;
use crate::core::facts::{AttachmentFacts, Confirmation, FenceMode, NodeFacts, PvFacts, Readiness};
use crate::core::instance::{InstanceId, VolumeId};
use crate::core::kube_model::Ending;
use crate::core::metrics::Dependency;
use crate::core::policy::Policy;
use crate::core::recovery::{self, Hold, RecoveryCase, RecoveryPolicy, RecoveryVerdict};
use crate::core::report::{RecoveryOutcome, RecoveryReport};
use crate::core::resolve::{self, Resolution};
use crate::core::suspect::{Intent, NodeRef, Origin, Suspect};
use crate::core::volumes;
use crate::shell::cluster::{ConfirmOutcome, UntaintOutcome};

/// One node to look at.
struct Candidate {
    requested: bool,
    /// An operator confirms it healthy (manual recovery).
    confirm: bool,
    origins: Vec<Origin>,
}

/// Runs the recovery check over the fenced nodes and the requested ones;
/// also says whether the kill switch turned on during the settle wait.
pub(super) async fn run(
    ctx: &Ctx<'_>,
    policy: &Policy,
    mut dry_run: bool,
    requested: Vec<Suspect>,
    nodes: &[NodeFacts],
    known: &HashMap<InstanceId, Confirmation>,
) -> (Vec<RecoveryReport>, Switched) {
    let mut reports = Vec::new();
    let mut candidates: BTreeMap<String, Candidate> = BTreeMap::new();
    // Routinely, only the fenced nodes that are Ready again: one still down
    // cannot recover, and asking EC2 about it on every invocation is waste.
    for node in nodes
        .iter()
        .filter(|n| n.fenced.is_some() && n.readiness == Readiness::Ready)
    {
        candidates.insert(
            node.name.clone(),
            Candidate {
                requested: false,
                confirm: false,
                origins: Vec::new(),
            },
        );
    }
    for suspect in requested {
        let Some(node) = find(&suspect.target, nodes) else {
            info!(suspect = %suspect.target, "recovery asked for a machine no node matches");
            reports.push(unmatched(suspect.target.to_string(), suspect.origin));
            continue;
        };
        let c = candidates
            .entry(node.name.clone())
            .or_insert_with(|| Candidate {
                requested: true,
                confirm: false,
                origins: Vec::new(),
            });
        c.requested = true;
        c.confirm |= suspect.intent == Intent::Confirm;
        c.origins.push(suspect.origin);
    }
    if candidates.is_empty() {
        return (reports, Switched::default());
    }
    let mut switched = Switched::default();

    let started = tokio::time::Instant::now();
    let first_seen = k8s_openapi::jiff::Timestamp::now().as_second();
    let settle = policy.recovery_settle;
    let settle_secs = i64::try_from(settle.as_secs()).unwrap_or(i64::MAX);
    let rules = Rules {
        settle,
        policy: policy.recovery,
    };
    // An operator's confirmations are written first; the decision reads them
    // back from the Nodes.
    let (confirmed, confirm_errors) = confirm(ctx, dry_run, &candidates).await;
    let reread;
    let nodes = if confirmed.is_empty() {
        nodes
    } else {
        reread = read_again(ctx, nodes, &confirmed).await;
        &reread[..]
    };
    let mut view = View::gather(ctx, rules, nodes, &candidates, known).await;
    let mut verdicts = view.decide(rules, &candidates, 0);
    // A requested recovery that only waits for the settle delay waits here,
    // once, rather than for a retry minutes later.
    let wait = verdicts
        .iter()
        .filter(|(name, _)| candidates[name.as_str()].requested)
        .filter_map(|(_, v)| match v {
            RecoveryVerdict::Hold(Hold::Settling { remaining_secs }) => Some(*remaining_secs),
            _ => None,
        })
        .max();
    if let Some(secs) = wait
        && !dry_run
    {
        let pause = Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(settle);
        info!(
            wait_s = pause.as_secs(),
            "a requested node is Ready again; waiting out the settle delay"
        );
        tokio::time::sleep(pause).await;
        switched = ctx.switched_off_since(&policy.control_namespace).await;
        if switched.on {
            warn!("the kill switch turned on during the settle delay: the rest is a plan");
            dry_run = true;
        }
        match ctx.cluster.list_nodes().await {
            Ok(fresh) => {
                // After the wait, every machine is asked again.
                view = View::gather(ctx, rules, &fresh, &candidates, &HashMap::new()).await;
                let waited = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
                verdicts = view.decide(rules, &candidates, waited);
            }
            Err(e) => {
                // The verdicts before the delay stand: still settling, so
                // a requested recovery reports waiting and is retried.
                ctx.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "could not re-read the nodes after the settle delay");
            }
        }
    }

    for (name, verdict) in verdicts {
        let c = &candidates[&name];
        let node = view.nodes.get(&name);
        let instance = node.and_then(|n| n.instance.clone());
        let state = instance
            .as_ref()
            .and_then(|i| match view.confirmations.get(i) {
                Some(Confirmation::Seen(f)) => Some(f.state.clone()),
                _ => None,
            });
        let mut report = RecoveryReport {
            node: name.clone(),
            instance_id: instance,
            instance_state: state,
            outcome: RecoveryOutcome::Kept,
            reason: String::new(),
            hold: None,
            taint_removed: false,
            requested: c.requested,
            errors: confirm_errors.get(&name).cloned().into_iter().collect(),
            origins: c.origins.clone(),
        };
        match verdict {
            RecoveryVerdict::Hold(hold) => {
                report.outcome = if hold.pending() {
                    RecoveryOutcome::Waiting
                } else {
                    RecoveryOutcome::Kept
                };
                report.reason = hold.to_string();
                info!(node = %name, hold = hold.code(), requested = c.requested, "recovery held: {hold}");
                if c.requested && hold.pending() {
                    ctx.record(&name, NodeEvent::recovery_waiting(&hold)).await;
                }
                report.hold = Some(hold);
                // The routine look at a node that stays fenced is not news.
                if !c.requested && report.outcome == RecoveryOutcome::Kept {
                    continue;
                }
            }
            RecoveryVerdict::Recover { fenced_at } if dry_run => {
                report.outcome = RecoveryOutcome::Planned;
                report.reason = "dry run: would remove node-fencer's taint and annotations".into();
                info!(node = %name, fenced_at, "recovery planned (dry run)");
            }
            RecoveryVerdict::Recover { fenced_at } => {
                let ending = Ending {
                    fenced_at: &fenced_at,
                    settle_secs,
                    seen_ready_at: first_seen,
                    needs_confirmation: rules.policy == RecoveryPolicy::Manual,
                };
                end(ctx, &name, &ending, node, &mut report).await;
            }
        }
        reports.push(report);
    }
    (reports, switched)
}

/// Records the confirmations operators asked for (nothing in a dry run):
/// the Nodes confirmed, and the errors by Node.
async fn confirm(
    ctx: &Ctx<'_>,
    dry_run: bool,
    candidates: &BTreeMap<String, Candidate>,
) -> (Vec<String>, HashMap<String, String>) {
    let mut confirmed = Vec::new();
    let mut errors = HashMap::new();
    for name in candidates.iter().filter(|(_, c)| c.confirm).map(|(n, _)| n) {
        if dry_run {
            info!(node = %name, "dry run: would record the operator's confirmation");
            continue;
        }
        match ctx.cluster.confirm_recovery(name).await {
            Ok(ConfirmOutcome::Confirmed) => {
                info!(node = %name, "an operator confirmed the node healthy");
                confirmed.push(name.clone());
            }
            Ok(ConfirmOutcome::NotFenced | ConfirmOutcome::NodeGone) => {
                info!(node = %name, "nothing of node-fencer's to confirm");
            }
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                warn!(node = %name, error = %e, "could not record the confirmation");
                errors.insert(name.clone(), e.to_string());
            }
        }
    }
    (confirmed, errors)
}

/// `nodes`, with the Nodes `names` read again (their confirmation written
/// since), and the confirmation recorded as an Event on each.
async fn read_again(ctx: &Ctx<'_>, nodes: &[NodeFacts], names: &[String]) -> Vec<NodeFacts> {
    let mut nodes = nodes.to_vec();
    for name in names {
        match ctx.cluster.get_node(name).await {
            Ok(Some(fresh)) => {
                if let Some(mark) = &fresh.fenced {
                    ctx.record(name, NodeEvent::recovery_confirmed(&mark.at))
                        .await;
                }
                match nodes.iter_mut().find(|n| n.name == *name) {
                    Some(n) => *n = fresh,
                    None => nodes.push(fresh),
                }
            }
            Ok(None) => nodes.retain(|n| n.name != *name),
            Err(e) => {
                // The decision then reads the Node as it was: still
                // unconfirmed, so the fencing stays.
                ctx.meter.error(Dependency::Kubernetes);
                warn!(node = %name, error = %e, "could not read the node again after its confirmation");
            }
        }
    }
    nodes
}

/// Writes the end of one fencing and records it.
async fn end(
    ctx: &Ctx<'_>,
    name: &str,
    ending: &Ending<'_>,
    node: Option<&NodeFacts>,
    report: &mut RecoveryReport,
) {
    match ctx.cluster.untaint_node(name, ending).await {
        Ok(UntaintOutcome::Ended { taint_removed }) => {
            report.outcome = RecoveryOutcome::Recovered;
            report.taint_removed = taint_removed;
            let legacy = node
                .and_then(|n| n.fenced.as_ref())
                .is_some_and(|m| m.mode == FenceMode::Legacy);
            let event = NodeEvent::fencing_ended(ending.fenced_at, taint_removed, legacy);
            report.reason.clone_from(&event.note);
            info!(node = name, taint_removed, "fencing ended");
            ctx.record(name, event).await;
        }
        Ok(UntaintOutcome::NodeNotReady) => {
            report.outcome = RecoveryOutcome::Waiting;
            report.reason = Hold::NodeNotReady.to_string();
            report.hold = Some(Hold::NodeNotReady);
        }
        Ok(UntaintOutcome::NotSettled { remaining_secs }) => {
            // The Node flapped since the list: its new Ready time counts.
            let hold = Hold::Settling { remaining_secs };
            info!(
                node = name,
                remaining_secs, "not Ready for the settle delay at patch time"
            );
            report.outcome = RecoveryOutcome::Waiting;
            report.reason = hold.to_string();
            report.hold = Some(hold);
        }
        Ok(UntaintOutcome::NotOurs) => {
            report.reason = Hold::NotFenced.to_string();
            report.hold = Some(Hold::NotFenced);
        }
        Ok(UntaintOutcome::NotConfirmed) => {
            // The confirmation was withdrawn since the decision read it.
            let hold = Hold::AwaitingConfirmation {
                fenced_at: ending.fenced_at.to_owned(),
            };
            report.reason = hold.to_string();
            report.hold = Some(hold);
        }
        Ok(UntaintOutcome::NodeGone) => {
            report.reason = "the node no longer exists".into();
        }
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(node = name, error = %e, "could not end the fencing");
            report.outcome = RecoveryOutcome::Failed;
            report.reason = "the taint could not be removed".into();
            report.errors.push(e.to_string());
        }
    }
}

/// The Node a recovery request names: by the usual resolution, or by the
/// instance node-fencer recorded (the Node may name a new one by now).
fn find<'a>(target: &NodeRef, nodes: &'a [NodeFacts]) -> Option<&'a NodeFacts> {
    match resolve::resolve(target, nodes) {
        Resolution::Node(i) => Some(&nodes[i]),
        Resolution::Instance(id) => nodes.iter().find(|n| {
            n.fenced
                .as_ref()
                .is_some_and(|m| m.instance.as_ref() == Some(&id))
        }),
        Resolution::Unmatched => None,
    }
}

/// The recovery rules in force: the settle delay, and who ends a fencing.
#[derive(Clone, Copy)]
struct Rules {
    settle: Duration,
    policy: RecoveryPolicy,
}

/// What the recovery decisions look at, gathered with one call of each kind.
struct View {
    nodes: HashMap<String, NodeFacts>,
    confirmations: HashMap<InstanceId, Confirmation>,
    attachments: Option<(Vec<AttachmentFacts>, Vec<PvFacts>)>,
}

impl View {
    async fn gather(
        ctx: &Ctx<'_>,
        rules: Rules,
        nodes: &[NodeFacts],
        candidates: &BTreeMap<String, Candidate>,
        known: &HashMap<InstanceId, Confirmation>,
    ) -> Self {
        let nodes: HashMap<String, NodeFacts> = nodes
            .iter()
            .filter(|n| candidates.contains_key(&n.name))
            .map(|n| (n.name.clone(), n.clone()))
            .collect();
        let mut ids: Vec<InstanceId> = nodes
            .values()
            .filter(|n| n.fenced.is_some())
            .flat_map(|n| {
                let fenced = n.fenced.as_ref().and_then(|m| m.instance.clone());
                n.instance.clone().into_iter().chain(fenced)
            })
            .collect();
        ids.sort();
        ids.dedup();
        // What this invocation already asked (the screen) is not asked twice.
        let mut confirmations: HashMap<InstanceId, Confirmation> = ids
            .iter()
            .filter_map(|id| Some((id.clone(), known.get(id)?.clone())))
            .collect();
        ids.retain(|id| !confirmations.contains_key(id));
        confirmations.extend(confirm::instances(ctx, &ids).await);
        let mut view = Self {
            nodes,
            confirmations,
            attachments: None,
        };
        // The attachments are listed only when some node gets that far.
        let needed = view
            .nodes
            .values()
            .any(|n| view.verdict(rules, n, 0) == RecoveryVerdict::Hold(Hold::AttachmentsUnknown));
        if needed {
            let (vas, pvs) = futures::join!(
                ctx.cluster.list_volume_attachments(),
                ctx.cluster.list_persistent_volumes()
            );
            match (vas, pvs) {
                (Ok(vas), Ok(pvs)) => view.attachments = Some((vas, pvs)),
                (Err(e), _) | (_, Err(e)) => {
                    ctx.meter.error(Dependency::Kubernetes);
                    warn!(error = %e, "could not list attachments; no recovery this time");
                }
            }
        }
        view
    }

    /// The verdict for one Node as gathered; `waited` seconds count as
    /// Ready time for a Node whose condition does not say since when.
    fn verdict(&self, rules: Rules, node: &NodeFacts, waited: i64) -> RecoveryVerdict {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let attached = self.attached(node);
        let fenced = node
            .fenced
            .as_ref()
            .and_then(|m| m.instance.as_ref())
            .filter(|id| Some(*id) != node.instance.as_ref())
            .and_then(|id| self.confirmations.get(id));
        recovery::decide(&RecoveryCase {
            node,
            current: node
                .instance
                .as_ref()
                .and_then(|id| self.confirmations.get(id)),
            fenced,
            attached: attached.as_deref(),
            now,
            seen_ready_at: now - waited,
            settle_secs: i64::try_from(rules.settle.as_secs()).unwrap_or(i64::MAX),
            policy: rules.policy,
        })
    }

    /// The verdict per candidate; a candidate no Node matches any more is
    /// not node-fencer's to end.
    fn decide(
        &self,
        rules: Rules,
        candidates: &BTreeMap<String, Candidate>,
        waited: i64,
    ) -> Vec<(String, RecoveryVerdict)> {
        candidates
            .keys()
            .map(|name| {
                let verdict = match self.nodes.get(name) {
                    Some(node) => self.verdict(rules, node, waited),
                    None => RecoveryVerdict::Hold(Hold::NotFenced),
                };
                (name.clone(), verdict)
            })
            .collect()
    }

    /// The volumes of the mark still tied to the Node by a VolumeAttachment;
    /// `None` while the attachments are not listed.
    fn attached(&self, node: &NodeFacts) -> Option<Vec<VolumeId>> {
        let Some(mark) = &node.fenced else {
            return Some(Vec::new());
        };
        let Some((vas, pvs)) = &self.attachments else {
            return None;
        };
        Some(
            volumes::volumes_of_node(&node.name, node.instance.as_ref(), vas, pvs)
                .into_iter()
                .map(|v| v.volume)
                .filter(|v| mark.volumes.contains(v))
                .collect(),
        )
    }
}

/// A recovery request that names no Node of this cluster.
fn unmatched(target: String, origin: Origin) -> RecoveryReport {
    RecoveryReport {
        node: target,
        instance_id: None,
        instance_state: None,
        outcome: RecoveryOutcome::Kept,
        reason: "no node of this cluster matches".into(),
        hold: None,
        taint_removed: false,
        requested: true,
        errors: Vec::new(),
        origins: vec![origin],
    }
}
