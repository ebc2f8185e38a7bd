//! The witness round of `serve` on-premises: every Node in reach that the
//! inventory places is looked at on its BMC as a fencing would look at it
//! ([`Redfish::witness_each`]), and judged ([`witness::judge`]); each change
//! is an Event on the Node, and the round's verdicts are `/metrics`' gauges.
//! Nothing else is written: no taint, no mark, no power-off.

use tracing::{info, warn};

use crate::core::model::facts::NodeFacts;
use crate::core::model::instance::{InstanceId, Provider};
use crate::core::outbound::events::{NodeEvent, event_name};
use crate::core::rules::identity;
use crate::core::rules::reach::Reach;
use crate::core::rules::witness::{self, Known, Look, Witnessed};
use crate::entry::app::App;
use crate::shell::cloud::redfish::Redfish;
use crate::shell::cluster::{ClusterReads, FencingWrites, Kube};

impl App {
    /// One round over every Node the inventory places and `NODE_SELECTOR`
    /// reaches; `known` is what the round before saw, against which the
    /// changes are told as Events under `correlation_id`. `None` without an
    /// inventory.
    pub async fn witness_round(
        &self,
        known: &Known,
        correlation_id: &str,
    ) -> Option<Result<Vec<Witnessed>, String>> {
        let onprem = self.onprem.as_ref()?;
        Some(self.witness_with(&onprem.bmcs, known, correlation_id).await)
    }

    async fn witness_with(
        &self,
        bmcs: &Redfish,
        known: &Known,
        correlation_id: &str,
    ) -> Result<Vec<Witnessed>, String> {
        let client = self.clients.kube().await.map_err(|e| e.to_string())?;
        let inventory = self.onprem.as_ref().map(|o| o.inventory.clone());
        let cluster = Kube::new(client, self.reporter.clone())
            .sharing_version(self.server_version.clone())
            .placing(inventory);
        let nodes = cluster.list_nodes().await.map_err(|e| e.to_string())?;
        let config = self.config();
        let active = config.policy.active_fencing.is_some();
        let round = look_at(bmcs, &nodes, &config.policy.reach, active).await;
        // DRY_RUN changes nothing, Events included: the log and the metric
        // still tell.
        let record = !config.policy.dry_run;
        for change in witness::changes(known, &round) {
            tell(&cluster, change, record, correlation_id).await;
        }
        Ok(round)
    }
}

/// Each of `nodes` that `reach` reaches and the inventory places on a
/// machine, judged on what its BMC answers now ([`Redfish::witness_each`]);
/// `active`: whether a forced power-off must be possible too. The round's
/// verdicts, and preflight's.
pub(crate) async fn look_at(
    bmcs: &Redfish,
    nodes: &[NodeFacts],
    reach: &Reach,
    active: bool,
) -> Vec<Witnessed> {
    // A UUID two Nodes report is no identity, as in a fencing.
    let mut nodes = nodes.to_vec();
    identity::doubt_shared_by_nodes(&mut nodes);
    let placed: Vec<(&NodeFacts, InstanceId)> = nodes
        .iter()
        .filter(|n| reach.exemption(&n.labels).is_none())
        .filter_map(|n| n.instance.clone().map(|id| (n, id)))
        .filter(|(_, id)| id.provider() == Provider::Redfish)
        .collect();
    let ids: Vec<InstanceId> = placed.iter().map(|(_, id)| id.clone()).collect();
    let looked = bmcs.witness_each(&ids).await;
    placed
        .iter()
        .filter_map(|(node, id)| {
            let (_, look) = looked.iter().find(|(i, _)| i == id)?;
            let look = match look {
                Ok((facts, force_off)) => Look::Answered {
                    facts,
                    force_off: active.then(|| force_off.clone()),
                },
                Err(e) => Look::Failed {
                    code: e.code.as_deref(),
                    message: &e.message,
                },
            };
            Some(Witnessed {
                node: node.name.clone(),
                machine: id.to_string(),
                verdict: witness::judge(node, &look),
            })
        })
        .collect()
}

/// The change of one Node's witness, as a log line and, when `record`,
/// an Event on the Node.
async fn tell(cluster: &Kube, change: &Witnessed, record: bool, correlation_id: &str) {
    let event = match &change.verdict {
        Err(failing) => {
            warn!(node = %change.node, machine = %change.machine, reason = failing.reason.code(), detail = %failing.detail, "the witness of this Node's machine fails");
            NodeEvent::witness_failing(&change.machine, failing)
        }
        Ok(()) => {
            info!(node = %change.node, machine = %change.machine, "the witness of this Node's machine answers again");
            NodeEvent::witness_restored(&change.machine)
        }
    };
    if !record {
        return;
    }
    let name = event_name(&change.node, event.reason, correlation_id);
    if let Err(e) = cluster.node_event(&change.node, &event, &name).await {
        warn!(node = %change.node, error = %e, "the witness's Event could not be recorded");
    }
}
