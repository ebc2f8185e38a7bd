//! The proof that a Node's kubelet has been silent since its machine
//! stopped (`FAST_NOT_READY`): the cloud confirmed the machine off and
//! recorded when it stopped, and the kubelet's Lease in `kube-node-lease`
//! was last renewed before that by at least [`SKEW_MARGIN_SECS`]. Such a
//! Node is dead by the evidence the node lifecycle controller would wait its
//! grace period to act on, so node-fencer may mark it `Ready=Unknown`
//! itself. Pure: the stop times as the clouds spell them, the judgement,
//! and the condition written.

use std::collections::HashMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::core::inbound::suspect::{AuditOrigin, NodeRef, Origin, Suspect};
use crate::core::model::facts::Confirmation;
use crate::core::model::instance::InstanceId;
use crate::core::model::values;
use crate::core::rules::decide;

/// How much earlier than the recorded stop the kubelet's last renewal
/// must be. The Lease's `renewTime` is the node's clock, the stop time the
/// cloud's: both are NTP-disciplined (Amazon Time Sync, Google's metadata
/// server), typically within milliseconds, but a kubelet's clock may drift
/// before its sync; five seconds covers that drift and the stop time's
/// one-second resolution. A kubelet that died with a renewal inside the
/// margin is never proven silent: neither its last renewal nor the stop
/// moves again, so its Node waits for the node controller, as without
/// the setting. Where the recorded stop is the moment the kubelet died (a
/// power cut), that is up to half of the stops with the kubelet's 10 s
/// renewal interval; where it is the moment the machine reached `stopped`
/// after a shutdown, the kubelet died well before it.
pub const SKEW_MARGIN_SECS: i64 = 5;

/// The `reason` node-fencer writes on the `Ready` condition it marks.
pub const MARK_REASON: &str = "NodeFencerKubeletSilent";

/// What the cluster holds of a Node's kubelet Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "lease", content = "renewed_at")]
pub enum KubeletLease {
    /// No Lease of the Node's name in `kube-node-lease` (a kubelet older
    /// than node Leases, or a cluster without them).
    Missing,
    /// A Lease without `spec.renewTime`.
    NeverRenewed,
    /// A Lease of another Node object of the same name (its owner
    /// reference names another uid: a Node deleted and registered again):
    /// its renewals say nothing of this Node's kubelet.
    OtherHolder,
    /// Last renewed at this Unix second (rounded up: never earlier than
    /// the renewal).
    RenewedAt(i64),
}

/// The judgement on one Node whose machine the cloud calls off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "proof")]
pub enum Silence {
    /// The kubelet has not renewed its Lease since the recorded stop (by
    /// the margin): the Node may be marked `Ready=Unknown`.
    Silent {
        /// The cloud's recorded stop (Unix seconds).
        stopped_at: i64,
        /// The Lease's last renewal (Unix seconds).
        renewed_at: i64,
    },
    /// The kubelet renewed its Lease after the recorded stop (within the
    /// margin counts as after): it may be alive, so nothing is marked and
    /// the contradiction is reported.
    HeardAfterStop {
        /// The cloud's recorded stop (Unix seconds).
        stopped_at: i64,
        /// The Lease's last renewal (Unix seconds).
        renewed_at: i64,
    },
    /// Nothing proves it either way: the Node controller's own judgement
    /// is waited for, as without the setting.
    Unproven {
        /// What is missing.
        why: Unproven,
    },
}

/// What keeps the proof from being made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unproven {
    /// The cloud does not confirm the machine off in this look.
    NotOff,
    /// The cloud recorded no stop time.
    NoStopTime,
    /// No Lease of the Node's kubelet.
    NoLease,
    /// The Lease was never renewed.
    NoRenewal,
    /// The Lease belongs to another Node object of the same name.
    OtherHolder,
}

impl Silence {
    /// A short, stable name for logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Silent { .. } => "silent",
            Self::HeardAfterStop { .. } => "heard_after_stop",
            Self::Unproven { why } => match why {
                Unproven::NotOff => "unproven_not_off",
                Unproven::NoStopTime => "unproven_no_stop_time",
                Unproven::NoLease => "unproven_no_lease",
                Unproven::NoRenewal => "unproven_no_renewal",
                Unproven::OtherHolder => "unproven_other_holder",
            },
        }
    }
}

/// The stops the triggers of an invocation reported, by machine, the
/// latest per machine: the time of each EventBridge `stopped` or
/// `terminated` event (when the instance got there), and of each audit
/// entry that ends a Compute Engine `stop` or `delete` (when the operation
/// was done). Other triggers report none.
pub fn reported_stops(suspects: &[Suspect]) -> HashMap<InstanceId, i64> {
    let mut stops: HashMap<InstanceId, i64> = HashMap::new();
    for s in suspects {
        let NodeRef::Instance(id) = &s.target else {
            continue;
        };
        let at = match &s.origin {
            Origin::Ec2StateChange {
                reported_state,
                reported_at: Some(at),
                ..
            } if matches!(reported_state.as_str(), "stopped" | "terminated") => *at,
            Origin::AuditLog(AuditOrigin {
                reported_at: Some(at),
                ..
            }) => *at,
            _ => continue,
        };
        let latest = stops.entry(id.clone()).or_insert(at);
        *latest = (*latest).max(at);
    }
    stops
}

/// The stop the kubelet's silence is measured against: the later of the
/// stop the cloud recorded and the one a trigger reported.
///
/// EC2 records when a stop was asked for, and a kubelet goes on renewing
/// through the guest's shutdown; its `stopped` event is timed when the
/// machine got there, after the last renewal the kubelet could make. Any
/// authentic stop of this machine is a sound reference: a kubelet that ran
/// after it (the machine started again, then stopped) renewed after it, and
/// is heard. An authentic stop is never in the future: a reported time
/// after `now` is not believed, as it would make any renewal look earlier.
pub fn stop_time(recorded: Option<i64>, reported: Option<i64>, now: i64) -> Option<i64> {
    recorded.max(reported.filter(|at| *at <= now))
}

/// Judges one Node from the cloud's answer about its machine, the stop a
/// trigger reported for it (see [`stop_time`]) and its kubelet's Lease. A
/// hibernated stop is off only with `fence_hibernated`, exactly as for the
/// taint.
pub fn judge(
    confirmation: &Confirmation,
    fence_hibernated: bool,
    lease: KubeletLease,
    (reported, now): (Option<i64>, i64),
) -> Silence {
    let unproven = |why| Silence::Unproven { why };
    let facts = match confirmation {
        Confirmation::Seen(facts)
            if decide::not_confirmed(confirmation, fence_hibernated).is_none() =>
        {
            facts
        }
        _ => return unproven(Unproven::NotOff),
    };
    let Some(stopped_at) = stop_time(facts.stopped_at, reported, now) else {
        return unproven(Unproven::NoStopTime);
    };
    let renewed_at = match lease {
        KubeletLease::Missing => return unproven(Unproven::NoLease),
        KubeletLease::NeverRenewed => return unproven(Unproven::NoRenewal),
        KubeletLease::OtherHolder => return unproven(Unproven::OtherHolder),
        KubeletLease::RenewedAt(at) => at,
    };
    if renewed_at.saturating_add(SKEW_MARGIN_SECS) <= stopped_at {
        Silence::Silent {
            stopped_at,
            renewed_at,
        }
    } else {
        Silence::HeardAfterStop {
            stopped_at,
            renewed_at,
        }
    }
}

/// The time of a stop in EC2's `StateTransitionReason`, as in
/// `User initiated (2026-11-26 12:00:00 GMT)` (moto writes `UTC`), in Unix
/// seconds; `None` for any other text (an empty reason, a reason without a
/// time, another zone).
pub fn ec2_stop_time(reason: &str) -> Option<i64> {
    let open = reason.rfind('(')?;
    let inner = reason.get(open + 1..)?.strip_suffix(')')?;
    let mut parts = inner.split(' ');
    let (date, time, zone) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !matches!(zone, "GMT" | "UTC") {
        return None;
    }
    let all_digits = |s: &str, shape: &str| {
        s.len() == shape.len()
            && s.chars().zip(shape.chars()).all(|(c, want)| {
                if want == 'd' {
                    c.is_ascii_digit()
                } else {
                    c == want
                }
            })
    };
    if !all_digits(date, "dddd-dd-dd") || !all_digits(time, "dd:dd:dd") {
        return None;
    }
    values::unix_seconds(&format!("{date}T{time}Z"))
}

/// The time of a stop in Compute Engine's `lastStopTimestamp` (RFC 3339,
/// in the VM's zone's offset), in Unix seconds.
pub fn gce_stop_time(last_stop: &str) -> Option<i64> {
    values::unix_seconds(last_stop)
}

/// The `message` node-fencer writes on the `Ready` condition it marks:
/// who wrote it and on what evidence.
pub fn mark_message(stopped_at: i64, renewed_at: i64) -> String {
    format!(
        "node-fencer: the cloud confirms the machine off, stopped at {}; the kubelet last renewed its Lease at {}, {} s before (margin {SKEW_MARGIN_SECS} s)",
        values::rfc3339(stopped_at),
        values::rfc3339(renewed_at),
        stopped_at.saturating_sub(renewed_at)
    )
}

/// The kubelet's Lease of the Node whose uid is `node_uid` as the proof
/// reads it: its `renewTime` rounded up to the second, so a renewal is
/// never taken for earlier than it was; only while the Lease is that
/// Node's. The kubelet makes its Node the Lease's owner: an owner reference
/// to another Node uid is a Lease of an earlier Node of the same name. (The
/// `holderIdentity` cannot tell: the kubelet writes the Node's name there,
/// simulators such as kwok their own.)
pub fn kubelet_lease(lease: Option<&Lease>, node_uid: Option<&str>) -> KubeletLease {
    let Some(lease) = lease else {
        return KubeletLease::Missing;
    };
    let another_node = lease
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "Node")
        .any(|o| node_uid.is_some_and(|uid| o.uid != uid));
    if another_node {
        return KubeletLease::OtherHolder;
    }
    let spec = lease.spec.as_ref();
    match spec.and_then(|s| s.renew_time.as_ref()) {
        None => KubeletLease::NeverRenewed,
        Some(t) => {
            let up = i64::from(t.0.subsec_nanosecond() > 0);
            KubeletLease::RenewedAt(t.0.as_second().saturating_add(up))
        }
    }
}

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
    use crate::core::model::facts::InstanceFacts;
    use crate::core::model::instance::{InstanceId, InstanceState};

    const STOP: i64 = 1_795_000_000;

    fn seen(state: InstanceState, stopped_at: Option<i64>) -> Confirmation {
        let mut facts =
            InstanceFacts::bare(InstanceId::parse("i-0123456789abcdef0").unwrap(), state);
        facts.stopped_at = stopped_at;
        Confirmation::Seen(facts)
    }

    /// The decision table of issue 39: one row per case it names.
    #[test]
    fn the_proof_as_a_table() {
        use InstanceState::*;
        let silent = Silence::Silent {
            stopped_at: STOP,
            renewed_at: STOP - 10,
        };
        let heard = |renewed_at| Silence::HeardAfterStop {
            stopped_at: STOP,
            renewed_at,
        };
        let unproven = |why| Silence::Unproven { why };
        let renewed = KubeletLease::RenewedAt;
        let rows: Vec<(&str, Confirmation, bool, KubeletLease, Silence)> = vec![
            (
                "silent for 10 s before the stop",
                seen(Stopped, Some(STOP)),
                false,
                renewed(STOP - 10),
                silent.clone(),
            ),
            (
                "terminated counts as off",
                seen(Terminated, Some(STOP)),
                false,
                renewed(STOP - 10),
                silent,
            ),
            (
                "renewed exactly the margin before the stop",
                seen(Stopped, Some(STOP)),
                false,
                renewed(STOP - SKEW_MARGIN_SECS),
                Silence::Silent {
                    stopped_at: STOP,
                    renewed_at: STOP - SKEW_MARGIN_SECS,
                },
            ),
            (
                "renewed one second inside the margin",
                seen(Stopped, Some(STOP)),
                false,
                renewed(STOP - SKEW_MARGIN_SECS + 1),
                heard(STOP - SKEW_MARGIN_SECS + 1),
            ),
            (
                "renewed after the stop",
                seen(Stopped, Some(STOP)),
                false,
                renewed(STOP + 30),
                heard(STOP + 30),
            ),
            (
                "no stop time",
                seen(Stopped, None),
                false,
                renewed(STOP - 600),
                unproven(Unproven::NoStopTime),
            ),
            (
                "no Lease",
                seen(Stopped, Some(STOP)),
                false,
                KubeletLease::Missing,
                unproven(Unproven::NoLease),
            ),
            (
                "a Lease never renewed",
                seen(Stopped, Some(STOP)),
                false,
                KubeletLease::NeverRenewed,
                unproven(Unproven::NoRenewal),
            ),
            (
                "hibernated, not fenced by the setting",
                seen(Hibernated, Some(STOP)),
                false,
                renewed(STOP - 600),
                unproven(Unproven::NotOff),
            ),
            (
                "hibernated, fenced by the setting",
                seen(Hibernated, Some(STOP)),
                true,
                renewed(STOP - 600),
                Silence::Silent {
                    stopped_at: STOP,
                    renewed_at: STOP - 600,
                },
            ),
            (
                "still stopping",
                seen(Stopping, Some(STOP)),
                false,
                renewed(STOP - 600),
                unproven(Unproven::NotOff),
            ),
            (
                "running (started again)",
                seen(Running, Some(STOP)),
                false,
                renewed(STOP - 600),
                unproven(Unproven::NotOff),
            ),
            (
                "a recreated VM: not the Node's machine",
                Confirmation::NotFound,
                false,
                renewed(STOP - 600),
                unproven(Unproven::NotOff),
            ),
            (
                "the lookup failed",
                Confirmation::LookupFailed {
                    error: "throttled".into(),
                },
                false,
                renewed(STOP - 600),
                unproven(Unproven::NotOff),
            ),
        ];
        for (name, confirmation, hibernated, lease, want) in rows {
            assert_eq!(
                judge(&confirmation, hibernated, lease, (None, STOP + 60)),
                want,
                "{name}"
            );
        }
    }

    /// Issue 39's next step: EC2 records when the stop was asked for, and a
    /// kubelet renews through the shutdown; the `stopped` event's time, when
    /// the machine got there, proves it silent.
    #[test]
    fn a_reported_stop_later_than_the_recorded_one_is_the_reference() {
        let stopped = seen(InstanceState::Stopped, Some(STOP));
        // Renewed 20 s after the stop request, during the shutdown; the
        // machine was stopped 40 s after the request.
        let lease = KubeletLease::RenewedAt(STOP + 20);
        let now = STOP + 45;
        assert!(matches!(
            judge(&stopped, false, lease, (None, now)),
            Silence::HeardAfterStop { .. }
        ));
        assert_eq!(
            judge(&stopped, false, lease, (Some(STOP + 40), now)),
            Silence::Silent {
                stopped_at: STOP + 40,
                renewed_at: STOP + 20
            }
        );
        // A stale event of an earlier stop: the recorded stop is later.
        assert!(matches!(
            judge(&stopped, false, lease, (Some(STOP - 3600), now)),
            Silence::HeardAfterStop {
                stopped_at: STOP,
                ..
            }
        ));
        // No recorded time: the reported one alone.
        let no_time = seen(InstanceState::Stopped, None);
        assert!(matches!(
            judge(&no_time, false, lease, (Some(STOP + 40), now)),
            Silence::Silent { stopped_at, .. } if stopped_at == STOP + 40
        ));
        // A kubelet renewing after the reported stop is heard.
        let alive = KubeletLease::RenewedAt(STOP + 44);
        assert!(matches!(
            judge(&stopped, false, alive, (Some(STOP + 40), now)),
            Silence::HeardAfterStop { .. }
        ));
        // The report never makes a machine off that the cloud does not.
        let running = seen(InstanceState::Running, Some(STOP));
        assert_eq!(
            judge(&running, false, lease, (Some(STOP + 40), now)),
            Silence::Unproven {
                why: Unproven::NotOff
            }
        );
    }

    #[test]
    fn a_reported_stop_in_the_future_is_not_believed() {
        let now = STOP + 45;
        assert_eq!(stop_time(Some(STOP), Some(now + 1), now), Some(STOP));
        assert_eq!(stop_time(None, Some(now + 600), now), None);
        assert_eq!(stop_time(None, Some(now), now), Some(now));
        assert_eq!(stop_time(None, None, now), None);
        let lease = KubeletLease::RenewedAt(STOP + 20);
        let stopped = seen(InstanceState::Stopped, Some(STOP));
        assert!(matches!(
            judge(&stopped, false, lease, (Some(i64::MAX), now)),
            Silence::HeardAfterStop {
                stopped_at: STOP,
                ..
            }
        ));
    }

    #[test]
    fn only_ec2_stopped_and_terminated_events_report_a_stop() {
        use crate::core::inbound::suspect::Intent;
        let a = InstanceId::parse("i-0123456789abcdef0").unwrap();
        let b = InstanceId::parse("i-0fedcba9876543210").unwrap();
        let event = |id: &InstanceId, state: &str, at: Option<i64>| Suspect {
            target: NodeRef::Instance(id.clone()),
            intent: Intent::Fence,
            origin: Origin::Ec2StateChange {
                event_id: None,
                reported_state: state.into(),
                reported_at: at,
            },
        };
        let suspects = vec![
            event(&a, "stopped", Some(STOP)),
            event(&a, "terminated", Some(STOP + 7)),
            event(&a, "running", Some(STOP + 99)),
            event(&b, "stopped", None),
            Suspect {
                target: NodeRef::Instance(b.clone()),
                intent: Intent::Fence,
                origin: Origin::Direct,
            },
        ];
        let stops = reported_stops(&suspects);
        assert_eq!(stops.get(&a), Some(&(STOP + 7)));
        assert_eq!(stops.get(&b), None);
    }

    /// The end of a Compute Engine stop reports its VM's stop, as EC2's
    /// `stopped` event does; an entry without a time reports none.
    #[test]
    fn the_last_audit_entry_of_a_stop_reports_a_stop() {
        use crate::core::inbound::suspect::{Delivery, Intent};
        let vm = InstanceId::parse("gce://proj-fencer/us-east1-c/vm-1").unwrap();
        let other = InstanceId::parse("gce://proj-fencer/us-east1-c/vm-2").unwrap();
        let entry = |id: &InstanceId, at: Option<i64>| Suspect {
            target: NodeRef::Instance(id.clone()),
            intent: Intent::Fence,
            origin: Origin::AuditLog(AuditOrigin {
                method: "v1.compute.instances.stop".into(),
                insert_id: None,
                reported_at: at,
                delivery: Delivery::Eventarc { id: None },
            }),
        };
        let suspects = [
            entry(&vm, Some(STOP + 3)),
            entry(&vm, Some(STOP)),
            entry(&other, None),
        ];
        let stops = reported_stops(&suspects);
        assert_eq!(stops.get(&vm), Some(&(STOP + 3)));
        assert_eq!(stops.get(&other), None);
    }

    #[test]
    fn ec2_stop_times_are_read_from_the_transition_reason() {
        let want = values::unix_seconds("2026-11-26T12:00:05Z");
        assert!(want.is_some());
        for text in [
            "User initiated (2026-11-26 12:00:05 GMT)",
            "User initiated (2026-11-26 12:00:05 UTC)",
            "Service initiated (2026-11-26 12:00:05 GMT)",
        ] {
            assert_eq!(ec2_stop_time(text), want, "{text}");
        }
    }

    #[test]
    fn odd_transition_reasons_give_no_stop_time() {
        for text in [
            "",
            "User initiated",
            "User initiated shutdown",
            "Server.InternalError",
            "User initiated (2026-11-26 12:00:05 PST)",
            "User initiated (2026-11-26 12:00:05)",
            "User initiated (2026-11-26 12:00:05 GMT",
            "User initiated (2026-11-26 12:00:05 GMT extra)",
            "User initiated (2026-13-45 25:61:61 GMT)",
            "User initiated (2026-11-26T12:00:05 GMT)",
            "User initiated (20261126 120005 GMT)",
            "User initiated (٢٠٢٦-11-26 12:00:05 GMT)",
            "(",
            ")",
            "()",
        ] {
            assert_eq!(ec2_stop_time(text), None, "{text:?}");
        }
    }

    proptest::proptest! {
        /// Any text, however odd, gives a time or none, never a panic; a
        /// time EC2 could write is read back to the second.
        #[test]
        fn any_transition_reason_is_read_without_panic(
            text in "\\PC{0,64}",
            secs in 0i64..4_000_000_000,
        ) {
            let _ = ec2_stop_time(&text);
            let _ = gce_stop_time(&text);
            let t = k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
            let written = format!("User initiated ({} GMT)", t.strftime("%Y-%m-%d %H:%M:%S"));
            proptest::prop_assert_eq!(ec2_stop_time(&written), Some(secs));
        }
    }

    #[test]
    fn gce_stop_times_keep_their_offset() {
        assert_eq!(
            gce_stop_time("2026-11-26T04:00:05.123-08:00"),
            values::unix_seconds("2026-11-26T12:00:05Z")
        );
        assert_eq!(gce_stop_time("yesterday"), None);
    }

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
    fn a_renewal_is_rounded_up_to_the_second() {
        let owned = |owner: &str, renew: Option<&str>| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "worker-2", "namespace": "kube-node-lease",
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-2", "uid": owner}]},
                "spec": {"holderIdentity": "worker-2", "renewTime": renew},
            }))
            .unwrap()
        };
        let lease = |renew| owned("uid-2", renew);
        let at = values::unix_seconds("2026-11-26T12:00:00Z").unwrap();
        let read = |l: Option<&Lease>| kubelet_lease(l, Some("uid-2"));
        assert_eq!(read(None), KubeletLease::Missing);
        assert_eq!(read(Some(&lease(None))), KubeletLease::NeverRenewed);
        assert_eq!(
            read(Some(&lease(Some("2026-11-26T12:00:00.000000Z")))),
            KubeletLease::RenewedAt(at)
        );
        assert_eq!(
            read(Some(&lease(Some("2026-11-26T12:00:00.000001Z")))),
            KubeletLease::RenewedAt(at + 1)
        );
        // Issue 45, item 5: the Lease of an earlier Node of the same name
        // proves nothing of this Node's kubelet, however old its renewal.
        let earlier = owned("uid-1", Some("2026-11-26T12:00:00Z"));
        assert_eq!(read(Some(&earlier)), KubeletLease::OtherHolder);
        // A Node whose uid was not read holds no Lease to another.
        assert_eq!(
            kubelet_lease(Some(&earlier), None),
            KubeletLease::RenewedAt(at)
        );
        let seen = Confirmation::Seen(InstanceFacts {
            stopped_at: Some(at + 60),
            ..InstanceFacts::bare(
                InstanceId::parse("i-0123456789abcdef0").unwrap(),
                InstanceState::Stopped,
            )
        });
        assert_eq!(
            judge(&seen, false, KubeletLease::OtherHolder, (None, at + 90)),
            Silence::Unproven {
                why: Unproven::OtherHolder
            }
        );
    }

    #[test]
    fn the_mark_names_node_fencer_and_the_evidence() {
        let m = mark_message(STOP, STOP - 12);
        assert!(m.starts_with("node-fencer:"), "{m}");
        assert!(m.contains("12 s before"), "{m}");
        assert!(m.contains(&values::rfc3339(STOP)), "{m}");
    }
}
