//! What the recovery decisions look at: the candidates' Nodes, the cloud's
//! answers about their machines, and their attachments when a verdict
//! needs them; and the verdict on each, from [`crate::core::rules::recovery`].

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tracing::warn;

use crate::core::inbound::suspect::Origin;
use crate::core::model::facts::{AttachmentFacts, Confirmation, NodeFacts, PvFacts};
use crate::core::model::instance::{InstanceId, VolumeId};
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::recovery::{self, Hold, RecoveryCase, RecoveryPolicy, RecoveryVerdict};
use crate::core::rules::volumes;
use crate::pipeline::ctx::Ctx;
use crate::pipeline::looks::Looks;

/// One node to look at.
pub(super) struct Candidate {
    /// A trigger asked for it (else it is a routine look at a fenced node).
    pub(super) requested: bool,
    /// An operator confirms it healthy (manual recovery).
    pub(super) confirm: bool,
    /// The triggers that asked.
    pub(super) origins: Vec<Origin>,
}

/// The recovery rules in force: the settle delay, and who ends a fencing.
#[derive(Clone, Copy)]
pub(super) struct Rules {
    pub(super) settle: Duration,
    pub(super) policy: RecoveryPolicy,
}

/// What the recovery decisions look at, gathered with one call of each kind.
pub(super) struct View {
    pub(super) nodes: HashMap<String, NodeFacts>,
    pub(super) confirmations: HashMap<InstanceId, Confirmation>,
    attachments: Option<(Vec<AttachmentFacts>, Vec<PvFacts>)>,
}

impl View {
    /// The candidates' Nodes among `nodes`, what the cloud says of their
    /// machines (asked `again` after a wait, else only those not asked
    /// about yet in this invocation), and their attachments when a verdict
    /// needs them.
    pub(super) async fn gather(
        ctx: &Ctx<'_>,
        rules: Rules,
        nodes: &[NodeFacts],
        candidates: &BTreeMap<String, Candidate>,
        (looks, again): (&mut Looks, bool),
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
        // What this invocation already asked is not asked twice, but after a
        // wait every machine is asked again.
        if again {
            looks.again(ctx, &ids).await;
        } else {
            looks.first(ctx, &ids).await;
        }
        let confirmations: HashMap<InstanceId, Confirmation> = ids
            .iter()
            .filter_map(|id| Some((id.clone(), looks.get(id)?.clone())))
            .collect();
        let mut view = Self {
            nodes,
            confirmations,
            attachments: None,
        };
        // The attachments are listed only when some node gets that far.
        let now = ctx.now().as_second();
        let needed = view.nodes.values().any(|n| {
            view.verdict(rules, n, (0, now)) == RecoveryVerdict::Hold(Hold::AttachmentsUnknown)
        });
        if needed {
            let (vas, pvs) = futures::join!(
                ctx.reads.list_volume_attachments(),
                ctx.reads.list_persistent_volumes()
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

    /// The verdict for one Node as gathered, at `now` (Unix seconds);
    /// `waited` seconds count as Ready time for a Node whose condition does
    /// not say since when.
    fn verdict(
        &self,
        rules: Rules,
        node: &NodeFacts,
        (waited, now): (i64, i64),
    ) -> RecoveryVerdict {
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

    /// The verdict per candidate at `now` (Unix seconds); a candidate no
    /// Node matches any more is not node-fencer's to end.
    pub(super) fn decide(
        &self,
        rules: Rules,
        candidates: &BTreeMap<String, Candidate>,
        (waited, now): (i64, i64),
    ) -> Vec<(String, RecoveryVerdict)> {
        candidates
            .keys()
            .map(|name| {
                let verdict = match self.nodes.get(name) {
                    Some(node) => self.verdict(rules, node, (waited, now)),
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
