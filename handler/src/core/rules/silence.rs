//! The proof that a Node's kubelet has been silent since its machine
//! stopped (`FAST_NOT_READY`): the cloud confirmed the machine off and
//! recorded when it stopped, and the kubelet's Lease in `kube-node-lease`
//! was last renewed before that by at least [`SKEW_MARGIN_SECS`]. Such a
//! Node is dead by the evidence the node lifecycle controller would wait its
//! grace period to act on, so node-fencer may mark it `Ready=Unknown`
//! itself. Pure: the stop times as the clouds spell them, the judgement,
//! and the condition written.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::core::model::facts::Confirmation;
use crate::core::model::values;
use crate::core::rules::decide;

/// How much earlier than the recorded stop the kubelet's last renewal
/// must be. The Lease's `renewTime` is the node's clock, the stop time the
/// cloud's: both are NTP-disciplined (Amazon Time Sync, Google's metadata
/// server), typically within milliseconds, but a kubelet's clock may drift
/// before its sync; five seconds covers that drift and the stop time's
/// one-second resolution, and is half the kubelet's 10 s renewal interval,
/// so a kubelet that renewed right before the stop still proves silent on
/// its next missed renewal.
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
            },
        }
    }
}

/// Judges one Node from the cloud's answer about its machine and its
/// kubelet's Lease. A hibernated stop is off only with `fence_hibernated`,
/// exactly as for the taint.
pub fn judge(confirmation: &Confirmation, fence_hibernated: bool, lease: KubeletLease) -> Silence {
    let unproven = |why| Silence::Unproven { why };
    let facts = match confirmation {
        Confirmation::Seen(facts)
            if decide::not_confirmed(confirmation, fence_hibernated).is_none() =>
        {
            facts
        }
        _ => return unproven(Unproven::NotOff),
    };
    let Some(stopped_at) = facts.stopped_at else {
        return unproven(Unproven::NoStopTime);
    };
    let renewed_at = match lease {
        KubeletLease::Missing => return unproven(Unproven::NoLease),
        KubeletLease::NeverRenewed => return unproven(Unproven::NoRenewal),
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
        rfc3339(stopped_at),
        rfc3339(renewed_at),
        stopped_at.saturating_sub(renewed_at)
    )
}

/// The kubelet's Lease as the proof reads it: its `renewTime` rounded up
/// to the second, so a renewal is never taken for earlier than it was.
pub fn kubelet_lease(lease: Option<&Lease>) -> KubeletLease {
    let Some(lease) = lease else {
        return KubeletLease::Missing;
    };
    match lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) {
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
            "lastTransitionTime": rfc3339(now),
        }]},
    }))
}

/// Unix seconds in RFC 3339, or the number itself if out of range.
pub fn rfc3339(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map_or_else(|_| secs.to_string(), |t| t.to_string())
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
            assert_eq!(judge(&confirmation, hibernated, lease), want, "{name}");
        }
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
        assert_eq!(c["lastTransitionTime"], rfc3339(STOP));
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
        let lease = |renew: Option<&str>| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "worker-2", "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": "worker-2", "renewTime": renew},
            }))
            .unwrap()
        };
        let at = values::unix_seconds("2026-11-26T12:00:00Z").unwrap();
        assert_eq!(kubelet_lease(None), KubeletLease::Missing);
        assert_eq!(
            kubelet_lease(Some(&lease(None))),
            KubeletLease::NeverRenewed
        );
        assert_eq!(
            kubelet_lease(Some(&lease(Some("2026-11-26T12:00:00.000000Z")))),
            KubeletLease::RenewedAt(at)
        );
        assert_eq!(
            kubelet_lease(Some(&lease(Some("2026-11-26T12:00:00.000001Z")))),
            KubeletLease::RenewedAt(at + 1)
        );
    }

    #[test]
    fn the_mark_names_node_fencer_and_the_evidence() {
        let m = mark_message(STOP, STOP - 12);
        assert!(m.starts_with("node-fencer:"), "{m}");
        assert!(m.contains("12 s before"), "{m}");
        assert!(m.contains(&rfc3339(STOP)), "{m}");
    }
}
