//! EventBridge `EC2 Instance State-change Notification` events.

use aws_lambda_events::event::cloudwatch_events::ec2::InstanceStateChange;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde_json::Value;

use super::InputError;
use crate::core::inbound::suspect::{Batch, Ignored, Intent, NodeRef, Origin, Suspect};
use crate::core::model::instance::{InstanceId, InstanceState};

const SOURCE: &str = "aws.ec2";
const DETAIL_TYPE: &str = "EC2 Instance State-change Notification";
const SHAPE: &str = "EC2 state-change event";

/// Parses an EventBridge event; only EC2 state changes are accepted.
///
/// The state in the event is a hint: it decides whether to look at the
/// instance at all, never whether to fence (EC2 is asked again).
pub fn parse(value: Value) -> Result<Batch, InputError> {
    let event: EventBridgeEvent<Value> =
        serde_json::from_value(value).map_err(|e| InputError::invalid("EventBridge event", e))?;
    if event.source != SOURCE || event.detail_type != DETAIL_TYPE {
        return Err(InputError::UnsupportedEvent {
            event_source: event.source,
            detail_type: event.detail_type,
        });
    }
    let detail: InstanceStateChange =
        serde_json::from_value(event.detail).map_err(|e| InputError::invalid(SHAPE, e))?;
    let instance = InstanceId::ec2(&detail.instance_id).ok_or_else(|| {
        InputError::invalid(
            SHAPE,
            format!(
                "detail.instance-id `{}` is not an EC2 instance id",
                detail.instance_id
            ),
        )
    })?;
    let origin = Origin::Ec2StateChange {
        event_id: event.id,
        reported_state: detail.state.clone(),
        reported_at: event.time.map(|t| t.timestamp()),
    };
    let intent = match InstanceState::from_name(&detail.state) {
        // EC2's events never say `hibernated` (they say `stopped`); the
        // confirmation tells the two apart.
        InstanceState::Stopped | InstanceState::Terminated | InstanceState::Hibernated => {
            Intent::Fence
        }
        InstanceState::Running => Intent::Recover,
        InstanceState::Pending
        | InstanceState::Stopping
        | InstanceState::ShuttingDown
        | InstanceState::Suspended
        | InstanceState::Unknown => {
            return Ok(Batch {
                suspects: vec![],
                ignored: vec![Ignored {
                    origin,
                    reason: format!(
                        "instance {instance} reported `{}`: not a final state, \
                         the stopped/terminated event will follow",
                        detail.state
                    ),
                }],
                ..Batch::default()
            });
        }
    };
    Ok(Batch {
        suspects: vec![Suspect {
            target: NodeRef::Instance(instance),
            intent,
            origin,
        }],
        ..Batch::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(state: &str, id: &str) -> Value {
        json!({
            "version": "0",
            "id": "7bf73129-1428-4cd3-a780-95db273d1602",
            "detail-type": "EC2 Instance State-change Notification",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": "2026-11-22T10:00:00Z",
            "region": "us-east-1",
            "resources": [format!("arn:aws:ec2:us-east-1:123456789012:instance/{id}")],
            "detail": {"instance-id": id, "state": state}
        })
    }

    #[test]
    fn final_states_map_to_intents() {
        for (state, intent) in [
            ("stopped", Some(Intent::Fence)),
            ("terminated", Some(Intent::Fence)),
            ("running", Some(Intent::Recover)),
            ("pending", None),
            ("stopping", None),
            ("shutting-down", None),
            ("rebooting", None),
            ("", None),
        ] {
            let batch = parse(event(state, "i-0123456789abcdef0")).unwrap();
            assert_eq!(batch.suspects.first().map(|s| s.intent), intent, "{state}");
            assert_eq!(batch.suspects.len() + batch.ignored.len(), 1);
        }
    }

    /// The event's time reaches the suspect's origin (and the report); an
    /// event without one carries none, a malformed one is refused.
    #[test]
    fn the_events_time_is_carried() {
        let batch = parse(event("stopped", "i-0123456789abcdef0")).unwrap();
        let at = batch.suspects.first().map(|s| s.origin.clone());
        let want = crate::core::model::values::unix_seconds("2026-11-22T10:00:00Z");
        assert!(matches!(
            at,
            Some(Origin::Ec2StateChange { reported_at, .. }) if reported_at == want && want.is_some()
        ));
        let shown = serde_json::to_value(&batch.suspects[0].origin).unwrap();
        assert_eq!(shown["time"], "2026-11-22T10:00:00Z");

        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev.as_object_mut().map(|o| o.remove("time"));
        let batch = parse(ev).unwrap();
        let shown = serde_json::to_value(&batch.suspects[0].origin).unwrap();
        assert!(shown.get("time").is_none(), "{shown}");

        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev["time"] = json!("yesterday");
        assert!(matches!(parse(ev), Err(InputError::Invalid { .. })));
    }

    #[test]
    fn other_sources_are_refused() {
        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev["source"] = json!("aws.autoscaling");
        assert!(matches!(
            parse(ev),
            Err(InputError::UnsupportedEvent { .. })
        ));
        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev["detail-type"] = json!("EC2 Spot Instance Interruption Warning");
        assert!(matches!(
            parse(ev),
            Err(InputError::UnsupportedEvent { .. })
        ));
    }

    #[test]
    fn missing_or_bad_fields_are_invalid() {
        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev["detail"] = json!({"state": "stopped"});
        assert!(matches!(parse(ev), Err(InputError::Invalid { .. })));
        let ev = event("stopped", "i-nope");
        assert!(matches!(parse(ev), Err(InputError::Invalid { .. })));
        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev["detail"] = json!("stopped");
        assert!(matches!(parse(ev), Err(InputError::Invalid { .. })));
        let mut ev = event("stopped", "i-0123456789abcdef0");
        ev.as_object_mut().map(|m| m.remove("source"));
        assert!(matches!(parse(ev), Err(InputError::Invalid { .. })));
    }
}
