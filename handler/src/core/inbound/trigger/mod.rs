//! Inbound shapes: decides which trigger a document is and reduces it to a
//! [`Batch`] of suspects. Pure: no I/O, no clock, no environment.
//!
//! [`SOURCES`] is the one table of where triggers come from: how each is
//! recognised (a Lambda event by its top-level key, a request to `serve` by
//! its route), how a request to `serve` proves who sent it, how much body it
//! may carry, and its parser. The Lambda classifier ([`classify`]) and
//! `serve`'s routing both read it, so a source is added in one place.

pub mod alertmanager;
pub mod direct;
pub mod eventbridge;
pub mod function_url;
pub mod gce_audit;
pub mod webhook;

use aws_lambda_events::event::lambda_function_urls::LambdaFunctionUrlRequest;
use http::HeaderMap;
use serde_json::Value;

use crate::core::inbound::suspect::Batch;

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

/// How a request to `serve` proves who sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// A Google-signed OIDC token (Pub/Sub push, Eventarc, Cloud Scheduler).
    GoogleOidc,
    /// The webhook's bearer token: the request is the neutral
    /// [`webhook`] entry's, headers checked before the body is read.
    WebhookToken,
}

/// Which of `serve`'s services a route belongs to (`SERVE_ROUTES`): the
/// events Google delivers, or the public webhook, which may run as a
/// service of its own so that no caller of it can take the events' slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteGroup {
    /// `/pubsub`, `/eventarc`, `/sweep`.
    Events,
    /// `/alertmanager`.
    Alertmanager,
}

impl RouteGroup {
    /// Every group, as `SERVE_ROUTES` names them.
    pub const ALL: [(&'static str, RouteGroup); 2] = [
        ("events", RouteGroup::Events),
        ("alertmanager", RouteGroup::Alertmanager),
    ];
}

/// What `serve` reads of a route's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// Nothing: the route's request says all by arriving.
    Ignored,
    /// A JSON document of at most this many bytes; a longer one is refused
    /// (413) unread past the bound.
    Json {
        /// The bound, in bytes.
        max: usize,
    },
}

/// A route of `serve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Its path.
    pub path: &'static str,
    /// Its service.
    pub group: RouteGroup,
    /// How its caller is checked, before any of the body is read.
    pub auth: Auth,
    /// What of its body is read.
    pub body: Body,
}

/// A source's parser: the document (a Lambda event, or a request's body;
/// `null` for a route whose body is ignored) and the request's headers
/// (none for a Lambda event).
type Parse = fn(Value, &HeaderMap) -> Result<Trigger, InputError>;

/// Where triggers come from.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// Its name, for logs and errors.
    pub name: &'static str,
    /// The top-level key that marks it as a Lambda event; `None`: it never
    /// arrives as one.
    pub key: Option<&'static str>,
    /// The route it arrives on in `serve`; `None`: not served over HTTP.
    pub route: Option<Route>,
    /// Its parser.
    pub parse: Parse,
}

/// Pub/Sub pushes messages of up to 10 MB, base64 in a JSON envelope whose
/// attributes and ids add at most a few KiB more.
const PUBSUB_MAX_BODY: usize = gce_audit::MAX_DATA.div_ceil(3) * 4 + 64 * 1024;

/// Every source, in the order the Lambda classifier tries their keys: the
/// shape decides, not a type field. EventBridge events carry `detail-type`,
/// Function URL requests `requestContext`, Alertmanager payloads `alerts`,
/// direct invocations `action`.
pub const SOURCES: &[Source] = &[
    Source {
        name: "EventBridge EC2 state change",
        key: Some("detail-type"),
        route: None,
        parse: |v, _| eventbridge::parse(v).map(Trigger::Batch),
    },
    Source {
        name: "Function URL request",
        key: Some("requestContext"),
        route: None,
        parse: |v, _| {
            serde_json::from_value(v)
                .map(|req| Trigger::Http(Box::new(req)))
                .map_err(|e| InputError::invalid("Function URL request", e))
        },
    },
    Source {
        name: "Alertmanager webhook",
        key: Some("alerts"),
        route: Some(Route {
            path: "/alertmanager",
            group: RouteGroup::Alertmanager,
            auth: Auth::WebhookToken,
            body: Body::Json {
                max: webhook::MAX_BODY_BYTES,
            },
        }),
        parse: |v, _| alertmanager::parse(v).map(Trigger::Batch),
    },
    Source {
        name: "direct invocation",
        key: Some("action"),
        route: None,
        parse: |v, _| {
            direct::parse(v).map(|r| match r {
                direct::Request::Batch(b) => Trigger::Batch(b),
                direct::Request::Preflight => Trigger::Preflight,
            })
        },
    },
    Source {
        name: "Compute Engine audit log entry, Pub/Sub push",
        key: None,
        route: Some(Route {
            path: "/pubsub",
            group: RouteGroup::Events,
            auth: Auth::GoogleOidc,
            body: Body::Json {
                max: PUBSUB_MAX_BODY,
            },
        }),
        parse: |v, _| gce_audit::parse_push(v).map(|e| Trigger::Batch(e.into_batch())),
    },
    Source {
        name: "Compute Engine audit log entry, Eventarc",
        key: None,
        route: Some(Route {
            path: "/eventarc",
            group: RouteGroup::Events,
            auth: Auth::GoogleOidc,
            // Binary mode: the body is the entry itself, the data of a
            // Pub/Sub message of Eventarc's transport.
            body: Body::Json {
                max: gce_audit::MAX_DATA,
            },
        }),
        parse: |v, headers| {
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            gce_audit::parse_eventarc(header("ce-type").unwrap_or(""), header("ce-id"), v)
                .map(|e| Trigger::Batch(e.into_batch()))
        },
    },
    Source {
        name: "scheduled sweep",
        key: None,
        route: Some(Route {
            path: "/sweep",
            group: RouteGroup::Events,
            auth: Auth::GoogleOidc,
            body: Body::Ignored,
        }),
        parse: |_, _| Ok(Trigger::Batch(direct::sweep())),
    },
];

/// The source `serve` takes on `path`, if any.
pub fn routed(path: &str) -> Option<(&'static Source, Route)> {
    SOURCES
        .iter()
        .find_map(|s| s.route.filter(|r| r.path == path).map(|r| (s, r)))
}

/// Classifies a document by its shape and parses it: the first source of
/// [`SOURCES`] whose key it carries.
pub(crate) fn classify(value: Value) -> Result<Trigger, InputError> {
    let Value::Object(map) = &value else {
        return Err(InputError::NotAnObject(json_kind(&value)));
    };
    let source = SOURCES
        .iter()
        .find(|s| s.key.is_some_and(|k| map.contains_key(k)));
    if let Some(source) = source {
        return (source.parse)(value, &HeaderMap::new());
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

    /// Each source is recognised one way at least, and no two alike: a key
    /// or a route names one source only.
    #[test]
    fn the_table_of_sources_is_unambiguous() {
        let keys: Vec<_> = SOURCES.iter().filter_map(|s| s.key).collect();
        let paths: Vec<_> = SOURCES
            .iter()
            .filter_map(|s| s.route.map(|r| r.path))
            .collect();
        for s in SOURCES {
            assert!(
                s.key.is_some() || s.route.is_some(),
                "{} is never recognised",
                s.name
            );
        }
        for (i, k) in keys.iter().enumerate() {
            assert!(!keys[..i].contains(k), "key {k} twice");
        }
        for (i, p) in paths.iter().enumerate() {
            assert!(!paths[..i].contains(p), "route {p} twice");
        }
        assert_eq!(paths, ["/alertmanager", "/pubsub", "/eventarc", "/sweep"]);
        assert!(routed("/healthz").is_none() && routed("/").is_none());
        // Google's deliveries carry its OIDC token; the public webhook, the
        // bearer token, in a service group of its own.
        for (path, auth, group) in [
            ("/pubsub", Auth::GoogleOidc, RouteGroup::Events),
            ("/eventarc", Auth::GoogleOidc, RouteGroup::Events),
            ("/sweep", Auth::GoogleOidc, RouteGroup::Events),
            (
                "/alertmanager",
                Auth::WebhookToken,
                RouteGroup::Alertmanager,
            ),
        ] {
            let (_, route) = routed(path).expect("a route");
            assert_eq!((route.auth, route.group), (auth, group), "{path}");
        }
    }

    /// A route's parser is the same as the Lambda classifier's for the same
    /// source; the Eventarc route reads its CloudEvent headers.
    #[test]
    fn routes_parse_with_the_sources_parsers() {
        let (source, _) = routed("/alertmanager").expect("a route");
        let via_route = match (source.parse)(fixture("alertmanager-v4.json"), &HeaderMap::new()) {
            Ok(Trigger::Batch(b)) => b,
            other => panic!("a batch, got {other:?}"),
        };
        assert_eq!(via_route, batch("alertmanager-v4.json"));

        let cloud_event: Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/gce/preempted.eventarc.json"
        ))
        .expect("fixture JSON");
        let mut headers = HeaderMap::new();
        for name in ["ce-type", "ce-id"] {
            let value = cloud_event["headers"][name].as_str().expect("a header");
            headers.insert(name, http::HeaderValue::from_str(value).expect("a value"));
        }
        let (eventarc, _) = routed("/eventarc").expect("a route");
        let body = cloud_event["body"].clone();
        let Ok(Trigger::Batch(b)) = (eventarc.parse)(body.clone(), &headers) else {
            panic!("a batch");
        };
        assert_eq!(b.suspects.len(), 1);
        let refused = (eventarc.parse)(body, &HeaderMap::new());
        assert!(
            matches!(refused, Err(InputError::Invalid { .. })),
            "{refused:?}"
        );

        let (sweep, route) = routed("/sweep").expect("a route");
        assert_eq!(route.body, Body::Ignored);
        let Ok(Trigger::Batch(b)) = (sweep.parse)(Value::Null, &HeaderMap::new()) else {
            panic!("a batch");
        };
        assert!(b.sweep);
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
        use crate::core::inbound::suspect::{Intent, NodeRef};
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
                crate::core::model::names::NodeName::parse("ip-10-0-1-17.ec2.internal").unwrap()
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
