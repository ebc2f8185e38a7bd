//! The sweep: the scheduled invocation also looks for Nodes to fence that
//! no event named. An EC2 event can be missed (EventBridge delivers at
//! least once, not always), dead-lettered after Lambda's retries, or handled
//! while the kill switch was on; the Node is then still NotReady and its
//! machine still off, and nothing would ever look again.

use crate::core::inbound::suspect::{Intent, NodeRef, Origin, Suspect};
use crate::core::model::facts::{NodeFacts, Readiness};
use crate::core::model::names::NodeName;

/// A suspect for every Node that is not Ready and not out of service yet:
/// the usual pipeline confirms each machine (one batched lookup for all)
/// and fences only those the cloud reports off.
pub fn suspects(nodes: &[NodeFacts]) -> Vec<Suspect> {
    nodes
        .iter()
        .filter(|n| n.readiness != Readiness::Ready && !n.is_out_of_service())
        .filter_map(|n| NodeName::parse(&n.name))
        .map(|name| Suspect {
            target: NodeRef::Name(name),
            intent: Intent::Fence,
            origin: Origin::Sweep,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::{OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, TaintFacts};

    fn node(name: &str, readiness: Readiness, tainted: bool) -> NodeFacts {
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
            readiness,
            internal_ips: vec![],
            host_names: vec![],
            taints: if tainted {
                vec![TaintFacts {
                    key: OUT_OF_SERVICE_KEY.into(),
                    value: Some("nodeshutdown".into()),
                    effect: OUT_OF_SERVICE_EFFECT.into(),
                }]
            } else {
                vec![]
            },
            ready_since: None,
            fenced: None,
        }
    }

    #[test]
    fn only_silent_nodes_not_fenced_yet_are_swept() {
        let nodes = [
            node("ready", Readiness::Ready, false),
            node("silent", Readiness::Unknown, false),
            node("down", Readiness::NotReady, false),
            node("fenced", Readiness::Unknown, true),
            node("Not_A_Name", Readiness::Unknown, false),
        ];
        let swept: Vec<String> = suspects(&nodes)
            .iter()
            .map(|s| s.target.to_string())
            .collect();
        assert_eq!(swept, ["node silent", "node down"]);
        assert!(
            suspects(&nodes)
                .iter()
                .all(|s| s.intent == Intent::Fence && s.origin == Origin::Sweep)
        );
    }
}
