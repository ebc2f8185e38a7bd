//! When a machine stopped, as the clouds record it and as the triggers
//! report it: the reference the kubelet's silence is measured against.

use std::collections::HashMap;

use crate::core::inbound::suspect::{AuditOrigin, NodeRef, Origin, Suspect};
use crate::core::model::instance::InstanceId;
use crate::core::model::values;

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

#[cfg(test)]
mod tests {
    use super::*;

    const STOP: i64 = 1_795_000_000;

    #[test]
    fn a_reported_stop_in_the_future_is_not_believed() {
        let now = STOP + 45;
        assert_eq!(stop_time(Some(STOP), Some(now + 1), now), Some(STOP));
        assert_eq!(stop_time(None, Some(now + 600), now), None);
        assert_eq!(stop_time(None, Some(now), now), Some(now));
        assert_eq!(stop_time(None, None, now), None);
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
}
