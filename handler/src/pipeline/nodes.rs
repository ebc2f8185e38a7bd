//! Reading the Nodes an invocation decides over: by name when a fresh
//! census vouches for the rest of the cluster ([`crate::core::rules::view`]), the
//! whole cluster otherwise. Anything short of every Node found by name, and
//! its own (a Node whose provider id names another instance is not
//! trusted), reads the whole cluster instead; so does a failed call, whose
//! error the full list then reports if it fails too. The sweep, which reads
//! the whole cluster anyway, leaves the census for the invocations after it.

use std::collections::{BTreeSet, HashMap};

use futures::StreamExt;
use tracing::{info, warn};

use crate::core::inbound::suspect::Suspect;
use crate::core::model::facts::{Confirmation, NodeFacts};
use crate::core::model::instance::{InstanceId, Provider};
use crate::core::outbound::metrics::Dependency;
use crate::core::rules::view::{self, Census, NodeView, Read};
use crate::core::settings::policy::Policy;
use crate::pipeline::ctx::{Ctx, PARALLEL_NODES};
use crate::pipeline::error::PipelineError;

/// The Nodes for these suspects.
pub(crate) async fn view(
    ctx: &Ctx<'_>,
    policy: &Policy,
    suspects: &[Suspect],
    known: &HashMap<InstanceId, Confirmation>,
) -> Result<NodeView, PipelineError> {
    let reads = view::reads(suspects, known).filter(|r| !r.is_empty());
    match reads {
        Some(reads) => match partial(ctx, policy, reads).await {
            Some(view) => Ok(view),
            None => full(ctx).await,
        },
        None => full(ctx).await,
    }
}

/// The same Nodes read again, after a wait or under the Lease.
pub(crate) async fn refresh(
    ctx: &Ctx<'_>,
    policy: &Policy,
    view: &NodeView,
) -> Result<NodeView, PipelineError> {
    if !view.is_partial() {
        return full(ctx).await;
    }
    match partial(ctx, policy, view.read_by_name().to_vec()).await {
        Some(view) => Ok(view),
        None => full(ctx).await,
    }
}

/// Every Node.
pub(crate) async fn full(ctx: &Ctx<'_>) -> Result<NodeView, PipelineError> {
    let nodes = ctx.reads.list_nodes().await.inspect_err(|_| {
        ctx.meter.error(Dependency::Kubernetes);
    })?;
    Ok(NodeView::full(nodes))
}

/// The Nodes `reads` name, node-fencer's labelled ones and the census;
/// `None` when they do not make a view that can be trusted.
async fn partial(ctx: &Ctx<'_>, policy: &Policy, reads: Vec<Read>) -> Option<NodeView> {
    let now = ctx.now().as_second();
    let census = match ctx.control.read_census(&policy.control_namespace).await {
        Ok(Some(census)) if census.fresh(now) => census,
        Ok(_) => {
            info!("no census from a recent sweep: reading every Node");
            return None;
        }
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "could not read the census: reading every Node");
            return None;
        }
    };
    let read: Vec<Option<NodeFacts>> = futures::stream::iter(&reads)
        .map(|r| async move {
            match ctx.reads.get_node(&r.name).await {
                Ok(Some(node)) if r.finds(&node) => Some(node),
                Ok(Some(_)) => {
                    warn!(
                        node = r.name,
                        "the Node of that name is another instance's: reading every Node"
                    );
                    None
                }
                Ok(None) => {
                    info!(node = r.name, "no Node of that name: reading every Node");
                    None
                }
                Err(e) => {
                    ctx.meter.error(Dependency::Kubernetes);
                    warn!(error = %e, "reading every Node instead");
                    None
                }
            }
        })
        .buffered(PARALLEL_NODES)
        .collect()
        .await;
    let read: Vec<NodeFacts> = read.into_iter().collect::<Option<_>>()?;
    // A BMC's machine is known by its UUID, an identity only when no other
    // Node reports it, which only the list of every Node shows.
    let on_bmc = |n: &NodeFacts| {
        n.instance
            .as_ref()
            .is_some_and(|i| i.provider() == Provider::Redfish)
    };
    if read.iter().any(on_bmc) {
        info!("a Node read by name is on a BMC's machine: reading every Node");
        return None;
    }
    let labelled = ctx
        .reads
        .list_fenced_nodes()
        .await
        .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))
        .ok()?;
    let total = match policy.max_out_of_service_percent {
        Some(_) => Some(
            ctx.reads
                .count_nodes()
                .await
                .inspect_err(|_| ctx.meter.error(Dependency::Kubernetes))
                .ok()?,
        ),
        None => None,
    };
    Some(NodeView::partial(reads, read, labelled, census, total))
}

/// Counts, in the sweep's full list, the Nodes out of service without
/// node-fencer's label, and leaves the count for the invocations until the
/// next sweep. A failure only costs them the full list.
pub(crate) async fn take_census(
    ctx: &Ctx<'_>,
    policy: &Policy,
    all: &[NodeFacts],
    known: &HashMap<InstanceId, Confirmation>,
) {
    let labelled: BTreeSet<String> = match ctx.reads.list_fenced_nodes().await {
        Ok(nodes) => nodes.into_iter().map(|n| n.name).collect(),
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "could not list the labelled Nodes; no census this time");
            return;
        }
    };
    let now = ctx.now().as_second();
    let census = Census::count(all, &labelled, known, now);
    match ctx
        .control
        .write_census(&policy.control_namespace, &census, &ctx.correlation_id)
        .await
    {
        Ok(()) => info!(
            others = census.others,
            labelled = labelled.len(),
            "census left for the invocations until the next sweep"
        ),
        Err(e) => {
            ctx.meter.error(Dependency::Kubernetes);
            warn!(error = %e, "could not leave the census");
        }
    }
}
