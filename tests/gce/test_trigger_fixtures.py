"""The GCE trigger fixtures of handler/tests/fixtures/gce, parsed strictly with Google's types.

node-fencer takes Compute Engine events as Cloud Audit Log entries, delivered two ways:

- `*.pubsub.json`: a Pub/Sub push request body from a Logging sink,
  {"message": {"data": base64(LogEntry JSON), "messageId", "publishTime", "attributes"},
   "subscription": "projects/P/subscriptions/S"}
  (https://cloud.google.com/pubsub/docs/push). The body is parsed as google-events'
  MessagePublishedData and its data as LogEntryData.
- `*.eventarc.json`: {"headers": {...}, "body": LogEntry JSON}, an Eventarc CloudEvent in
  binary mode (https://cloud.google.com/eventarc/docs/cloudevents). The headers carry the
  CloudEvent attributes Eventarc sets for google.cloud.audit.log.v1.written; the body is
  parsed as LogEntryData.

Parsing is protobuf's JSON parser with unknown fields refused, so a field Google's types do
not have fails. Two things real bodies carry are handled before it, each checked: Pub/Sub
push repeats messageId and publishTime as message_id and publish_time (equal values), and
the AuditLog payload names its type in "@type", which google-events models as the message
itself. Beyond the types, each entry must be a Compute Engine instance's audit entry whose
names agree with each other: logName, resource labels, resourceName, the CloudEvent source
and subject (resourceName may name the project by its number, as entries written for an instance
schedule and some system events do). An empty or missing fixture directory fails.

google-events' copy of the AuditLog types is older than what Cloud Logging writes today:
it has no authorizationInfo[].permissionType and no authenticationInfo.oauthInfo, so an
entry copied verbatim from a live project fails here until those two fields are taken out.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.events.cloud.audit_v1.types import LogEntryData
from google.events.cloud.pubsub_v1.types import MessagePublishedData
from google.protobuf.json_format import ParseError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "handler" / "tests" / "fixtures" / "gce"
PUBSUB = sorted(FIXTURES.glob("*.pubsub.json"))
EVENTARC = sorted(FIXTURES.glob("*.eventarc.json"))

AUDIT_LOG_TYPE = "type.googleapis.com/google.cloud.audit.AuditLog"
EVENT_TYPE = "google.cloud.audit.log.v1.written"
LOG_NAME = re.compile(r"projects/(?P<project>[a-z][-a-z0-9]{4,28}[a-z0-9])/logs/"
                      r"cloudaudit\.googleapis\.com%2F(?P<log>activity|system_event|data_access)")
INSTANCE_NAME = re.compile(r"projects/(?P<project>[^/]+)/zones/(?P<zone>[a-z]+-[a-z]+[0-9]+-[a-z])/"
                           r"instances/(?P<name>[a-z]([-a-z0-9]{0,61}[a-z0-9])?)")
SUBSCRIPTION = re.compile(r"projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/subscriptions/[A-Za-z][-\w.~+%]{2,254}")
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")
# The Pub/Sub push body's snake_case copies of message fields.
PUSH_ALIASES = {"message_id": "messageId", "publish_time": "publishTime"}


def fixtures_or_failure(paths: list[Path], kind: str) -> list[Any]:
    if paths:
        return [pytest.param(p, id=p.name) for p in paths]
    return [pytest.param(None, id=f"no-{kind}-fixture")]


def require(path: Path | None, kind: str) -> Path:
    if path is None:
        pytest.fail(f"no {kind} fixture in {FIXTURES.relative_to(REPO)}: the GCE triggers are untested")
    return path


def strict_log_entry(entry: Any, where: str) -> tuple[LogEntryData, dict[str, Any]]:
    """Parses a LogEntry as LogEntryData refusing unknown fields, after checking and taking out
    the AuditLog payload's "@type"; then checks it is a Compute Engine instance's audit entry."""
    assert isinstance(entry, dict), f"{where}: a LogEntry is a JSON object"
    entry = copy.deepcopy(entry)
    payload = entry.get("protoPayload")
    assert isinstance(payload, dict), f"{where}: no protoPayload: not an audit log entry"
    assert payload.pop("@type", None) == AUDIT_LOG_TYPE, f"{where}: protoPayload.@type is not {AUDIT_LOG_TYPE}"
    try:
        parsed = LogEntryData.from_json(json.dumps(entry), ignore_unknown_fields=False)
    except ParseError as e:
        pytest.fail(f"{where}: not a google.events.cloud.audit.v1.LogEntryData: {e}")
    log = LOG_NAME.fullmatch(parsed.log_name)
    assert log, f"{where}: logName {parsed.log_name!r} is not a project's Cloud Audit Log"
    audit = parsed.proto_payload
    assert audit.service_name == "compute.googleapis.com", f"{where}: not a Compute Engine entry"
    assert audit.method_name, f"{where}: no methodName"
    api_call = audit.method_name.split(".", 1)[0] in ("v1", "beta", "alpha")
    assert log["log"] == ("activity" if api_call else "system_event"), (
        f"{where}: {audit.method_name} is written to the {'activity' if api_call else 'system_event'} log, "
        f"not {log['log']}"
    )
    target = INSTANCE_NAME.fullmatch(audit.resource_name)
    assert target, f"{where}: resourceName {audit.resource_name!r} is not an instance"
    assert parsed.resource.type == "gce_instance", f"{where}: resource.type {parsed.resource.type!r}"
    labels = dict(parsed.resource.labels)
    assert set(labels) == {"instance_id", "project_id", "zone"}, f"{where}: resource.labels {sorted(labels)}"
    assert labels["instance_id"].isdigit(), f"{where}: instance_id {labels['instance_id']!r} is not numeric"
    # resourceName names the project by id, or (instance schedules, some system events) by its
    # number; the labels and the log name always by id.
    by_number = target["project"].isdigit()
    assert labels["project_id"] == log["project"], f"{where}: the project differs"
    assert by_number or target["project"] == labels["project_id"], f"{where}: the project differs"
    assert labels["zone"] == target["zone"], f"{where}: the zone differs"
    op = parsed.operation
    assert op.id and op.producer, f"{where}: an instance's audit entry has an operation"
    if api_call:
        assert op.producer == "compute.googleapis.com", f"{where}: operation.producer {op.producer!r}"
    else:
        assert op.producer == audit.method_name and op.first and op.last, (
            f"{where}: a system event is one entry, its producer the method"
        )
    assert parsed.timestamp and parsed.receive_timestamp >= parsed.timestamp, f"{where}: timestamps"
    assert parsed.insert_id, f"{where}: no insertId"
    return parsed, entry


def strict_push_body(body: Any, where: str) -> MessagePublishedData:
    assert isinstance(body, dict) and set(body) <= {"message", "subscription", "deliveryAttempt"}, (
        f"{where}: a push body is {{message, subscription[, deliveryAttempt]}}"
    )
    body = copy.deepcopy(body)
    message = body.get("message")
    assert isinstance(message, dict), f"{where}: no message"
    for alias, field in PUSH_ALIASES.items():
        if alias in message:
            assert message[alias] == message.get(field), f"{where}: message.{alias} differs from {field}"
            del message[alias]
    try:
        return MessagePublishedData.from_json(json.dumps(body), ignore_unknown_fields=False)
    except ParseError as e:
        pytest.fail(f"{where}: not a google.events.cloud.pubsub.v1.MessagePublishedData: {e}")


def test_the_fixture_directory_holds_both_kinds_and_nothing_else() -> None:
    assert FIXTURES.is_dir(), f"{FIXTURES.relative_to(REPO)} does not exist: the GCE triggers are untested"
    assert PUBSUB, f"no *.pubsub.json in {FIXTURES.relative_to(REPO)}"
    assert EVENTARC, f"no *.eventarc.json in {FIXTURES.relative_to(REPO)}"
    strays = sorted(p.name for p in FIXTURES.iterdir() if p not in PUBSUB and p not in EVENTARC)
    assert not strays, f"files that are neither *.pubsub.json nor *.eventarc.json (never checked): {strays}"


@pytest.mark.parametrize("path", fixtures_or_failure(PUBSUB, "pubsub"))
def test_pubsub_push_bodies_parse_as_googles_types(path: Path | None) -> None:
    path = require(path, "*.pubsub.json")
    body = json.loads(path.read_text(encoding="utf-8"))
    published = strict_push_body(body, path.name)
    message = published.message
    assert SUBSCRIPTION.fullmatch(published.subscription), f"subscription {published.subscription!r}"
    assert message.message_id.isdigit(), f"messageId {message.message_id!r}"
    assert message.publish_time, "no publishTime"
    stamp = message.attributes.get("logging.googleapis.com/timestamp", "")
    assert RFC3339.fullmatch(stamp), "a Logging sink sets the logging.googleapis.com/timestamp attribute"
    try:
        entry = json.loads(message.data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        pytest.fail(f"{path.name}: message.data is not base64 of a JSON LogEntry: {e}")
    strict_log_entry(entry, f"{path.name} message.data")


@pytest.mark.parametrize("path", fixtures_or_failure(EVENTARC, "eventarc"))
def test_eventarc_cloudevents_parse_as_googles_types(path: Path | None) -> None:
    path = require(path, "*.eventarc.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict) and set(doc) == {"headers", "body"}, "an Eventarc fixture is {headers, body}"
    headers = {name.lower(): value for name, value in doc["headers"].items()}
    assert len(headers) == len(doc["headers"]), "a header is repeated"
    for name in ("ce-id", "ce-source", "ce-specversion", "ce-type", "ce-subject"):
        assert isinstance(headers.get(name), str) and headers[name], f"no {name} header"
    assert headers["ce-type"] == EVENT_TYPE
    assert headers["ce-specversion"] == "1.0"
    assert headers.get("content-type", "").startswith("application/json"), "binary mode carries a JSON body"
    for name in ("ce-time", "ce-recordedtime"):
        if name in headers:
            assert RFC3339.fullmatch(headers[name]), f"{name} {headers[name]!r} is not RFC 3339"
    parsed, _ = strict_log_entry(doc["body"], f"{path.name} body")
    audit = parsed.proto_payload
    log = LOG_NAME.fullmatch(parsed.log_name)
    assert log
    assert headers["ce-source"] == f"//cloudaudit.googleapis.com/projects/{log['project']}/logs/{log['log']}"
    assert headers["ce-subject"] == f"{audit.service_name}/{audit.resource_name}"
    for name, value in (("ce-methodname", audit.method_name), ("ce-servicename", audit.service_name),
                        ("ce-resourcename", audit.resource_name)):
        if name in headers:
            assert headers[name] == value, f"{name} differs from the entry"


# --- the parsing really refuses what Google's types do not have -------------------------------


def first(paths: list[Path], kind: str) -> Path:
    if not paths:
        pytest.fail(f"no {kind} fixture to plant mistakes in")
    return paths[0]


@pytest.mark.parametrize(
    ("plant", "expected"),
    [
        (lambda e: e["protoPayload"].update(methodNam="x"), 'no field named "methodNam"'),
        (lambda e: e["resource"].update(lables={}), 'no field named "lables"'),
        (lambda e: e["operation"].update(final=True), 'no field named "final"'),
        (lambda e: e.update(jsonPayload={}), 'no field named "jsonPayload"'),
        (lambda e: e["protoPayload"].update({"@type": "type.googleapis.com/google.cloud.audit.Other"}),
         "protoPayload.@type"),
        (lambda e: e.update(logName="projects/nf-project/logs/syslog"), "not a project's Cloud Audit Log"),
        (lambda e: e["resource"]["labels"].update(zone="europe-west1-b"), "the zone differs"),
        (lambda e: e["resource"]["labels"].update(project_id="other-project-1"), "the project differs"),
        (lambda e: e["protoPayload"].update(resourceName="projects/other-project-1/zones/us-east1-c/"
                                                          "instances/gke-pool-1-abcd"), "the project differs"),
    ],
)
def test_a_planted_mistake_in_a_log_entry_fails(plant: Any, expected: str) -> None:
    doc = json.loads(first(EVENTARC, "*.eventarc.json").read_text(encoding="utf-8"))
    entry = doc["body"]
    strict_log_entry(entry, "unplanted")
    plant(entry)
    with pytest.raises((AssertionError, pytest.fail.Exception)) as caught:
        strict_log_entry(entry, "planted")
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("plant", "expected"),
    [
        (lambda b: b["message"].update(messageID="1"), 'no field named "messageID"'),
        (lambda b: b["message"].update(message_id="2"), "message.message_id differs"),
        (lambda b: b.update(ackId="x"), "a push body is"),
        (lambda b: b["message"].update(data="not base64!"), "MessagePublishedData"),
    ],
)
def test_a_planted_mistake_in_a_push_body_fails(plant: Any, expected: str) -> None:
    body = json.loads(first(PUBSUB, "*.pubsub.json").read_text(encoding="utf-8"))
    strict_push_body(body, "unplanted")
    plant(body)
    with pytest.raises((AssertionError, pytest.fail.Exception)) as caught:
        strict_push_body(body, "planted")
    assert expected in str(caught.value)
