//! Inbound shapes: decides which trigger a JSON document is and reduces it to
//! a [`Batch`] of suspects. Pure: no I/O, no clock, no environment.

pub mod alertmanager;
pub mod direct;
pub mod eventbridge;
pub mod function_url;
pub mod gce_audit;

use aws_lambda_events::event::lambda_function_urls::LambdaFunctionUrlRequest;
use serde_json::Value;

use crate::core::suspect::Batch;

/// Why an inbound document was refused. Nothing is changed for any of these.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    /// The bytes are not JSON at all.
    #[error("the event is not valid JSON: {0}")]
    NotJson(String),
    /// The document is JSON but not an object.
    #[error("the event must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// No known trigger has this shape.
    #[error(
        "unrecognised event shape (top-level keys: {keys}); expected an EventBridge EC2 \
         state-change event, a Function URL request, an Alertmanager webhook, or \
         {{\"action\": \"fence\"|\"check\"|\"recover\"|\"sweep\"|\"preflight\", \"node\"|\"instanceId\": ...}}"
    )]
    UnknownShape {
        /// The keys seen, to help whoever sent it.
        keys: String,
    },
    /// An EventBridge event of another source or detail type.
    #[error(
        "unsupported EventBridge event `{detail_type}` from `{event_source}`; only \
         `EC2 Instance State-change Notification` from `aws.ec2` is handled"
    )]
    UnsupportedEvent {
        /// The event's `source`.
        event_source: String,
        /// The event's `detail-type`.
        detail_type: String,
    },
    /// A known shape with missing or mistyped fields.
    #[error("invalid {shape}: {message}")]
    Invalid {
        /// Which trigger it looked like.
        shape: &'static str,
        /// What is wrong, from the parser.
        message: String,
    },
}

impl InputError {
    pub(crate) fn invalid(shape: &'static str, err: impl std::fmt::Display) -> Self {
        Self::Invalid {
            shape,
            message: err.to_string(),
        }
    }
}

/// One inbound document, classified by its shape.
#[derive(Debug)]
pub enum Trigger {
    /// Already reduced to suspects (EventBridge, a direct invocation, or an
    /// Alertmanager payload invoked directly, which IAM has authenticated).
    Batch(Batch),
    /// A Function URL request: must be authenticated before its body is read.
    Http(Box<LambdaFunctionUrlRequest>),
    /// `{"action": "preflight"}`: check the set-up, change nothing.
    Preflight,
}

/// Classifies a document by its shape and parses it.
///
/// The shape decides, not a type field: EventBridge events carry `detail-type`,
/// Function URL requests carry `requestContext`, Alertmanager payloads carry
/// `alerts`, direct invocations carry `action`.
pub fn classify(value: Value) -> Result<Trigger, InputError> {
    let Value::Object(map) = &value else {
        return Err(InputError::NotAnObject(json_kind(&value)));
    };
    if map.contains_key("detail-type") {
        return eventbridge::parse(value).map(Trigger::Batch);
    }
    if map.contains_key("requestContext") {
        return serde_json::from_value(value)
            .map(|req| Trigger::Http(Box::new(req)))
            .map_err(|e| InputError::invalid("Function URL request", e));
    }
    if map.contains_key("alerts") {
        return alertmanager::parse(value).map(Trigger::Batch);
    }
    if map.contains_key("action") {
        return direct::parse(value).map(|r| match r {
            direct::Request::Batch(b) => Trigger::Batch(b),
            direct::Request::Preflight => Trigger::Preflight,
        });
    }
    let mut keys: Vec<&str> = map.keys().map(String::as_str).take(8).collect();
    keys.sort_unstable();
    Err(InputError::UnknownShape {
        keys: if keys.is_empty() {
            "none".into()
        } else {
            keys.join(", ")
        },
    })
}

/// Parses raw bytes and classifies them (the command line's `handle`).
pub fn classify_bytes(bytes: &[u8]) -> Result<Trigger, InputError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| InputError::NotJson(e.to_string()))?;
    classify(value)
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every input kept in `handler/fuzz/regressions` (crashes found by the
    /// fuzz targets, and hostile samples) is refused with an input error, or
    /// parsed into well-formed suspects; a Function URL request without the
    /// right token is refused.
    #[test]
    fn fuzz_regressions_are_refused_cleanly() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let token = function_url::WebhookToken::new("a-token-nobody-presents").ok();
        let mut replayed = 0;
        for entry in std::fs::read_dir(&dir).expect("handler/fuzz/regressions exists") {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                continue;
            }
            let bytes = std::fs::read(&path).expect("a readable regression input");
            replayed += 1;
            // The audit log parsers take the same hostile inputs without a panic.
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                let _ = gce_audit::parse_push(value.clone());
                let _ = gce_audit::parse_eventarc(gce_audit::AUDIT_LOG_WRITTEN, None, value);
            }
            match classify_bytes(&bytes) {
                Err(_) => {}
                Ok(Trigger::Batch(batch)) => {
                    for s in &batch.suspects {
                        assert!(s.target.is_well_formed(), "{path:?}: {}", s.target);
                    }
                }
                Ok(Trigger::Http(req)) => {
                    let refused = function_url::parse(&req, token.as_ref());
                    assert!(refused.is_err(), "{path:?} was accepted");
                }
                Ok(Trigger::Preflight) => {}
            }
        }
        assert!(
            replayed >= 5,
            "only {replayed} regression inputs in {dir:?}"
        );
    }

    #[test]
    fn non_objects_are_refused_by_kind() {
        for (value, kind) in [
            (json!(null), "null"),
            (json!([1]), "an array"),
            (json!("x"), "a string"),
            (json!(3), "a number"),
        ] {
            assert_eq!(
                classify(value).err(),
                Some(InputError::NotAnObject(kind)),
                "{kind}"
            );
        }
    }

    #[test]
    fn unknown_shapes_name_their_keys() {
        let err = classify(json!({"foo": 1, "bar": 2})).err();
        let Some(InputError::UnknownShape { keys }) = err else {
            panic!("expected UnknownShape, got {err:?}");
        };
        assert_eq!(keys, "bar, foo");
        assert!(matches!(
            classify(json!({})),
            Err(InputError::UnknownShape { .. })
        ));
    }

    #[test]
    fn malformed_bytes_are_not_json() {
        for bytes in [&b"{"[..], b"", b"\xff\xfe", b"{\"action\": }"] {
            assert!(matches!(classify_bytes(bytes), Err(InputError::NotJson(_))));
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = "[".repeat(100_000);
        assert!(matches!(
            classify_bytes(deep.as_bytes()),
            Err(InputError::NotJson(_))
        ));
    }

    fn fixture(name: &str) -> Value {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn batch(name: &str) -> Batch {
        match classify(fixture(name)) {
            Ok(Trigger::Batch(b)) => b,
            other => panic!("{name}: expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn fixtures_parse_into_the_expected_suspects() {
        use crate::core::suspect::{Intent, NodeRef};
        let b = batch("eventbridge-ec2-stopped.json");
        assert_eq!(b.suspects.len(), 1);
        assert_eq!(b.suspects[0].intent, Intent::Fence);
        assert_eq!(
            b.suspects[0].target.to_string(),
            "instance i-0123456789abcdef0"
        );
        let b = batch("eventbridge-ec2-running.json");
        assert_eq!(b.suspects[0].intent, Intent::Recover);
        let b = batch("alertmanager-v4.json");
        let targets: Vec<String> = b.suspects.iter().map(|s| s.target.to_string()).collect();
        assert_eq!(
            targets,
            [
                "node ip-10-0-1-17.ec2.internal",
                "address 10.0.1.18",
                "node ip-10-0-1-19.ec2.internal"
            ]
        );
        assert_eq!(b.suspects[2].intent, Intent::Recover);
        assert_eq!(b.ignored.len(), 1, "Watchdog names no node");
        let b = batch("direct-fence.json");
        assert_eq!(
            b.suspects[0].target,
            NodeRef::Name(
                crate::core::names::NodeName::parse("ip-10-0-1-17.ec2.internal").unwrap()
            )
        );
        let b = batch("direct-check.json");
        assert_eq!(b.suspects[0].intent, Intent::Check);
    }

    #[test]
    fn the_function_url_fixture_authenticates_and_decodes() {
        let Ok(Trigger::Http(req)) = classify(fixture("function-url-alertmanager.json")) else {
            panic!("expected an HTTP request");
        };
        let token = function_url::WebhookToken::new("test-token-0123456789abcdef").unwrap();
        let b = function_url::parse(&req, Some(&token)).unwrap();
        assert_eq!(b.suspects.len(), 3);
        let wrong = function_url::WebhookToken::new("another-token-0123456789").unwrap();
        assert_eq!(
            function_url::parse(&req, Some(&wrong)).unwrap_err().status,
            401
        );
    }

    #[test]
    fn typed_events_round_trip() {
        use aws_lambda_events::event::cloudwatch_events::ec2::InstanceStateChange;
        use aws_lambda_events::event::eventbridge::EventBridgeEvent;
        let ev: EventBridgeEvent<InstanceStateChange> =
            serde_json::from_value(fixture("eventbridge-ec2-stopped.json")).unwrap();
        let again: EventBridgeEvent<InstanceStateChange> =
            serde_json::from_value(serde_json::to_value(&ev).unwrap()).unwrap();
        assert_eq!(ev, again);
        let req: LambdaFunctionUrlRequest =
            serde_json::from_value(fixture("function-url-alertmanager.json")).unwrap();
        let again: LambdaFunctionUrlRequest =
            serde_json::from_value(serde_json::to_value(&req).unwrap()).unwrap();
        assert_eq!(req, again);
    }
}
