//! The patches node-fencer writes on a Node, each computed from the Node as
//! read: the out-of-service taint and its record, an operator's
//! confirmation, the recovery that takes them back, and the power-off mark.
//! Pure: the shell sends them.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Value, json};

use crate::core::model::facts::{
    FenceMode, NO_SCHEDULE_EFFECT, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE,
    Readiness, SeenOff,
};
use crate::core::model::instance::{InstanceId, InstanceState, VolumeId};
use crate::core::model::kube_read::{
    ANNOTATION_BOOT_ID, ANNOTATION_CORRELATION, ANNOTATION_FENCED_AT, ANNOTATION_INSTANCE,
    ANNOTATION_MACHINE_SEEN_OFF, ANNOTATION_MODE, ANNOTATION_POWER_OFF_REASON,
    ANNOTATION_POWERED_OFF_AT, ANNOTATION_POWERED_OFF_BOOT_ID, ANNOTATION_RECOVERY_CONFIRMED,
    ANNOTATION_TAINT, ANNOTATION_VOLUMES, ANNOTATIONS, LABEL_FENCED, boot_id, fence_mark,
    readiness, ready_since, seen_off_value,
};

/// The merge patch that notes on the Node that node-fencer saw its machine
/// off: one annotation, held to the Node judged by its uid when it was
/// read (the API server refuses a patch that would change it, so another
/// object of the name gets nothing).
pub fn seen_off_patch(uid: Option<&str>, note: &SeenOff) -> Value {
    let mut meta = json!({"annotations": {ANNOTATION_MACHINE_SEEN_OFF: seen_off_value(note)}});
    if let Some(uid) = uid {
        meta["uid"] = json!(uid);
    }
    json!({ "metadata": meta })
}

/// What node-fencer records on a Node whose machine it powers off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PowerStamp {
    /// RFC 3339 time of the power-off.
    pub at: String,
    /// The boot id the Node reported when it was judged.
    pub(crate) boot_id: Option<String>,
    /// Why, in words.
    pub reason: String,
}

/// The merge patch that records a power-off on the Node: annotations only,
/// so it needs no resourceVersion and drops nothing.
pub fn power_mark_patch(stamp: &PowerStamp) -> Value {
    json!({"metadata": {
        "annotations": {
            ANNOTATION_POWERED_OFF_AT: stamp.at,
            ANNOTATION_POWERED_OFF_BOOT_ID: stamp.boot_id.as_deref().unwrap_or(""),
            ANNOTATION_POWER_OFF_REASON: stamp.reason,
        },
        // Labelled like a fenced Node: a power-off in flight takes room
        // under the cap, and the invocations that read only the labelled
        // Nodes must count it too.
        "labels": {LABEL_FENCED: "true"},
    }})
}

/// The merge patch that takes back a power-off mark whose stop the cloud
/// refused: the machine runs as before, so neither the cap nor the
/// never-twice rule may count it. The `fenced` label stays while `node`
/// (as read now) carries a fencing's mark: it names the fenced Nodes the
/// sweep re-checks for recovery. Guarded by the resourceVersion read.
pub fn power_unmark_patch(node: &Node) -> Value {
    let mut meta = json!({
        "annotations": {
            ANNOTATION_POWERED_OFF_AT: null,
            ANNOTATION_POWERED_OFF_BOOT_ID: null,
            ANNOTATION_POWER_OFF_REASON: null,
        },
    });
    if fence_mark(node).is_none() {
        meta["labels"] = json!({LABEL_FENCED: null});
    }
    if let Some(rv) = node.metadata.resource_version.as_deref() {
        meta["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": meta })
}

/// The out-of-service taint that evicts (any value).
fn is_out_of_service(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_KEY && t.effect == OUT_OF_SERVICE_EFFECT
}

/// True for the `NoSchedule` out-of-service taint of the pair, as
/// node-fencer writes it (the API keeps no time for `NoSchedule` taints: the
/// fencing's annotation says it was node-fencer's).
fn is_our_no_schedule(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_KEY
        && t.effect == NO_SCHEDULE_EFFECT
        && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
}

/// True for the out-of-service taint node-fencer wrote at `fenced_at`: its
/// value, and its `timeAdded` to the second (the API keeps seconds). An
/// operator's taint (another value, or re-applied later) is not ours.
fn is_ours(t: &Taint, fenced_at: &str) -> bool {
    let at = fenced_at
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second());
    is_out_of_service(t)
        && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
        && at.is_some()
        && t.time_added.as_ref().map(|added| added.0.as_second()) == at
}

/// What node-fencer records with the taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The instance EC2 confirmed off.
    pub instance: InstanceId,
    /// Its state at decision time.
    pub state: InstanceState,
    /// RFC 3339 time of the decision.
    pub at: String,
    /// The invocation's correlation id.
    pub correlation_id: String,
    /// How the node is fenced.
    pub mode: FenceMode,
    /// The EBS volumes planned for force-detach.
    pub volumes: Vec<VolumeId>,
    /// Also apply the `NoSchedule` out-of-service taint.
    pub no_schedule: bool,
    /// The `metadata.uid` of the Node judged, when it was read: a Node of
    /// the same name read at patch time is written only if it is that one.
    pub node_uid: Option<String>,
}

/// What the taint step found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintOutcome {
    /// The taint was added by this call.
    Applied,
    /// The taint was already there.
    AlreadyPresent,
    /// The Node became Ready since the decision; nothing was written.
    NodeReady,
    /// The Node no longer exists.
    NodeGone,
    /// The Node of that name is another object than the one judged (another
    /// uid, or another machine): deleted and registered again since.
    AnotherNode,
}

/// What the recovery step found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UntaintOutcome {
    /// The fencing is ended; `taint_removed` says whether a taint went with it.
    Ended {
        /// Whether the out-of-service taint was removed.
        taint_removed: bool,
    },
    /// The Node no longer carries this fencing's mark; nothing was written.
    NotOurs,
    /// The Node is not Ready any more; nothing was written.
    NodeNotReady,
    /// The Node is Ready, but (as read at patch time) not for the settle
    /// delay yet; nothing was written.
    NotSettled {
        /// Seconds still to wait.
        remaining_secs: i64,
    },
    /// The Node no longer exists.
    NodeGone,
    /// Recovery is manual, and the Node read at patch time carries no
    /// confirmation of this fencing's end; nothing was written.
    NotConfirmed,
}

/// What to do about the taint, given the Node as it is now.
#[derive(Clone, Debug, PartialEq)]
pub enum TaintPatch {
    /// Send this merge patch.
    Apply(Value),
    /// The taint is there already.
    AlreadyPresent,
    /// The taint is there, stamped with this invocation's correlation id: an
    /// earlier attempt of this run applied it and its answer was lost.
    AppliedByThisRun,
    /// The Node turned Ready since the decision: do not fence.
    NodeReady,
    /// The Node is another object than the one judged (another uid).
    AnotherNode,
    /// The Node has no resourceVersion to guard the write with.
    NoResourceVersion,
    /// An existing taint could not be restated; writing would drop it.
    Unrepresentable,
}

/// Builds the merge patch that fences the Node: the out-of-service taint
/// (taint mode) and the annotations that record it. The patch carries the
/// resourceVersion it was built from, so the API server refuses it (409) if
/// anyone changed the Node in between, and it restates every existing taint,
/// so none is dropped. It is held to the Node judged: another uid gets
/// nothing, and the uid it names is in the patch too, so the API server
/// refuses it (the uid is immutable) if it ever met another object.
pub fn taint_patch(node: &Node, stamp: &Stamp) -> TaintPatch {
    let uid = node.metadata.uid.as_deref();
    if is_another_node(uid, stamp) {
        return TaintPatch::AnotherNode;
    }
    if readiness(node) == Readiness::Ready {
        return TaintPatch::NodeReady;
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return TaintPatch::NoResourceVersion;
    };
    let mut meta = json!({"resourceVersion": rv, "labels": {LABEL_FENCED: "true"}});
    if let Some(uid) = uid {
        meta["uid"] = json!(uid);
    }
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let present = match stamp.mode {
        FenceMode::Taint => existing.iter().any(is_out_of_service),
        FenceMode::Legacy => fence_mark(node).is_some(),
    };
    if present {
        let ours = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CORRELATION))
            .is_some_and(|id| *id == stamp.correlation_id);
        return if ours {
            TaintPatch::AppliedByThisRun
        } else {
            TaintPatch::AlreadyPresent
        };
    }
    let mut annotations = fence_annotations(node, stamp);
    if stamp.mode == FenceMode::Legacy {
        meta["annotations"] = annotations;
        return TaintPatch::Apply(json!({ "metadata": meta }));
    }
    // Restating a taint we cannot serialise would drop it: refuse instead.
    let Ok(mut taints) = existing
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<Value>, _>>()
    else {
        return TaintPatch::Unrepresentable;
    };
    taints.push(json!({
        "key": OUT_OF_SERVICE_KEY,
        "value": OUT_OF_SERVICE_VALUE,
        "effect": OUT_OF_SERVICE_EFFECT,
        "timeAdded": stamp.at,
    }));
    let mut applied = vec![format!(
        "{OUT_OF_SERVICE_KEY}={OUT_OF_SERVICE_VALUE}:{OUT_OF_SERVICE_EFFECT}"
    )];
    // One already there (an operator's) is left as it is, and not ours to remove.
    if stamp.no_schedule && !existing.iter().any(is_our_no_schedule) {
        taints.push(json!({
            "key": OUT_OF_SERVICE_KEY,
            "value": OUT_OF_SERVICE_VALUE,
            "effect": NO_SCHEDULE_EFFECT,
        }));
        applied.push(format!(
            "{OUT_OF_SERVICE_KEY}={OUT_OF_SERVICE_VALUE}:{NO_SCHEDULE_EFFECT}"
        ));
    }
    annotations[ANNOTATION_TAINT] = json!(applied.join(","));
    meta["annotations"] = annotations;
    TaintPatch::Apply(json!({
        "metadata": meta,
        "spec": { "taints": taints }
    }))
}

/// True when the Node of uid `uid` is another object than the one `stamp`
/// was judged on (when its uid was read).
fn is_another_node(uid: Option<&str>, stamp: &Stamp) -> bool {
    stamp
        .node_uid
        .as_deref()
        .is_some_and(|judged| uid != Some(judged))
}

/// The annotations that record a fencing of `node` by `stamp` (the taint
/// applied is added by the taint mode).
fn fence_annotations(node: &Node, stamp: &Stamp) -> Value {
    let volumes: Vec<&str> = stamp.volumes.iter().map(VolumeId::as_str).collect();
    let mut annotations = json!({
        ANNOTATION_FENCED_AT: stamp.at,
        ANNOTATION_INSTANCE: format!("{}={}", stamp.instance, stamp.state),
        ANNOTATION_CORRELATION: stamp.correlation_id,
        ANNOTATION_MODE: stamp.mode.name(),
        ANNOTATION_VOLUMES: volumes.join(","),
    });
    if let Some(boot) = boot_id(node) {
        annotations[ANNOTATION_BOOT_ID] = json!(boot);
    }
    annotations
}

/// What confirming a fencing's end did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// The Node carries the confirmation of its fencing now.
    Confirmed,
    /// node-fencer has not fenced this Node: nothing to confirm.
    NotFenced,
    /// The Node's fencing is another one than the confirmation names.
    AnotherFencing,
    /// The Node no longer exists.
    NodeGone,
}

/// What to write to confirm the end of a Node's fencing.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfirmPatch {
    /// Send this merge patch, guarded by the resourceVersion: the
    /// confirmation names the fencing's `fenced-at`.
    Apply(Value),
    /// The Node carries this fencing's confirmation already.
    Already,
    /// node-fencer has not fenced this Node.
    NotFenced,
    /// The Node's fencing is another one than the confirmation names.
    AnotherFencing,
    /// The Node has no resourceVersion to guard the write with.
    NoResourceVersion,
}

/// What confirming the end of the Node's fencing writes; `fenced_at`, when
/// given, names the fencing confirmed (an operator looked at that one).
pub fn confirm_patch(node: &Node, fenced_at: Option<&str>) -> ConfirmPatch {
    let Some(mark) = fence_mark(node) else {
        return ConfirmPatch::NotFenced;
    };
    if let Some(asked) = fenced_at
        && !crate::core::model::values::same_time(asked, &mark.at)
    {
        return ConfirmPatch::AnotherFencing;
    }
    if mark.confirmed {
        return ConfirmPatch::Already;
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return ConfirmPatch::NoResourceVersion;
    };
    ConfirmPatch::Apply(json!({"metadata": {
        "resourceVersion": rv,
        "annotations": {ANNOTATION_RECOVERY_CONFIRMED: mark.at}
    }}))
}

/// What to do to end a fencing, given the Node as it is now.
#[derive(Clone, Debug, PartialEq)]
pub enum UntaintPatch {
    /// Send this merge patch; `removes_taint` tells whether it drops the taint.
    Apply {
        /// The patch.
        patch: Value,
        /// Whether the out-of-service taint goes with it.
        removes_taint: bool,
    },
    /// The Node carries no mark of this fencing (cleared, re-fenced since,
    /// or a new object under the same name): nothing of ours to remove.
    NotOurs,
    /// The Node is not Ready: recovery must wait.
    NodeNotReady,
    /// The Node has not been Ready for the settle delay: recovery must wait.
    NotSettled {
        /// Seconds still to wait.
        remaining_secs: i64,
    },
    /// The Node has no resourceVersion to guard the write with.
    NoResourceVersion,
    /// A remaining taint could not be restated; writing would drop it.
    Unrepresentable,
    /// Recovery is manual and no operator confirmed this fencing's end.
    NotConfirmed,
}

/// The fencing to end and the settle rule it must meet on the Node read at
/// patch time: a Node that flapped since the list the decision came from
/// shows a newer Ready transition there.
#[derive(Clone, Copy, Debug)]
pub struct Ending<'a> {
    /// The fencing, by its `fenced-at`.
    pub fenced_at: &'a str,
    /// How long the Node must have been Ready, in seconds.
    pub settle_secs: i64,
    /// Since when the invocation has seen the Node Ready (Unix seconds):
    /// the start of the settle delay when the condition does not say.
    pub seen_ready_at: i64,
    /// Recovery is manual: the Node read at patch time must carry an
    /// operator's confirmation of this fencing's end.
    pub needs_confirmation: bool,
}

/// Builds the merge patch that ends the fencing `ending` names, at `now`
/// (Unix seconds): removes the out-of-service taint only when node-fencer's
/// annotation says node-fencer applied it, and clears node-fencer's
/// annotations. Guarded by the resourceVersion, like the taint patch; every
/// other taint is restated.
pub fn untaint_patch(node: &Node, ending: &Ending<'_>, now: i64) -> UntaintPatch {
    let fenced_at = ending.fenced_at;
    let Some(mark) = fence_mark(node).filter(|m| m.at == fenced_at) else {
        return UntaintPatch::NotOurs;
    };
    if ending.needs_confirmation && !mark.confirmed {
        return UntaintPatch::NotConfirmed;
    }
    if readiness(node) != Readiness::Ready {
        return UntaintPatch::NodeNotReady;
    }
    let since = ready_since(node).unwrap_or(ending.seen_ready_at);
    let remaining_secs = ending.settle_secs - (now - since);
    if remaining_secs > 0 {
        return UntaintPatch::NotSettled { remaining_secs };
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return UntaintPatch::NoResourceVersion;
    };
    let applied_taint = mark.mode == FenceMode::Taint
        && node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION_TAINT));
    let cleared: serde_json::Map<String, Value> = ANNOTATIONS
        .iter()
        .map(|k| ((*k).to_owned(), Value::Null))
        .collect();
    let mut patch = json!({"metadata": {
        "resourceVersion": rv, "annotations": cleared, "labels": {LABEL_FENCED: null}
    }});
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| is_ours(t, fenced_at) || (mark.no_schedule && is_our_no_schedule(t));
    let removes_taint = applied_taint && existing.iter().any(ours);
    if removes_taint {
        let Ok(kept) = existing
            .iter()
            .filter(|t| !ours(t))
            .map(serde_json::to_value)
            .collect::<Result<Vec<Value>, _>>()
        else {
            return UntaintPatch::Unrepresentable;
        };
        patch["spec"] = json!({ "taints": kept });
    }
    UntaintPatch::Apply {
        patch,
        removes_taint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::kube_read::fixtures::node;
    use crate::core::model::kube_read::node_facts;

    const NOW: i64 = 1_795_000_000;

    /// Ending the fencing `at` with no settle delay left to wait.
    fn settled(fenced_at: &str) -> Ending<'_> {
        Ending {
            fenced_at,
            settle_secs: 30,
            seen_ready_at: NOW - 30,
            needs_confirmation: false,
        }
    }

    fn stamp() -> Stamp {
        Stamp {
            instance: InstanceId::parse("i-0123456789abcdef0").unwrap(),
            state: InstanceState::Stopped,
            at: "2026-11-22T10:00:00Z".into(),
            correlation_id: "c-1".into(),
            mode: FenceMode::Taint,
            volumes: vec![VolumeId::parse("vol-0123456789abcdef0").unwrap()],
            no_schedule: false,
            node_uid: None,
        }
    }

    /// Issue 58, item 8: taking a power-off mark back leaves the `fenced`
    /// label of a Node that carries a fencing.
    #[test]
    fn taking_a_power_off_mark_back_keeps_a_fenced_nodes_label() {
        let fenced = fenced_and_back();
        let patch = power_unmark_patch(&fenced);
        assert!(patch["metadata"].get("labels").is_none(), "{patch}");
        assert!(patch["metadata"]["annotations"][ANNOTATION_POWERED_OFF_AT].is_null());
        let bare = node("Unknown", json!([]), Some("7"));
        let patch = power_unmark_patch(&bare);
        assert!(
            patch["metadata"]["labels"][LABEL_FENCED].is_null(),
            "{patch}"
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }

    /// Issue 58, item 3: the taint is held to the Node judged. A Node
    /// registered again under the name (another uid) gets nothing; the one
    /// judged gets a patch that names its uid, which the API server holds
    /// the object to (a uid cannot change), beside the resourceVersion.
    #[test]
    fn the_taint_is_held_to_the_uid_judged() {
        let mut n = node("Unknown", json!([]), Some("5"));
        n.metadata.uid = Some("uid-new".into());
        let judged = Stamp {
            node_uid: Some("uid-old".into()),
            ..stamp()
        };
        assert_eq!(taint_patch(&n, &judged), TaintPatch::AnotherNode);
        let legacy = Stamp {
            mode: FenceMode::Legacy,
            ..judged.clone()
        };
        assert_eq!(taint_patch(&n, &legacy), TaintPatch::AnotherNode);
        // Even a Ready Node of another uid is told as another Node.
        let mut ready = node("True", json!([]), Some("5"));
        ready.metadata.uid = Some("uid-new".into());
        assert_eq!(taint_patch(&ready, &judged), TaintPatch::AnotherNode);
        n.metadata.uid = Some("uid-old".into());
        for stamp in [judged, legacy] {
            let TaintPatch::Apply(patch) = taint_patch(&n, &stamp) else {
                panic!("the Node judged is fenced");
            };
            assert_eq!(patch["metadata"]["uid"], "uid-old");
            assert_eq!(patch["metadata"]["resourceVersion"], "5");
        }
        // A Node whose uid was not read is held to its resourceVersion alone.
        let TaintPatch::Apply(patch) = taint_patch(&n, &stamp()) else {
            panic!("a patch");
        };
        assert_eq!(patch["metadata"]["uid"], "uid-old");
    }

    /// A Node fenced by `stamp()`, Ready again, with another taint beside ours.
    fn fenced_and_back() -> Node {
        fenced_and_back_by(&stamp())
    }

    /// A Node fenced by `stamp`, Ready again, with another taint beside ours.
    fn fenced_and_back_by(stamp: &Stamp) -> Node {
        let mut n = node(
            "Unknown",
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
            Some("5"),
        );
        n.status.as_mut().unwrap().node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
            boot_id: "boot-1".into(),
            ..Default::default()
        });
        let TaintPatch::Apply(patch) = taint_patch(&n, stamp) else {
            panic!("expected a patch");
        };
        assert_eq!(patch["metadata"]["labels"][LABEL_FENCED], "true");
        n.metadata.annotations =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap();
        n.spec.as_mut().unwrap().taints =
            serde_json::from_value(patch["spec"]["taints"].clone()).unwrap();
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        n
    }

    #[test]
    fn the_mark_reads_back_what_the_patch_wrote() {
        let n = fenced_and_back();
        let mark = fence_mark(&n).unwrap();
        assert_eq!(mark.mode, FenceMode::Taint);
        assert_eq!(mark.at, "2026-11-22T10:00:00Z");
        assert_eq!(mark.instance.unwrap().as_str(), "i-0123456789abcdef0");
        assert_eq!(mark.volumes, stamp().volumes);
        assert!(node_facts(&n).unwrap().fenced.is_some());
        assert_eq!(fence_mark(&node("True", json!([]), Some("1"))), None);
    }

    /// Rook/Ceph's pair: both taints go on, the annotation says so and
    /// records the boot; recovery removes both, and an operator's
    /// `NoSchedule` taint that was there first is neither doubled nor ours.
    #[test]
    fn the_no_schedule_pair_is_applied_recorded_and_removed_together() {
        let pair = Stamp {
            no_schedule: true,
            ..stamp()
        };
        let n = fenced_and_back_by(&pair);
        let effects: Vec<&str> = n
            .spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .unwrap()
            .iter()
            .filter(|t| t.key == OUT_OF_SERVICE_KEY)
            .map(|t| t.effect.as_str())
            .collect();
        assert_eq!(effects, ["NoExecute", "NoSchedule"]);
        let mark = fence_mark(&n).unwrap();
        assert!(mark.no_schedule);
        assert_eq!(mark.boot_id.as_deref(), Some("boot-1"));
        let UntaintPatch::Apply { patch, .. } =
            untaint_patch(&n, &settled("2026-11-22T10:00:00Z"), NOW)
        else {
            panic!("expected a patch");
        };
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
        );
        // Without the setting, only the NoExecute taint, and no claim on the pair.
        let single = fenced_and_back();
        assert!(!fence_mark(&single).unwrap().no_schedule);

        // An operator's NoSchedule out-of-service taint, there first, stays.
        let theirs =
            json!({"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoSchedule"});
        let before = node("Unknown", json!([theirs]), Some("5"));
        let TaintPatch::Apply(patch) = taint_patch(&before, &pair) else {
            panic!("expected a patch");
        };
        let taints = patch["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 2, "{taints:?}");
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_TAINT],
            format!("{OUT_OF_SERVICE_KEY}=nodeshutdown:NoExecute")
        );
    }

    #[test]
    fn recovery_removes_only_our_taint_and_clears_our_annotations() {
        let n = fenced_and_back();
        let UntaintPatch::Apply {
            patch,
            removes_taint,
        } = untaint_patch(&n, &settled("2026-11-22T10:00:00Z"), NOW)
        else {
            panic!("expected a patch");
        };
        assert!(removes_taint);
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        let labels = &patch["metadata"]["labels"];
        assert!(
            labels.get(LABEL_FENCED).is_some_and(Value::is_null),
            "{labels}"
        );
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
        );
        for key in ANNOTATIONS {
            assert_eq!(patch["metadata"]["annotations"][key], Value::Null, "{key}");
            assert!(
                patch["metadata"]["annotations"].get(key).is_some(),
                "{key} cleared"
            );
        }
        // Issue 12, item 9: a taint an operator put back (another value, or
        // the same value added later) stays, while our annotations go.
        for theirs in [
            json!({"key": OUT_OF_SERVICE_KEY, "value": "manual", "effect": "NoExecute",
                   "timeAdded": "2026-11-22T10:00:00Z"}),
            json!({"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoExecute",
                   "timeAdded": "2026-11-22T10:05:00Z"}),
            json!({"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoExecute"}),
        ] {
            let mut put_back = n.clone();
            put_back.spec.as_mut().unwrap().taints = Some(vec![
                serde_json::from_value(
                    json!({"key": "dedicated", "value": "db", "effect": "NoSchedule"}),
                )
                .unwrap(),
                serde_json::from_value(theirs.clone()).unwrap(),
            ]);
            let UntaintPatch::Apply {
                patch,
                removes_taint,
            } = untaint_patch(&put_back, &settled("2026-11-22T10:00:00Z"), NOW)
            else {
                panic!("expected a patch");
            };
            assert!(!removes_taint, "{theirs}");
            assert!(patch.get("spec").is_none(), "{theirs}: {patch}");
            assert_eq!(
                patch["metadata"]["annotations"][ANNOTATION_FENCED_AT],
                Value::Null
            );
        }
        // Another fencing since (a newer mark), or no mark at all: not ours.
        assert_eq!(
            untaint_patch(&n, &settled("2026-11-22T09:00:00Z"), NOW),
            UntaintPatch::NotOurs
        );
        let mut theirs = n.clone();
        theirs.metadata.annotations = None;
        assert_eq!(
            untaint_patch(&theirs, &settled("2026-11-22T10:00:00Z"), NOW),
            UntaintPatch::NotOurs
        );
        // Not Ready yet.
        let mut down = n.clone();
        down.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "Unknown".into();
        assert_eq!(
            untaint_patch(&down, &settled("2026-11-22T10:00:00Z"), NOW),
            UntaintPatch::NodeNotReady
        );
    }

    #[test]
    fn manual_recovery_needs_a_confirmation_of_this_very_fencing() {
        let at = "2026-11-22T10:00:00Z";
        let mut n = fenced_and_back();
        let manual = Ending {
            needs_confirmation: true,
            ..settled(at)
        };
        assert_eq!(untaint_patch(&n, &manual, NOW), UntaintPatch::NotConfirmed);
        let ConfirmPatch::Apply(patch) = confirm_patch(&n, None) else {
            panic!("a fenced node's end can be confirmed");
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_RECOVERY_CONFIRMED],
            at
        );
        assert_eq!(
            confirm_patch(&node("True", json!([]), Some("5")), None),
            ConfirmPatch::NotFenced
        );
        let confirm = |n: &mut Node, value: &str| {
            n.metadata
                .annotations
                .get_or_insert_default()
                .insert(ANNOTATION_RECOVERY_CONFIRMED.into(), value.into());
        };
        // A confirmation of an earlier fencing does not end this one.
        confirm(&mut n, "2026-11-01T08:00:00Z");
        assert!(!fence_mark(&n).unwrap().confirmed);
        assert_eq!(untaint_patch(&n, &manual, NOW), UntaintPatch::NotConfirmed);
        confirm(&mut n, at);
        assert!(fence_mark(&n).unwrap().confirmed);
        assert_eq!(confirm_patch(&n, None), ConfirmPatch::Already);
        let UntaintPatch::Apply {
            patch,
            removes_taint,
        } = untaint_patch(&n, &manual, NOW)
        else {
            panic!("a confirmed, settled fencing ends");
        };
        assert!(removes_taint);
        // The confirmation goes with the rest of node-fencer's record.
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_RECOVERY_CONFIRMED],
            Value::Null
        );
        assert!(
            patch["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .contains_key(ANNOTATION_RECOVERY_CONFIRMED)
        );
    }

    #[test]
    fn the_settle_delay_is_checked_on_the_node_read_at_patch_time() {
        let at = "2026-11-22T10:00:00Z";
        let mut n = fenced_and_back();
        // No transition time: the delay runs from the invocation's first sighting.
        let early = Ending {
            seen_ready_at: NOW - 10,
            ..settled(at)
        };
        assert_eq!(
            untaint_patch(&n, &early, NOW),
            UntaintPatch::NotSettled { remaining_secs: 20 }
        );
        // Issue 12, item 10: the Node flapped after the list the decision
        // came from; its fresh transition time wins over the first sighting.
        let ready = &mut n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
        ready.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(NOW - 5).unwrap(),
        ));
        assert_eq!(
            untaint_patch(&n, &settled(at), NOW),
            UntaintPatch::NotSettled { remaining_secs: 25 }
        );
        assert!(matches!(
            untaint_patch(&n, &settled(at), NOW + 25),
            UntaintPatch::Apply { .. }
        ));
    }

    #[test]
    fn a_legacy_fence_writes_no_taint_and_recovery_removes_none() {
        let legacy = Stamp {
            mode: FenceMode::Legacy,
            ..stamp()
        };
        let mut n = node(
            "Unknown",
            json!([{"key": OUT_OF_SERVICE_KEY, "value": "someone", "effect": "NoExecute"}]),
            Some("3"),
        );
        let TaintPatch::Apply(patch) = taint_patch(&n, &legacy) else {
            panic!("expected a patch");
        };
        assert!(patch.get("spec").is_none(), "{patch}");
        assert_eq!(patch["metadata"]["annotations"][ANNOTATION_MODE], "legacy");
        assert_eq!(patch["metadata"]["labels"][LABEL_FENCED], "true");
        n.metadata.annotations =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap();
        assert_eq!(
            taint_patch(
                &n,
                &Stamp {
                    correlation_id: "c-2".into(),
                    ..legacy.clone()
                }
            ),
            TaintPatch::AlreadyPresent
        );
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        let UntaintPatch::Apply {
            patch,
            removes_taint,
        } = untaint_patch(&n, &settled(&legacy.at), NOW)
        else {
            panic!("expected a patch");
        };
        // Someone else's out-of-service taint stays.
        assert!(!removes_taint);
        assert!(patch.get("spec").is_none(), "{patch}");
    }

    #[test]
    fn the_patch_keeps_other_taints_and_carries_the_resource_version() {
        let others = json!([
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-22T09:59:00Z"},
            {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
        ]);
        let TaintPatch::Apply(patch) = taint_patch(&node("Unknown", others, Some("42")), &stamp())
        else {
            panic!("expected a patch");
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let taints = patch["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 3);
        assert_eq!(taints[0]["key"], "node.kubernetes.io/unreachable");
        assert_eq!(taints[1]["value"], "db");
        assert_eq!(taints[2]["key"], OUT_OF_SERVICE_KEY);
        assert_eq!(taints[2]["effect"], "NoExecute");
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_INSTANCE],
            "i-0123456789abcdef0=stopped"
        );
    }

    #[test]
    fn no_patch_when_present_ready_or_unversioned() {
        let present = json!([{"key": OUT_OF_SERVICE_KEY, "value": "x", "effect": "NoExecute"}]);
        assert_eq!(
            taint_patch(&node("False", present, Some("1")), &stamp()),
            TaintPatch::AlreadyPresent
        );
        assert_eq!(
            taint_patch(&node("True", json!([]), Some("1")), &stamp()),
            TaintPatch::NodeReady
        );
        assert_eq!(
            taint_patch(&node("False", json!([]), None), &stamp()),
            TaintPatch::NoResourceVersion
        );
        let no_schedule = json!([{"key": OUT_OF_SERVICE_KEY, "effect": "NoSchedule"}]);
        assert!(matches!(
            taint_patch(&node("False", no_schedule, Some("1")), &stamp()),
            TaintPatch::Apply(_)
        ));
    }

    #[test]
    fn a_taint_stamped_by_this_run_counts_as_applied_by_it() {
        let present = json!([{"key": OUT_OF_SERVICE_KEY, "value": "x", "effect": "NoExecute"}]);
        let mut ours = node("False", present, Some("2"));
        ours.metadata.annotations = Some(
            [(ANNOTATION_CORRELATION.to_owned(), "c-1".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(taint_patch(&ours, &stamp()), TaintPatch::AppliedByThisRun);
        let other_run = Stamp {
            correlation_id: "c-2".into(),
            ..stamp()
        };
        assert_eq!(taint_patch(&ours, &other_run), TaintPatch::AlreadyPresent);
    }
}
