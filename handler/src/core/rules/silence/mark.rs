//! The `Ready=Unknown` node-fencer writes on a Node whose kubelet is
//! proven silent: the patch, and the message that names the evidence.

use k8s_openapi::api::core::v1::Node;

use crate::core::model::values;

use super::{Proof, SKEW_MARGIN_SECS};

/// The `message` node-fencer writes on the `Ready` condition it marks:
/// who wrote it and on what evidence.
pub fn mark_message(proof: &Proof) -> String {
    format!(
        "node-fencer: the cloud confirms the machine off, stopped at {}; the kubelet last renewed its Lease at {}, {} s before (margin {SKEW_MARGIN_SECS} s), and has missed its renewal due every {} s: the Lease unwritten for {} s {}",
        values::rfc3339(proof.stopped_at),
        values::rfc3339(proof.renewed_at),
        proof.stopped_at.saturating_sub(proof.renewed_at),
        proof.renew_every_secs,
        proof.quiet_secs,
        proof.clock.phrase(),
    )
}

/// The `reason` node-fencer writes on the `Ready` condition it marks.
pub const MARK_REASON: &str = "NodeFencerKubeletSilent";

/// What marking a Node `Ready=Unknown` does, given the Node as just read.
#[derive(Clone, Debug, PartialEq)]
pub enum MarkPatch {
    /// Send this strategic merge patch to `nodes/status`: it merges into
    /// the `Ready` condition by type (the kubelet's `lastHeartbeatTime`
    /// stays, so the node controller's own clock is not reset) and carries
    /// the resourceVersion read.
    Apply(serde_json::Value),
    /// The Node is not `Ready=True` (any more): nothing to write.
    NotReady,
    /// No resourceVersion to guard the write: none is sent.
    NoResourceVersion,
}

/// The patch that marks `node` `Ready=Unknown` at `now` (Unix seconds),
/// with `message` naming the evidence.
pub fn mark_patch(node: &Node, message: &str, now: i64) -> MarkPatch {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    if ready.is_none_or(|c| c.status != "True") {
        return MarkPatch::NotReady;
    }
    let Some(version) = node.metadata.resource_version.as_deref() else {
        return MarkPatch::NoResourceVersion;
    };
    MarkPatch::Apply(serde_json::json!({
        "metadata": {"resourceVersion": version},
        "status": {"conditions": [{
            "type": "Ready",
            "status": "Unknown",
            "reason": MARK_REASON,
            "message": message,
            "lastTransitionTime": values::rfc3339(now),
        }]},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::rules::silence::ProofClock;

    const STOP: i64 = 1_795_000_000;

    fn node(ready: Option<&str>, version: Option<&str>) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "worker-2", "resourceVersion": version},
            "status": {"conditions": ready.map(|r| vec![serde_json::json!({
                "type": "Ready", "status": r,
                "lastHeartbeatTime": "2026-11-26T11:59:50Z",
                "lastTransitionTime": "2026-11-26T10:00:00Z",
            })])},
        }))
        .unwrap()
    }

    #[test]
    fn the_mark_is_a_guarded_merge_into_the_ready_condition_only() {
        let MarkPatch::Apply(patch) = mark_patch(&node(Some("True"), Some("41")), "why", STOP)
        else {
            panic!("a Ready Node with a version is marked");
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "41");
        let conditions = patch["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        let c = &conditions[0];
        assert_eq!(c["type"], "Ready");
        assert_eq!(c["status"], "Unknown");
        assert_eq!(c["reason"], MARK_REASON);
        assert_eq!(c["message"], "why");
        assert_eq!(c["lastTransitionTime"], values::rfc3339(STOP));
        // The kubelet's last heartbeat is its own: the node controller's
        // grace period keeps running from it.
        assert!(c.get("lastHeartbeatTime").is_none());
    }

    #[test]
    fn a_node_not_ready_or_unguarded_is_not_written() {
        for ready in [None, Some("False"), Some("Unknown")] {
            assert_eq!(
                mark_patch(&node(ready, Some("41")), "why", STOP),
                MarkPatch::NotReady,
                "{ready:?}"
            );
        }
        assert_eq!(
            mark_patch(&node(Some("True"), None), "why", STOP),
            MarkPatch::NoResourceVersion
        );
    }

    #[test]
    fn the_mark_names_node_fencer_and_the_evidence() {
        let m = mark_message(&Proof {
            stopped_at: STOP,
            renewed_at: STOP - 12,
            quiet_secs: 17,
            renew_every_secs: 10,
            clock: ProofClock::Apiserver,
        });
        assert!(m.starts_with("node-fencer:"), "{m}");
        assert!(m.contains("12 s before"), "{m}");
        assert!(
            m.contains("unwritten for 17 s by the apiserver's clock"),
            "{m}"
        );
        assert!(m.contains(&values::rfc3339(STOP)), "{m}");
    }
}
