//! Nodes another writer tainted `node.kubernetes.io/out-of-service`
//! (aws-node-termination-handler after a drain, medik8s FAR, a cloud
//! controller, a person). node-fencer never claims that taint: it writes no
//! fencing mark of its own on such a Node, so its recovery never removes
//! it, and the cap counts it like any other. When the machine is confirmed
//! off, the decision fences it without a new taint: the force-detach and the
//! pods, which the taint alone does not free at once. When the machine
//! runs, node-fencer touches nothing and says so here: the taint already
//! lets Kubernetes delete the pods and detach the volumes of a machine that
//! may still write.

use crate::core::model::facts::{NodeFacts, OUT_OF_SERVICE_KEY};
use crate::core::model::instance::InstanceState;
use crate::core::rules::decide::{Skip, Verdict};

/// The values of the out-of-service taints on `node` that node-fencer did
/// not write (none when it fenced the Node itself: its mark is there).
pub fn others_taints(node: &NodeFacts) -> Vec<String> {
    if node.fenced.is_some() {
        return Vec::new();
    }
    node.taints
        .iter()
        .filter(|t| t.key == OUT_OF_SERVICE_KEY)
        .map(|t| {
            let value = t.value.as_deref().unwrap_or("");
            format!("{OUT_OF_SERVICE_KEY}={value}:{}", t.effect)
        })
        .collect()
}

/// The other writers' taints worth a warning, with the machine's state:
/// on a Node whose machine the cloud reports in a state where it may write
/// (not on its way off: a drain's taint before the stop is the neighbour's
/// normal order).
pub fn on_live_machine(
    node: &NodeFacts,
    verdict: &Verdict,
) -> Option<(Vec<String>, InstanceState)> {
    match verdict {
        Verdict::Skip {
            reason: Skip::InstanceNotOff { state },
        } if !state.is_stopping() => {
            let taints = others_taints(node);
            (!taints.is_empty()).then(|| (taints, state.clone()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::{FenceMark, FenceMode, Readiness, TaintFacts};

    fn tainted(value: &str, ours: bool) -> NodeFacts {
        let mut node = NodeFacts::bare("worker-2", Readiness::Unknown);
        node.taints.push(TaintFacts {
            key: OUT_OF_SERVICE_KEY.into(),
            value: Some(value.into()),
            effect: "NoExecute".into(),
        });
        node.taints.push(TaintFacts {
            key: "node.kubernetes.io/unreachable".into(),
            value: None,
            effect: "NoExecute".into(),
        });
        if ours {
            node.fenced = Some(FenceMark {
                mode: FenceMode::Taint,
                instance: None,
                state: None,
                volumes: vec![],
                at: "2026-11-26T12:00:00Z".into(),
                correlation_id: None,
                confirmed: false,
                no_schedule: false,
                boot_id: None,
            });
        }
        node
    }

    fn not_off(state: InstanceState) -> Verdict {
        Verdict::Skip {
            reason: Skip::InstanceNotOff { state },
        }
    }

    #[test]
    fn another_writers_taint_on_a_machine_that_may_write_is_named() {
        let other = tainted("nodeshutdown", false);
        let named = vec!["node.kubernetes.io/out-of-service=nodeshutdown:NoExecute".to_owned()];
        assert_eq!(others_taints(&other), named);
        for state in [InstanceState::Running, InstanceState::Pending] {
            assert_eq!(
                on_live_machine(&other, &not_off(state.clone())),
                Some((named.clone(), state))
            );
        }
        // On its way off (a drain, then the stop): nothing to say.
        assert!(on_live_machine(&other, &not_off(InstanceState::Stopping)).is_none());
        // Fenced, or skipped for another reason: nothing to say.
        let fenced = Verdict::Fence {
            add_taint: false,
            dry_run: false,
        };
        assert!(on_live_machine(&other, &fenced).is_none());
        let ready = Verdict::Skip {
            reason: Skip::NodeReady,
        };
        assert!(on_live_machine(&other, &ready).is_none());
        // node-fencer's own fencing of a machine started again is
        // recovery's business.
        let ours = tainted("nodeshutdown", true);
        assert!(others_taints(&ours).is_empty());
        assert!(on_live_machine(&ours, &not_off(InstanceState::Running)).is_none());
        // No out-of-service taint at all.
        let bare = NodeFacts::bare("worker-3", Readiness::Unknown);
        assert!(on_live_machine(&bare, &not_off(InstanceState::Running)).is_none());
    }
}
