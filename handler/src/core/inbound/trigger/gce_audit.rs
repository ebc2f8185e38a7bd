//! Compute Engine's Cloud Audit Log entries about a VM, as they reach a
//! service: through a Logging sink to Pub/Sub and a push subscription (the
//! push request carries the LogEntry base64-encoded in `message.data`), or
//! as an Eventarc CloudEvent in binary mode (`ce-type:
//! google.cloud.audit.log.v1.written`, the LogEntry as the body).
//!
//! The entries that name a suspect: the end of a `stop` or `delete` call
//! (`operation.last`), and the system events a VM goes down by
//! (`compute.instances.guestTerminate`, `…preempted`, `…hostError`,
//! `…terminateOnHostMaintenance`). The end of a `start` or `resume` asks for
//! recovery. As with EC2's events, the entry only says where to look: the
//! Compute API is asked again before anything is done.
//! <https://cloud.google.com/compute/docs/logging/audit-logging>

use base64::Engine;
use serde::Serialize;
use serde_json::Value;

use super::InputError;
use crate::core::inbound::suspect::{
    AuditOrigin, Batch, Delivery, Ignored, Intent, NodeRef, Origin, Suspect,
};
use crate::core::model::gce::GceInstance;
use crate::core::model::instance::InstanceId;
use crate::core::model::values;

const PUSH: &str = "Pub/Sub push request";
const ENTRY: &str = "Cloud Audit Log entry";
const EVENTARC: &str = "Eventarc CloudEvent";

/// The CloudEvent type Eventarc gives an audit log entry.
pub const AUDIT_LOG_WRITTEN: &str = "google.cloud.audit.log.v1.written";

/// Pub/Sub refuses messages over 10 MB; anything larger is not one.
pub(crate) const MAX_DATA: usize = 10 * 1024 * 1024;

/// What one entry asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum AuditEvent {
    /// A VM to look at.
    Suspect {
        /// The VM.
        instance: GceInstance,
        /// Its numeric id (`resource.labels.instance_id`): a VM recreated
        /// under the same name has another.
        instance_id: Option<String>,
        /// Fence, or recover.
        intent: Intent,
        /// Where it came from.
        origin: AuditOrigin,
    },
    /// An entry about a VM that asks for nothing (another method, or a call
    /// that has not finished).
    Ignored {
        /// Where it came from.
        origin: AuditOrigin,
        /// Why.
        reason: String,
    },
}

/// Parses a Pub/Sub push request body carrying one audit log entry.
pub fn parse_push(body: Value) -> Result<AuditEvent, InputError> {
    let message = body
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| InputError::invalid(PUSH, "missing `message` object"))?;
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let data =
        text(message, "data").ok_or_else(|| InputError::invalid(PUSH, "missing `message.data`"))?;
    if data.len() > MAX_DATA * 4 / 3 + 4 {
        return Err(InputError::invalid(PUSH, "`message.data` is over 10 MB"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.as_bytes())
        .map_err(|e| InputError::invalid(PUSH, format!("`message.data` is not base64: {e}")))?;
    let entry: Value = serde_json::from_slice(&bytes).map_err(|e| {
        InputError::invalid(PUSH, format!("`message.data` is not a JSON log entry: {e}"))
    })?;
    let delivery = Delivery::PubSub {
        message_id: text(message, "messageId").or_else(|| text(message, "message_id")),
        subscription: text(&body, "subscription"),
    };
    parse_entry(&entry, delivery)
}

/// Parses an Eventarc CloudEvent in binary mode: its `ce-type` and `ce-id`
/// headers and its body, the entry.
pub fn parse_eventarc(
    ce_type: &str,
    ce_id: Option<&str>,
    body: Value,
) -> Result<AuditEvent, InputError> {
    if ce_type != AUDIT_LOG_WRITTEN {
        return Err(InputError::invalid(
            EVENTARC,
            format!("ce-type `{ce_type}` is not `{AUDIT_LOG_WRITTEN}`"),
        ));
    }
    let delivery = Delivery::Eventarc {
        id: ce_id.map(str::to_owned),
    };
    parse_entry(&body, delivery)
}

/// What a method does to the VM it names.
enum Verb {
    /// An API call whose end (`operation.last`) means the VM went down.
    Down,
    /// A system event: the VM went down.
    Event,
    /// An API call whose end means the VM runs again.
    Up,
    /// Anything else.
    Other,
}

fn verb(method: &str) -> Verb {
    // API calls carry their version (`v1.`, `beta.`); system events do not.
    let Some((prefix, verb)) = method.split_once("compute.instances.") else {
        return Verb::Other;
    };
    let api = matches!(prefix, "v1." | "beta." | "alpha.");
    match verb {
        "stop" | "delete" if api => Verb::Down,
        "start" | "resume" if api => Verb::Up,
        "guestTerminate" | "preempted" | "hostError" | "terminateOnHostMaintenance"
            if prefix.is_empty() =>
        {
            Verb::Event
        }
        _ => Verb::Other,
    }
}

fn parse_entry(entry: &Value, delivery: Delivery) -> Result<AuditEvent, InputError> {
    if !entry.is_object() {
        return Err(InputError::invalid(ENTRY, "the entry is not a JSON object"));
    }
    let payload = entry
        .get("protoPayload")
        .filter(|p| p.is_object())
        .ok_or_else(|| {
            InputError::invalid(ENTRY, "missing `protoPayload`: not an audit log entry")
        })?;
    let method = payload
        .get("methodName")
        .and_then(Value::as_str)
        .ok_or_else(|| InputError::invalid(ENTRY, "missing `protoPayload.methodName`"))?;
    let last = entry
        .pointer("/operation/last")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let origin = AuditOrigin {
        method: method.to_owned(),
        insert_id: entry
            .get("insertId")
            .and_then(Value::as_str)
            .map(str::to_owned),
        reported_at: stop_reported(entry, method, last),
        delivery,
    };
    let resource_type = entry.pointer("/resource/type").and_then(Value::as_str);
    if resource_type != Some("gce_instance") {
        return Ok(AuditEvent::Ignored {
            origin,
            reason: format!(
                "the entry is about a `{}`, not a gce_instance",
                resource_type.unwrap_or("-")
            ),
        });
    }
    let resource_name = payload
        .get("resourceName")
        .and_then(Value::as_str)
        .ok_or_else(|| InputError::invalid(ENTRY, "missing `protoPayload.resourceName`"))?;
    let label = |key: &str| {
        entry
            .pointer(&format!("/resource/labels/{key}"))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let instance_id = label("instance_id")
        .filter(|id| is_number(id))
        .map(str::to_owned);
    let instance = match vm_named(resource_name, label("project_id"), label("zone"))? {
        Named::Vm(instance) => instance,
        Named::IdOnly(id) => {
            return Ok(AuditEvent::Ignored {
                origin,
                reason: format!(
                    "`{method}` names its VM by id {id} only, not by name: no Node's provider \
                     id can be matched to it; the sweep finds the Node if it is NotReady"
                ),
            });
        }
    };
    match intent(method, last, &instance) {
        Ok(intent) => Ok(AuditEvent::Suspect {
            instance,
            instance_id,
            intent,
            origin,
        }),
        Err(reason) => Ok(AuditEvent::Ignored { origin, reason }),
    }
}

/// When the VM stopped, as the entry reports it: the `timestamp` of the
/// last entry of a `stop` or `delete` call, written once the operation is
/// done. System events are left out: their entries are not documented to
/// be written only once the VM is down.
fn stop_reported(entry: &Value, method: &str, last: bool) -> Option<i64> {
    if !(last && matches!(verb(method), Verb::Down)) {
        return None;
    }
    entry
        .get("timestamp")
        .and_then(Value::as_str)
        .and_then(values::unix_seconds)
}

/// What an entry of `method` about `instance` asks for, or why it is
/// ignored: a stop or start counts once its operation is over (`last`).
fn intent(method: &str, last: bool, instance: &GceInstance) -> Result<Intent, String> {
    match verb(method) {
        Verb::Event => Ok(Intent::Fence),
        Verb::Down if last => Ok(Intent::Fence),
        Verb::Up if last => Ok(Intent::Recover),
        Verb::Down | Verb::Up => Err(format!(
            "{instance}: `{method}` has not finished; its last entry (operation.last) will follow"
        )),
        Verb::Other => Err(format!(
            "{instance}: `{method}` neither stops nor starts a VM"
        )),
    }
}

/// How an entry names its VM.
enum Named {
    /// By project id, zone and name: the Node's provider id.
    Vm(GceInstance),
    /// By its numeric id alone, in place of the name.
    IdOnly(String),
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The VM of `protoPayload.resourceName` (`projects/P/zones/Z/instances/N`,
/// a full API URL too), read with the entry's `resource.labels`. Entries
/// written for an instance schedule, and some system events, name the
/// project by its number: then `project_id` names it, as a provider id
/// does. Where both name the project or the zone they must agree: an entry
/// whose two halves disagree names no VM for sure.
fn vm_named(
    resource_name: &str,
    project_id: Option<&str>,
    zone_label: Option<&str>,
) -> Result<Named, InputError> {
    let not_a_vm = || {
        InputError::invalid(
            ENTRY,
            format!("`{resource_name}` is not projects/P/zones/Z/instances/NAME"),
        )
    };
    let path = resource_name
        .split_once("/compute/v1/")
        .map_or(resource_name, |(_, path)| path)
        .trim_start_matches('/');
    let ["projects", project, "zones", zone, "instances", name] =
        path.split('/').collect::<Vec<_>>()[..]
    else {
        return Err(not_a_vm());
    };
    // A VM's name starts with a letter: digits alone are its id.
    if is_number(name) {
        return Ok(Named::IdOnly(name.to_owned()));
    }
    let by_id = match (is_number(project), project_id) {
        (false, _) => project,
        (true, Some(id)) => id,
        (true, None) => {
            return Err(InputError::invalid(
                ENTRY,
                format!(
                    "`{resource_name}` names its project by number and resource.labels.project_id is missing"
                ),
            ));
        }
    };
    let instance = GceInstance::new(by_id, zone, name).ok_or_else(not_a_vm)?;
    if zone_label.is_some_and(|z| z != zone) {
        return Err(InputError::invalid(
            ENTRY,
            format!("`{resource_name}` is in another zone than resource.labels.zone"),
        ));
    }
    if project_id.is_some_and(|id| id != by_id) {
        return Err(InputError::invalid(
            ENTRY,
            format!("`{resource_name}` is in another project than resource.labels.project_id"),
        ));
    }
    Ok(Named::Vm(instance))
}

impl AuditEvent {
    /// The batch this entry asks for: its VM by provider id, which names
    /// its Node, or nothing.
    pub(crate) fn into_batch(self) -> Batch {
        match self {
            Self::Suspect {
                instance,
                intent,
                origin,
                ..
            } => Batch {
                suspects: vec![Suspect {
                    target: NodeRef::Instance(InstanceId::gce(&instance)),
                    intent,
                    origin: Origin::AuditLog(origin),
                }],
                ..Batch::default()
            },
            Self::Ignored { origin, reason } => Batch {
                ignored: vec![Ignored {
                    origin: Origin::AuditLog(origin),
                    reason,
                }],
                ..Batch::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(method: &str, operation: Value) -> Value {
        json!({
            "insertId": "-abc123",
            "logName": "projects/my-project-1/logs/cloudaudit.googleapis.com%2Factivity",
            "protoPayload": {
                "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                "methodName": method,
                "resourceName": "projects/my-project-1/zones/us-east1-c/instances/gke-pool-1-abcd",
                "serviceName": "compute.googleapis.com"
            },
            "resource": {"type": "gce_instance", "labels": {
                "instance_id": "1234567890123456789", "project_id": "my-project-1", "zone": "us-east1-c"}},
            "operation": operation,
            "severity": "NOTICE",
            "timestamp": "2026-11-25T10:00:00.000000Z"
        })
    }

    fn push(entry: &Value) -> Value {
        json!({
            "message": {
                "data": base64::engine::general_purpose::STANDARD.encode(entry.to_string()),
                "messageId": "9876543210",
                "publishTime": "2026-11-25T10:00:01.000Z",
                "attributes": {"logging.googleapis.com/timestamp": "2026-11-25T10:00:00Z"}
            },
            "subscription": "projects/my-project-1/subscriptions/node-fencer"
        })
    }

    fn intent(event: &AuditEvent) -> Option<Intent> {
        match event {
            AuditEvent::Suspect { intent, .. } => Some(*intent),
            AuditEvent::Ignored { .. } => None,
        }
    }

    #[test]
    fn an_entry_names_its_vm_by_the_nodes_provider_id() {
        let last = json!({"id": "op", "producer": "compute.googleapis.com", "last": true});
        let batch = parse_push(push(&entry("v1.compute.instances.stop", last)))
            .unwrap()
            .into_batch();
        assert_eq!(batch.suspects.len(), 1);
        let suspect = &batch.suspects[0];
        assert_eq!(
            suspect.target,
            NodeRef::Instance(
                InstanceId::parse("gce://my-project-1/us-east1-c/gke-pool-1-abcd").unwrap()
            )
        );
        assert_eq!(suspect.intent, Intent::Fence);
        assert_eq!(suspect.origin.kind(), "gce_audit_log");
        // The report names the trigger as the metrics do.
        assert_eq!(
            serde_json::to_value(&suspect.origin).unwrap()["kind"],
            suspect.origin.kind()
        );
        let first = json!({"id": "op", "producer": "compute.googleapis.com", "first": true});
        let ignored = parse_push(push(&entry("v1.compute.instances.stop", first)))
            .unwrap()
            .into_batch();
        assert!(ignored.suspects.is_empty());
        assert_eq!(ignored.ignored.len(), 1);
    }

    /// Issue 39: the last entry of a stop or delete reports when the VM
    /// went down; a first entry, a start and a system event report no stop.
    #[test]
    fn the_end_of_a_stop_or_delete_reports_its_time() {
        let reported = |method: &str, operation: Value, timestamp: Value| {
            let mut e = entry(method, operation);
            e["timestamp"] = timestamp;
            let batch = parse_push(push(&e)).unwrap().into_batch();
            let origin = batch
                .suspects
                .first()
                .map(|s| &s.origin)
                .or(batch.ignored.first().map(|i| &i.origin));
            match origin {
                Some(Origin::AuditLog(o)) => o.reported_at,
                other => panic!("an audit origin, not {other:?}"),
            }
        };
        let last = json!({"id": "op", "last": true});
        let at = json!("2026-11-25T10:00:07.250Z");
        let want = values::unix_seconds("2026-11-25T10:00:07Z");
        assert_eq!(
            reported("v1.compute.instances.stop", last.clone(), at.clone()),
            want
        );
        assert_eq!(
            reported("beta.compute.instances.delete", last.clone(), at.clone()),
            want
        );
        let first = json!({"id": "op", "first": true});
        assert_eq!(
            reported("v1.compute.instances.stop", first, at.clone()),
            None
        );
        assert_eq!(
            reported("v1.compute.instances.start", last.clone(), at.clone()),
            None
        );
        assert_eq!(
            reported("compute.instances.guestTerminate", json!({}), at),
            None
        );
        assert_eq!(
            reported(
                "v1.compute.instances.stop",
                last.clone(),
                json!("yesterday")
            ),
            None
        );
        assert_eq!(reported("v1.compute.instances.stop", last, json!(17)), None);
    }

    #[test]
    fn the_end_of_a_stop_names_the_vm_to_fence() {
        let last = json!({"id": "operation-1", "producer": "compute.googleapis.com", "last": true});
        let event = parse_push(push(&entry("v1.compute.instances.stop", last))).unwrap();
        let AuditEvent::Suspect {
            instance,
            instance_id,
            intent,
            origin,
        } = event
        else {
            panic!("a suspect");
        };
        assert_eq!(
            instance.provider_id(),
            "gce://my-project-1/us-east1-c/gke-pool-1-abcd"
        );
        assert_eq!(instance_id.as_deref(), Some("1234567890123456789"));
        assert_eq!(intent, Intent::Fence);
        assert_eq!(
            origin.delivery,
            Delivery::PubSub {
                message_id: Some("9876543210".into()),
                subscription: Some("projects/my-project-1/subscriptions/node-fencer".into())
            }
        );
    }

    #[test]
    fn a_call_that_has_not_finished_is_ignored() {
        let first =
            json!({"id": "operation-1", "producer": "compute.googleapis.com", "first": true});
        for method in ["v1.compute.instances.stop", "v1.compute.instances.start"] {
            let event = parse_push(push(&entry(method, first.clone()))).unwrap();
            assert_eq!(intent(&event), None, "{method}");
        }
    }

    #[test]
    fn each_method_asks_for_what_it_does() {
        let last =
            json!({"id": "op", "producer": "compute.googleapis.com", "first": true, "last": true});
        for (method, want) in [
            ("v1.compute.instances.stop", Some(Intent::Fence)),
            ("beta.compute.instances.stop", Some(Intent::Fence)),
            ("v1.compute.instances.delete", Some(Intent::Fence)),
            ("compute.instances.guestTerminate", Some(Intent::Fence)),
            ("compute.instances.preempted", Some(Intent::Fence)),
            ("compute.instances.hostError", Some(Intent::Fence)),
            (
                "compute.instances.terminateOnHostMaintenance",
                Some(Intent::Fence),
            ),
            ("v1.compute.instances.start", Some(Intent::Recover)),
            ("v1.compute.instances.resume", Some(Intent::Recover)),
            // Suspended resumes from RAM: not off, nothing to do.
            ("v1.compute.instances.suspend", None),
            ("v1.compute.instances.setMetadata", None),
            ("v1.compute.instances.guestTerminate", None),
            ("compute.instances.stop", None),
        ] {
            let event = parse_push(push(&entry(method, last.clone()))).unwrap();
            assert_eq!(intent(&event), want, "{method}");
        }
    }

    #[test]
    fn eventarc_delivers_the_entry_itself() {
        let last = json!({"id": "op", "producer": "compute.googleapis.com", "last": true});
        let body = entry("v1.compute.instances.delete", last);
        let event = parse_eventarc(AUDIT_LOG_WRITTEN, Some("ce-1"), body.clone()).unwrap();
        assert_eq!(intent(&event), Some(Intent::Fence));
        let err = parse_eventarc("google.cloud.pubsub.topic.v1.messagePublished", None, body)
            .unwrap_err();
        assert!(err.to_string().contains("ce-type"), "{err}");
    }

    #[test]
    fn another_resource_type_is_ignored() {
        let mut e = entry("v1.compute.disks.delete", json!({"last": true}));
        e["resource"]["type"] = json!("gce_disk");
        assert_eq!(intent(&parse_push(push(&e)).unwrap()), None);
    }

    #[test]
    fn bad_input_gets_a_clear_error() {
        let good = entry("v1.compute.instances.stop", json!({"last": true}));
        let mut no_name = good.clone();
        no_name["protoPayload"]
            .as_object_mut()
            .unwrap()
            .remove("resourceName");
        let mut bad_name = good.clone();
        bad_name["protoPayload"]["resourceName"] = json!("projects/../zones/x/instances/y");
        let mut no_method = good.clone();
        no_method["protoPayload"]
            .as_object_mut()
            .unwrap()
            .remove("methodName");
        for (body, says) in [
            (json!({}), "message"),
            (json!({"message": {}}), "message.data"),
            (json!({"message": {"data": "not base64!"}}), "base64"),
            (
                json!({"message": {"data": base64::engine::general_purpose::STANDARD.encode("[1]")}}),
                "not a JSON object",
            ),
            (
                json!({"message": {"data": base64::engine::general_purpose::STANDARD.encode("{")}}),
                "JSON log entry",
            ),
            (push(&json!({"textPayload": "hello"})), "protoPayload"),
            (push(&no_name), "resourceName"),
            (push(&bad_name), "is not projects"),
            (push(&no_method), "methodName"),
        ] {
            let err = parse_push(body).unwrap_err();
            assert!(err.to_string().contains(says), "{says}: {err}");
        }
    }

    /// The real-shaped fixtures (checked against Google's published types
    /// by tests/gce) parse to what they describe.
    #[test]
    fn the_fixtures_name_their_vm() {
        let vm = GceInstance::from_provider_id("gce://my-project-1/us-east1-c/gke-pool-1-abcd");
        let fixture = |text: &str| -> Value { serde_json::from_str(text).expect("fixture JSON") };
        for body in [
            include_str!("../../../../tests/fixtures/gce/stop-last.pubsub.json"),
            include_str!("../../../../tests/fixtures/gce/guest-terminate.pubsub.json"),
        ] {
            let AuditEvent::Suspect {
                instance, intent, ..
            } = parse_push(fixture(body)).unwrap()
            else {
                panic!("a suspect");
            };
            assert_eq!(Some(instance), vm.clone());
            assert_eq!(intent, Intent::Fence);
        }
        let cloud_event = fixture(include_str!(
            "../../../../tests/fixtures/gce/preempted.eventarc.json"
        ));
        let header = |name: &str| cloud_event["headers"][name].as_str();
        let event = parse_eventarc(
            header("ce-type").unwrap_or_default(),
            header("ce-id"),
            cloud_event["body"].clone(),
        )
        .unwrap();
        assert_eq!(intent(&event), Some(Intent::Fence));
    }

    /// Regression (issue 33, item 18): entries written for an instance
    /// schedule (and some system events) name the project by its number;
    /// `resource.labels.project_id` names it as the Node's provider id
    /// does, so the VM is found, through Pub/Sub and Eventarc alike.
    #[test]
    fn a_vm_named_by_project_number_is_found_by_its_project_id() {
        let vm = GceInstance::from_provider_id("gce://my-project-1/us-east1-c/gke-pool-1-abcd");
        let by_number = |e: &mut Value| {
            e["protoPayload"]["resourceName"] =
                json!("projects/123456789012/zones/us-east1-c/instances/gke-pool-1-abcd");
        };
        let mut e = entry("v1.compute.instances.stop", json!({"last": true}));
        by_number(&mut e);
        for event in [
            parse_push(push(&e)).unwrap(),
            parse_eventarc(AUDIT_LOG_WRITTEN, Some("ce-1"), e.clone()).unwrap(),
        ] {
            let AuditEvent::Suspect {
                instance, intent, ..
            } = event
            else {
                panic!("a suspect: {event:?}");
            };
            assert_eq!(Some(instance), vm.clone());
            assert_eq!(intent, Intent::Fence);
        }
        let fixture = |text: &str| -> Value { serde_json::from_str(text).expect("fixture JSON") };
        let pushed = fixture(include_str!(
            "../../../../tests/fixtures/gce/schedule-stop-by-number.pubsub.json"
        ));
        let cloud_event = fixture(include_str!(
            "../../../../tests/fixtures/gce/host-error-by-number.eventarc.json"
        ));
        let header = |name: &str| cloud_event["headers"][name].as_str();
        for event in [
            parse_push(pushed).unwrap(),
            parse_eventarc(
                header("ce-type").unwrap_or_default(),
                header("ce-id"),
                cloud_event["body"].clone(),
            )
            .unwrap(),
        ] {
            let AuditEvent::Suspect { instance, .. } = event else {
                panic!("a suspect: {event:?}");
            };
            assert_eq!(Some(instance), vm.clone());
        }
    }

    #[test]
    fn the_two_halves_of_an_entry_must_agree_on_the_vm() {
        for (name, project_id, zone, says) in [
            (
                "projects/123456789012/zones/us-east1-c/instances/vm-1",
                None,
                Some("us-east1-c"),
                "by number",
            ),
            (
                "projects/my-project-1/zones/us-east1-c/instances/vm-1",
                Some("other-project-1"),
                Some("us-east1-c"),
                "another project",
            ),
            (
                "projects/123456789012/zones/us-east1-c/instances/vm-1",
                Some("my-project-1"),
                Some("us-east1-b"),
                "another zone",
            ),
            (
                "projects/123456789012/zones/us-east1-c/instances/vm-1",
                Some("Not A Project"),
                None,
                "is not projects",
            ),
        ] {
            let mut e = entry("v1.compute.instances.stop", json!({"last": true}));
            e["protoPayload"]["resourceName"] = json!(name);
            e["resource"]["labels"] = json!({"instance_id": "1"});
            if let Some(p) = project_id {
                e["resource"]["labels"]["project_id"] = json!(p);
            }
            if let Some(z) = zone {
                e["resource"]["labels"]["zone"] = json!(z);
            }
            let err = parse_push(push(&e)).unwrap_err();
            assert!(err.to_string().contains(says), "{says}: {err}");
        }
    }

    /// A VM named by its numeric id alone matches no Node's provider id (a
    /// name): reported and left to the sweep, never a guess.
    #[test]
    fn a_vm_named_by_id_alone_is_ignored_with_the_reason() {
        let mut e = entry("compute.instances.hostError", json!({"last": true}));
        e["protoPayload"]["resourceName"] =
            json!("projects/123456789012/zones/us-east1-c/instances/1234567890123456789");
        let batch = parse_push(push(&e)).unwrap().into_batch();
        assert!(batch.suspects.is_empty());
        assert_eq!(batch.ignored.len(), 1);
        assert!(
            batch.ignored[0]
                .reason
                .contains("by id 1234567890123456789"),
            "{}",
            batch.ignored[0].reason
        );
    }

    #[test]
    fn a_malformed_instance_id_label_is_dropped_not_trusted() {
        let mut e = entry("v1.compute.instances.stop", json!({"last": true}));
        e["resource"]["labels"]["instance_id"] = json!("12ab");
        let AuditEvent::Suspect { instance_id, .. } = parse_push(push(&e)).unwrap() else {
            panic!("a suspect");
        };
        assert_eq!(instance_id, None);
    }
}
