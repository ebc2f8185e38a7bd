//! The Nodes one invocation looks at: the whole cluster, or, between sweeps,
//! only the Nodes it needs. On a cluster of thousands of Nodes a full list is
//! tens of megabytes read for every event; what a fencing needs is the Node
//! the event names (one read by name), the Nodes node-fencer fenced (one
//! label-selected list: they take room under the cap) and how many Nodes
//! others put out of service, which the last sweep counted (the census).
//! Pure.
//!
//! The census can only be as fresh as the last sweep: a Node that another
//! tool tainted since is not counted until the next one. A partial view is
//! therefore used only to admit: whenever it would refuse by the cap, the
//! pipeline looks again at the whole cluster, as it always did.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::core::inbound::suspect::{NodeRef, Suspect};
use crate::core::model::facts::{Confirmation, NodeFacts};
use crate::core::model::instance::InstanceId;
use crate::core::rules::cap;

/// How old a census may be and still vouch for the rest of the cluster:
/// two sweeps at the default interval of 10 minutes.
const CENSUS_MAX_AGE_SECS: i64 = 20 * 60;

/// What a sweep counted, for the invocations until the next one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Nodes that take room under the cap without node-fencer's label
    /// (tainted by another tool or by hand, or fenced by an older
    /// node-fencer that did not label).
    pub others: usize,
    /// When it was counted (Unix seconds).
    pub counted_at: i64,
    /// The machines more than one Node named, with those Nodes: an event
    /// that reads its Node by name cannot see the others.
    pub shared: Vec<(InstanceId, Vec<String>)>,
}

/// The most shared machines a census keeps (it rides in an annotation).
const MAX_SHARED: usize = 100;

impl Census {
    /// Counts, in a full list of the Nodes, those that take room under the
    /// cap and do not carry node-fencer's label (`labelled` names those that
    /// do). `known` is what the invocation learnt of the machines; a Node it
    /// knows nothing of counts.
    pub fn count(
        all: &[NodeFacts],
        labelled: &BTreeSet<String>,
        known: &HashMap<InstanceId, Confirmation>,
        now: i64,
    ) -> Self {
        let mut by_machine: BTreeMap<&InstanceId, Vec<String>> = BTreeMap::new();
        for node in all {
            if let Some(id) = &node.instance {
                by_machine.entry(id).or_default().push(node.name.clone());
            }
        }
        Self {
            others: all
                .iter()
                .filter(|n| !labelled.contains(&n.name) && cap::counts(n, known))
                .count(),
            counted_at: now,
            shared: by_machine
                .into_iter()
                .filter(|(_, nodes)| nodes.len() > 1)
                .map(|(id, nodes)| (id.clone(), nodes))
                .take(MAX_SHARED)
                .collect(),
        }
    }

    /// The shared machines as one line: `ID=NODE,NODE;ID=NODE,NODE`.
    pub fn shared_text(&self) -> String {
        self.shared
            .iter()
            .map(|(id, nodes)| format!("{id}={}", nodes.join(",")))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// The shared machines from [`Self::shared_text`]'s line; parts that do
    /// not read are dropped.
    pub fn parse_shared(text: &str) -> Vec<(InstanceId, Vec<String>)> {
        text.split(';')
            .filter_map(|part| {
                let (id, nodes) = part.split_once('=')?;
                let nodes: Vec<String> = nodes
                    .split(',')
                    .filter(|n| crate::core::model::names::is_dns_subdomain(n))
                    .map(str::to_owned)
                    .collect();
                Some((InstanceId::parse(id)?, nodes))
            })
            .filter(|(_, nodes)| nodes.len() > 1)
            .collect()
    }

    /// True when it may still stand for the rest of the cluster at `now`;
    /// one from the future (a skewed clock) does not.
    pub fn fresh(&self, now: i64) -> bool {
        (0..=CENSUS_MAX_AGE_SECS).contains(&(now - self.counted_at))
    }
}

/// A Node to read by name, and the instance it must be the Node of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    /// The name to read.
    pub name: String,
    /// For a Node found by its instance's private DNS name: that instance,
    /// which the Node's provider id must name (other VPCs, and later
    /// instances at the same address, reuse the name). `None` for a Node
    /// the trigger named itself.
    pub instance: Option<InstanceId>,
}

impl Read {
    /// True when `node` is the Node this read looks for.
    pub fn finds(&self, node: &NodeFacts) -> bool {
        node.name == self.name
            && self
                .instance
                .as_ref()
                .is_none_or(|id| node.instance.as_ref() == Some(id))
    }
}

/// The most Nodes read by name in one invocation: each is read again under
/// the Lease, so beyond a few a list of every Node is fewer requests (an
/// Alertmanager batch in a zone outage names many).
const MAX_READS_BY_NAME: usize = 8;

/// The Nodes to read by name for these suspects, once each; `None` when some
/// suspect cannot be found that way (an address, or an instance EC2 did not
/// describe or gave no private DNS name) or there are more than
/// [`MAX_READS_BY_NAME`], so the whole cluster is read.
pub fn reads(suspects: &[Suspect], known: &HashMap<InstanceId, Confirmation>) -> Option<Vec<Read>> {
    let mut reads: Vec<Read> = Vec::new();
    for suspect in suspects {
        let read = match &suspect.target {
            NodeRef::Name(name) => Read {
                name: name.as_str().to_owned(),
                instance: None,
            },
            NodeRef::Instance(id) => {
                let Some(Confirmation::Seen(facts)) = known.get(id) else {
                    return None;
                };
                let name = facts
                    .private_dns_name
                    .as_deref()
                    .filter(|n| !n.is_empty())?;
                Read {
                    name: name.to_owned(),
                    instance: Some(id.clone()),
                }
            }
            NodeRef::Address(_) => return None,
        };
        if !reads.contains(&read) {
            reads.push(read);
        }
    }
    (reads.len() <= MAX_READS_BY_NAME).then_some(reads)
}

/// The part of the cluster a partial view stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Partial {
    /// The Nodes that carry node-fencer's label.
    labelled: BTreeSet<String>,
    /// The census' count of the others.
    others: usize,
    /// How many Nodes the cluster has, when it was asked.
    total: Option<usize>,
    /// What was read by name, to read again.
    read: Vec<Read>,
    /// The census' shared machines.
    shared: Vec<(InstanceId, Vec<String>)>,
}

/// The Nodes an invocation decides over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// The Nodes at hand: all of them, or those read by name and those
    /// node-fencer labelled.
    pub nodes: Vec<NodeFacts>,
    partial: Option<Partial>,
}

impl NodeView {
    /// Every Node of the cluster.
    pub fn full(mut nodes: Vec<NodeFacts>) -> Self {
        crate::core::rules::identity::doubt_shared_by_nodes(&mut nodes);
        Self {
            nodes,
            partial: None,
        }
    }

    /// The Nodes read by name, those with node-fencer's label, the census of
    /// the others and, when asked, the cluster's size. A Node in both lists
    /// is kept once, as read by name.
    pub fn partial(
        reads: Vec<Read>,
        read: Vec<NodeFacts>,
        labelled: Vec<NodeFacts>,
        census: Census,
        total: Option<usize>,
    ) -> Self {
        let names: BTreeSet<String> = labelled.iter().map(|n| n.name.clone()).collect();
        let mut nodes = read;
        let extra: Vec<NodeFacts> = labelled
            .into_iter()
            .filter(|l| !nodes.iter().any(|n| n.name == l.name))
            .collect();
        nodes.extend(extra);
        Self {
            nodes,
            partial: Some(Partial {
                labelled: names,
                others: census.others,
                total,
                read: reads,
                shared: census.shared,
            }),
        }
    }

    /// True when the view is not the whole cluster.
    pub fn is_partial(&self) -> bool {
        self.partial.is_some()
    }

    /// What a partial view read by name.
    pub fn read_by_name(&self) -> &[Read] {
        self.partial.as_ref().map_or(&[], |p| p.read.as_slice())
    }

    /// How many Nodes the cluster has, for a cap given as a share: the
    /// count asked for a partial view (the Nodes at hand if it was not).
    pub fn cluster_size(&self) -> usize {
        match &self.partial {
            Some(Partial {
                total: Some(total), ..
            }) => *total,
            _ => self.nodes.len(),
        }
    }

    /// The other Nodes that name `node`'s machine: those at hand, and, in a
    /// partial view, those the last sweep counted.
    pub fn others_naming(&self, node: &NodeFacts) -> Vec<String> {
        let mut others: Vec<String> = crate::core::rules::power::others_naming(node, &self.nodes)
            .into_iter()
            .map(str::to_owned)
            .collect();
        if let (Some(p), Some(own)) = (&self.partial, &node.instance) {
            let counted = p.shared.iter().filter(|(id, _)| id == own);
            for name in counted.flat_map(|(_, nodes)| nodes) {
                if *name != node.name && !others.contains(name) {
                    others.push(name.clone());
                }
            }
        }
        others
    }

    /// How many Nodes take room under the cap: counted in a full view; in a
    /// partial one, the labelled Nodes at hand plus the census' others.
    pub fn taken(&self, known: &HashMap<InstanceId, Confirmation>) -> usize {
        match &self.partial {
            None => cap::taken(&self.nodes, known),
            Some(p) => {
                let labelled = self
                    .nodes
                    .iter()
                    .filter(|n| p.labelled.contains(&n.name) && cap::counts(n, known))
                    .count();
                labelled + p.others
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::inbound::suspect::{Intent, Origin};
    use crate::core::model::facts::InstanceFacts;
    use crate::core::model::facts::{FenceMark, FenceMode, Readiness, TaintFacts};
    use crate::core::model::instance::InstanceState;
    use crate::core::model::names::NodeName;

    fn node(name: &str, out: bool, terminated: bool) -> NodeFacts {
        NodeFacts {
            attached: None,
            machine: Default::default(),
            power: Default::default(),
            taints: if out {
                vec![TaintFacts::out_of_service()]
            } else {
                vec![]
            },
            fenced: terminated.then(|| FenceMark {
                no_schedule: false,
                boot_id: None,
                confirmed: false,
                mode: FenceMode::Taint,
                instance: None,
                state: Some(InstanceState::Terminated),
                volumes: vec![],
                at: "2026-11-24T10:00:00Z".into(),
                correlation_id: None,
            }),
            ..NodeFacts::bare(name, Readiness::Unknown)
        }
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    const NOW: i64 = 1_800_000_000;

    fn by_name(name: &str) -> Read {
        Read {
            name: name.into(),
            instance: None,
        }
    }

    fn id(n: u8) -> InstanceId {
        InstanceId::parse(&format!("i-0123456789abcde{n:02x}")).unwrap()
    }

    fn suspect(target: NodeRef) -> Suspect {
        Suspect {
            target,
            intent: Intent::Fence,
            origin: Origin::Direct,
        }
    }

    fn seen(n: u8, dns: Option<&str>) -> (InstanceId, Confirmation) {
        let facts = InstanceFacts {
            private_dns_name: dns.map(str::to_owned),
            ..InstanceFacts::bare(id(n), InstanceState::Stopped)
        };
        (id(n), Confirmation::Seen(facts))
    }

    #[test]
    fn an_instance_is_read_by_its_private_dns_name_and_must_be_the_nodes_own() {
        let known: HashMap<_, _> = [seen(1, Some("ip-10-0-1-17.ec2.internal"))].into();
        let reads = reads(
            &[
                suspect(NodeRef::Instance(id(1))),
                suspect(NodeRef::Instance(id(1))),
                suspect(NodeRef::Name(NodeName::parse("worker-3").unwrap())),
            ],
            &known,
        )
        .unwrap();
        assert_eq!(
            reads,
            [
                Read {
                    name: "ip-10-0-1-17.ec2.internal".into(),
                    instance: Some(id(1)),
                },
                by_name("worker-3"),
            ]
        );
        let mut twin = node("ip-10-0-1-17.ec2.internal", false, false);
        assert!(!reads[0].finds(&twin), "a Node without the provider id");
        twin.instance = Some(id(2));
        assert!(!reads[0].finds(&twin), "another instance's Node");
        twin.instance = Some(id(1));
        assert!(reads[0].finds(&twin));
        assert!(reads[1].finds(&node("worker-3", false, false)));
    }

    #[test]
    fn a_large_batch_reads_the_whole_cluster() {
        let names = |n: usize| -> Vec<Suspect> {
            (0..n)
                .map(|k| {
                    let name = NodeName::parse(&format!("worker-{k}")).unwrap();
                    suspect(NodeRef::Name(name))
                })
                .collect()
        };
        let known = HashMap::new();
        assert_eq!(
            reads(&names(MAX_READS_BY_NAME), &known).map(|r| r.len()),
            Some(MAX_READS_BY_NAME)
        );
        assert_eq!(reads(&names(MAX_READS_BY_NAME + 1), &known), None);
    }

    #[test]
    fn what_cannot_be_read_by_name_reads_the_whole_cluster() {
        let known: HashMap<_, _> = [seen(1, None), seen(2, Some(""))].into();
        for target in [
            NodeRef::Instance(id(1)),
            NodeRef::Instance(id(2)),
            NodeRef::Instance(id(3)),
            NodeRef::Address("10.0.1.17".parse().unwrap()),
        ] {
            assert_eq!(reads(&[suspect(target.clone())], &known), None, "{target}");
        }
    }

    #[test]
    fn the_census_counts_the_out_of_service_nodes_without_the_label_that_take_room() {
        let all = [
            node("ours", true, false),
            node("by-hand", true, false),
            node("by-hand-dead", true, true),
            node("healthy", false, false),
        ];
        let census = Census::count(&all, &names(&["ours"]), &HashMap::new(), NOW);
        assert_eq!(census.others, 1);
        assert_eq!(census.counted_at, NOW);
    }

    #[test]
    fn a_census_vouches_for_twenty_minutes_and_never_from_the_future() {
        let census = Census {
            others: 0,
            counted_at: NOW,
            shared: vec![],
        };
        assert!(census.fresh(NOW));
        assert!(census.fresh(NOW + CENSUS_MAX_AGE_SECS));
        assert!(!census.fresh(NOW + CENSUS_MAX_AGE_SECS + 1));
        assert!(!census.fresh(NOW - 1));
    }

    #[test]
    fn a_partial_view_counts_the_labelled_nodes_and_the_census() {
        let read = vec![node("suspect", false, false), node("ours-1", true, false)];
        let labelled = vec![
            node("ours-1", true, false),
            node("ours-2", true, false),
            node("ours-dead", true, true),
        ];
        let census = Census {
            others: 2,
            counted_at: NOW,
            shared: vec![],
        };
        let reads = vec![by_name("suspect"), by_name("ours-1")];
        let view = NodeView::partial(reads.clone(), read, labelled, census, Some(5000));
        let names: Vec<&str> = view.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["suspect", "ours-1", "ours-2", "ours-dead"]);
        assert!(view.is_partial());
        assert_eq!(view.read_by_name(), reads);
        // ours-1 and ours-2, plus the two others; the dead one takes no room.
        assert_eq!(view.taken(&HashMap::new()), 4);
        assert_eq!(view.cluster_size(), 5000);
    }

    #[test]
    fn an_unlabelled_node_read_by_name_is_left_to_the_census() {
        // Tainted by hand: the census counted it already.
        let view = NodeView::partial(
            vec![by_name("by-hand")],
            vec![node("by-hand", true, false)],
            vec![],
            Census {
                others: 1,
                counted_at: NOW,
                shared: vec![],
            },
            None,
        );
        assert_eq!(view.taken(&HashMap::new()), 1);
        assert_eq!(view.cluster_size(), 1);
    }

    #[test]
    fn a_full_view_counts_every_node() {
        let view = NodeView::full(vec![node("a", true, false), node("b", true, false)]);
        assert!(!view.is_partial());
        assert_eq!(view.taken(&HashMap::new()), 2);
        assert_eq!(view.cluster_size(), 2);
        assert!(view.read_by_name().is_empty());
    }
}
