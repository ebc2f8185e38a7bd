//! The fencing pipeline: kill switch → resolve → confirm → decide →
//! discover volumes → (settle, lease, recount) → re-confirm → taint →
//! (release) → detach → verify → report, then the recovery check of fenced
//! nodes ([`recover`]). It gathers facts through the [`Cloud`] and
//! [`Cluster`] traits, leaves every choice to the pure core, and carries out
//! the plan.

mod recover;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use crate::control::KillSwitch;
use crate::decide::{self, Case, Settings, Skip, Verdict};
use crate::facts::{Confirmation, FenceMode, InstanceFacts, NodeFacts, VolumeFacts};
use crate::instance::{InstanceId, VolumeId};
use crate::kube_model::Stamp;
use crate::metrics::{Dependency, Meter, Stage};
use crate::mode::{self, ModeSetting};
use crate::report::{NodeReport, Outcome, Report, VolumeOutcome, VolumeReport};
use crate::resolve::{self, Resolution};
use crate::shell::cloud::Cloud;
use crate::shell::cluster::{Cluster, ClusterError, NodeEvent, TaintOutcome};
use crate::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use crate::volumes::{self, NodeVolume, VolumeAction};

/// How many nodes are fenced at once within one invocation.
const PARALLEL_NODES: usize = 8;

/// The handles and settings one invocation works with.
pub struct Ctx<'a> {
    /// EC2.
    pub cloud: &'a dyn Cloud,
    /// Kubernetes.
    pub cluster: &'a dyn Cluster,
    /// Dry-run and the cap.
    pub settings: Settings,
    /// How long to wait for detached volumes to become `available`.
    pub detach_wait: Duration,
    /// How often to look while waiting.
    pub poll_interval: Duration,
    /// The invocation's correlation id.
    pub correlation_id: String,
    /// Where stage latencies and failed calls are counted.
    pub meter: &'a Meter,
    /// Mode, percentage cap, second confirmation, recovery, controls.
    pub lifecycle: Lifecycle,
}

/// The settings of the whole node lifecycle beyond fencing itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    /// Taint, legacy, or by server version.
    pub mode: ModeSetting,
    /// The cap as a share of all nodes, in percent.
    pub max_out_of_service_percent: Option<u8>,
    /// Wait before the second EC2 confirmation.
    pub confirm_again_after: Duration,
    /// How long a node must be Ready again before its fencing ends.
    pub recovery_settle: Duration,
    /// Where the fencing Lease and the kill switch live.
    pub control_namespace: String,
}

impl Default for Lifecycle {
    /// What the configuration defaults to, with no settle delay.
    fn default() -> Self {
        Self {
            mode: ModeSetting::Auto,
            max_out_of_service_percent: None,
            confirm_again_after: Duration::ZERO,
            recovery_settle: Duration::ZERO,
            control_namespace: "kube-system".into(),
        }
    }
}

/// A failure that stops the whole invocation before any decision.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The node list could not be read, so nothing can be resolved.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// One node (or unmatched suspect) being worked on.
struct Target {
    reference: NodeRef,
    node: Option<usize>,
    instance: Option<InstanceId>,
    intent: Intent,
    origins: Vec<Origin>,
}

/// Runs the pipeline over one batch.
pub async fn run(ctx: &Ctx<'_>, batch: Batch) -> Result<Report, PipelineError> {
    let mut errors = Vec::new();
    let kill_switch = match ctx
        .cluster
        .kill_switch(&ctx.lifecycle.control_namespace)
        .await
    {
        Ok(KillSwitch::Unreadable(value)) => {
            warn!(
                value,
                "the kill switch holds neither true nor false; acting as if it were on"
            );
            KillSwitch::Unreadable(value)
        }
        Ok(k) => {
            if k.engaged() {
                warn!("kill switch on: every action is a dry run");
            }
            k
        }
        Err(e) => {
            // Fail closed: an unreadable switch may be an engaged one.
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "kill switch unreadable; acting as if it were on");
            errors.push(format!("{e}; every action was a dry run"));
            KillSwitch::Unreadable(e.to_string())
        }
    };
    let settings = Settings {
        dry_run: ctx.settings.dry_run || kill_switch.engaged(),
        ..ctx.settings
    };
    let (fencing, recovering): (Vec<Suspect>, Vec<Suspect>) = batch
        .suspects
        .into_iter()
        .partition(|s| matches!(s.intent, Intent::Fence | Intent::Check));
    let nodes = ctx.cluster.list_nodes().await.inspect_err(|_| {
        ctx.meter.error(Dependency::Kubernetes);
    })?;
    let (results, mode) = if fencing.is_empty() {
        (Vec::new(), None)
    } else {
        fence_batch(ctx, &settings, fencing, &nodes).await?
    };
    let recoveries = recover::run(ctx, settings.dry_run, recovering, &nodes).await;
    Ok(Report {
        correlation_id: ctx.correlation_id.clone(),
        dry_run: settings.dry_run,
        kill_switch: kill_switch.engaged(),
        mode,
        results,
        recoveries,
        ignored: batch.ignored,
        errors,
    })
}

async fn fence_batch(
    ctx: &Ctx<'_>,
    settings: &Settings,
    suspects: Vec<Suspect>,
    nodes: &[NodeFacts],
) -> Result<(Vec<NodeReport>, Option<FenceMode>), PipelineError> {
    let resolutions: Vec<Resolution> = suspects
        .iter()
        .map(|s| resolve::resolve(&s.target, nodes))
        .collect();

    // Confirm out of band, one batched call for every instance of the invocation.
    let mut ids: Vec<InstanceId> = resolutions
        .iter()
        .filter_map(|r| match r {
            Resolution::Node(i) => nodes[*i].instance.clone(),
            Resolution::Instance(id) => Some(id.clone()),
            Resolution::Unmatched => None,
        })
        .collect();
    ids.sort();
    ids.dedup();
    let confirmations = confirm(ctx, &ids).await;

    let targets = group(suspects, resolutions, nodes, &confirmations);
    let cases: Vec<Case<'_>> = targets
        .iter()
        .map(|t| Case {
            intent: t.intent,
            node: t.node.map(|i| &nodes[i]),
            confirmation: t.instance.as_ref().and_then(|id| confirmations.get(id)),
        })
        .collect();
    let out_of_service = nodes.iter().filter(|n| n.is_out_of_service()).count();
    let capped = Settings {
        max_out_of_service: cap(ctx, settings, nodes.len()),
        ..*settings
    };
    let verdicts = decide::decide_batch(&cases, &capped, out_of_service);

    let mut reports: Vec<Option<NodeReport>> = Vec::with_capacity(targets.len());
    let mut to_fence: Vec<(usize, bool, bool)> = Vec::new();
    for (i, (target, verdict)) in targets.iter().zip(&verdicts).enumerate() {
        let node = target.node.map(|n| nodes[n].name.clone());
        let state = seen(target.instance.as_ref(), &confirmations).map(|f| f.state.clone());
        info!(
            suspect = %target.reference, node = node.as_deref().unwrap_or("-"),
            instance = target.instance.as_ref().map_or("-", |i| i.as_str()),
            state = state.as_ref().map_or("-", |s| s.name()),
            verdict = match verdict { Verdict::Fence { .. } => "fence", Verdict::Skip { reason } => reason.code() },
            "decided"
        );
        match verdict {
            Verdict::Skip { reason } => {
                if matches!(reason, Skip::CapReached { .. })
                    && let Some(name) = &node
                {
                    refused(ctx, name, reason).await;
                }
                reports.push(Some(skipped_target(target, node, state, reason)));
            }
            Verdict::Fence { add_taint, dry_run } => {
                to_fence.push((i, *add_taint, *dry_run));
                reports.push(None);
            }
        }
    }
    if to_fence.is_empty() {
        return Ok((reports.into_iter().flatten().collect(), None));
    }
    let mode = fence_mode(ctx).await?;

    // Discover the volumes of every node to fence: one list of each kind.
    let discovery = discover_volumes(ctx, &to_fence, &targets, nodes).await;

    let live_taints = to_fence.iter().any(|(_, add, dry)| *add && !*dry);
    if to_fence.iter().any(|(_, _, dry)| !dry) && !ctx.lifecycle.confirm_again_after.is_zero() {
        info!(
            delay_s = ctx.lifecycle.confirm_again_after.as_secs(),
            "waiting before the second confirmation"
        );
        tokio::time::sleep(ctx.lifecycle.confirm_again_after).await;
    }
    // New taints are decided and written under the cluster's Lease, counted
    // against the Nodes as they are now: the cap holds across invocations.
    let namespace = &ctx.lifecycle.control_namespace;
    if live_taints {
        ctx.cluster
            .acquire_lease(namespace, &ctx.correlation_id)
            .await
            .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
    }
    let fenced = fence_under_lease(
        ctx,
        settings,
        mode,
        live_taints,
        to_fence,
        &targets,
        nodes,
        &confirmations,
        &discovery,
        reports,
    )
    .await;
    if live_taints
        && let Err(e) = ctx
            .cluster
            .release_lease(namespace, &ctx.correlation_id)
            .await
    {
        // It expires on its own; the next holder waits at most that long.
        ctx.meter.error(Dependency::Kubernetes);
        warn!(error = %e, "could not release the fencing lease");
    }
    let (work, mut reports) = fenced?;
    let mut done = Vec::new();
    for (i, stamp, actions, node_volumes, report) in work {
        let span = info_span!("act", node = report.node.as_deref().unwrap_or("-"), instance = %stamp.instance);
        done.push(
            async move {
                (
                    i,
                    act(ctx, mode, &stamp, &actions, &node_volumes, report).await,
                )
            }
            .instrument(span),
        );
    }
    let done: Vec<(usize, NodeReport)> = futures::stream::iter(done)
        .buffer_unordered(PARALLEL_NODES)
        .collect()
        .await;
    let mut done = verify(ctx, done).await;
    for (i, report) in done.drain(..) {
        reports[i] = Some(report);
    }
    Ok((reports.into_iter().flatten().collect(), Some(mode)))
}

/// One node whose taint stage passed: what its act stage needs.
type Work = (usize, Stamp, Vec<VolumeAction>, Vec<NodeVolume>, NodeReport);

/// Recounts, re-confirms and writes the taints (or legacy marks). Runs with
/// the Lease held when `live_taints` (a new taint is planned, not a dry run).
#[allow(clippy::too_many_arguments)]
async fn fence_under_lease(
    ctx: &Ctx<'_>,
    settings: &Settings,
    mode: FenceMode,
    live_taints: bool,
    mut to_fence: Vec<(usize, bool, bool)>,
    targets: &[Target],
    nodes: &[NodeFacts],
    confirmations: &HashMap<InstanceId, Confirmation>,
    discovery: &Discovery,
    mut reports: Vec<Option<NodeReport>>,
) -> Result<(Vec<Work>, Vec<Option<NodeReport>>), PipelineError> {
    if live_taints {
        let fresh = ctx.cluster.list_nodes().await.inspect_err(|_| {
            ctx.meter.error(Dependency::Kubernetes);
        })?;
        let limit = cap(ctx, settings, fresh.len());
        let now_out = fresh.iter().filter(|n| n.is_out_of_service()).count();
        let new: Vec<usize> = (0..to_fence.len())
            .filter(|&k| to_fence[k].1 && !to_fence[k].2)
            .collect();
        let already: Vec<bool> = new
            .iter()
            .map(|&k| {
                let name = targets[to_fence[k].0].node.map(|n| &nodes[n].name);
                fresh
                    .iter()
                    .any(|f| Some(&f.name) == name && f.is_out_of_service())
            })
            .collect();
        let admitted = decide::recount(&already, now_out, limit);
        let mut refused_now = Vec::new();
        for (&k, verdict) in new.iter().zip(admitted) {
            match verdict {
                decide::Recount::New => {}
                decide::Recount::AlreadyOut => to_fence[k].1 = false,
                decide::Recount::Refused(reason) => refused_now.push((k, reason)),
            }
        }
        for (k, reason) in refused_now.iter().rev() {
            let (i, _, _) = to_fence.remove(*k);
            let target = &targets[i];
            let node = target.node.map(|n| nodes[n].name.clone());
            if let Some(name) = &node {
                refused(ctx, name, reason).await;
            }
            let state = seen(target.instance.as_ref(), confirmations).map(|f| f.state.clone());
            reports[i] = Some(skipped_target(target, node, state, reason));
        }
    }

    // Re-confirm right before the first irreversible step.
    let live: Vec<InstanceId> = to_fence
        .iter()
        .filter(|(_, _, dry)| !dry)
        .filter_map(|(i, _, _)| targets[*i].instance.clone())
        .collect();
    let reconfirmed = if live.is_empty() {
        HashMap::new()
    } else {
        confirm(ctx, &live).await
    };

    let mut work = Vec::new();
    for (i, add_taint, dry_run) in to_fence {
        let target = &targets[i];
        let Some(node) = target.node.map(|n| &nodes[n]) else {
            continue;
        };
        let Some(instance) = seen(target.instance.as_ref(), confirmations) else {
            continue;
        };
        let node_volumes = discovery
            .volumes
            .get(&node.name)
            .cloned()
            .unwrap_or_default();
        let actions = volumes::plan_detach(
            &instance.id,
            instance.root_device_name.as_deref(),
            &node_volumes,
            &discovery.described,
        );
        let mut report = NodeReport {
            target: target.reference.to_string(),
            node: Some(node.name.clone()),
            instance_id: Some(instance.id.clone()),
            instance_state: Some(instance.state.clone()),
            outcome: Outcome::Planned,
            reason: String::new(),
            skip: None,
            taint_applied: false,
            pods_deleted: 0,
            attachments_deleted: 0,
            volumes: Vec::new(),
            errors: discovery.errors.clone(),
            origins: target.origins.clone(),
        };
        if dry_run {
            report.volumes = volume_reports(&actions, &node_volumes, true);
            report.reason = plan_text(mode, add_taint, &actions);
            reports[i] = Some(report);
            continue;
        }
        let again = reconfirmed
            .get(&instance.id)
            .cloned()
            .unwrap_or(Confirmation::LookupFailed {
                error: "missing from the re-confirmation".into(),
            });
        if !again.confirms_off() {
            let reason = match decide::decide_one(
                &Case {
                    intent: target.intent,
                    node: Some(node),
                    confirmation: Some(&again),
                },
                settings,
            ) {
                Verdict::Skip { reason } => reason,
                Verdict::Fence { .. } => Skip::LookupFailed {
                    error: "re-confirmation inconsistent".into(),
                },
            };
            warn!(node = %node.name, %reason, "re-confirmation did not confirm; not fencing");
            reports[i] = Some(skipped(
                report.target,
                report.node,
                report.instance_id,
                report.instance_state,
                reason,
                report.origins,
            ));
            continue;
        }
        work.push((
            i,
            add_taint,
            instance.clone(),
            actions,
            node_volumes,
            report,
        ));
    }

    let stamp_at = k8s_openapi::jiff::Timestamp::now().to_string();
    let tainted: Vec<(Work, bool)> =
        futures::stream::iter(work)
            .map(|(i, add_taint, instance, actions, node_volumes, report)| {
                let span = info_span!("fence", node = report.node.as_deref().unwrap_or("-"), instance = %instance.id);
                let stamp = Stamp {
                    instance: instance.id.clone(),
                    state: instance.state.clone(),
                    at: stamp_at.clone(),
                    correlation_id: ctx.correlation_id.clone(),
                    mode,
                    volumes: actions
                        .iter()
                        .filter(|a| matches!(a, VolumeAction::Detach { .. }))
                        .map(|a| a.volume().clone())
                        .collect(),
                };
                async move {
                    let (report, go_on) = taint(ctx, add_taint, &stamp, &actions, &node_volumes, report).await;
                    ((i, stamp, actions, node_volumes, report), go_on)
                }
                .instrument(span)
            })
            .buffer_unordered(PARALLEL_NODES)
            .collect()
            .await;
    let mut next = Vec::new();
    for (done, go_on) in tainted {
        if go_on {
            next.push(done);
        } else {
            let (i, _, _, _, report) = done;
            reports[i] = Some(report);
        }
    }
    Ok((next, reports))
}

/// The cap in force for a cluster of `nodes` Nodes.
fn cap(ctx: &Ctx<'_>, settings: &Settings, nodes: usize) -> usize {
    decide::effective_cap(
        settings.max_out_of_service,
        ctx.lifecycle.max_out_of_service_percent,
        nodes,
    )
}

/// The mode in force: configured, or by the server's version.
async fn fence_mode(ctx: &Ctx<'_>) -> Result<FenceMode, PipelineError> {
    Ok(match ctx.lifecycle.mode {
        ModeSetting::Taint => FenceMode::Taint,
        ModeSetting::Legacy => FenceMode::Legacy,
        ModeSetting::Auto => {
            let version = ctx
                .cluster
                .server_version()
                .await
                .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))?;
            let chosen = mode::choose(ModeSetting::Auto, version);
            info!(%version, mode = chosen.name(), "fencing mode chosen by server version");
            chosen
        }
    })
}

async fn refused(ctx: &Ctx<'_>, node: &str, reason: &Skip) {
    warn!(node, "{reason}");
    emit(
        ctx,
        node,
        true,
        "FencingRefused",
        "Fence",
        reason.to_string(),
    )
    .await;
}

/// Asks EC2 about the instances; any error makes every answer a failed lookup.
async fn confirm(ctx: &Ctx<'_>, ids: &[InstanceId]) -> HashMap<InstanceId, Confirmation> {
    if ids.is_empty() {
        return HashMap::new();
    }
    let started = Instant::now();
    let described = ctx.cloud.describe_instances(ids).await;
    ctx.meter.stage(Stage::Confirm, started.elapsed());
    match described {
        Ok(found) => {
            let mut map: HashMap<InstanceId, Confirmation> = ids
                .iter()
                .map(|id| (id.clone(), Confirmation::NotFound))
                .collect();
            for facts in found {
                if map.contains_key(&facts.id) {
                    map.insert(facts.id.clone(), Confirmation::Seen(facts));
                }
            }
            map
        }
        Err(e) => {
            ctx.meter.error(Dependency::Ec2);
            warn!(error = %e, "could not confirm instance states; nothing will be fenced");
            ids.iter()
                .map(|id| {
                    (
                        id.clone(),
                        Confirmation::LookupFailed {
                            error: e.to_string(),
                        },
                    )
                })
                .collect()
        }
    }
}

fn seen<'a>(
    id: Option<&InstanceId>,
    confirmations: &'a HashMap<InstanceId, Confirmation>,
) -> Option<&'a InstanceFacts> {
    match confirmations.get(id?)? {
        Confirmation::Seen(facts) => Some(facts),
        Confirmation::NotFound | Confirmation::LookupFailed { .. } => None,
    }
}

/// Merges suspects that point at the same node, so each node is decided once.
fn group(
    suspects: Vec<Suspect>,
    resolutions: Vec<Resolution>,
    nodes: &[NodeFacts],
    confirmations: &HashMap<InstanceId, Confirmation>,
) -> Vec<Target> {
    let mut targets: Vec<Target> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (suspect, resolution) in suspects.into_iter().zip(resolutions) {
        let (node, instance) = match resolution {
            Resolution::Node(i) => (Some(i), nodes[i].instance.clone()),
            Resolution::Instance(id) => {
                let by_dns = seen(Some(&id), confirmations)
                    .and_then(|facts| resolve::resolve_by_dns(facts, nodes));
                (by_dns, Some(id))
            }
            Resolution::Unmatched => (None, None),
        };
        let key = match node {
            Some(i) => format!("node/{}", nodes[i].name),
            None => format!("ref/{}", suspect.target),
        };
        match index.get(&key) {
            Some(&t) => {
                let target = &mut targets[t];
                if suspect.intent == Intent::Fence {
                    target.intent = Intent::Fence;
                }
                target.origins.push(suspect.origin);
            }
            None => {
                index.insert(key, targets.len());
                targets.push(Target {
                    reference: suspect.target,
                    node,
                    instance,
                    intent: suspect.intent,
                    origins: vec![suspect.origin],
                });
            }
        }
    }
    targets
}

struct Discovery {
    volumes: HashMap<String, Vec<NodeVolume>>,
    described: Vec<VolumeFacts>,
    errors: Vec<String>,
}

async fn discover_volumes(
    ctx: &Ctx<'_>,
    to_fence: &[(usize, bool, bool)],
    targets: &[Target],
    nodes: &[NodeFacts],
) -> Discovery {
    let mut errors = Vec::new();
    let (vas, pvs) = futures::join!(
        ctx.cluster.list_volume_attachments(),
        ctx.cluster.list_persistent_volumes()
    );
    let mut failed = |e: ClusterError| {
        ctx.meter.error(Dependency::Kubernetes);
        errors.push(e.to_string());
    };
    let vas = vas.unwrap_or_else(|e| {
        failed(e);
        Vec::new()
    });
    let pvs = pvs.unwrap_or_else(|e| {
        failed(e);
        Vec::new()
    });
    let mut volumes = HashMap::new();
    for (i, _, _) in to_fence {
        if let Some(n) = targets[*i].node {
            let name = &nodes[n].name;
            volumes.insert(name.clone(), volumes::volumes_of_node(name, &vas, &pvs));
        }
    }
    let mut ids: Vec<VolumeId> = volumes
        .values()
        .flatten()
        .map(|v| v.volume.clone())
        .collect();
    ids.sort();
    ids.dedup();
    let described = if ids.is_empty() {
        Vec::new()
    } else {
        ctx.cloud.describe_volumes(&ids).await.unwrap_or_else(|e| {
            ctx.meter.error(Dependency::Ec2);
            errors.push(e.to_string());
            Vec::new()
        })
    };
    Discovery {
        volumes,
        described,
        errors,
    }
}

/// The taint (or, in legacy mode, the mark) on one node. Returns the report
/// and whether the act stage may go on.
async fn taint(
    ctx: &Ctx<'_>,
    add_taint: bool,
    stamp: &Stamp,
    actions: &[VolumeAction],
    node_volumes: &[NodeVolume],
    mut report: NodeReport,
) -> (NodeReport, bool) {
    if !add_taint {
        return (report, true);
    }
    let node = report.node.clone().unwrap_or_default();
    let started = Instant::now();
    let tainted = ctx.cluster.taint_node(&node, stamp).await;
    ctx.meter.stage(Stage::Taint, started.elapsed());
    match tainted {
        Ok(TaintOutcome::Applied) => {
            report.taint_applied = true;
            let (reason, note) = match stamp.mode {
                FenceMode::Taint => {
                    info!("out-of-service taint applied");
                    (
                        "OutOfServiceTaintApplied",
                        format!(
                            "EC2 reports {} `{}`: applied node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
                            stamp.instance, stamp.state
                        ),
                    )
                }
                FenceMode::Legacy => {
                    info!("fenced the legacy way (marked)");
                    (
                        "FencedLegacy",
                        format!(
                            "EC2 reports {} `{}`: force-deleting the node's pods and VolumeAttachments (no out-of-service taint on this cluster)",
                            stamp.instance, stamp.state
                        ),
                    )
                }
            };
            emit(ctx, &node, false, reason, "Fence", note).await;
            (report, true)
        }
        Ok(TaintOutcome::AlreadyPresent) => {
            info!("already fenced");
            (report, true)
        }
        Ok(outcome @ (TaintOutcome::NodeReady | TaintOutcome::NodeGone)) => {
            let reason = if outcome == TaintOutcome::NodeReady {
                Skip::NodeReady
            } else {
                Skip::NotInCluster
            };
            warn!(%reason, "node changed before the taint; not fencing");
            report.outcome = Outcome::Skipped;
            report.reason = reason.to_string();
            report.skip = Some(reason);
            (report, false)
        }
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "taint failed; no volume is detached");
            report.outcome = Outcome::Failed;
            report.reason = "the taint could not be applied".into();
            report.errors.push(e.to_string());
            report.volumes = volume_reports(actions, node_volumes, true);
            (report, false)
        }
    }
}

/// What follows the taint: in legacy mode the node's pods and
/// VolumeAttachments go first; then the EBS volumes are force-detached.
async fn act(
    ctx: &Ctx<'_>,
    mode: FenceMode,
    stamp: &Stamp,
    actions: &[VolumeAction],
    node_volumes: &[NodeVolume],
    mut report: NodeReport,
) -> NodeReport {
    let node = report.node.clone().unwrap_or_default();
    if mode == FenceMode::Legacy {
        legacy(ctx, &node, node_volumes, &mut report).await;
    }
    report.volumes = volume_reports(actions, node_volumes, false);
    let mut detached = Vec::new();
    let started = Instant::now();
    let mut sent = false;
    for (action, vr) in actions.iter().zip(report.volumes.iter_mut()) {
        let VolumeAction::Detach { volume, .. } = action else {
            continue;
        };
        sent = true;
        match ctx.cloud.detach_volume(volume, &stamp.instance).await {
            Ok(()) => {
                info!(volume = %volume, "force-detach sent");
                vr.outcome = VolumeOutcome::Stuck;
                detached.push(volume.to_string());
            }
            Err(e) if e.is_already_detached() => {
                // Someone else detached it first, or a detach is under way:
                // left to the verification, which trusts only `available`.
                info!(volume = %volume, error = %e, "volume no longer attached, or detaching");
                vr.detail = Some(e.to_string());
            }
            Err(e) => {
                ctx.meter.error(Dependency::Ec2);
                warn!(volume = %volume, error = %e, "force-detach failed");
                vr.outcome = VolumeOutcome::Failed;
                vr.detail = Some(e.to_string());
                report.errors.push(e.to_string());
            }
        }
    }
    if sent {
        ctx.meter.stage(Stage::Detach, started.elapsed());
    }
    if !detached.is_empty() {
        let note = format!(
            "force-detached EBS volume(s) {} from {}",
            detached.join(", "),
            stamp.instance
        );
        emit(ctx, &node, false, "VolumesForceDetached", "Detach", note).await;
    }
    report.outcome = if report.taint_applied {
        Outcome::Fenced
    } else {
        Outcome::AlreadyFenced
    };
    report
}

/// The legacy recipe, for clusters without the out-of-service taint: the
/// pods still bound to the node are force-deleted (grace period 0) so their
/// controllers replace them, and the node's VolumeAttachments of the EBS
/// volumes are deleted so the attach/detach controller lets go of them. The
/// Node object stays (deleting it loses its labels, taints and history).
async fn legacy(ctx: &Ctx<'_>, node: &str, node_volumes: &[NodeVolume], report: &mut NodeReport) {
    match ctx.cluster.pods_on_node(node).await {
        Ok(pods) => {
            let mut results = Vec::new();
            for pod in &pods {
                results.push(ctx.cluster.force_delete_pod(pod).await);
            }
            let deleted = tally(ctx, report, results);
            report.pods_deleted = deleted;
            if deleted > 0 {
                info!(deleted, "pods force-deleted");
                let note =
                    format!("force-deleted {deleted} pod(s) bound to the node (grace period 0)");
                emit(ctx, node, false, "PodsForceDeleted", "Fence", note).await;
            }
        }
        Err(e) => {
            tally(ctx, report, vec![Err(e)]);
        }
    }
    let mut names: Vec<&str> = node_volumes.iter().map(|v| v.attachment.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut results = Vec::new();
    for name in names {
        results.push(ctx.cluster.delete_volume_attachment(name).await);
    }
    let deleted = tally(ctx, report, results);
    report.attachments_deleted = deleted;
    if deleted > 0 {
        info!(deleted, "volumeattachments deleted");
        let note = format!("deleted {deleted} VolumeAttachment(s) of the node");
        emit(ctx, node, false, "VolumeAttachmentsDeleted", "Fence", note).await;
    }
}

/// Counts the Kubernetes calls that succeeded; each failure is counted,
/// logged and reported (the node's outcome becomes `failed`).
fn tally(ctx: &Ctx<'_>, report: &mut NodeReport, results: Vec<Result<(), ClusterError>>) -> usize {
    let mut done = 0;
    for result in results {
        match result {
            Ok(()) => done += 1,
            Err(e) => {
                ctx.meter.error(Dependency::Kubernetes);
                warn!(error = %e, "legacy fencing step failed");
                report.errors.push(e.to_string());
            }
        }
    }
    done
}

/// Waits, bounded, until every detached volume is `available`, then settles
/// each node's outcome and reason.
async fn verify(ctx: &Ctx<'_>, mut done: Vec<(usize, NodeReport)>) -> Vec<(usize, NodeReport)> {
    let pending = |done: &[(usize, NodeReport)]| -> Vec<VolumeId> {
        done.iter()
            .flat_map(|(_, r)| r.volumes.iter())
            .filter(|v| v.outcome == VolumeOutcome::Stuck)
            .map(|v| v.volume.clone())
            .collect()
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + ctx.detach_wait;
    loop {
        let waiting = pending(&done);
        if waiting.is_empty() {
            break;
        }
        match ctx.cloud.describe_volumes(&waiting).await {
            Ok(described) => {
                let free: BTreeMap<&VolumeId, &str> = described
                    .iter()
                    .filter(|f| f.state == "available")
                    .map(|f| (&f.id, f.state.as_str()))
                    .collect();
                for (_, r) in &mut done {
                    for v in &mut r.volumes {
                        if v.outcome == VolumeOutcome::Stuck && free.contains_key(&v.volume) {
                            v.outcome = VolumeOutcome::Detached;
                            v.detail = None;
                        }
                    }
                }
            }
            Err(e) => {
                ctx.meter.error(Dependency::Ec2);
                warn!(error = %e, "could not check detached volumes");
            }
        }
        if pending(&done).is_empty() || tokio::time::Instant::now() >= deadline {
            ctx.meter.stage(Stage::Verify, started.elapsed());
            break;
        }
        tokio::time::sleep(ctx.poll_interval).await;
    }
    for (_, r) in &mut done {
        if matches!(r.outcome, Outcome::Skipped | Outcome::Failed) {
            continue;
        }
        let stuck: Vec<String> = r
            .volumes
            .iter()
            .filter(|v| v.outcome == VolumeOutcome::Stuck)
            .map(|v| v.volume.to_string())
            .collect();
        for v in &mut r.volumes {
            if v.outcome == VolumeOutcome::Stuck {
                v.detail = Some(format!(
                    "not available after {}s",
                    ctx.detach_wait.as_secs()
                ));
            }
        }
        let failed = r.volumes.iter().any(|v| v.outcome == VolumeOutcome::Failed);
        let detached = r
            .volumes
            .iter()
            .filter(|v| v.outcome == VolumeOutcome::Detached)
            .count();
        let taint = match (
            r.taint_applied,
            r.pods_deleted > 0 || r.attachments_deleted > 0,
        ) {
            (true, false) => "tainted out-of-service".to_owned(),
            (false, false) => "already out-of-service".to_owned(),
            (_, true) => format!(
                "fenced the legacy way: {} pod(s) force-deleted, {} VolumeAttachment(s) deleted",
                r.pods_deleted, r.attachments_deleted
            ),
        };
        r.reason = format!("{taint}; {detached} volume(s) force-detached");
        if !stuck.is_empty() {
            r.errors.push(format!(
                "volume(s) still not available: {}",
                stuck.join(", ")
            ));
        }
        if !stuck.is_empty() || failed || !r.errors.is_empty() {
            r.outcome = Outcome::Failed;
        }
    }
    done
}

fn volume_reports(
    actions: &[VolumeAction],
    node_volumes: &[NodeVolume],
    planned: bool,
) -> Vec<VolumeReport> {
    actions
        .iter()
        .map(|a| {
            let pv = node_volumes
                .iter()
                .find(|nv| &nv.volume == a.volume())
                .and_then(|nv| nv.pv.clone());
            let (outcome, detail) = match a {
                VolumeAction::Detach { device, .. } => (
                    if planned {
                        VolumeOutcome::WouldDetach
                    } else {
                        VolumeOutcome::Stuck
                    },
                    device.clone(),
                ),
                VolumeAction::NotAttached { state, .. } => {
                    (VolumeOutcome::AlreadyDetached, Some(state.clone()))
                }
                VolumeAction::Refuse { reason, .. } => {
                    (VolumeOutcome::Refused, Some(reason.clone()))
                }
            };
            VolumeReport {
                volume: a.volume().clone(),
                pv,
                outcome,
                detail,
            }
        })
        .collect()
}

fn plan_text(mode: FenceMode, add_taint: bool, actions: &[VolumeAction]) -> String {
    let detach = actions
        .iter()
        .filter(|a| matches!(a, VolumeAction::Detach { .. }))
        .count();
    if mode == FenceMode::Legacy {
        format!(
            "dry run: would force-delete the node's pods and VolumeAttachments and force-detach {detach} volume(s) (legacy mode)"
        )
    } else if add_taint {
        format!("dry run: would apply the out-of-service taint and force-detach {detach} volume(s)")
    } else {
        format!("dry run: already out of service; would force-detach {detach} volume(s)")
    }
}

fn skipped_target(
    target: &Target,
    node: Option<String>,
    state: Option<crate::instance::InstanceState>,
    reason: &Skip,
) -> NodeReport {
    skipped(
        target.reference.to_string(),
        node,
        target.instance.clone(),
        state,
        reason.clone(),
        target.origins.clone(),
    )
}

fn skipped(
    target: String,
    node: Option<String>,
    instance_id: Option<InstanceId>,
    instance_state: Option<crate::instance::InstanceState>,
    reason: Skip,
    origins: Vec<Origin>,
) -> NodeReport {
    NodeReport {
        target,
        node,
        instance_id,
        instance_state,
        outcome: Outcome::Skipped,
        reason: reason.to_string(),
        skip: Some(reason),
        taint_applied: false,
        pods_deleted: 0,
        attachments_deleted: 0,
        volumes: Vec::new(),
        errors: Vec::new(),
        origins,
    }
}

/// Records an Event; a failure to record is logged, never fatal to fencing.
async fn emit(
    ctx: &Ctx<'_>,
    node: &str,
    warning: bool,
    reason: &'static str,
    action: &'static str,
    note: String,
) {
    let event = NodeEvent {
        warning,
        reason,
        action,
        note,
    };
    if let Err(e) = ctx.cluster.node_event(node, &event).await {
        ctx.meter.error(Dependency::Kubernetes);
        warn!(error = %e, reason, "could not record the event");
    }
}
