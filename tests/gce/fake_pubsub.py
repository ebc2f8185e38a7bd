"""A fake of Pub/Sub's REST `publish` method, the one call node-fencer's notifications make.

No Pub/Sub emulator runs here (Google's is a Java component of the gcloud CLI), so the
notifications are published to this stand-in, served by the fake Compute Engine's server
(fake_compute.py) under /v1/. It is held to Google's published description of the API
(pubsub.v1.json, shipped in google-api-python-client; see test_fake_pubsub.py) and driven by
Google's own Python client in its tests. Only the Python standard library is used.

    POST /v1/projects/{project}/topics/{topic}:publish        pubsub.projects.topics.publish

Behaviour kept from Pub/Sub: a topic that does not exist answers 404 NOT_FOUND ("Resource not
found (resource=TOPIC)."); a body with a field PublishRequest or PubsubMessage does not have, a
message with neither data nor attributes, data that is not base64, an output-only field
(messageId, publishTime) set, or an attribute key or value beyond Pub/Sub's limits answers 400
INVALID_ARGUMENT; a published message gets a server-assigned id and publish time. Faults
(429, 500, 503) can be injected for a number of calls.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
import threading
from typing import Any

PUBLISH_PATH = re.compile(r"^/v1/projects/(?P<project>[^/]+)/topics/(?P<topic>[^/:]+):publish$")
# The fields of PubsubMessage a publisher may set, and those the server sets.
MESSAGE_FIELDS = frozenset({"data", "attributes", "orderingKey"})
OUTPUT_ONLY_FIELDS = frozenset({"messageId", "publishTime"})
REQUEST_FIELDS = frozenset({"messages"})
# https://cloud.google.com/pubsub/quotas#resource_limits
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_MESSAGES = 1000
FAULT_STATUSES = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


class PubSubError(Exception):
    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


def invalid(message: str) -> PubSubError:
    return PubSubError(400, "INVALID_ARGUMENT", message)


class FakePubSub:
    """Topics and the messages published to them. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with getattr(self, "_lock", threading.Lock()):
            self.topics: dict[str, list[dict[str, Any]]] = {}
            self.faults: list[list[int]] = []  # [status, remaining]
            self._next_id = 1

    def create_topic(self, project: str, topic: str) -> dict[str, Any]:
        name = f"projects/{project}/topics/{topic}"
        with self._lock:
            self.topics.setdefault(name, [])
        return {"name": name}

    def inject_fault(self, status: int, count: int = 1) -> None:
        if status not in FAULT_STATUSES:
            raise ValueError(f"status {status} is not one of {sorted(FAULT_STATUSES)}")
        with self._lock:
            self.faults.append([status, count])

    def published(self) -> dict[str, list[dict[str, Any]]]:
        """Every topic's messages, data decoded when it is text."""
        with self._lock:
            return {name: [dict(m) for m in messages] for name, messages in self.topics.items()}

    def handles(self, path: str) -> bool:
        return path.startswith("/v1/")

    def handle(self, http_method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        try:
            matched = PUBLISH_PATH.match(path)
            if matched is None:
                raise PubSubError(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")
            if http_method != "POST":
                raise PubSubError(405, "METHOD_NOT_ALLOWED", f"HTTP method {http_method} is not supported by this URL")
            name = f"projects/{matched['project']}/topics/{matched['topic']}"
            with self._lock:
                for fault in self.faults:
                    if fault[1] > 0:
                        fault[1] -= 1
                        raise PubSubError(fault[0], FAULT_STATUSES[fault[0]], "injected fault")
                if name not in self.topics:
                    raise PubSubError(404, "NOT_FOUND", f"Resource not found (resource={matched['topic']}).")
                messages = [_checked(m, i) for i, m in enumerate(_messages(body))]
                ids = []
                for message in messages:
                    message["messageId"] = str(self._next_id)
                    message["publishTime"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    self._next_id += 1
                    self.topics[name].append(message)
                    ids.append(message["messageId"])
            return 200, {"messageIds": ids}
        except PubSubError as e:
            return e.code, e.body()


def _messages(body: Any) -> list[Any]:
    if not isinstance(body, dict):
        raise invalid("Invalid JSON payload received. Expected an object.")
    unknown = set(body) - REQUEST_FIELDS
    if unknown:
        raise invalid(f"Invalid JSON payload received. Unknown name \"{sorted(unknown)[0]}\": Cannot find field.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("The request contains no messages.")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"The value for {len(messages)} is too large. You passed messages in the request, "
                      f"but the maximum value is {MAX_MESSAGES}.")
    return messages


def _checked(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"Invalid JSON payload received. {where} is not an object.")
    output_only = set(message) & OUTPUT_ONLY_FIELDS
    if output_only:
        raise invalid(f"{where}.{sorted(output_only)[0]} is set by the server and must not be published.")
    unknown = set(message) - MESSAGE_FIELDS
    if unknown:
        raise invalid(f"Invalid JSON payload received. Unknown name \"{sorted(unknown)[0]}\" at '{where}'.")
    out: dict[str, Any] = {}
    data = message.get("data", "")
    if not isinstance(data, str):
        raise invalid(f"Invalid value at '{where}.data' (TYPE_BYTES): not a string")
    try:
        # Google's JSON mapping of bytes takes standard or URL-safe base64.
        raw = base64.b64decode(data.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"Invalid value at '{where}.data' (TYPE_BYTES), Base64 decoding failed") from None
    attributes = message.get("attributes", {})
    if not isinstance(attributes, dict) or not all(isinstance(v, str) for v in attributes.values()):
        raise invalid(f"Invalid value at '{where}.attributes': a map of strings")
    if not raw and not attributes:
        raise invalid("Some messages are empty: a message needs data or at least one attribute.")
    if len(attributes) > MAX_ATTRIBUTES:
        raise invalid(f"Too many attributes: {len(attributes)} > {MAX_ATTRIBUTES}.")
    for key, value in attributes.items():
        if not key or len(key.encode()) > MAX_ATTRIBUTE_KEY_BYTES or key.startswith("goog"):
            raise invalid(f"Invalid attribute key {key!r}.")
        if len(value.encode()) > MAX_ATTRIBUTE_VALUE_BYTES:
            raise invalid(f"The value of attribute {key!r} is longer than {MAX_ATTRIBUTE_VALUE_BYTES} bytes.")
    out["data"] = data
    try:
        out["text"] = raw.decode()
    except UnicodeDecodeError:
        pass
    if attributes:
        out["attributes"] = dict(attributes)
    if "orderingKey" in message:
        out["orderingKey"] = message["orderingKey"]
    return out
