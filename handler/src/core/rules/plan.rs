//! The plan per node and how far each node got. The pipeline's stages move a
//! [`NodeRun`] from one [`Stage`] to the next through the transitions here;
//! the report is built once, from the final state, by [`NodeRun::into_report`].
//! Pure: every transition is a function of what a stage observed.

use std::collections::HashMap;
use std::time::Duration;

use crate::core::inbound::suspect::{Intent, NodeRef, Origin, Suspect};
use crate::core::model::facts::{Confirmation, FenceMode, InstanceFacts, NodeFacts, VolumeFacts};
use crate::core::model::facts::{CsiVolume, PodRef, PvFacts};
use crate::core::model::instance::{InstanceId, InstanceState, VolumeId};
use crate::core::outbound::kube_patch::{Stamp, TaintOutcome};
use crate::core::outbound::report::{
    AttachmentOutcome, AttachmentReport, NodeReport, Outcome, VolumeOutcome, VolumeReport,
};
use crate::core::rules::cap;
use crate::core::rules::decide::{self, Recount, Skip, Standing, Verdict};
use crate::core::rules::in_use;
use crate::core::rules::power::{self, PowerReport};
use crate::core::rules::resolve::{self, ClusterScope, Resolution, Unclaimed};
use crate::core::rules::view::NodeView;
use crate::core::rules::volumes::{
    self, AttachmentAction, NodeAttachment, NodeVolume, VolumeAction,
};

/// One node (or one suspect that matched no node), after merging the
/// suspects that name the same node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// How the first trigger named it.
    pub(crate) reference: NodeRef,
    /// The Node (index into the node list), if one matched.
    pub node: Option<usize>,
    /// The instance to confirm: the Node's, or the one the trigger named.
    pub instance: Option<InstanceId>,
    /// Fence wins over check when several triggers name the node.
    pub intent: Intent,
    /// Every trigger that named it.
    pub origins: Vec<Origin>,
    /// A trigger that named it may have its machine powered off, should the
    /// cloud still call it running ([`power::is_candidate`]).
    pub power_off: bool,
}

/// The instances to ask the cloud about, once each, for these resolutions.
pub fn instances_to_confirm(resolutions: &[Resolution], nodes: &[NodeFacts]) -> Vec<InstanceId> {
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
    ids
}

/// Takes back what the cloud described under a Node's machine name when it
/// is known to be another machine (a VM deleted and created again under the
/// same name): for that Node, its own machine is not found. Nothing of the
/// new machine's may be taken for the old one's, least of all its state.
pub fn disown_replaced(nodes: &[NodeFacts], confirmations: &mut HashMap<InstanceId, Confirmation>) {
    for node in nodes {
        let Some(id) = &node.instance else { continue };
        if let Some(Confirmation::Seen(facts)) = confirmations.get(id)
            && !facts.identity.may_be_machine_of(&node.machine)
        {
            confirmations.insert(id.clone(), Confirmation::NotFound);
        }
    }
}

/// What the cloud described for `id`, if it described it.
pub fn seen<'a>(
    id: Option<&InstanceId>,
    confirmations: &'a HashMap<InstanceId, Confirmation>,
) -> Option<&'a InstanceFacts> {
    match confirmations.get(id?)? {
        Confirmation::Seen(facts) => Some(facts),
        Confirmation::NotFound | Confirmation::LookupFailed { .. } => None,
    }
}

/// Merges suspects that point at the same node, so each node is decided once.
/// An instance no Node claims by provider id is matched to a Node only as
/// [`resolve::resolve_unclaimed`] allows, within the cluster's `scope`.
pub fn targets(
    suspects: Vec<Suspect>,
    resolutions: Vec<Resolution>,
    nodes: &[NodeFacts],
    confirmations: &HashMap<InstanceId, Confirmation>,
    scope: Option<&ClusterScope>,
) -> Vec<Target> {
    let mut targets: Vec<Target> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (suspect, resolution) in suspects.into_iter().zip(resolutions) {
        let (node, instance) = match resolution {
            Resolution::Node(i) => (Some(i), nodes[i].instance.clone()),
            Resolution::Instance(id) => {
                let unclaimed = seen(Some(&id), confirmations)
                    .map(|facts| resolve::resolve_unclaimed(facts, nodes, scope));
                match unclaimed {
                    Some(Unclaimed::Node(i)) => (Some(i), Some(id)),
                    // The Node is named, its machine is not: no instance to confirm.
                    Some(Unclaimed::Unproven(i)) => (Some(i), None),
                    Some(Unclaimed::Nothing) | None => (None, Some(id)),
                }
            }
            Resolution::Unmatched => (None, None),
        };
        let key = match node {
            Some(i) => format!("node/{}", nodes[i].name),
            None => format!("ref/{}", suspect.target),
        };
        let power_off = power::is_candidate(&suspect);
        // A power-off is a fence with one more step before it.
        let intent = match suspect.intent {
            Intent::PowerOff => Intent::Fence,
            other => other,
        };
        match index.get(&key) {
            Some(&t) => {
                let target = &mut targets[t];
                if intent == Intent::Fence {
                    target.intent = Intent::Fence;
                }
                target.power_off |= power_off;
                target.origins.push(suspect.origin);
            }
            None => {
                index.insert(key, targets.len());
                targets.push(Target {
                    reference: suspect.target,
                    node,
                    instance,
                    intent,
                    origins: vec![suspect.origin],
                    power_off,
                });
            }
        }
    }
    targets
}

/// How far one node got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Left alone, for this reason.
    Skipped(Skip),
    /// To be fenced; not yet admitted (recount, second confirmation).
    Decided,
    /// Dry run: the plan is the outcome.
    Planned,
    /// Admitted and confirmed off again: the taint is next.
    Admitted,
    /// The taint (legacy mode: the mark) is on the Node.
    Tainted,
    /// The taint could not be written; no volume was touched.
    TaintFailed,
    /// The taint is on, but right before the detaches the cloud did not
    /// confirm the instance off again: nothing of the node's is freed.
    DetachHeld(Skip),
    /// The legacy steps and the force-detaches were sent.
    DetachSent,
    /// The wait for the detached volumes is over (all free, or the bound ran out).
    Verified,
}

/// What fencing one node means: set when it is decided, its volumes once
/// they are discovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// What the cloud said at decision time.
    pub instance: InstanceFacts,
    /// False when the Node carries the taint already: only the volumes are left.
    pub(crate) add_taint: bool,
    /// The invocation whose fencing the Node carries, if any.
    pub(crate) marked_by: Option<String>,
    /// Plan only.
    pub dry_run: bool,
    /// The node's volumes, from its VolumeAttachments.
    pub(crate) node_volumes: Vec<NodeVolume>,
    /// What to do with each, once the cloud has described them.
    pub(crate) actions: Vec<VolumeAction>,
    /// Legacy mode: what to do with each of the node's VolumeAttachments,
    /// every driver's.
    pub attachments: Vec<AttachmentAction>,
    /// Legacy mode: the names of the deleted attachments' volumes in the
    /// Node's `status.volumesInUse`, to release ([`in_use::to_release`]).
    pub(crate) release_in_use: Vec<String>,
    /// The Node's CSI volumes as Kubernetes recorded them at decision
    /// time ([`NodeFacts::attached`]): the attachments to read by name.
    pub attached: Option<Vec<CsiVolume>>,
    /// The values of the out-of-service taints the Node carries once
    /// fenced (another writer's, and node-fencer's own): which pods stay is
    /// judged against all of them.
    pub out_of_service: Vec<String>,
}

impl NodePlan {
    /// The volumes to force-detach.
    pub fn detaches(&self) -> impl Iterator<Item = &VolumeId> {
        self.actions.iter().filter_map(|a| match a {
            VolumeAction::Detach { volume, .. } => Some(volume),
            VolumeAction::NotAttached { .. }
            | VolumeAction::Refuse { .. }
            | VolumeAction::Keep { .. } => None,
        })
    }

    /// A new taint written for real: what makes an invocation take the Lease.
    pub(crate) fn writes_new_taint(&self) -> bool {
        self.add_taint && !self.dry_run
    }
}

/// One node's way through the pipeline. Its fields are its own: every
/// change is one of the named transitions below, so the stages cannot put a
/// run into a state no transition leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRun {
    /// How the trigger named it.
    reference: String,
    /// The Node, if one matched.
    node: Option<String>,
    /// Its `metadata.uid`, as judged: every write is held to it.
    node_uid: Option<String>,
    /// The instance.
    instance_id: Option<InstanceId>,
    /// The state the cloud reported at decision time.
    instance_state: Option<InstanceState>,
    /// The triggers that named it.
    origins: Vec<Origin>,
    /// How far it got.
    stage: Stage,
    /// The plan, for a node decided for fencing.
    plan: Option<NodePlan>,
    /// Whether this invocation wrote the taint (legacy mode: the mark).
    taint_applied: bool,
    /// Pods force-deleted.
    pods_deleted: usize,
    /// Legacy mode: VolumeAttachments deleted.
    attachments_deleted: usize,
    /// Legacy mode: each VolumeAttachment, once the recipe ran.
    attachments: Vec<AttachmentReport>,
    /// Each volume's progress, once the act stage starts.
    volumes: Vec<VolumeReport>,
    /// Errors met on the way.
    errors: Vec<String>,
    /// Active fencing's decision on the node, and what came of it.
    power_off: Option<PowerReport>,
    /// What names the fencing the volumes are freed for: the time on the
    /// Node's mark, the one found or the one this invocation writes.
    fencing: Option<String>,
}

/// What the cloud answered to one force-detach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetachAnswer {
    /// Sent: the verification sees the volume free, or stuck.
    Sent,
    /// Not attached any more, or a detach is under way: left to the
    /// verification, which trusts only what the cloud shows.
    NotAttached(String),
    /// Never detached (the machine's boot disk).
    Refused(String),
    /// The call failed.
    Failed(String),
}

/// The runs of a batch, one per target, from the decisions: a node to fence
/// gets its plan (volumes to follow), every other one its skip reason.
pub fn plan(
    targets: &[Target],
    verdicts: &[Verdict],
    nodes: &[NodeFacts],
    confirmations: &HashMap<InstanceId, Confirmation>,
) -> Vec<NodeRun> {
    targets
        .iter()
        .zip(verdicts)
        .map(|(target, verdict)| {
            let node = target.node.map(|n| &nodes[n]);
            let instance = seen(target.instance.as_ref(), confirmations);
            let (stage, plan) = match (verdict, instance) {
                (Verdict::Fence { add_taint, dry_run }, Some(instance)) if node.is_some() => (
                    Stage::Decided,
                    Some(NodePlan {
                        instance: instance.clone(),
                        add_taint: *add_taint,
                        marked_by: node
                            .and_then(|n| n.fenced.as_ref())
                            .and_then(|m| m.correlation_id.clone()),
                        dry_run: *dry_run,
                        node_volumes: Vec::new(),
                        actions: Vec::new(),
                        attachments: Vec::new(),
                        release_in_use: Vec::new(),
                        attached: node.and_then(|n| n.attached.clone()),
                        out_of_service: node
                            .map(|n| n.out_of_service_values(*add_taint))
                            .unwrap_or_default(),
                    }),
                ),
                (Verdict::Skip { reason }, _) => (Stage::Skipped(reason.clone()), None),
                // The decision fences only a Node whose instance was seen off.
                (Verdict::Fence { .. }, _) => (
                    Stage::Skipped(Skip::LookupFailed {
                        error: "no instance facts for a node decided for fencing".into(),
                    }),
                    None,
                ),
            };
            NodeRun {
                reference: target.reference.to_string(),
                node: node.map(|n| n.name.clone()),
                node_uid: node.and_then(|n| n.uid.clone()),
                instance_id: instance
                    .map(|f| f.id.clone())
                    .or_else(|| target.instance.clone()),
                instance_state: instance.map(|f| f.state.clone()),
                origins: target.origins.clone(),
                stage,
                plan,
                taint_applied: false,
                pods_deleted: 0,
                attachments_deleted: 0,
                attachments: Vec::new(),
                volumes: Vec::new(),
                errors: Vec::new(),
                power_off: None,
                fencing: node.and_then(|n| n.fenced.as_ref()).map(|m| m.at.clone()),
            }
        })
        .collect()
}

impl NodeRun {
    /// How the trigger named it.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The Node, if one matched.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The Node's `metadata.uid` as judged, when it was read.
    pub fn node_uid(&self) -> Option<&str> {
        self.node_uid.as_deref()
    }

    /// The machine.
    pub fn instance_id(&self) -> Option<&InstanceId> {
        self.instance_id.as_ref()
    }

    /// What the cloud said of the machine at decision time.
    pub fn instance_state(&self) -> Option<&InstanceState> {
        self.instance_state.as_ref()
    }

    /// How far it got.
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// The plan, for a node decided for fencing.
    pub fn plan(&self) -> Option<&NodePlan> {
        self.plan.as_ref()
    }

    /// Whether this invocation wrote the taint (legacy mode: the mark).
    pub fn taint_applied(&self) -> bool {
        self.taint_applied
    }

    /// What names the fencing the volumes are freed for (the time on the
    /// Node's mark), when node-fencer marked it.
    pub fn fencing_at(&self) -> Option<&str> {
        self.fencing.as_deref()
    }

    /// Active fencing judged the node: its report.
    pub fn power_off(&mut self, report: PowerReport) {
        self.power_off = Some(report);
    }

    /// Errors met on the way; the node's outcome is then `failed`.
    pub fn failed_with(&mut self, errors: impl IntoIterator<Item = String>) {
        self.errors.extend(errors);
    }

    /// The pods force-deleted from the node.
    pub fn pods_deleted(&mut self, deleted: usize) {
        self.pods_deleted = deleted;
    }

    /// Legacy mode: the recipe's VolumeAttachments, and how many went.
    pub fn attachments_done(&mut self, reports: Vec<AttachmentReport>, deleted: usize) {
        self.attachments = reports;
        self.attachments_deleted = deleted;
    }

    /// What the cloud answered to the force-detach of `volume`.
    pub fn detach_answered(&mut self, volume: &VolumeId, answer: DetachAnswer) {
        let Some(v) = self.volumes.iter_mut().find(|v| &v.volume == volume) else {
            return;
        };
        match answer {
            DetachAnswer::Sent => {}
            DetachAnswer::NotAttached(detail) => v.detail = Some(detail),
            DetachAnswer::Refused(detail) => {
                v.outcome = VolumeOutcome::Refused;
                v.detail = Some(detail);
            }
            DetachAnswer::Failed(detail) => {
                v.outcome = VolumeOutcome::Failed;
                v.detail = Some(detail.clone());
                self.errors.push(detail);
            }
        }
    }

    /// A run still on its way to fencing, with its plan.
    pub fn fencing(&self) -> Option<&NodePlan> {
        match self.stage {
            Stage::Decided | Stage::Admitted | Stage::Tainted | Stage::DetachSent => {
                self.plan.as_ref()
            }
            Stage::Skipped(_)
            | Stage::Planned
            | Stage::TaintFailed
            | Stage::DetachHeld(_)
            | Stage::Verified => None,
        }
    }

    /// Sets the node's volumes and what to do with each, from the
    /// VolumeAttachments and the cloud's description of the volumes.
    pub fn plan_volumes(
        &mut self,
        node_volumes: Vec<NodeVolume>,
        described: &[VolumeFacts],
        kept: &[(VolumeId, String)],
    ) {
        if let Some(plan) = &mut self.plan {
            plan.actions = volumes::plan_detach(&plan.instance, &node_volumes, described, kept);
            plan.node_volumes = node_volumes;
        }
    }

    /// Legacy mode: sets what to do with each of the node's
    /// VolumeAttachments, keeping those whose volume a staying pod mounts.
    pub fn plan_attachments(
        &mut self,
        attachments: &[NodeAttachment],
        pods: &[PodRef],
        pvs: &[PvFacts],
    ) {
        if let Some(plan) = &mut self.plan {
            plan.attachments = volumes::plan_attachments(attachments, pods, pvs);
            plan.release_in_use = in_use::to_release(&plan.attachments, pvs);
        }
    }

    /// Makes a run still decided a plan only (the kill switch turned on).
    pub fn plan_only(&mut self) {
        if self.stage == Stage::Decided
            && let Some(plan) = &mut self.plan
        {
            plan.dry_run = true;
        }
    }

    /// Skips the run for `reason`.
    pub fn skip(&mut self, reason: Skip) {
        self.stage = Stage::Skipped(reason);
    }

    /// Under the Lease, the recount found another invocation had fenced the
    /// node meanwhile: no new taint, the volumes are still ours to free.
    pub(crate) fn already_out(&mut self) {
        if let Some(plan) = &mut self.plan {
            plan.add_taint = false;
        }
    }

    /// The second confirmation, right before the first irreversible step:
    /// admitted only if the cloud says, again, that the instance is off. A
    /// dry run is planned and never written.
    pub fn confirm_again(&mut self, again: Option<&Confirmation>, fence_hibernated: bool) {
        if self.stage != Stage::Decided {
            return;
        }
        let Some(plan) = &self.plan else {
            return;
        };
        if plan.dry_run {
            self.stage = Stage::Planned;
            return;
        }
        let again = again.map(|c| plan.instance.same_machine(c));
        self.stage = match not_off(again.as_ref(), fence_hibernated, "the re-confirmation") {
            Some(reason) => Stage::Skipped(reason),
            None => Stage::Admitted,
        };
    }

    /// What the taint stage writes on the Node (annotations and taint, with
    /// the `NoSchedule` one when `no_schedule`).
    /// A new mark names this fencing from here on.
    pub fn stamp(
        &mut self,
        mode: FenceMode,
        at: &str,
        correlation_id: &str,
        no_schedule: bool,
    ) -> Option<Stamp> {
        let plan = self.plan.as_ref()?;
        if plan.add_taint {
            self.fencing = Some(at.to_owned());
        }
        Some(Stamp {
            instance: plan.instance.id.clone(),
            state: plan.instance.state.clone(),
            at: at.to_owned(),
            correlation_id: correlation_id.to_owned(),
            mode,
            volumes: plan.detaches().cloned().collect(),
            no_schedule,
            node_uid: self.node_uid.clone(),
        })
    }

    /// What the taint write found. `Ok(None)`: no write was needed (the
    /// node was out of service already).
    pub fn tainted(&mut self, outcome: Result<Option<TaintOutcome>, String>) {
        self.stage = match outcome {
            Ok(Some(TaintOutcome::Applied)) => {
                self.taint_applied = true;
                Stage::Tainted
            }
            Ok(None | Some(TaintOutcome::AlreadyPresent)) => Stage::Tainted,
            Ok(Some(TaintOutcome::NodeReady)) => Stage::Skipped(Skip::NodeReady),
            // The Node judged is gone: the one of its name now is another.
            Ok(Some(TaintOutcome::NodeGone | TaintOutcome::AnotherNode)) => {
                Stage::Skipped(Skip::NotInCluster)
            }
            Err(e) => {
                self.errors.push(e);
                Stage::TaintFailed
            }
        };
    }

    /// The confirmation right before the node's volumes are freed (and, in
    /// legacy mode, its pods and VolumeAttachments deleted): the taint patch,
    /// its retries and the Lease lie between the last look and this one, so
    /// the cloud is asked again; anything but "off" holds the node here.
    pub fn confirm_before_detach(&mut self, again: Option<&Confirmation>, fence_hibernated: bool) {
        if self.stage != Stage::Tainted {
            return;
        }
        let Some(plan) = &self.plan else {
            return;
        };
        let again = again.map(|c| plan.instance.same_machine(c));
        if let Some(reason) = not_off(
            again.as_ref(),
            fence_hibernated,
            "the confirmation before the detach",
        ) {
            self.stage = Stage::DetachHeld(reason);
        }
    }

    /// Too little of the request's time is left for this node's detaches:
    /// nothing of the node's is freed now; the retry does it.
    pub fn out_of_time(&mut self, left: Duration, needs: Duration) {
        if self.stage == Stage::Tainted {
            self.stage = Stage::DetachHeld(Skip::OutOfTime {
                left_secs: left.as_secs(),
                needs_secs: needs.as_secs(),
            });
        }
    }

    /// The act stage starts: every volume to detach is pending until the
    /// detach is answered and the volume seen free.
    pub fn start_detaching(&mut self) {
        if let Some(plan) = &self.plan {
            self.volumes = volume_reports(&plan.actions, &plan.node_volumes, false);
        }
        self.stage = Stage::DetachSent;
    }

    /// The volumes still waiting to be seen free.
    pub fn pending(&self) -> impl Iterator<Item = &VolumeId> {
        self.volumes
            .iter()
            .filter(|v| v.outcome == VolumeOutcome::Stuck)
            .map(|v| &v.volume)
    }

    /// The cloud described these volumes: those no longer held by the
    /// fenced instance are done, whether `available`, already attached to
    /// the replacement's node, or still attached elsewhere (io2 Multi-Attach).
    pub fn observe(&mut self, described: &[VolumeFacts]) {
        let Some(fenced) = self.plan.as_ref().map(|p| p.instance.id.clone()) else {
            return;
        };
        for v in &mut self.volumes {
            let free = described.iter().any(|f| {
                f.id == v.volume
                    && !f
                        .attachments
                        .iter()
                        .any(|a| a.instance == fenced && a.state.holds())
            });
            if v.outcome == VolumeOutcome::Stuck && free {
                v.outcome = VolumeOutcome::Detached;
                v.detail = None;
            }
        }
    }

    /// The wait for the volumes is over.
    pub fn verified(&mut self) {
        if self.stage == Stage::DetachSent {
            self.stage = Stage::Verified;
        }
    }

    /// The node's report, from its final state; `detach_wait` is the bound
    /// the verification waited for.
    pub fn into_report(self, mode: Option<FenceMode>, detach_wait: Duration) -> NodeReport {
        let mut report = NodeReport {
            target: self.reference,
            node: self.node,
            instance_id: self.instance_id,
            instance_state: self.instance_state,
            outcome: Outcome::Skipped,
            reason: String::new(),
            skip: None,
            taint_applied: self.taint_applied,
            pods_deleted: self.pods_deleted,
            attachments_deleted: self.attachments_deleted,
            attachments: self.attachments,
            volumes: self.volumes,
            errors: self.errors,
            origins: self.origins,
            power_off: self.power_off,
            fenced_at: self.fencing,
        };
        let planned = |plan: &NodePlan| volume_reports(&plan.actions, &plan.node_volumes, true);
        let planned_attachments = |plan: &NodePlan| attachment_reports(&plan.attachments);
        match (self.stage, self.plan) {
            (Stage::Skipped(reason), _) => {
                report.reason = reason.to_string();
                report.skip = Some(reason);
                report.volumes.clear();
            }
            (Stage::Planned, Some(plan)) => {
                report.outcome = Outcome::Planned;
                report.reason = plan_text(mode.unwrap_or(FenceMode::Taint), &plan);
                report.volumes = planned(&plan);
                report.attachments = planned_attachments(&plan);
            }
            (Stage::TaintFailed, plan) => {
                report.outcome = Outcome::Failed;
                report.reason = "the taint could not be applied".into();
                report.volumes = plan.as_ref().map(planned).unwrap_or_default();
                report.attachments = plan.as_ref().map(planned_attachments).unwrap_or_default();
            }
            (Stage::DetachHeld(reason), plan) => {
                report.outcome = Outcome::Failed;
                report.reason = format!(
                    "the taint is on, but no volume was freed: right before the detach, {reason}"
                );
                report.volumes = plan.as_ref().map(planned).unwrap_or_default();
                report.attachments = plan.as_ref().map(planned_attachments).unwrap_or_default();
            }
            (Stage::Tainted | Stage::DetachSent | Stage::Verified, _) => {
                settle(&mut report, mode.unwrap_or(FenceMode::Taint), detach_wait);
            }
            (Stage::Decided | Stage::Admitted | Stage::Planned, _) => {
                report.outcome = Outcome::Failed;
                report.reason = "the plan was not carried out".into();
            }
        }
        report
    }
}

/// Why a later look does not confirm the instance off (`None`: it does);
/// an instance missing from `look`'s answer is a failed lookup.
fn not_off(again: Option<&Confirmation>, fence_hibernated: bool, look: &str) -> Option<Skip> {
    match again {
        Some(c) => decide::not_confirmed(c, fence_hibernated),
        None => Some(Skip::LookupFailed {
            error: format!("missing from {look}"),
        }),
    }
}

/// The outcome and reason of a node whose taint is on, from its volumes.
fn settle(report: &mut NodeReport, mode: FenceMode, detach_wait: Duration) {
    let stuck: Vec<String> = report
        .volumes
        .iter()
        .filter(|v| v.outcome == VolumeOutcome::Stuck)
        .map(|v| v.volume.to_string())
        .collect();
    for v in &mut report.volumes {
        if v.outcome == VolumeOutcome::Stuck {
            v.detail = Some(format!("not available after {}s", detach_wait.as_secs()));
        }
    }
    let failed = report
        .volumes
        .iter()
        .any(|v| v.outcome == VolumeOutcome::Failed);
    let detached = report
        .volumes
        .iter()
        .filter(|v| v.outcome == VolumeOutcome::Detached)
        .count();
    let pods = match report.pods_deleted {
        0 => String::new(),
        n => format!(", {n} pod(s) force-deleted"),
    };
    let taint = match (report.taint_applied, mode) {
        (true, FenceMode::Taint) => format!("tainted out-of-service{pods}"),
        (false, FenceMode::Taint) => format!("already out-of-service{pods}"),
        (_, FenceMode::Legacy) => {
            let deleted = report
                .attachments
                .iter()
                .filter(|a| a.outcome == AttachmentOutcome::Deleted)
                .map(|a| a.driver.as_str());
            let by_driver = volumes::per_driver(deleted);
            format!(
                "fenced the legacy way: {} pod(s) force-deleted, {} VolumeAttachment(s) deleted{}",
                report.pods_deleted,
                report.attachments_deleted,
                if by_driver.is_empty() {
                    String::new()
                } else {
                    format!(" ({by_driver})")
                }
            )
        }
    };
    report.reason = format!("{taint}; {detached} volume(s) force-detached");
    if !stuck.is_empty() {
        report.errors.push(format!(
            "volume(s) still not available: {}",
            stuck.join(", ")
        ));
    }
    report.outcome = if !stuck.is_empty() || failed || !report.errors.is_empty() {
        Outcome::Failed
    } else if report.taint_applied {
        Outcome::Fenced
    } else {
        Outcome::AlreadyFenced
    };
}

/// The volume lines of a report: `planned` for a dry run or a plan not
/// carried out, otherwise the detaches as pending.
pub fn volume_reports(
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
                VolumeAction::NotAttached { state, .. } => (
                    VolumeOutcome::AlreadyDetached,
                    Some(state.name().to_owned()),
                ),
                VolumeAction::Refuse { reason, .. } => {
                    (VolumeOutcome::Refused, Some(reason.clone()))
                }
                VolumeAction::Keep { pod, .. } => (
                    VolumeOutcome::Kept,
                    Some(format!(
                        "used by pod {pod}, which tolerates the out-of-service taint and stays on the node"
                    )),
                ),
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

/// The VolumeAttachment lines of a report before (or without) the legacy
/// recipe: each one would be deleted, or is kept for its pod.
pub fn attachment_reports(actions: &[AttachmentAction]) -> Vec<AttachmentReport> {
    actions
        .iter()
        .map(|a| {
            let (pv, outcome, detail) = match a {
                AttachmentAction::Delete { pv, .. } => {
                    (pv.clone(), AttachmentOutcome::WouldDelete, None)
                }
                AttachmentAction::Keep { pv, pod, .. } => (
                    pv.clone(),
                    AttachmentOutcome::Kept,
                    Some(format!(
                        "used by pod {pod}, which tolerates the out-of-service taint and stays on the node"
                    )),
                ),
            };
            AttachmentReport {
                attachment: a.attachment().to_owned(),
                driver: a.driver().to_owned(),
                pv,
                outcome,
                detail,
            }
        })
        .collect()
}

fn plan_text(mode: FenceMode, plan: &NodePlan) -> String {
    let detach = plan.detaches().count();
    if mode == FenceMode::Legacy {
        let deletes = plan
            .attachments
            .iter()
            .filter(|a| matches!(a, AttachmentAction::Delete { .. }));
        format!(
            "dry run: would force-delete the node's pods and {} VolumeAttachment(s) and force-detach {detach} volume(s) (legacy mode)",
            deletes.count()
        )
    } else if plan.add_taint {
        format!("dry run: would apply the out-of-service taint and force-detach {detach} volume(s)")
    } else {
        format!("dry run: already out of service; would force-detach {detach} volume(s)")
    }
}

/// Recounts the runs about to write a new taint against the Nodes as they
/// are under the Lease (`fresh`), with `limit` in force. A run whose node is
/// out of service by now loses its new taint; one over the cap is skipped.
/// Returns the indices of the runs refused here.
pub fn recount(
    runs: &mut [NodeRun],
    fresh: &NodeView,
    known: &HashMap<InstanceId, Confirmation>,
    limit: usize,
) -> Vec<usize> {
    let new: Vec<usize> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.fencing().is_some_and(NodePlan::writes_new_taint))
        .map(|(k, _)| k)
        .collect();
    let standing: Vec<Standing> = new
        .iter()
        .map(|&k| {
            let node = fresh
                .nodes
                .iter()
                .find(|f| Some(&f.name) == runs[k].node.as_ref());
            match node {
                Some(f) if f.is_out_of_service() => Standing::Out,
                Some(f) if cap::holds_room(f, known) => Standing::HoldsRoom,
                _ => Standing::In,
            }
        })
        .collect();
    let now_out = fresh.taken(known);
    let mut refused = Vec::new();
    for (&k, verdict) in new.iter().zip(decide::recount(&standing, now_out, limit)) {
        match verdict {
            Recount::New => {}
            Recount::AlreadyOut => runs[k].already_out(),
            Recount::Refused(reason) => {
                runs[k].skip(reason);
                refused.push(k);
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_vm_recreated_under_the_nodes_name_is_not_its_machine() {
        let vm = InstanceId::parse("gce://proj-fencer/us-central1-a/node-1").expect("a VM");
        let mut node = NodeFacts::bare("node-1", crate::core::model::facts::Readiness::Unknown);
        node.instance = Some(vm.clone());
        node.machine.uid = Some(7);
        let answer = |uid| {
            let mut facts = InstanceFacts::bare(vm.clone(), InstanceState::Stopped);
            facts.identity.uid = Some(uid);
            HashMap::from([(vm.clone(), Confirmation::Seen(facts))])
        };
        let mut replaced = answer(8);
        disown_replaced(std::slice::from_ref(&node), &mut replaced);
        assert_eq!(replaced[&vm], Confirmation::NotFound);
        let mut own = answer(7);
        disown_replaced(std::slice::from_ref(&node), &mut own);
        assert!(matches!(own[&vm], Confirmation::Seen(_)));
    }
    use super::*;
    use crate::core::model::facts::{
        OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, VolumeAttachmentState,
    };
    use crate::core::model::facts::{Readiness, TaintFacts};
    use crate::core::model::instance::{AttachmentState, VolumeState};

    fn id(s: &str) -> InstanceId {
        InstanceId::parse(s).unwrap()
    }

    fn vol(s: &str) -> VolumeId {
        VolumeId::parse(s).unwrap()
    }

    fn node(name: &str, out: bool) -> NodeFacts {
        NodeFacts {
            seen_off: None,
            version: None,
            labels: Default::default(),
            uid: None,
            attached: None,
            machine: Default::default(),
            power: Default::default(),
            name: name.into(),
            instance: None,
            readiness: Readiness::NotReady,
            internal_ips: vec![],
            host_names: vec![],
            taints: if out {
                vec![TaintFacts {
                    key: OUT_OF_SERVICE_KEY.into(),
                    value: Some("x".into()),
                    effect: OUT_OF_SERVICE_EFFECT.into(),
                }]
            } else {
                vec![]
            },
            ready_since: None,
            fenced: None,
        }
    }

    fn decided(name: &str, add_taint: bool, dry_run: bool) -> NodeRun {
        NodeRun {
            reference: format!("node {name}"),
            node: Some(name.into()),
            node_uid: None,
            instance_id: Some(id("i-0123456789abcdef0")),
            instance_state: Some(InstanceState::Stopped),
            origins: vec![Origin::Direct],
            stage: Stage::Decided,
            plan: Some(NodePlan {
                instance: InstanceFacts::bare(id("i-0123456789abcdef0"), InstanceState::Stopped),
                add_taint,
                marked_by: None,
                dry_run,
                node_volumes: vec![],
                actions: vec![],
                attachments: vec![],
                release_in_use: vec![],
                attached: None,
                out_of_service: vec![crate::core::model::facts::OUT_OF_SERVICE_VALUE.into()],
            }),
            taint_applied: false,
            pods_deleted: 0,
            attachments_deleted: 0,
            attachments: vec![],
            volumes: vec![],
            errors: vec![],
            power_off: None,
            fencing: None,
        }
    }

    fn with_volume(mut run: NodeRun) -> NodeRun {
        let volume = vol("vol-0123456789abcdef0");
        run.plan_volumes(
            vec![NodeVolume {
                volume: volume.clone(),
                pv: Some("pv-a".into()),
                attachment: "csi-a".into(),
                attachment_uid: "uid-csi-a".into(),
            }],
            &[VolumeFacts {
                id: volume,
                state: VolumeState::InUse,
                attachments: vec![VolumeAttachmentState {
                    instance: id("i-0123456789abcdef0"),
                    device: Some("/dev/xvdba".into()),
                    state: AttachmentState::Attached,
                }],
            }],
            &[],
        );
        run
    }

    fn free(volume: &str) -> VolumeFacts {
        VolumeFacts {
            id: vol(volume),
            state: VolumeState::Available,
            attachments: vec![],
        }
    }

    #[test]
    fn the_second_confirmation_admits_only_an_instance_still_off() {
        let off = Confirmation::Seen(decided("a", true, false).plan.unwrap().instance);
        let mut running = off.clone();
        if let Confirmation::Seen(f) = &mut running {
            f.state = InstanceState::Running;
        }
        let cases = [
            (Some(&off), Stage::Admitted),
            (
                Some(&running),
                Stage::Skipped(Skip::InstanceNotOff {
                    state: InstanceState::Running,
                }),
            ),
            (
                Some(&Confirmation::NotFound),
                Stage::Skipped(Skip::InstanceNotFound),
            ),
            (
                None,
                Stage::Skipped(Skip::LookupFailed {
                    error: "missing from the re-confirmation".into(),
                }),
            ),
        ];
        for (again, want) in cases {
            let mut run = decided("a", true, false);
            run.confirm_again(again, false);
            assert_eq!(run.stage, want, "{again:?}");
        }
        let mut dry = decided("a", true, true);
        dry.confirm_again(Some(&running), false);
        assert_eq!(
            dry.stage,
            Stage::Planned,
            "a dry run is planned, never written"
        );
    }

    #[test]
    fn every_taint_answer_moves_the_run_to_its_stage() {
        let cases = [
            (Ok(Some(TaintOutcome::Applied)), Stage::Tainted, true),
            (
                Ok(Some(TaintOutcome::AlreadyPresent)),
                Stage::Tainted,
                false,
            ),
            (Ok(None), Stage::Tainted, false),
            (
                Ok(Some(TaintOutcome::NodeReady)),
                Stage::Skipped(Skip::NodeReady),
                false,
            ),
            (
                Ok(Some(TaintOutcome::NodeGone)),
                Stage::Skipped(Skip::NotInCluster),
                false,
            ),
            (Err("apiserver down".to_owned()), Stage::TaintFailed, false),
        ];
        for (answer, stage, applied) in cases {
            let mut run = decided("a", true, false);
            run.stage = Stage::Admitted;
            run.tainted(answer.clone());
            assert_eq!(
                (run.stage.clone(), run.taint_applied),
                (stage, applied),
                "{answer:?}"
            );
            assert_eq!(run.fencing().is_some(), run.stage == Stage::Tainted);
        }
    }

    #[test]
    fn nothing_is_freed_unless_the_instance_is_still_off_right_before_the_detach() {
        let off = Confirmation::Seen(decided("a", true, false).plan.unwrap().instance);
        let mut started = off.clone();
        if let Confirmation::Seen(f) = &mut started {
            f.state = InstanceState::Pending;
        }
        for (again, held) in [
            (Some(&off), false),
            (Some(&started), true),
            (Some(&Confirmation::NotFound), true),
            (None, true),
        ] {
            let mut run = with_volume(decided("a", true, false));
            run.tainted(Ok(Some(TaintOutcome::Applied)));
            run.confirm_before_detach(again, false);
            assert_eq!(run.fencing().is_some(), !held, "{again:?}");
            let report = run.into_report(Some(FenceMode::Taint), Duration::ZERO);
            if held {
                assert_eq!(report.outcome, Outcome::Failed);
                assert!(report.leaves_work(), "a retry looks again");
                assert_eq!(report.volumes[0].outcome, VolumeOutcome::WouldDetach);
            }
        }
    }

    #[test]
    fn a_failed_taint_reports_the_volumes_it_left_alone() {
        let mut run = with_volume(decided("a", true, false));
        run.stage = Stage::Admitted;
        run.tainted(Err("boom".into()));
        let report = run.into_report(Some(FenceMode::Taint), Duration::from_secs(60));
        assert_eq!(report.outcome, Outcome::Failed);
        assert_eq!(report.reason, "the taint could not be applied");
        assert_eq!(report.volumes[0].outcome, VolumeOutcome::WouldDetach);
        assert!(report.leaves_work());
    }

    #[test]
    fn a_volume_seen_free_is_detached_and_one_still_attached_fails_the_node() {
        for (described, outcome, vol_outcome) in [
            (
                vec![free("vol-0123456789abcdef0")],
                Outcome::Fenced,
                VolumeOutcome::Detached,
            ),
            (vec![], Outcome::Failed, VolumeOutcome::Stuck),
        ] {
            let mut run = with_volume(decided("a", true, false));
            run.tainted(Ok(Some(TaintOutcome::Applied)));
            run.start_detaching();
            assert_eq!(run.pending().count(), 1);
            run.observe(&described);
            run.verified();
            let report = run.into_report(Some(FenceMode::Taint), Duration::from_secs(7));
            assert_eq!(report.outcome, outcome, "{report:#?}");
            assert_eq!(report.volumes[0].outcome, vol_outcome);
            if outcome == Outcome::Failed {
                assert_eq!(
                    report.volumes[0].detail.as_deref(),
                    Some("not available after 7s")
                );
                assert!(report.errors[0].contains("vol-0123456789abcdef0"));
            } else {
                assert_eq!(
                    report.reason,
                    "tainted out-of-service; 1 volume(s) force-detached"
                );
            }
        }
    }

    /// Issue 12, item 13: io2 Multi-Attach volumes, and volumes the
    /// attach/detach controller already gave to the replacement's node, are
    /// never `available`; what matters is that the fenced instance let go.
    #[test]
    fn a_volume_is_free_once_the_fenced_instance_no_longer_holds_it() {
        let attached = |to: &str, state| VolumeAttachmentState {
            instance: id(to),
            device: Some("/dev/xvdba".into()),
            state,
        };
        let cases = [
            (VolumeState::Available, vec![], VolumeOutcome::Detached),
            (
                VolumeState::InUse,
                vec![attached("i-0000000000000000b", AttachmentState::Attached)],
                VolumeOutcome::Detached,
            ),
            (
                VolumeState::InUse,
                vec![attached("i-0123456789abcdef0", AttachmentState::Detached)],
                VolumeOutcome::Detached,
            ),
            (
                VolumeState::InUse,
                vec![attached("i-0123456789abcdef0", AttachmentState::Detaching)],
                VolumeOutcome::Stuck,
            ),
            (
                VolumeState::InUse,
                vec![
                    attached("i-0000000000000000b", AttachmentState::Attached),
                    attached("i-0123456789abcdef0", AttachmentState::Attached),
                ],
                VolumeOutcome::Stuck,
            ),
        ];
        for (state, attachments, want) in cases {
            let mut run = with_volume(decided("a", true, false));
            run.tainted(Ok(Some(TaintOutcome::Applied)));
            run.start_detaching();
            run.observe(&[VolumeFacts {
                id: vol("vol-0123456789abcdef0"),
                state,
                attachments: attachments.clone(),
            }]);
            assert_eq!(run.volumes[0].outcome, want, "{state:?} {attachments:?}");
        }
    }

    #[test]
    fn a_dry_run_reports_its_plan() {
        let mut run = with_volume(decided("a", false, true));
        run.confirm_again(None, false);
        let report = run.into_report(Some(FenceMode::Taint), Duration::ZERO);
        assert_eq!(report.outcome, Outcome::Planned);
        assert_eq!(
            report.reason,
            "dry run: already out of service; would force-detach 1 volume(s)"
        );
        assert_eq!(report.volumes[0].outcome, VolumeOutcome::WouldDetach);
    }

    #[test]
    fn the_recount_admits_up_to_the_cap_and_drops_the_taint_of_a_node_fenced_meanwhile() {
        let mut runs = vec![
            decided("a", true, false),
            decided("b", true, false),
            decided("c", true, false),
            decided("d", true, true),
        ];
        // b was fenced by another invocation; one more node is out elsewhere.
        let fresh = NodeView::full(vec![
            node("a", false),
            node("b", true),
            node("c", false),
            node("x", true),
        ]);
        let refused = recount(&mut runs, &fresh, &HashMap::new(), 3);
        assert_eq!(refused, [2]);
        assert_eq!(runs[0].stage, Stage::Decided);
        assert!(runs[0].plan.as_ref().unwrap().add_taint);
        assert!(!runs[1].plan.as_ref().unwrap().add_taint, "no second taint");
        assert!(matches!(
            runs[2].stage,
            Stage::Skipped(Skip::CapReached {
                limit: 3,
                out_of_service: 3
            })
        ));
        assert_eq!(runs[3].stage, Stage::Decided, "a dry run takes no cap room");
    }

    #[test]
    fn the_stamp_names_the_volumes_planned_for_detach() {
        let mut run = with_volume(decided("a", true, false));
        let stamp = run
            .stamp(FenceMode::Taint, "2026-01-01T00:00:00Z", "c-1", false)
            .unwrap();
        assert_eq!(
            run.fencing_at(),
            Some("2026-01-01T00:00:00Z"),
            "it names the fencing"
        );
        assert_eq!(stamp.volumes, [vol("vol-0123456789abcdef0")]);
        assert_eq!(stamp.instance, id("i-0123456789abcdef0"));
    }
}
