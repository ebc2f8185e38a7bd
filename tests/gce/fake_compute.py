"""A stateful fake of the Compute Engine v1 REST API, the subset node-fencer uses.

No Compute Engine emulator exists, so the GCE side of node-fencer is tested against this
server. It is held to Google's published description of the API (compute.v1.json, shipped
in google-api-python-client; see test_fake_compute.py) and driven by Google's own Python
client in its tests. Only the Python standard library is used.

Served under /compute/v1 (the table ROUTES lists each route beside its discovery method):

    GET  projects/{project}/zones/{zone}/instances/{instance}
    GET  projects/{project}/zones/{zone}/instances                  filter, maxResults, pageToken
    GET  projects/{project}/aggregated/instances                    filter, maxResults, pageToken
    GET  projects/{project}/zones/{zone}/disks/{disk}
    GET  projects/{project}/regions/{region}/disks/{disk}
    POST projects/{project}/zones/{zone}/instances/{instance}/detachDisk   deviceName, requestId
    POST projects/{project}/zones/{zone}/instances/{instance}/attachDisk   forceAttach, requestId
    POST projects/{project}/zones/{zone}/instances/{instance}/stop         requestId, ...
    POST projects/{project}/zones/{zone}/instances/{resource}/testIamPermissions
    POST projects/{project}/zones/{zone}/disks/{resource}/testIamPermissions
    POST projects/{project}/regions/{region}/disks/{resource}/testIamPermissions
    GET  projects/{project}/zones/{zone}/operations/{operation}
    POST projects/{project}/zones/{zone}/operations/{operation}/wait

Under /compute/beta, disks.get and regionDisks.get alone (the PD CSI driver reads disks
through the beta API), answering the v1 shape. POST /_fake/token and the metadata server's
token path stand in for Google's token services (see TOKEN_PATH).

Behaviour kept from GCE: errors in Google's JSON error shape ({"error": {"code", "message",
"errors": [{"message", "domain", "reason"}]}}, no "status" but on 429 and 5xx): 404 notFound
naming the very resource asked for ("The resource 'projects/P/zones/Z/instances/N' was not
found"), or the project when the fake holds nothing in it; 400 invalid for a zone or region it
does not have ("Invalid value for field 'zone': 'Z'. Unknown zone."); 429 rateLimitExceeded,
503 backendError; attach, detach and stop answer a zonal Operation that goes
PENDING, RUNNING, DONE after a configurable delay, and only then change the instance and
the disk; the same requestId returns the same Operation; a boot disk can only be detached
from a TERMINATED instance; an instance being stopped is STOPPING, then TERMINATED; a
recreated instance of the same name has a new id and creationTimestamp; testIamPermissions
answers the asked permissions less those denied (deny_permissions), leaving out an empty
list as GCE does. A query parameter
the method does not declare answers 400, one it declares but this fake does not implement
answers 501, so a client never silently gets less than it asked for.

In process (tests):

    fake = FakeCompute(operation_delay=0.2).start()
    fake.create_instance("proj", "us-central1-a", "node-1", data_disks=2)
    ... fake.endpoint is "http://127.0.0.1:PORT/compute/v1/" ...
    fake.stop()

As a process (like moto_server): `python3 fake_compute.py --port 0` prints the chosen port
alone on the first line of stdout, then serves until killed. State is seeded over HTTP:
POST /_fake/<action> with a JSON object of keyword arguments, for the actions in
CONTROL_ACTIONS (create_instance, create_disk, attach_disk, set_status, delete_instance,
recreate_instance, inject_fault, deny_permissions, configure, reset, create_topic,
inject_publish_fault); GET /_fake/requests lists the requests served on the API (not the control
actions); GET /_fake/state dumps every instance, disk and operation; GET /_fake/published lists
the messages published to each Pub/Sub topic.

The same server answers Pub/Sub's publish method under /v1/ (fake_pubsub.py), for the
notifications.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime as dt
import hashlib
import http.server
import json
import re
import socket
import socketserver
import sys
import threading
import time
import urllib.parse
import uuid
from typing import Any, Callable

from fake_pubsub import FakePubSub

API_PREFIX = "/compute/v1/"
CONTROL_PREFIX = "/_fake/"
# The PD CSI driver reads disks through the beta API (its betaService). The beta Disk is the v1
# Disk with more optional fields, so these routes answer the v1 shape, held to compute.v1.json.
BETA_PREFIX = "/compute/beta/"
BETA_METHODS = frozenset({"compute.disks.get", "compute.regionDisks.get"})
# What the PD CSI driver authenticates with when its cloud config names a token-url: it POSTs
# there with a token of the metadata server's (GCE_METADATA_HOST), and sends the token it gets
# back to Compute Engine. Neither is Compute Engine's, neither is checked: they stand in for
# Google's token services so that Google's own client runs unchanged.
TOKEN_PATH = "/_fake/token"
METADATA_TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
# Compute Engine still names its resources with www.googleapis.com links.
LINK_BASE = "https://www.googleapis.com/compute/v1/"

INSTANCE_STATUSES = (
    "PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED",
    "SUSPENDING", "SUSPENDED", "REPAIRING", "TERMINATED",
)
MAX_RESULTS_LIMIT = 500
# The properties of an AttachedDisk (compute.v1.json) instances.attachDisk accepts in its body.
ATTACHED_DISK_FIELDS = frozenset({
    "architecture", "autoDelete", "boot", "deviceName", "diskEncryptionKey", "diskSizeGb",
    "forceAttach", "guestOsFeatures", "index", "initializeParams", "interface", "kind", "licenses",
    "mode", "savedState", "shieldedInstanceInitialState", "source", "type",
})
DEFAULT_WAIT_TIMEOUT = 120.0  # zoneOperations.wait returns after at most about 2 minutes
# Query parameters every Google API method accepts (compute.v1.json "parameters").
STANDARD_PARAMS = frozenset({
    "$.xgafv", "access_token", "alt", "callback", "key", "oauth_token", "prettyPrint",
    "quotaUser", "uploadType", "upload_protocol", "userIp",
})
# Standard parameters this fake does not implement: answered with 501.
UNIMPLEMENTED_STANDARD_PARAMS = frozenset({"fields", "callback"})
# System parameters that go by their `$` name alone: the API version Google's Rust client pins
# on every call ($apiVersion=2026-09-01). The fake serves one version and accepts any.
DOLLAR_SYSTEM_PARAMS = frozenset({"$apiVersion"})
# Pacific time, as Compute Engine writes its timestamps.
TIMESTAMP_TZ = dt.timezone(dt.timedelta(hours=-8))


# --- time -------------------------------------------------------------------------------


class Clock:
    """Wall-clock seconds; operations complete against it."""

    def now(self) -> float:
        return time.time()


class FakeClock(Clock):
    """A clock that moves only when told to, for deterministic operation timing."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def rfc3339(seconds: float) -> str:
    stamp = dt.datetime.fromtimestamp(seconds, TIMESTAMP_TZ)
    return stamp.isoformat(timespec="milliseconds")


# --- errors -----------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered in Google's JSON error shape."""

    def __init__(self, code: int, reason: str, message: str, *, domain: str = "global",
                 status: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.domain = domain
        self.status = status

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}],
        }
        if self.status:
            error["status"] = self.status
        return {"error": error}


def not_found(resource_path: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{resource_path}' was not found")


def unknown_location(field: str, value: str) -> ApiError:
    """Compute Engine's answer for a zone or region it does not have: 400, not 404."""
    return invalid(field, value, f"Unknown {field}.")


def invalid(field: str, value: str, why: str) -> ApiError:
    return ApiError(400, "invalid", f"Invalid value for field '{field}': '{value}'. {why}")


def fault_error(status: int) -> ApiError:
    """The bodies Compute Engine answers when throttled (429) or unavailable (503)."""
    if status == 429:
        return ApiError(
            429, "rateLimitExceeded",
            "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of "
            "service 'compute.googleapis.com' for consumer 'project_number:123456789012'.",
            domain="usageLimits", status="RESOURCE_EXHAUSTED",
        )
    if status == 503:
        return ApiError(503, "backendError", "Backend Error", status="UNAVAILABLE")
    if status == 500:
        return ApiError(500, "backendError", "Internal error. Please try again.", status="INTERNAL")
    raise ValueError(f"no fault body for status {status} (429, 500 or 503)")


# --- routes -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Route:
    """One served route: its discovery method (compute.v1.json `id`), HTTP method and
    `flatPath`, the method's query parameters the fake implements, and its handler."""

    method_id: str
    http_method: str
    flat_path: str
    params: frozenset[str]
    handler: str
    # The handler also gets the request's JSON body.
    takes_body: bool = False

    def pattern(self) -> re.Pattern[str]:
        regex = re.sub(r"\\\{([a-zA-Z]+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.flat_path))
        return re.compile("^" + regex + "$")


ROUTES: tuple[Route, ...] = (
    Route("compute.instances.get", "GET", "projects/{project}/zones/{zone}/instances/{instance}",
          frozenset(), "instances_get"),
    Route("compute.instances.list", "GET", "projects/{project}/zones/{zone}/instances",
          frozenset({"filter", "maxResults", "pageToken"}), "instances_list"),
    Route("compute.instances.aggregatedList", "GET", "projects/{project}/aggregated/instances",
          frozenset({"filter", "maxResults", "pageToken", "includeAllScopes"}), "instances_aggregated_list"),
    Route("compute.disks.get", "GET", "projects/{project}/zones/{zone}/disks/{disk}",
          frozenset(), "disks_get"),
    Route("compute.regionDisks.get", "GET", "projects/{project}/regions/{region}/disks/{disk}",
          frozenset(), "region_disks_get"),
    Route("compute.instances.detachDisk", "POST",
          "projects/{project}/zones/{zone}/instances/{instance}/detachDisk",
          frozenset({"deviceName", "requestId"}), "instances_detach_disk"),
    Route("compute.instances.attachDisk", "POST",
          "projects/{project}/zones/{zone}/instances/{instance}/attachDisk",
          frozenset({"forceAttach", "requestId"}), "instances_attach_disk", takes_body=True),
    Route("compute.instances.stop", "POST", "projects/{project}/zones/{zone}/instances/{instance}/stop",
          frozenset({"requestId", "discardLocalSsd", "noGracefulShutdown"}), "instances_stop"),
    Route("compute.instances.testIamPermissions", "POST",
          "projects/{project}/zones/{zone}/instances/{resource}/testIamPermissions",
          frozenset(), "instances_test_iam_permissions", takes_body=True),
    Route("compute.disks.testIamPermissions", "POST",
          "projects/{project}/zones/{zone}/disks/{resource}/testIamPermissions",
          frozenset(), "disks_test_iam_permissions", takes_body=True),
    Route("compute.regionDisks.testIamPermissions", "POST",
          "projects/{project}/regions/{region}/disks/{resource}/testIamPermissions",
          frozenset(), "region_disks_test_iam_permissions", takes_body=True),
    Route("compute.zoneOperations.get", "GET", "projects/{project}/zones/{zone}/operations/{operation}",
          frozenset(), "zone_operations_get"),
    Route("compute.zoneOperations.wait", "POST",
          "projects/{project}/zones/{zone}/operations/{operation}/wait",
          frozenset(), "zone_operations_wait"),
)

# Every query parameter each route's discovery method declares (path parameters aside), so
# that one declared but not implemented answers 501 and one not declared answers 400. The
# discovery test checks this table against compute.v1.json.
DECLARED_PARAMS: dict[str, frozenset[str]] = {
    "compute.instances.get": frozenset(),
    "compute.instances.list": frozenset({"filter", "maxResults", "orderBy", "pageToken"}),
    "compute.instances.aggregatedList": frozenset({
        "filter", "includeAllScopes", "maxResults", "orderBy", "pageToken", "serviceProjectNumber",
    }),
    "compute.disks.get": frozenset(),
    "compute.regionDisks.get": frozenset(),
    "compute.instances.detachDisk": frozenset({"deviceName", "requestId"}),
    "compute.instances.attachDisk": frozenset({"forceAttach", "requestId"}),
    "compute.instances.stop": frozenset({"discardLocalSsd", "noGracefulShutdown", "requestId"}),
    "compute.instances.testIamPermissions": frozenset(),
    "compute.disks.testIamPermissions": frozenset(),
    "compute.regionDisks.testIamPermissions": frozenset(),
    "compute.zoneOperations.get": frozenset(),
    "compute.zoneOperations.wait": frozenset(),
}

_COMPILED = tuple((route, route.pattern()) for route in ROUTES)


def match_route(http_method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    for route, pattern in _COMPILED:
        m = pattern.match(path)
        if m and route.http_method == http_method:
            return route, {k: urllib.parse.unquote(v) for k, v in m.groupdict().items()}
    return None


def path_matches_other_method(path: str) -> bool:
    return any(pattern.match(path) for _, pattern in _COMPILED)


# --- list filters -----------------------------------------------------------------------

_FILTER_TOKEN = re.compile(
    r"""\s*(?:
        (?P<lp>\() | (?P<rp>\)) |
        (?P<op>!=|>=|<=|=|:|<|>) |
        (?P<quoted>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*') |
        (?P<word>[^\s()=!:<>"']+)
    )""",
    re.VERBOSE,
)


class FilterError(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _FILTER_TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise FilterError(text)
        pos = m.end()
        kind = m.lastgroup or ""
        value = m.group(kind)
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out.append((kind, value))
    return out


def compile_filter(text: str) -> Callable[[dict[str, Any]], bool]:
    """A predicate for Compute Engine's list filter: `field OP value` terms (OP one of =,
    !=, :, <, >, <=, >=, and the regular-expression eq and ne), joined by AND (or by a space),
    OR, NOT and parentheses. Fields are dotted paths (labels.env, scheduling.preemptible)."""
    tokens = _tokens(text)
    pos = 0

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal pos
        if pos >= len(tokens):
            raise FilterError(text)
        pos += 1
        return tokens[pos - 1]

    def parse_or() -> Callable[[dict[str, Any]], bool]:
        terms = [parse_and()]
        while (t := peek()) and t == ("word", "OR"):
            take()
            terms.append(parse_and())
        return lambda r: any(term(r) for term in terms)

    def parse_and() -> Callable[[dict[str, Any]], bool]:
        terms = [parse_not()]
        while (t := peek()) and t[0] != "rp" and t != ("word", "OR"):
            if t == ("word", "AND"):
                take()
            terms.append(parse_not())
        return lambda r: all(term(r) for term in terms)

    def parse_not() -> Callable[[dict[str, Any]], bool]:
        if peek() == ("word", "NOT"):
            take()
            inner = parse_primary()
            return lambda r: not inner(r)
        return parse_primary()

    def parse_primary() -> Callable[[dict[str, Any]], bool]:
        kind, value = take()
        if kind == "lp":
            inner = parse_or()
            if take()[0] != "rp":
                raise FilterError(text)
            return inner
        if kind != "word":
            raise FilterError(text)
        field = value
        op_kind, op = take()
        if op_kind != "op" and not (op_kind == "word" and op in ("eq", "ne")):
            raise FilterError(text)
        operand_kind, operand = take()
        if operand_kind not in ("word", "quoted"):
            raise FilterError(text)
        return _comparison(field, op, operand)

    predicate = parse_or()
    if pos != len(tokens):
        raise FilterError(text)
    return predicate


def _values(resource: dict[str, Any], path: str) -> list[str]:
    """The values at a dotted path as filter text; a repeated field gives each element's."""
    values: list[Any] = [resource]
    for part in path.split("."):
        values = [v[part] for v in values if isinstance(v, dict) and part in v]
        values = [x for v in values for x in (v if isinstance(v, list) else [v])]
    return ["true" if v is True else "false" if v is False else v if isinstance(v, str) else json.dumps(v)
            for v in values]


def _comparison(field: str, op: str, operand: str) -> Callable[[dict[str, Any]], bool]:
    """A term over a field; on a repeated field it holds when it holds for one element (for
    != and ne, when the positive term holds for none)."""
    if op in ("eq", "ne"):
        try:
            regex = re.compile(operand)
        except re.error as e:
            raise FilterError(operand) from e
        matches: Callable[[str], bool] = lambda v: regex.fullmatch(v) is not None  # noqa: E731
    elif op == ":":
        glob = re.compile(".*".join(re.escape(p) for p in operand.split("*")), re.IGNORECASE)
        matches = lambda v: operand == "*" or glob.search(v) is not None  # noqa: E731
    elif op in ("=", "!="):
        matches = lambda v: v == operand  # noqa: E731
    else:
        def matches(v: str) -> bool:
            try:
                left, right = float(v), float(operand)
            except ValueError:
                left, right = v, operand  # type: ignore[assignment]
            return {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]
    if op in ("!=", "ne"):
        return lambda r: not any(matches(v) for v in _values(r, field) or [""])
    if op == ":":
        return lambda r: any(matches(v) for v in _values(r, field))
    return lambda r: any(matches(v) for v in _values(r, field) or [""])


# --- state ------------------------------------------------------------------------------


@dataclasses.dataclass
class Fault:
    method_id: str  # a discovery method id, or "*" for every compute route
    status: int
    remaining: int


@dataclasses.dataclass
class Operation:
    project: str
    zone: str
    name: str
    id: str
    operation_type: str
    target_link: str
    target_id: str
    user: str
    insert_time: float
    start_time: float
    done_time: float
    effect: Callable[[], None] | None
    request_id: str | None
    device_name: str | None = None  # detachDisk's target device
    disk_link: str | None = None  # attachDisk's disk
    attach_mode: str | None = None  # attachDisk's mode
    done: bool = False
    end_time: float | None = None

    def status(self, now: float) -> str:
        if self.done:
            return "DONE"
        return "PENDING" if now < self.start_time else "RUNNING"

    def to_json(self, now: float) -> dict[str, Any]:
        status = self.status(now)
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": self.id,
            "name": self.name,
            "zone": f"{LINK_BASE}projects/{self.project}/zones/{self.zone}",
            "operationType": self.operation_type,
            "targetLink": self.target_link,
            "targetId": self.target_id,
            "status": status,
            "user": self.user,
            "progress": 100 if status == "DONE" else 0,
            "insertTime": rfc3339(self.insert_time),
            "selfLink": f"{LINK_BASE}projects/{self.project}/zones/{self.zone}/operations/{self.name}",
        }
        if status != "PENDING":
            out["startTime"] = rfc3339(self.start_time)
        if status == "DONE" and self.end_time is not None:
            out["endTime"] = rfc3339(self.end_time)
        return out


class FakeCompute:
    """The fake's state and its HTTP server."""

    def __init__(self, *, clock: Clock | None = None, operation_delay: float = 0.5,
                 operation_pending: float = 0.0, wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
                 host: str = "127.0.0.1", port: int = 0,
                 user: str = "node-fencer@example-project.iam.gserviceaccount.com") -> None:
        self.clock = clock or Clock()
        self.operation_delay = operation_delay
        self.operation_pending = operation_pending
        self.wait_timeout = wait_timeout
        self.user = user
        self._host = host
        self._port = port
        self._lock = threading.RLock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._disks: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._operations: dict[tuple[str, str, str], Operation] = {}
        self._request_ids: dict[tuple[str, str, str], str] = {}
        self._zones: dict[str, set[str]] = {}
        self._faults: list[Fault] = []
        self._denied: set[str] = set()
        self._serial = 0
        self.exchanges: list[dict[str, Any]] = []
        self.pubsub = FakePubSub()

    # --- server lifecycle ---------------------------------------------------------------

    def start(self) -> FakeCompute:
        fake = self

        class Handler(_Handler):
            pass

        Handler.fake = fake
        server = _Server((self._host, self._port), Handler)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-compute", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeCompute:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "the fake is not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}/"

    @property
    def endpoint(self) -> str:
        """The API endpoint a client is pointed at (the discovery document's baseUrl)."""
        return f"http://{self._host}:{self.port}{API_PREFIX}"

    # --- seeding ------------------------------------------------------------------------

    def create_topic(self, project: str, topic: str) -> dict[str, Any]:
        """A Pub/Sub topic the notifications may be published to (fake_pubsub.py)."""
        return self.pubsub.create_topic(project, topic)

    def inject_publish_fault(self, status: int, count: int = 1) -> None:
        """The next `count` Pub/Sub publish calls answer `status` (429, 500 or 503)."""
        self.pubsub.inject_fault(status, count)

    def reset(self) -> None:
        with self._lock:
            self._reset_state()

    def configure(self, *, operation_delay: float | None = None, operation_pending: float | None = None,
                  wait_timeout: float | None = None, user: str | None = None) -> None:
        with self._lock:
            if operation_delay is not None:
                self.operation_delay = float(operation_delay)
            if operation_pending is not None:
                self.operation_pending = float(operation_pending)
            if wait_timeout is not None:
                self.wait_timeout = float(wait_timeout)
            if user is not None:
                self.user = user

    def add_zone(self, project: str, zone: str) -> None:
        with self._lock:
            self._zones.setdefault(project, set()).add(zone)

    def _next_id(self) -> str:
        self._serial += 1
        # 19 digits, like Compute Engine's unsigned 64-bit ids.
        return str(4_000_000_000_000_000_000 + self._serial * 7_919_000_013)

    def _fingerprint(self, *parts: str) -> str:
        digest = hashlib.sha256("/".join(parts + (str(self._serial),)).encode()).digest()[:8]
        # Compute Engine writes its `byte` fields in URL-safe base64, which Google's Rust client
        # insists on (it refuses `+` and `/`).
        return base64.urlsafe_b64encode(digest).decode()

    def create_disk(self, project: str, name: str, *, zone: str | None = None, region: str | None = None,
                    replica_zones: list[str] | None = None, size_gb: int = 10, disk_type: str = "pd-balanced",
                    source_image: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A zonal disk (zone=...) or a regional one (region=..., replica_zones=[two zones])."""
        if (zone is None) == (region is None):
            raise ValueError("a disk has exactly one of zone or region")
        with self._lock:
            now = self.clock.now()
            if zone is not None:
                key = (project, "zones", zone, name)
                self.add_zone(project, zone)
            else:
                assert region is not None
                key = (project, "regions", region, name)
                replica_zones = replica_zones or [f"{region}-a", f"{region}-b"]
                if len(replica_zones) != 2 or any(not z.startswith(region + "-") for z in replica_zones):
                    raise ValueError(f"a regional disk has two replica zones in {region}")
                for z in replica_zones:
                    self.add_zone(project, z)
            if key in self._disks:
                raise ValueError(f"disk {key} exists")
            scope, location = key[1], key[2]
            disk: dict[str, Any] = {
                "kind": "compute#disk",
                "id": self._next_id(),
                "creationTimestamp": rfc3339(now),
                "name": name,
                "sizeGb": str(size_gb),
                "status": "READY",
                "selfLink": f"{LINK_BASE}projects/{project}/{scope}/{location}/disks/{name}",
                "type": f"{LINK_BASE}projects/{project}/{scope}/{location}/diskTypes/{disk_type}",
                "labelFingerprint": self._fingerprint(project, name, "labels"),
                "physicalBlockSizeBytes": "4096",
                "users": [],
            }
            if zone is not None:
                disk["zone"] = f"{LINK_BASE}projects/{project}/zones/{zone}"
            else:
                disk["region"] = f"{LINK_BASE}projects/{project}/regions/{region}"
                disk["replicaZones"] = [f"{LINK_BASE}projects/{project}/zones/{z}" for z in replica_zones or []]
            if source_image:
                disk["sourceImage"] = source_image
            if labels:
                disk["labels"] = dict(labels)
            self._disks[key] = disk
            return json.loads(json.dumps(disk))

    def create_instance(self, project: str, zone: str, name: str, *, data_disks: int | list[dict[str, Any]] = 0,
                        status: str = "RUNNING", network_ip: str | None = None,
                        labels: dict[str, str] | None = None, machine_type: str = "e2-standard-4",
                        boot_disk: str | None = None) -> dict[str, Any]:
        """An instance with a boot disk (created with it, deleted with it) and data disks.

        data_disks: a count (zonal disks NAME-data-0, ...) or a list of specs, each with
        `name` and optionally `region` (a regional disk, with `replica_zones`), `size_gb`,
        `device_name` (default: the disk name, as the PD CSI driver attaches them) and
        `mode` (READ_WRITE or READ_ONLY). A disk that exists already is attached as it is."""
        if status not in INSTANCE_STATUSES:
            raise ValueError(f"unknown instance status {status}")
        with self._lock:
            key = (project, zone, name)
            if key in self._instances:
                raise ValueError(f"instance {key} exists")
            self.add_zone(project, zone)
            now = self.clock.now()
            self_link = f"{LINK_BASE}projects/{project}/zones/{zone}/instances/{name}"
            region = zone.rsplit("-", 1)[0]
            boot_name = boot_disk or name
            boot_key = (project, "zones", zone, boot_name)
            if boot_key not in self._disks:
                self.create_disk(
                    project, boot_name, zone=zone, size_gb=20,
                    source_image=f"{LINK_BASE}projects/cos-cloud/global/images/cos-117-18613-164-4",
                )
            specs = (
                [{"name": f"{name}-data-{i}"} for i in range(data_disks)]
                if isinstance(data_disks, int) else list(data_disks)
            )
            attached = [self._attached(boot_key, "persistent-disk-0", 0, boot=True, auto_delete=True)]
            for index, spec in enumerate(specs, start=1):
                disk_key = self._ensure_disk(project, zone, spec)
                attached.append(self._attached(
                    disk_key, spec.get("device_name") or spec["name"], index,
                    mode=spec.get("mode", "READ_WRITE"),
                ))
            instance: dict[str, Any] = {
                "kind": "compute#instance",
                "id": self._next_id(),
                "creationTimestamp": rfc3339(now),
                "name": name,
                "description": "",
                "tags": {"fingerprint": self._fingerprint(project, name, "tags")},
                "machineType": f"{LINK_BASE}projects/{project}/zones/{zone}/machineTypes/{machine_type}",
                "status": status,
                "zone": f"{LINK_BASE}projects/{project}/zones/{zone}",
                "canIpForward": False,
                "networkInterfaces": [{
                    "kind": "compute#networkInterface",
                    "network": f"{LINK_BASE}projects/{project}/global/networks/default",
                    "subnetwork": f"{LINK_BASE}projects/{project}/regions/{region}/subnetworks/default",
                    "networkIP": network_ip or f"10.128.0.{2 + self._serial % 250}",
                    "name": "nic0",
                    "fingerprint": self._fingerprint(project, name, "nic0"),
                    "stackType": "IPV4_ONLY",
                }],
                "disks": attached,
                "metadata": {"kind": "compute#metadata", "fingerprint": self._fingerprint(project, name, "md")},
                "selfLink": self_link,
                "scheduling": {
                    "onHostMaintenance": "MIGRATE",
                    "automaticRestart": True,
                    "preemptible": False,
                    "provisioningModel": "STANDARD",
                },
                "labels": dict(labels or {}),
                "labelFingerprint": self._fingerprint(project, name, "labels"),
                "startRestricted": False,
                "deletionProtection": False,
                "fingerprint": self._fingerprint(project, name),
                "lastStartTimestamp": rfc3339(now),
            }
            if not instance["labels"]:
                del instance["labels"]
            if status in ("TERMINATED", "STOPPED"):
                instance["lastStopTimestamp"] = rfc3339(now)
            for entry in attached:
                self._disk_by_link(entry["source"])["users"].append(self_link)
                self._disk_by_link(entry["source"])["lastAttachTimestamp"] = rfc3339(now)
            self._instances[key] = instance
            return json.loads(json.dumps(instance))

    def _ensure_disk(self, project: str, zone: str, spec: dict[str, Any]) -> tuple[str, str, str, str]:
        if spec.get("region"):
            key = (project, "regions", spec["region"], spec["name"])
            if key not in self._disks:
                self.create_disk(project, spec["name"], region=spec["region"],
                                 replica_zones=spec.get("replica_zones"), size_gb=spec.get("size_gb", 10))
        else:
            key = (project, "zones", zone, spec["name"])
            if key not in self._disks:
                self.create_disk(project, spec["name"], zone=zone, size_gb=spec.get("size_gb", 10))
        return key

    def _attached(self, disk_key: tuple[str, str, str, str], device_name: str, index: int, *,
                  boot: bool = False, auto_delete: bool = False, mode: str = "READ_WRITE") -> dict[str, Any]:
        disk = self._disks[disk_key]
        return {
            "kind": "compute#attachedDisk",
            "type": "PERSISTENT",
            "mode": mode,
            "source": disk["selfLink"],
            "deviceName": device_name,
            "index": index,
            "boot": boot,
            "autoDelete": auto_delete,
            "interface": "SCSI",
            "diskSizeGb": disk["sizeGb"],
        }

    def _disk_by_link(self, link: str) -> dict[str, Any]:
        for disk in self._disks.values():
            if disk["selfLink"] == link:
                return disk
        raise KeyError(link)

    def set_status(self, project: str, zone: str, name: str, status: str) -> dict[str, Any]:
        """Sets an instance's status as the platform would (a crash, a preemption, ...)."""
        if status not in INSTANCE_STATUSES:
            raise ValueError(f"unknown instance status {status}")
        with self._lock:
            instance = self._instances[(project, zone, name)]
            instance["status"] = status
            if status in ("TERMINATED", "STOPPED"):
                instance["lastStopTimestamp"] = rfc3339(self.clock.now())
            elif status == "SUSPENDED":
                instance["lastSuspendedTimestamp"] = rfc3339(self.clock.now())
            elif status == "RUNNING":
                instance["lastStartTimestamp"] = rfc3339(self.clock.now())
            return json.loads(json.dumps(instance))

    def attach_disk(self, project: str, zone: str, name: str, disk: str, *, device_name: str | None = None,
                    mode: str = "READ_WRITE") -> dict[str, Any]:
        """Attaches an existing disk to an instance at once, as a DONE instances.attachDisk leaves
        them, for a scene that starts with a disk already attached. `disk` is the disk's path as a
        PD CSI volume handle names it (projects/P/zones/Z/disks/D or projects/P/regions/R/disks/D);
        `device_name` defaults to the disk's name, as the PD CSI driver attaches it. Refused as
        GCE refuses instances.attachDisk (see _check_attach), with GCE's message in a ValueError.
        Returns the instance."""
        with self._lock:
            self._tick()
            try:
                instance, key, device = self._check_attach(project, zone, name, disk, device_name, mode)
            except ApiError as e:
                raise ValueError(e.message) from None
            self._attach_now(instance, key, device, mode)
            return json.loads(json.dumps(instance))

    def _check_attach(self, project: str, zone: str, name: str, disk: str, device_name: str | None,
                      mode: str) -> tuple[dict[str, Any], tuple[str, str, str, str], str]:
        """What GCE refuses in instances.attachDisk, as it answers (called under the lock): a
        missing instance or disk (404); a disk outside the instance's zone, a regional one
        outside its replica zones; a disk in use read-write (by any instance, this one too) or in
        use at all for a read-write attachment (400 resourceInUseByAnotherResource), counting
        attachments still in flight; a device name the instance already has. Returns the
        instance, the disk's key and the device name."""
        if mode not in ("READ_WRITE", "READ_ONLY"):
            raise invalid("resource.mode", mode, "Expected READ_WRITE or READ_ONLY.")
        parts = disk.split("/")
        if len(parts) != 6 or parts[0] != "projects" or parts[2] not in ("zones", "regions") \
                or parts[4] != "disks":
            raise invalid("resource.source", disk, "Expected projects/P/zones/Z/disks/D or projects/P/regions/R/disks/D.")
        instance = self._instances.get((project, zone, name))
        if instance is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        key = (parts[1], parts[2], parts[3], parts[5])
        entry = self._disks.get(key)
        if entry is None:
            raise not_found(disk)
        link = entry["selfLink"]
        if entry.get("zone") != instance["zone"] and instance["zone"] not in entry.get("replicaZones", []):
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.source': '{link}'. "
                                           "Disk must be in the same zone as the instance.")
        users = [(i["selfLink"], d["mode"]) for i in self._instances.values() if i["selfLink"] in entry["users"]
                 for d in i["disks"] if d["source"] == link]
        users += [(op.target_link, op.attach_mode) for op in self._operations.values()
                  if not op.done and op.operation_type == "attachDisk" and op.disk_link == link]
        if users and (mode == "READ_WRITE" or any(m == "READ_WRITE" for _, m in users)):
            holder = users[0][0][len(LINK_BASE):]
            raise ApiError(400, "resourceInUseByAnotherResource",
                           f"The disk resource '{disk}' is already being used by '{holder}'")
        device = device_name or parts[5]
        if any(d["deviceName"] == device for d in instance["disks"]):
            raise invalid("resource.deviceName", device, "The device name is already in use on the instance.")
        return instance, key, device

    def _attach_now(self, instance: dict[str, Any], key: tuple[str, str, str, str], device: str,
                    mode: str) -> None:
        entry = self._disks[key]
        index = 1 + max((d["index"] for d in instance["disks"]), default=-1)
        instance["disks"].append(self._attached(key, device, index, mode=mode))
        entry["users"].append(instance["selfLink"])
        entry["lastAttachTimestamp"] = rfc3339(self.clock.now())

    def delete_instance(self, project: str, zone: str, name: str) -> None:
        """Deletes an instance; its boot disk (autoDelete) goes with it, its data disks stay."""
        with self._lock:
            instance = self._instances.pop((project, zone, name))
            for entry in instance["disks"]:
                disk = self._disk_by_link(entry["source"])
                disk["users"] = [u for u in disk["users"] if u != instance["selfLink"]]
                disk["lastDetachTimestamp"] = rfc3339(self.clock.now())
                if entry.get("autoDelete"):
                    self._disks = {k: d for k, d in self._disks.items() if d is not disk}

    def recreate_instance(self, project: str, zone: str, name: str, *,
                          status: str = "RUNNING") -> dict[str, Any]:
        """Deletes the instance and creates one of the same name, with the same data disks
        and a fresh boot disk: a new id and creationTimestamp, as a MIG recreation gives."""
        with self._lock:
            old = self._instances[(project, zone, name)]
            specs = []
            for entry in old["disks"]:
                if entry["boot"]:
                    continue
                parts = entry["source"][len(LINK_BASE):].split("/")
                spec = {"name": parts[-1], "device_name": entry["deviceName"], "mode": entry["mode"]}
                if parts[2] == "regions":
                    spec["region"] = parts[3]
                specs.append(spec)
            network_ip = old["networkInterfaces"][0]["networkIP"]
            self.delete_instance(project, zone, name)
            return self.create_instance(project, zone, name, data_disks=specs, status=status,
                                        network_ip=network_ip, labels=old.get("labels"))

    def instance(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self._tick()
            found = self._instances.get((project, zone, name))
            return json.loads(json.dumps(found)) if found else None

    def disk(self, project: str, name: str, *, zone: str | None = None,
             region: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            self._tick()
            key = (project, "zones", zone, name) if zone else (project, "regions", region, name)
            found = self._disks.get(key)  # type: ignore[arg-type]
            return json.loads(json.dumps(found)) if found else None

    def inject_fault(self, method_id: str, status: int, count: int = 1) -> None:
        """Answers the next `count` requests to the discovery method `method_id` (or "*",
        every route) with `status`: 429 rateLimitExceeded, 500 or 503 backendError."""
        fault_error(status)  # validates the status
        if method_id != "*" and method_id not in {r.method_id for r in ROUTES}:
            raise ValueError(f"no route serves {method_id}")
        with self._lock:
            self._faults.append(Fault(method_id, status, count))

    def deny_permissions(self, permissions: list[str]) -> None:
        """From now on testIamPermissions leaves these out of its answers (an empty list
        grants everything again)."""
        if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
            raise ValueError("permissions is a list of strings")
        with self._lock:
            self._denied = set(permissions)

    def state(self) -> dict[str, Any]:
        with self._lock:
            self._tick()
            now = self.clock.now()
            return {
                "instances": list(self._instances.values()),
                "disks": list(self._disks.values()),
                "operations": [op.to_json(now) for op in self._operations.values()],
            }

    # --- operations ---------------------------------------------------------------------

    def _tick(self) -> None:
        """Completes every operation whose time has come (called under the lock)."""
        now = self.clock.now()
        for op in sorted(self._operations.values(), key=lambda o: o.done_time):
            if not op.done and now >= op.done_time:
                if op.effect is not None:
                    op.effect()
                op.done = True
                op.end_time = op.done_time

    def _new_operation(self, project: str, zone: str, operation_type: str, instance: dict[str, Any],
                       effect: Callable[[], None] | None, request_id: str | None) -> Operation:
        now = self.clock.now()
        ms = int(now * 1000)
        suffix = uuid.uuid4().hex
        op = Operation(
            project=project, zone=zone,
            name=f"operation-{ms}-{suffix[:13]}-{suffix[13:21]}-{suffix[21:29]}",
            id=self._next_id(), operation_type=operation_type,
            target_link=instance["selfLink"], target_id=instance["id"], user=self.user,
            insert_time=now, start_time=now + self.operation_pending,
            done_time=now + max(self.operation_pending, self.operation_delay),
            effect=effect, request_id=request_id,
        )
        self._operations[(project, zone, op.name)] = op
        if request_id:
            self._request_ids[(project, zone, request_id)] = op.name
        return op

    def _existing_request(self, project: str, zone: str, request_id: str | None) -> Operation | None:
        if not request_id:
            return None
        if not _valid_request_id(request_id):
            raise invalid("requestId", request_id,
                          "The request ID must be a valid UUID with the exception that zero UUID is not supported.")
        name = self._request_ids.get((project, zone, request_id))
        return self._operations.get((project, zone, name)) if name else None

    # --- handlers (called under the lock) -----------------------------------------------

    def _get_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        self._check_zone(project, zone)
        instance = self._instances.get((project, zone, name))
        if instance is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return instance

    def _check_project(self, project: str) -> None:
        # A project the fake holds nothing in stands for one that does not exist: Compute Engine
        # names the project, not the resource asked for.
        if project not in self._zones:
            raise not_found(f"projects/{project}")

    def _check_zone(self, project: str, zone: str) -> None:
        self._check_project(project)
        if zone not in self._zones[project]:
            raise unknown_location("zone", zone)

    def _check_region(self, project: str, region: str) -> None:
        self._check_project(project)
        if not any(z.rsplit("-", 1)[0] == region for z in self._zones[project]):
            raise unknown_location("region", region)

    def instances_get(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        return self._get_instance(p["project"], p["zone"], p["instance"])

    def instances_list(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        project, zone = p["project"], p["zone"]
        self._check_zone(project, zone)
        items = sorted(
            (i for (pr, z, _), i in self._instances.items() if pr == project and z == zone),
            key=lambda i: i["name"],
        )
        page, token = _page(_filtered(items, q), q, f"list/{project}/{zone}")
        out: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{project}/zones/{zone}/instances",
            "selfLink": f"{LINK_BASE}projects/{project}/zones/{zone}/instances",
        }
        if page:
            out["items"] = page
        if token:
            out["nextPageToken"] = token
        return out

    def instances_aggregated_list(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        project = p["project"]
        items = sorted(
            ((z, i) for (pr, z, _), i in self._instances.items() if pr == project),
            key=lambda zi: (zi[0], zi[1]["name"]),
        )
        predicate = _predicate(q)
        page, token = _page([zi for zi in items if predicate(zi[1])], q, f"aggregated/{project}")
        scopes: dict[str, Any] = {}
        for zone in sorted(self._zones.get(project, set())):
            scope = f"zones/{zone}"
            in_scope = [i for z, i in page if z == zone]
            if in_scope:
                scopes[scope] = {"instances": in_scope}
            else:
                scopes[scope] = {"warning": {
                    "code": "NO_RESULTS_ON_PAGE",
                    "message": f"There are no results for scope '{scope}' on this page.",
                    "data": [{"key": "scope", "value": scope}],
                }}
        out: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": scopes,
            "selfLink": f"{LINK_BASE}projects/{project}/aggregated/instances",
        }
        if token:
            out["nextPageToken"] = token
        return out

    def disks_get(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        self._check_zone(p["project"], p["zone"])
        return self._disk(p["project"], "zones", p["zone"], p["disk"])

    def region_disks_get(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        self._check_region(p["project"], p["region"])
        return self._disk(p["project"], "regions", p["region"], p["disk"])

    def _disk(self, project: str, kind: str, location: str, name: str) -> dict[str, Any]:
        """A zonal (`kind` "zones") or regional ("regions") disk, as served."""
        disk = self._disks.get((project, kind, location, name))
        if disk is None:
            raise not_found(f"projects/{project}/{kind}/{location}/disks/{name}")
        return _without_empty_users(disk)

    def instances_detach_disk(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        project, zone, name = p["project"], p["zone"], p["instance"]
        instance = self._get_instance(project, zone, name)
        request_id = q.get("requestId")
        if (existing := self._existing_request(project, zone, request_id)) is not None:
            return existing.to_json(self.clock.now())
        device_name = q.get("deviceName")
        if not device_name:
            raise ApiError(400, "required", "Required field 'deviceName' not specified")
        entry = next((d for d in instance["disks"] if d["deviceName"] == device_name), None)
        if entry is None:
            raise ApiError(400, "invalid", f"No attached disk found with device name '{device_name}'")
        if entry["boot"] and instance["status"] != "TERMINATED":
            raise ApiError(
                400, "invalidResourceUsage",
                "Invalid resource usage: 'To detach the boot disk, the instance must be in TERMINATED state.'.",
            )
        for op in self._operations.values():
            if not op.done and op.operation_type == "detachDisk" and op.target_link == instance["selfLink"] \
                    and op.device_name == device_name:
                raise ApiError(400, "resourceNotReady",
                               f"The resource '{entry['source'][len(LINK_BASE):]}' is not ready")
        instance_id, instance_link, disk_link = instance["id"], instance["selfLink"], entry["source"]

        def detach() -> None:
            current = self._instances.get((project, zone, name))
            if current is not None and current["id"] == instance_id:
                current["disks"] = [d for d in current["disks"] if d["deviceName"] != device_name]
            try:
                disk = self._disk_by_link(disk_link)
            except KeyError:
                return
            disk["users"] = [u for u in disk["users"] if u != instance_link]
            disk["lastDetachTimestamp"] = rfc3339(self.clock.now())

        op = self._new_operation(project, zone, "detachDisk", instance, detach, request_id)
        op.device_name = device_name
        return op.to_json(self.clock.now())

    def instances_attach_disk(self, p: dict[str, str], q: dict[str, str], body: Any) -> dict[str, Any]:
        """Checked at once as GCE checks it (_check_attach); the operation attaches when DONE.
        `source` may be a full link (any host, as a client's base path makes it) or a partial
        path. forceAttach=true (regional disks only, on GCE) is not implemented: 501."""
        project, zone, name = p["project"], p["zone"], p["instance"]
        instance = self._get_instance(project, zone, name)
        request_id = q.get("requestId")
        if (existing := self._existing_request(project, zone, request_id)) is not None:
            return existing.to_json(self.clock.now())
        force = q.get("forceAttach", "false")
        if force not in ("true", "false"):
            raise invalid("forceAttach", force, "Expected a boolean.")
        if force == "true" or (isinstance(body, dict) and body.get("forceAttach") is True):
            raise ApiError(501, "notImplemented", "forceAttach is not implemented by this fake.")
        if not isinstance(body, dict) or not isinstance(body.get("source"), str):
            raise ApiError(400, "required", "Required field 'resource.source' not specified")
        unknown = set(body) - ATTACHED_DISK_FIELDS
        if unknown:
            raise ApiError(400, "invalid", f"Invalid JSON payload received. Unknown name \"{sorted(unknown)[0]}\".")
        source = re.search(r"(?:^|/)(projects/[^/]+/(?:zones|regions)/[^/]+/disks/[^/]+)$", body["source"])
        if source is None:
            raise invalid("resource.source", body["source"], "Expected a disk's link.")
        if body.get("type", "PERSISTENT") != "PERSISTENT":
            raise ApiError(501, "notImplemented", "Only PERSISTENT disks are implemented by this fake.")
        mode = body.get("mode", "READ_WRITE")
        _, key, device = self._check_attach(project, zone, name, source.group(1), body.get("deviceName"), mode)
        instance_id = instance["id"]

        def attach() -> None:
            current = self._instances.get((project, zone, name))
            if current is not None and current["id"] == instance_id and key in self._disks \
                    and not any(d["deviceName"] == device for d in current["disks"]):
                self._attach_now(current, key, device, mode)

        op = self._new_operation(project, zone, "attachDisk", instance, attach, request_id)
        op.disk_link = self._disks[key]["selfLink"]
        op.attach_mode = mode
        return op.to_json(self.clock.now())

    def instances_stop(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        project, zone, name = p["project"], p["zone"], p["instance"]
        instance = self._get_instance(project, zone, name)
        request_id = q.get("requestId")
        if (existing := self._existing_request(project, zone, request_id)) is not None:
            return existing.to_json(self.clock.now())
        for flag in ("discardLocalSsd", "noGracefulShutdown"):
            if flag in q and q[flag] not in ("true", "false"):
                raise invalid(flag, q[flag], "Expected a boolean.")
        instance_id = instance["id"]
        already_off = instance["status"] in ("TERMINATED", "STOPPED")
        if not already_off:
            instance["status"] = "STOPPING"

        def stopped() -> None:
            current = self._instances.get((project, zone, name))
            # The same instance (a recreated one of the same name has another id), not yet off.
            if current is not None and current["id"] == instance_id \
                    and current["status"] not in ("TERMINATED", "STOPPED"):
                current["status"] = "TERMINATED"
                current["lastStopTimestamp"] = rfc3339(self.clock.now())

        op = self._new_operation(project, zone, "stop", instance, None if already_off else stopped, request_id)
        return op.to_json(self.clock.now())

    def instances_test_iam_permissions(self, p: dict[str, str], q: dict[str, str], body: Any) -> dict[str, Any]:
        self._get_instance(p["project"], p["zone"], p["resource"])
        return self._granted(body)

    def disks_test_iam_permissions(self, p: dict[str, str], q: dict[str, str], body: Any) -> dict[str, Any]:
        self._check_zone(p["project"], p["zone"])
        self._disk(p["project"], "zones", p["zone"], p["resource"])
        return self._granted(body)

    def region_disks_test_iam_permissions(self, p: dict[str, str], q: dict[str, str],
                                          body: Any) -> dict[str, Any]:
        self._check_region(p["project"], p["region"])
        self._disk(p["project"], "regions", p["region"], p["resource"])
        return self._granted(body)

    def _granted(self, body: Any) -> dict[str, Any]:
        """The asked permissions the caller holds: all but the denied ones."""
        if not isinstance(body, dict) or set(body) - {"permissions"}:
            raise ApiError(400, "invalid", "Invalid JSON payload received: expected a TestPermissionsRequest.")
        asked = body.get("permissions", [])
        if not isinstance(asked, list) or not all(isinstance(a, str) for a in asked):
            raise invalid("permissions", str(asked), "Expected a list of strings.")
        if any("*" in a for a in asked):
            raise invalid("permissions", str(asked), "Permissions with wildcards are not allowed.")
        granted = [a for a in asked if a not in self._denied]
        # An empty list is left out of the answer, as GCE does.
        return {"permissions": granted} if granted else {}

    def _get_operation(self, project: str, zone: str, name: str) -> Operation:
        self._check_zone(project, zone)
        op = self._operations.get((project, zone, name))
        if op is None:
            raise not_found(f"projects/{project}/zones/{zone}/operations/{name}")
        return op

    def zone_operations_get(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        return self._get_operation(p["project"], p["zone"], p["operation"]).to_json(self.clock.now())

    def zone_operations_wait(self, p: dict[str, str], q: dict[str, str]) -> dict[str, Any]:
        """Returns when the operation is DONE or after wait_timeout seconds of real time,
        whichever comes first, with the operation as it then is (as GCE's wait does)."""
        deadline = time.monotonic() + self.wait_timeout
        while True:
            self._tick()
            op = self._get_operation(p["project"], p["zone"], p["operation"])
            if op.done or time.monotonic() >= deadline:
                return op.to_json(self.clock.now())
            self._lock.release()
            try:
                time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
            finally:
                self._lock.acquire()

    # --- dispatch -----------------------------------------------------------------------

    def handle(self, http_method: str, raw_path: str, request_body: bytes = b"",
               user_agent: str | None = None) -> tuple[int, dict[str, Any]]:
        """Answers one request: (status, JSON body). The User-Agent is recorded beside it, so
        that a test can tell node-fencer's requests from the PD CSI driver's."""
        parsed = urllib.parse.urlsplit(raw_path)
        query_pairs = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
        query = dict(query_pairs)
        path = parsed.path
        method_id = None
        try:
            prefix = next((p for p in (API_PREFIX, BETA_PREFIX) if path.startswith(p)), None)
            if prefix is None:
                raise ApiError(404, "notFound", f"The requested URL {path} was not found on this server.")
            matched = match_route(http_method, path[len(prefix):])
            if matched is not None and prefix == BETA_PREFIX and matched[0].method_id not in BETA_METHODS:
                matched = None
            if matched is None:
                if prefix == API_PREFIX and path_matches_other_method(path[len(prefix):]):
                    raise ApiError(405, "httpMethodNotAllowed",
                                   f"HTTP method {http_method} is not supported by this URL")
                raise ApiError(404, "notFound", f"The requested URL {path} was not found on this server.")
            route, params = matched
            method_id = route.method_id
            self._check_query(route, query_pairs)
            with self._lock:
                for fault in self._faults:
                    if fault.remaining > 0 and fault.method_id in ("*", route.method_id):
                        fault.remaining -= 1
                        raise fault_error(fault.status)
                self._tick()
                handler = getattr(self, route.handler)
                if route.takes_body:
                    body = handler(params, query, _json_body(request_body))
                else:
                    body = handler(params, query)
                status = 200
        except ApiError as e:
            status, body = e.code, e.body()
        body = json.loads(json.dumps(body))
        with self._lock:
            self.exchanges.append({
                "method": http_method, "path": path, "query": query, "method_id": method_id,
                "status": status, "body": body, "user_agent": user_agent,
            })
        return status, body

    def _check_query(self, route: Route, pairs: list[tuple[str, str]]) -> None:
        declared = DECLARED_PARAMS[route.method_id]
        seen: set[str] = set()
        for sent, value in pairs:
            # A system parameter also goes by its name with a `$` ($alt, $fields), the form
            # Google's Rust client sends (https://cloud.google.com/apis/docs/system-parameters).
            system = sent[1:] in STANDARD_PARAMS | UNIMPLEMENTED_STANDARD_PARAMS
            name = sent[1:] if sent.startswith("$") and system else sent
            if name in seen:
                raise invalid(sent, value, "Repeated query parameter.")
            seen.add(name)
            if name in UNIMPLEMENTED_STANDARD_PARAMS or (name in declared and name not in route.params):
                raise ApiError(501, "notImplemented",
                               f"Query parameter '{sent}' of {route.method_id} is not implemented by this fake.")
            if name == "alt" and value != "json":
                raise ApiError(501, "notImplemented", f"{sent}={value} is not implemented by this fake.")
            if name not in declared and name not in STANDARD_PARAMS and name not in DOLLAR_SYSTEM_PARAMS:
                raise ApiError(
                    400, "invalid",
                    f"Invalid JSON payload received. Unknown name \"{sent}\": Cannot bind query parameter. "
                    f"Field '{sent}' could not be found in request message.",
                    status="INVALID_ARGUMENT",
                )


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        raise ApiError(400, "parseError", "Invalid JSON payload received.") from None


def _valid_request_id(value: str) -> bool:
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return False
    return parsed.int != 0 and str(parsed) == value.lower()


def _without_empty_users(disk: dict[str, Any]) -> dict[str, Any]:
    # Compute Engine leaves `users` out of a disk attached to nothing.
    return {k: v for k, v in disk.items() if not (k == "users" and not v)}


def _predicate(q: dict[str, str]) -> Callable[[dict[str, Any]], bool]:
    text = q.get("filter", "").strip()
    if not text:
        return lambda _: True
    try:
        return compile_filter(text)
    except FilterError:
        raise invalid("filter", text, "Invalid list filter expression.") from None


def _filtered(items: list[dict[str, Any]], q: dict[str, str]) -> list[dict[str, Any]]:
    predicate = _predicate(q)
    return [i for i in items if predicate(i)]


def _page(items: list[Any], q: dict[str, str], scope: str) -> tuple[list[Any], str | None]:
    raw = q.get("maxResults")
    limit = MAX_RESULTS_LIMIT
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise invalid("maxResults", raw, "Must be an integer.") from None
        if limit < 0:
            raise invalid("maxResults", raw, "Must be greater than or equal to 0")
        if limit > MAX_RESULTS_LIMIT:
            raise invalid("maxResults", raw, f"Must be less than or equal to {MAX_RESULTS_LIMIT}")
        if limit == 0:
            limit = MAX_RESULTS_LIMIT
    # A page token is bound to the list and filter it was issued for.
    binding = hashlib.sha256(f"{scope}\n{q.get('filter', '')}".encode()).hexdigest()[:12]
    offset = 0
    if token := q.get("pageToken"):
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode() + b"==="))
            offset, bound = int(decoded["o"]), decoded["b"]
        except (ValueError, KeyError, TypeError):
            raise invalid("pageToken", token, "Invalid page token.") from None
        if bound != binding or offset < 0:
            raise invalid("pageToken", token, "The page token does not belong to this list request.")
    page = items[offset:offset + limit]
    next_offset = offset + limit
    token_out = None
    if next_offset < len(items):
        token_out = base64.urlsafe_b64encode(
            json.dumps({"o": next_offset, "b": binding}).encode()).decode().rstrip("=")
    return page, token_out


# --- control API --------------------------------------------------------------------------

CONTROL_ACTIONS = (
    "create_instance", "create_disk", "attach_disk", "set_status", "delete_instance", "recreate_instance",
    "inject_fault", "deny_permissions", "configure", "reset", "add_zone",
    "create_topic", "inject_publish_fault",
)


def control(fake: FakeCompute, http_method: str, raw_path: str, body: bytes) -> tuple[int, Any]:
    path = urllib.parse.urlsplit(raw_path).path[len(CONTROL_PREFIX):]
    if http_method == "GET" and path == "requests":
        with fake._lock:
            return 200, [
                {k: e[k] for k in ("method", "path", "query", "method_id", "status", "user_agent")}
                for e in fake.exchanges
            ]
    if http_method == "GET" and path == "state":
        return 200, fake.state()
    if http_method == "GET" and path == "published":
        return 200, fake.pubsub.published()
    if http_method == "POST" and path in CONTROL_ACTIONS:
        try:
            kwargs = json.loads(body or b"{}")
            if not isinstance(kwargs, dict):
                raise ValueError("the body is a JSON object of keyword arguments")
            result = getattr(fake, path)(**kwargs)
        except (ValueError, KeyError, TypeError) as e:
            return 400, {"error": f"{path}: {type(e).__name__}: {e}"}
        return 200, result if result is not None else {}
    return 404, {"error": f"no control action {http_method} {path}; actions: {', '.join(CONTROL_ACTIONS)}"}


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up in DNS; a loopback server needs not.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-compute"
    # Headers and body leave in one write, without Nagle's delay: a keep-alive client
    # otherwise waits for a delayed ACK on every response.
    wbufsize = -1
    fake: FakeCompute
    verbose = False

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        extra: dict[str, str] = {}
        path = urllib.parse.urlsplit(self.path).path
        if path == METADATA_TOKEN_PATH:
            extra["Metadata-Flavor"] = "Google"
            if self.headers.get("Metadata-Flavor") != "Google":
                status, payload = 403, {"error": "Missing Metadata-Flavor: Google header"}
            else:
                status, payload = 200, {"access_token": "fake-metadata-token", "expires_in": 3600,
                                        "token_type": "Bearer"}
        elif path == TOKEN_PATH and self.command == "POST":
            expiry = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
            status, payload = 200, {"accessToken": "fake-access-token",
                                    "expireTime": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")}
        elif self.path.startswith(CONTROL_PREFIX):
            status, payload = control(self.fake, self.command, self.path, body)
        elif self.fake.pubsub.handles(path):
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = None
            status, payload = self.fake.pubsub.handle(self.command, path, request)
        else:
            status, payload = self.fake.handle(self.command, self.path, body, self.headers.get("User-Agent"))
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        if self.verbose:
            super().log_message(format, *args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--operation-delay", type=float, default=0.5,
                        help="seconds from an operation's insert to DONE (default 0.5)")
    parser.add_argument("--operation-pending", type=float, default=0.0,
                        help="seconds an operation stays PENDING before RUNNING (default 0)")
    parser.add_argument("--wait-timeout", type=float, default=DEFAULT_WAIT_TIMEOUT,
                        help="longest zoneOperations.wait, in seconds (default 120, as GCE)")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = parser.parse_args(argv)
    _Handler.verbose = args.verbose
    fake = FakeCompute(operation_delay=args.operation_delay, operation_pending=args.operation_pending,
                       wait_timeout=args.wait_timeout, host=args.host, port=args.port).start()
    print(fake.port, flush=True)
    try:
        assert fake._thread is not None
        while fake._thread.is_alive():
            fake._thread.join(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
