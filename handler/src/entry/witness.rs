//! The witness round that ends every sweep, on every entry point (the
//! scheduled sweep on Lambda, `/sweep` on Cloud Run, `serve`'s own
//! schedule, `node-fencer sweep`): every Node in reach is looked at on its
//! machine's provider (EC2, Compute Engine, the inventory's BMCs) as a
//! fencing would look at it, and judged ([`witness::judge`]); the
//! Kubernetes grants a fencing needs are asked again, one
//! SelfSubjectAccessReview per verb. Each change is an Event on the Node
//! and a notice; what was told is kept in a Lease of the control
//! namespace, so that the next invocation, with no memory of this one,
//! tells only what changed; the verdicts are in the sweep's report, its
//! metrics, and `/metrics`' gauges where `serve` keeps them. Nothing else
//! is written: no taint, no mark, no power-off.

use std::collections::{BTreeSet, HashMap};

use futures::StreamExt;

use tracing::{info, warn};

use crate::core::model::facts::NodeFacts;
use crate::core::model::instance::{InstanceId, Provider};
use crate::core::outbound::events::{NodeEvent, event_name};
use crate::core::outbound::report::{WitnessChange, WitnessSummary};
use crate::core::rules::mode;
use crate::core::rules::reach::Reach;
use crate::core::rules::witness::{self, Witnessed};
use crate::core::settings::grants::{self, Grant};
use crate::entry::app::App;
use crate::shell::cloud::witness::{CloudLook, look_ec2};
use crate::shell::cluster::{ClusterReads, FencingWrites, Kube, denied};
#[cfg(feature = "redfish")]
use {
    crate::core::rules::identity, crate::core::rules::witness::Look,
    crate::shell::cloud::census::LeaseCensus, crate::shell::cloud::redfish::Redfish,
};

#[cfg(feature = "redfish")]
impl App {
    /// Where the census of the inventory's UUIDs outlives the process: the
    /// witness Lease in the control namespace.
    pub(super) fn census_store(&self, cluster: &Kube) -> std::sync::Arc<LeaseCensus> {
        std::sync::Arc::new(LeaseCensus {
            cluster: cluster.clone(),
            namespace: self.config().policy.control_namespace.clone(),
            holder: self.reporter.clone(),
        })
    }
}

/// Each of `nodes` that `reach` reaches and the inventory places on a
/// machine, judged on what its BMC answers now ([`Redfish::witness_each`]);
/// `active`: whether a forced power-off must be possible too. The round's
/// verdicts, and preflight's.
#[cfg(feature = "redfish")]
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

/// How long before the invocation's deadline the witness round stops: the
/// report must still be written and returned.
const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

impl App {
    /// The round that ends a sweep: what it found, for the sweep's report.
    /// `record`: whether the changes are told as Events and kept (not in a
    /// dry run). A round that cannot run says why in its summary; it never
    /// fails the sweep. `deadline`: the invocation's, which the round never
    /// outlasts.
    pub(super) async fn sweep_witness(
        &self,
        correlation_id: &str,
        record: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> WitnessSummary {
        let outcome = match deadline {
            None => self.round(correlation_id, record, None).await,
            Some(deadline) => match deadline
                .checked_sub(DEADLINE_MARGIN)
                .filter(|until| *until > tokio::time::Instant::now())
            {
                None => Err("not run: the sweep left too little of the invocation's time".into()),
                // The round stops telling in time to keep what it told; the
                // timeout is for a look or a read that outlasts the rest.
                Some(until) => {
                    tokio::time::timeout_at(until, self.round(correlation_id, record, Some(until)))
                        .await
                        .unwrap_or_else(|_| Err("cut short by the invocation's deadline".into()))
                }
            },
        };
        outcome.unwrap_or_else(|error| {
            warn!(error = %error, "the witness round failed; the next sweep retries");
            WitnessSummary {
                error: Some(error),
                ..WitnessSummary::default()
            }
        })
    }

    async fn round(
        &self,
        correlation_id: &str,
        record: bool,
        until: Option<tokio::time::Instant>,
    ) -> Result<WitnessSummary, String> {
        let client = self.clients.kube().await.map_err(|e| e.to_string())?;
        let cluster = Kube::new(client.clone(), self.reporter.clone())
            .sharing_version(self.server_version.clone())
            .placing(self.onprem.as_ref().map(|o| o.inventory.clone()));
        let nodes = cluster.list_nodes().await.map_err(|e| e.to_string())?;
        let config = self.config();
        let active = config.policy.active_fencing.is_some();
        let mut round = self
            .look_at_machines(&cluster, &nodes, &config.policy.reach, active)
            .await;
        let denied = self.denied_grants(&client, &cluster).await;
        witness::denied_by_kubernetes(&mut round, &denied);
        let failing = round.iter().filter(|w| w.verdict.is_err()).count();
        info!(machines = round.len(), failing, denied = ?denied, "witness round done");
        if let Some(registry) = self.prometheus()
            && let Ok(mut registry) = registry.lock()
        {
            registry.record_witnesses(&round, unix_now());
        }
        // DRY_RUN changes nothing, Events and the census' record included:
        // the log and the metrics still tell.
        #[cfg(feature = "redfish")]
        if let (Some(onprem), true) = (&self.onprem, record) {
            let store = self.census_store(&cluster);
            onprem.bmcs.keep_census(store.as_ref()).await;
        }
        let mut summary = if round.is_empty() || !record {
            WitnessSummary::of(&round, Vec::new())
        } else {
            self.tell_changes(&cluster, &round, correlation_id, until)
                .await
        };
        summary.kubernetes_denied = denied;
        Ok(summary)
    }

    /// The needed Kubernetes grants this identity is denied, as a person
    /// reads them; none when they cannot be asked (the log says why): a
    /// round that could not ask is no proof of a loss.
    async fn denied_grants(&self, client: &kube::Client, cluster: &Kube) -> Vec<String> {
        let config = self.config();
        let mode = cluster
            .server_version()
            .await
            .ok()
            .map(|version| mode::choose(config.policy.mode, version));
        let fast = config.policy.fast_not_ready;
        let required: Vec<Grant> = grants::all(&config.policy.control_namespace)
            .into_iter()
            .filter(|g| g.required(mode, fast))
            .collect();
        match denied(client, &required).await {
            Ok(denied) => denied.into_iter().map(Grant::what).collect(),
            Err(e) => {
                warn!(error = %e, "the witness round could not ask Kubernetes for node-fencer's grants");
                Vec::new()
            }
        }
    }

    /// Tells the changes of `round` against the record the cluster keeps,
    /// then keeps what was told; the summary, with what went wrong.
    async fn tell_changes(
        &self,
        cluster: &Kube,
        round: &[Witnessed],
        correlation_id: &str,
        until: Option<tokio::time::Instant>,
    ) -> WitnessSummary {
        let namespace = &self.config().policy.control_namespace;
        let kept = cluster.read_witness_record(namespace).await;
        let known = match &kept {
            Ok(text) => text
                .as_deref()
                .and_then(witness::known_from_record)
                .unwrap_or_default(),
            Err(e) => {
                // Without what was told before, every failure would be told
                // again at each sweep: this round tells nothing.
                let mut summary = WitnessSummary::of(round, Vec::new());
                summary.error = Some(format!("the witness record could not be read: {e}"));
                return summary;
            }
        };
        let (changes, held) = witness::fitting(&known, round, witness::changes(&known, round));
        let stop = until.and_then(|until| until.checked_sub(RECORD_MARGIN));
        let told = tell_all(&changes, stop, |change| {
            tell(cluster, change, correlation_id)
        })
        .await;
        let untold = held + changes.len() - told.len();
        if untold > 0 {
            warn!(
                untold,
                held,
                "witness changes left for the next round: the record is full, or the invocation's time spent"
            );
        }
        let names: BTreeSet<&str> = told.iter().copied().map(|w| w.node.as_str()).collect();
        let mut summary =
            WitnessSummary::of(round, told.into_iter().map(WitnessChange::of).collect());
        summary.untold = untold;
        // Written only when it changes: a fleet whose witnesses all serve
        // never creates it.
        let now = witness::record_text(&witness::known_told(&known, round, &names));
        let before = kept.ok().flatten().unwrap_or_else(|| "{}".into());
        if before != now
            && let Err(e) = cluster
                .write_witness_record(namespace, &now, &self.reporter)
                .await
        {
            summary.error = Some(format!("the witness record could not be written: {e}"));
        }
        summary
    }

    /// Each of `nodes` that `reach` reaches, judged on what its machine's
    /// provider answers: EC2, Compute Engine, and the inventory's BMCs.
    async fn look_at_machines(
        &self,
        cluster: &Kube,
        nodes: &[NodeFacts],
        reach: &Reach,
        active: bool,
    ) -> Vec<Witnessed> {
        let round = self.look_at_clouds(nodes, reach, active).await;
        #[cfg(feature = "redfish")]
        if let Some(onprem) = &self.onprem {
            // Read at the first round: a restart forgets no UUID.
            onprem.bmcs.census_kept_in(self.census_store(cluster));
            let bmcs = look_at(&onprem.bmcs, nodes, reach, active).await;
            return [round, bmcs].concat();
        }
        #[cfg(not(feature = "redfish"))]
        let _ = cluster;
        round
    }

    /// Each of `nodes` that `reach` reaches and whose machine is an EC2
    /// instance or a Compute Engine VM, judged on what its cloud answers.
    async fn look_at_clouds(
        &self,
        nodes: &[NodeFacts],
        reach: &Reach,
        active: bool,
    ) -> Vec<Witnessed> {
        let placed: Vec<(&NodeFacts, InstanceId)> = nodes
            .iter()
            .filter(|n| reach.exemption(&n.labels).is_none())
            .filter_map(|n| n.instance.clone().map(|id| (n, id)))
            .filter(|(_, id)| id.provider() != Provider::Redfish)
            .collect();
        let of = |provider: Provider| -> Vec<InstanceId> {
            placed
                .iter()
                .filter(|(_, id)| id.provider() == provider)
                .map(|(_, id)| id.clone())
                .collect()
        };
        let mut looks: HashMap<InstanceId, CloudLook> = HashMap::new();
        let instances = of(Provider::Aws);
        if !instances.is_empty() {
            looks.extend(look_ec2(&self.clients.ec2, &instances, active).await);
        }
        #[cfg(feature = "google-cloud")]
        {
            let vms = of(Provider::Gce);
            if !vms.is_empty() {
                match self.clients.gce().await {
                    Some(compute) => looks.extend(
                        crate::shell::cloud::witness::look_gce(compute, &vms, active).await,
                    ),
                    None => looks.extend(vms.into_iter().map(|id| {
                        let e = crate::shell::cloud::CloudError::new(
                            Provider::Gce,
                            crate::shell::cloud::CloudCall::DescribeMachines,
                            "no Compute Engine client could be built (see the log)",
                        );
                        (id, CloudLook::Failed(e))
                    })),
                }
            }
        }
        placed
            .iter()
            .filter_map(|(node, id)| {
                let look = looks.get(id)?;
                Some(Witnessed {
                    node: node.name.clone(),
                    machine: id.to_string(),
                    verdict: witness::judge(node, &look.as_look()),
                })
            })
            .collect()
    }
}

/// The Unix time, in seconds.
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// How many Events a round writes at once: a fleet-wide change (a role
/// that lost a permission) is one per Node.
const TELL_AT_ONCE: usize = 8;

/// How long before the round's end its telling stops, to keep what it
/// told: the record's read and write.
const RECORD_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Each of `changes` told by `tell`, [`TELL_AT_ONCE`] at a time, until
/// `stop`; those told. One untold stays news for the next round. One in
/// flight at `stop` counts as untold: its Event may be written and told
/// again by the next round, at least once and never lost.
async fn tell_all<'a, F, Fut>(
    changes: &[&'a Witnessed],
    stop: Option<tokio::time::Instant>,
    tell: F,
) -> Vec<&'a Witnessed>
where
    F: Fn(&'a Witnessed) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tells = futures::stream::iter(changes.iter().copied())
        .map(|change| {
            let told = tell(change);
            async move {
                told.await;
                change
            }
        })
        .buffer_unordered(TELL_AT_ONCE);
    let mut told = Vec::with_capacity(changes.len());
    loop {
        let next = match stop {
            None => tells.next().await,
            Some(stop) => match tokio::time::timeout_at(stop, tells.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        match next {
            Some(change) => told.push(change),
            None => break,
        }
    }
    told
}

/// The change of one Node's witness, as a log line and an Event on the
/// Node.
async fn tell(cluster: &Kube, change: &Witnessed, correlation_id: &str) {
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
    let name = event_name(&change.node, event.reason, correlation_id);
    if let Err(e) = cluster.node_event(&change.node, &event, &name).await {
        warn!(node = %change.node, error = %e, "the witness's Event could not be recorded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(n: usize) -> Vec<Witnessed> {
        (0..n)
            .map(|i| Witnessed {
                node: format!("n{i:02}"),
                machine: format!("i-{i:017x}"),
                verdict: Ok(()),
            })
            .collect()
    }

    #[tokio::test]
    async fn telling_stops_in_time_and_names_only_what_it_told() {
        let round = round(40);
        let changes: Vec<&Witnessed> = round.iter().collect();
        // The first 16 are told at once; the others never end (an
        // apiserver that stopped answering): the stop ends the telling,
        // and the 16 are what the record keeps.
        let stop = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
        let told = tell_all(&changes, Some(stop), |change| async move {
            if change.node.as_str() >= "n16" {
                std::future::pending::<()>().await;
            }
        })
        .await;
        let mut names: Vec<&str> = told.iter().map(|w| w.node.as_str()).collect();
        names.sort_unstable();
        let first: Vec<String> = (0..16).map(|i| format!("n{i:02}")).collect();
        assert_eq!(names, first);

        let all = tell_all(&changes, None, |_| async {}).await;
        assert_eq!(all.len(), 40);
    }
}
