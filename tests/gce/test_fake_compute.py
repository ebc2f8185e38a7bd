"""The fake Compute Engine (fake_compute.py), held to Google's description of the API and
driven by Google's own client.

- Held to compute.v1.json (shipped in google-api-python-client): every route the fake serves
  is a method of the document, with its HTTP method, flatPath and query parameters; every
  field of every response it gives in a scenario that calls every route is a property of
  the method's response schema, recursively, and every enum value is in the schema's enum.
  The walker that checks this is itself tested on planted mistakes.
- Driven by the independent client (googleapiclient.discovery.build from the same document):
  instances.get/list/aggregatedList, disks.get, regionDisks.get, instances.detachDisk and
  stop, zoneOperations.get and wait, the errors GCE answers and injected 429/503.
- Semantics node-fencer relies on: a detach changes the instance and the disk only once its
  operation is DONE; requestId makes a call idempotent; a recreated instance has a new id;
  SUSPENDED and REPAIRING are reported as they are.
- The control action attach_disk (the PD CSI attacher stand-in of the scenario tests seeds
  attachments with it) leaves what a DONE attachDisk leaves and refuses what GCE refuses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from googleapiclient.errors import HttpError

import fake_compute as F
from gce_lib import PROJECT, REGION, ZONE, client_for

FAKE_SCRIPT = Path(F.__file__).resolve()
URL_SAFE_BASE64 = re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?")

# --- the schema walker ------------------------------------------------------------------------


class SchemaWalk:
    """Checks a JSON value against a schema of a discovery document, recursively: every object
    key must be a property (or fall under additionalProperties), every value of the declared
    type, every enum value in the enum. Records the enum values it saw."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.schemas = doc["schemas"]
        self.problems: list[str] = []
        self.enums_seen: set[tuple[str, str]] = set()

    def check(self, value: Any, schema_name: str, where: str = "$") -> None:
        self._walk(value, {"$ref": schema_name}, where, schema_name)

    def _walk(self, value: Any, schema: dict[str, Any], where: str, owner: str) -> None:
        if "$ref" in schema:
            owner = schema["$ref"]
            if owner not in self.schemas:
                self.problems.append(f"{where}: schema {owner} is not in the document")
                return
            schema = self.schemas[owner]
        kind = schema.get("type")
        if kind == "object" or "properties" in schema or "additionalProperties" in schema:
            if not isinstance(value, dict):
                self.problems.append(f"{where}: {type(value).__name__} where {owner} has an object")
                return
            props = schema.get("properties")
            extra = schema.get("additionalProperties")
            if props is None and extra is None:
                self.problems.append(f"{where}: a free-form object ({owner}); the fake should not emit one")
                return
            for key, item in value.items():
                if props is not None and key in props:
                    self._walk(item, props[key], f"{where}.{key}", f"{owner}.{key}")
                elif extra is not None:
                    self._walk(item, extra, f"{where}[{key!r}]", owner)
                else:
                    self.problems.append(f"{where}.{key}: not a property of {owner}")
        elif kind == "array":
            if not isinstance(value, list):
                self.problems.append(f"{where}: {type(value).__name__} where {owner} has an array")
                return
            for index, item in enumerate(value):
                self._walk(item, schema.get("items", {}), f"{where}[{index}]", owner)
        elif kind == "string":
            if not isinstance(value, str):
                self.problems.append(f"{where}: {value!r} is not a string ({owner})")
                return
            if "enum" in schema:
                if value not in schema["enum"]:
                    self.problems.append(f"{where}: {value!r} is not in the enum of {owner}: {schema['enum']}")
                self.enums_seen.add((owner, value))
            fmt = schema.get("format")
            if fmt in ("int64", "uint64") and not (value.isdigit() or (fmt == "int64" and value[1:].isdigit()
                                                                        and value.startswith("-"))):
                self.problems.append(f"{where}: {value!r} is not a {fmt} ({owner})")
            # Compute Engine writes bytes in URL-safe base64; Google's Rust client refuses `+` and `/`.
            if fmt == "byte" and not URL_SAFE_BASE64.fullmatch(value):
                self.problems.append(f"{where}: {value!r} is not URL-safe base64 ({owner})")
        elif kind == "integer":
            if not isinstance(value, int) or isinstance(value, bool):
                self.problems.append(f"{where}: {value!r} is not an integer ({owner})")
        elif kind == "boolean":
            if not isinstance(value, bool):
                self.problems.append(f"{where}: {value!r} is not a boolean ({owner})")
        elif kind == "number":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                self.problems.append(f"{where}: {value!r} is not a number ({owner})")
        elif kind != "any":
            self.problems.append(f"{where}: the schema of {owner} has no type the walker knows: {kind!r}")


def methods_by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}

    def visit(resources: dict[str, Any]) -> None:
        for resource in resources.values():
            for method in resource.get("methods", {}).values():
                found[method["id"]] = method
            visit(resource.get("resources", {}))

    visit(doc["resources"])
    return found


def check_error_body(status: int, body: Any) -> list[str]:
    """The shape Google's APIs answer errors in (no discovery schema describes it)."""
    problems = []
    if not isinstance(body, dict) or set(body) != {"error"}:
        return [f"an error body is {{'error': ...}} alone, not {body!r}"]
    error = body["error"]
    if not set(error) <= {"code", "message", "errors", "status", "details"}:
        problems.append(f"unexpected keys in error: {sorted(set(error))}")
    if error.get("code") != status:
        problems.append(f"error.code {error.get('code')!r} differs from the HTTP status {status}")
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append("error.message is not a non-empty string")
    entries = error.get("errors")
    if not isinstance(entries, list) or not entries:
        problems.append("error.errors is not a non-empty list")
    else:
        for entry in entries:
            if set(entry) != {"message", "domain", "reason"} or not all(isinstance(v, str) for v in entry.values()):
                problems.append(f"error.errors entry {entry!r} is not {{message, domain, reason}} strings")
    return problems


# --- held to the discovery document ---------------------------------------------------------


def test_every_route_is_a_method_of_the_discovery_document(compute_doc: dict[str, Any]) -> None:
    methods = methods_by_id(compute_doc)
    assert compute_doc["baseUrl"].endswith(F.API_PREFIX), "the fake serves under the document's servicePath"
    for route in F.ROUTES:
        assert route.method_id in methods, f"{route.method_id} is not a method of compute.v1.json"
        method = methods[route.method_id]
        assert method["httpMethod"] == route.http_method, route.method_id
        assert method["flatPath"] == route.flat_path, route.method_id
        assert method["path"] == route.flat_path, f"{route.method_id}: path and flatPath differ"
        declared = {n for n, p in method.get("parameters", {}).items() if p["location"] == "query"}
        assert F.DECLARED_PARAMS[route.method_id] == declared, (
            f"{route.method_id}: the fake's table of declared query parameters is out of date"
        )
        assert route.params <= declared, f"{route.method_id} reads parameters it does not declare"
        path_params = {n for n, p in method.get("parameters", {}).items() if p["location"] == "path"}
        assert route.pattern().groupindex.keys() == path_params, route.method_id
    assert set(F.DECLARED_PARAMS) == {r.method_id for r in F.ROUTES}
    assert F.STANDARD_PARAMS | F.UNIMPLEMENTED_STANDARD_PARAMS <= set(compute_doc["parameters"])


def test_no_two_routes_for_one_method_or_path() -> None:
    assert len({r.method_id for r in F.ROUTES}) == len(F.ROUTES)
    assert len({(r.http_method, r.flat_path) for r in F.ROUTES}) == len(F.ROUTES)


def exercise_every_route(server: F.FakeCompute, clock: F.FakeClock, compute: Any) -> None:
    """Calls every route, in every state the fake can answer from, through the client."""
    statuses = list(F.INSTANCE_STATUSES)
    for index, status in enumerate(statuses):
        server.create_instance(
            PROJECT, ZONE, f"node-{index}", status=status, labels={"pool": "a" if index % 2 else "b"},
            data_disks=[{"name": f"pvc-{index}"},
                        {"name": f"pvc-ro-{index}", "mode": "READ_ONLY"},
                        {"name": f"pvc-regional-{index}", "region": REGION}],
        )
    server.create_instance(PROJECT, "us-central1-b", "node-b")
    server.add_zone(PROJECT, "us-central1-c")  # an empty zone: a warning in aggregatedList
    server.create_disk(PROJECT, "unattached", zone=ZONE)
    instances, disks, ops = compute.instances(), compute.disks(), compute.zoneOperations()
    for index, status in enumerate(statuses):
        got = instances.get(project=PROJECT, zone=ZONE, instance=f"node-{index}").execute()
        assert got["status"] == status
    # list: filtered, paged
    request = instances.list(project=PROJECT, zone=ZONE, filter="labels.pool = a", maxResults=2)
    while request is not None:
        page = request.execute()
        request = instances.list_next(request, page)
    instances.list(project=PROJECT, zone="us-central1-c").execute()
    # aggregatedList: paged across zones
    request = instances.aggregatedList(project=PROJECT, maxResults=4)
    while request is not None:
        page = request.execute()
        request = instances.aggregatedList_next(request, page)
    disks.get(project=PROJECT, zone=ZONE, disk="pvc-0").execute()
    disks.get(project=PROJECT, zone=ZONE, disk="unattached").execute()
    compute.regionDisks().get(project=PROJECT, region=REGION, disk="pvc-regional-0").execute()
    # detachDisk: PENDING, RUNNING, DONE; the same requestId again
    request_id = str(uuid.uuid4())
    op = instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-2", deviceName="pvc-2",
                              requestId=request_id).execute()
    clock.advance(1.5)
    ops.get(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    clock.advance(1.0)
    ops.wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-2", deviceName="pvc-2",
                         requestId=request_id).execute()
    # attachDisk of the disk just detached: checked at once, attached when DONE
    op = instances.attachDisk(project=PROJECT, zone=ZONE, instance="node-2", forceAttach=False,
                              body={"source": f"projects/{PROJECT}/zones/{ZONE}/disks/pvc-2",
                                    "deviceName": "pvc-2", "mode": "READ_WRITE", "type": "PERSISTENT"}).execute()
    clock.advance(3.0)
    ops.wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    # the PD CSI driver reads disks through the beta API: the same v1 shape
    assert server.handle("GET", f"/compute/beta/projects/{PROJECT}/zones/{ZONE}/disks/pvc-2")[0] == 200
    instances.stop(project=PROJECT, zone=ZONE, instance="node-2").execute()
    clock.advance(3.0)
    # testIamPermissions on each kind of resource preflight tests
    asked = {"permissions": ["compute.instances.get", "compute.instances.detachDisk"]}
    instances.testIamPermissions(project=PROJECT, zone=ZONE, resource="node-0", body=asked).execute()
    on_disk = {"permissions": ["compute.disks.get"]}
    disks.testIamPermissions(project=PROJECT, zone=ZONE, resource="pvc-0", body=on_disk).execute()
    compute.regionDisks().testIamPermissions(project=PROJECT, region=REGION, resource="pvc-regional-0",
                                             body=on_disk).execute()
    instances.get(project=PROJECT, zone=ZONE, instance="node-2").execute()
    # the errors
    calls = [
        lambda: instances.get(project=PROJECT, zone=ZONE, instance="gone").execute(),
        lambda: instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-0",
                                     deviceName="persistent-disk-0").execute(),
        lambda: instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-3", deviceName="nope").execute(),
        lambda: ops.get(project=PROJECT, zone=ZONE, operation="operation-0-nope").execute(),
        lambda: instances.list(project=PROJECT, zone=ZONE, filter="name = (").execute(),
        lambda: instances.list(project=PROJECT, zone=ZONE, orderBy="name").execute(),
    ]
    for call in calls:
        with pytest.raises(HttpError):
            call()
    for status in (429, 503):
        server.inject_fault("compute.instances.get", status)
        with pytest.raises(HttpError):
            instances.get(project=PROJECT, zone=ZONE, instance="node-0").execute()


def test_every_response_is_held_to_its_schema(compute_doc: dict[str, Any], fake_clocked: F.FakeCompute,
                                               clock: F.FakeClock, compute_clocked: Any) -> None:
    exercise_every_route(fake_clocked, clock, compute_clocked)
    methods = methods_by_id(compute_doc)
    walk = SchemaWalk(compute_doc)
    served_ok: set[str] = set()
    error_problems: list[str] = []
    for exchange in fake_clocked.exchanges:
        assert exchange["method_id"] is not None, f"a request outside the routes: {exchange['path']}"
        if exchange["status"] == 200:
            schema = methods[exchange["method_id"]]["response"]["$ref"]
            walk.check(exchange["body"], schema, f"{exchange['method_id']}")
            served_ok.add(exchange["method_id"])
        else:
            error_problems += [f"{exchange['method_id']} {exchange['status']}: {p}"
                               for p in check_error_body(exchange["status"], exchange["body"])]
    assert not walk.problems, "responses the discovery document does not allow:\n" + "\n".join(walk.problems)
    assert not error_problems, "\n".join(error_problems)
    assert served_ok == {r.method_id for r in F.ROUTES}, "a route was not exercised"
    # The enum checks ran on every value node-fencer reads.
    seen = walk.enums_seen
    assert {v for o, v in seen if o == "Instance.status"} == set(F.INSTANCE_STATUSES)
    assert {v for o, v in seen if o == "Operation.status"} == {"PENDING", "RUNNING", "DONE"}
    assert {v for o, v in seen if o == "AttachedDisk.mode"} == {"READ_WRITE", "READ_ONLY"}
    assert {v for o, v in seen if o == "AttachedDisk.type"} == {"PERSISTENT"}
    assert ("Disk.status", "READY") in seen
    assert any(o == "InstancesScopedList.warning.code" for o, _ in seen), "no aggregatedList warning walked"
    statuses = {e["status"] for e in fake_clocked.exchanges}
    assert {200, 400, 404, 429, 501, 503} <= statuses


@pytest.mark.parametrize(
    ("schema", "plant", "expected"),
    [
        ("Instance", lambda i: i.update(bogusField=1), "$.bogusField: not a property of Instance"),
        ("Instance", lambda i: i.update(status="EXPLODED"), "'EXPLODED' is not in the enum of Instance.status"),
        ("Instance", lambda i: i["disks"][1].update(deviceNme="x"),
         "$.disks[1].deviceNme: not a property of AttachedDisk"),
        ("Instance", lambda i: i["disks"][1].update(mode="RW"), "'RW' is not in the enum of AttachedDisk.mode"),
        ("Instance", lambda i: i["networkInterfaces"][0].update(ip="10.0.0.1"), "not a property of NetworkInterface"),
        ("Instance", lambda i: i.update(id=12), "12 is not a string"),
        ("Instance", lambda i: i.update(id="i-0abc"), "'i-0abc' is not a uint64"),
        ("Instance", lambda i: i["disks"][0].update(index="0"), "'0' is not an integer"),
        ("Instance", lambda i: i["disks"][0].update(boot="true"), "'true' is not a boolean"),
        ("Instance", lambda i: i.update(disks={}), "has an array"),
        ("Instance", lambda i: i["labels"].update(env=3), "3 is not a string"),
        ("Instance", lambda i: i.update(fingerprint="a+b/cd=="), "'a+b/cd==' is not URL-safe base64"),
        ("InstanceAggregatedList", lambda a: a["items"]["zones/us-central1-a"].update(vms=[]),
         "not a property of InstancesScopedList"),
        ("InstanceAggregatedList", lambda a: a["items"]["zones/us-central1-a"]["instances"][0].update(x=1),
         "not a property of Instance"),
        ("Operation", lambda o: o.update(status="SUCCEEDED"), "'SUCCEEDED' is not in the enum of Operation.status"),
        ("Operation", lambda o: o.update(error={"errors": [{"code": "X", "why": "y"}]}), ".why: not a property"),
    ],
)
def test_the_walker_rejects_planted_mistakes(compute_doc: dict[str, Any], fake: F.FakeCompute, schema: str,
                                             plant: Any, expected: str) -> None:
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=1, labels={"env": "prod"})
    if schema == "Instance":
        value = fake.instance(PROJECT, ZONE, "node-1")
    elif schema == "InstanceAggregatedList":
        value = fake.handle("GET", f"{F.API_PREFIX}projects/{PROJECT}/aggregated/instances")[1]
    else:
        value = fake.handle("POST", f"{F.API_PREFIX}projects/{PROJECT}/zones/{ZONE}/instances/node-1/stop")[1]
    clean = SchemaWalk(compute_doc)
    clean.check(value, schema)
    assert clean.problems == [], "the unplanted value should pass"
    plant(value)
    walk = SchemaWalk(compute_doc)
    walk.check(value, schema)
    assert any(expected in p for p in walk.problems), walk.problems


# --- driven by Google's client ---------------------------------------------------------------


def test_get_returns_the_instance_node_fencer_reads(fake: F.FakeCompute, compute: Any) -> None:
    seeded = fake.create_instance(PROJECT, ZONE, "node-1", data_disks=2, network_ip="10.0.0.7",
                                  labels={"goog-k8s-cluster-name": "prod"})
    got = compute.instances().get(project=PROJECT, zone=ZONE, instance="node-1").execute()
    assert got == seeded
    assert got["kind"] == "compute#instance" and got["id"].isdigit() and len(got["id"]) == 19
    assert got["selfLink"] == f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/node-1"
    assert got["zone"].endswith(f"/projects/{PROJECT}/zones/{ZONE}")
    assert got["networkInterfaces"][0]["networkIP"] == "10.0.0.7"
    assert [(d["deviceName"], d["boot"], d["index"]) for d in got["disks"]] == [
        ("persistent-disk-0", True, 0), ("node-1-data-0", False, 1), ("node-1-data-1", False, 2),
    ]
    assert got["disks"][1]["source"].endswith(f"/projects/{PROJECT}/zones/{ZONE}/disks/node-1-data-0")


def test_a_missing_instance_is_googles_404(fake: F.FakeCompute, compute: Any) -> None:
    fake.add_zone(PROJECT, ZONE)
    with pytest.raises(HttpError) as caught:
        compute.instances().get(project=PROJECT, zone=ZONE, instance="gone").execute()
    assert caught.value.status_code == 404
    body = json.loads(caught.value.content)
    message = f"The resource 'projects/{PROJECT}/zones/{ZONE}/instances/gone' was not found"
    assert body == {"error": {"code": 404, "message": message,
                              "errors": [{"message": message, "domain": "global", "reason": "notFound"}]}}
    assert caught.value.error_details[0]["reason"] == "notFound"


def test_another_project_or_zone_is_not_the_vms_own_404(fake: F.FakeCompute, compute: Any) -> None:
    """A wrong project or zone never reads as "this VM was deleted": Google's answer then names the
    project (404 notFound) or refuses the zone (400 invalid), never the VM asked for."""
    fake.create_instance(PROJECT, ZONE, "node-1")
    instances = compute.instances()
    cases = [
        (instances.get(project="proj-elsewhere", zone=ZONE, instance="node-1"), 404, "notFound",
         "The resource 'projects/proj-elsewhere' was not found"),
        (instances.get(project=PROJECT, zone="us-east1-q", instance="node-1"), 400, "invalid",
         "Invalid value for field 'zone': 'us-east1-q'. Unknown zone."),
        (compute.disks().get(project="proj-elsewhere", zone=ZONE, disk="node-1"), 404, "notFound",
         "The resource 'projects/proj-elsewhere' was not found"),
        (compute.regionDisks().get(project=PROJECT, region="europe-west9", disk="pd"), 400, "invalid",
         "Invalid value for field 'region': 'europe-west9'. Unknown region."),
    ]
    for request, status, reason, message in cases:
        with pytest.raises(HttpError) as caught:
            request.execute()
        assert caught.value.status_code == status, request.uri
        body = json.loads(caught.value.content)
        assert body == {"error": {"code": status, "message": message,
                                  "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def test_list_filters_by_name_and_pages(fake: F.FakeCompute, compute: Any) -> None:
    for index, name in enumerate(("a-1", "a-2", "a-3", "b-1", "b-2")):
        fake.create_instance(PROJECT, ZONE, name, labels={"group": name[0]}, network_ip=f"10.1.0.{index}")
    instances = compute.instances()

    def names(**kwargs: Any) -> list[list[str]]:
        pages = []
        request = instances.list(project=PROJECT, zone=ZONE, **kwargs)
        while request is not None:
            page = request.execute()
            pages.append([i["name"] for i in page.get("items", [])])
            request = instances.list_next(request, page)
        return pages

    assert names(filter='name = "a-2"') == [["a-2"]]
    assert names(filter="name = a-2") == [["a-2"]]
    assert names(filter="name != a-2", maxResults=2) == [["a-1", "a-3"], ["b-1", "b-2"]]
    assert names(filter="name eq a-.*") == [["a-1", "a-2", "a-3"]]
    assert names(filter="name ne a-.*") == [["b-1", "b-2"]]
    assert names(filter='(name = "a-1") OR (name = "b-2")') == [["a-1", "b-2"]]
    assert names(filter="labels.group = b AND status = RUNNING") == [["b-1", "b-2"]]
    assert names(filter="name = nothing") == [[]]
    assert names(filter="networkInterfaces.networkIP = 10.1.0.3") == [["b-1"]]
    assert names(filter="name:b-*") == [["b-1", "b-2"]]
    assert names(filter="NOT labels.group = a") == [["b-1", "b-2"]]
    assert names(maxResults=2) == [["a-1", "a-2"], ["a-3", "b-1"], ["b-2"]]
    assert names() == [["a-1", "a-2", "a-3", "b-1", "b-2"]]


def test_list_refuses_what_gce_refuses(fake: F.FakeCompute, compute: Any) -> None:
    fake.create_instance(PROJECT, ZONE, "a-1")
    fake.create_instance(PROJECT, ZONE, "a-2")
    instances = compute.instances()
    first = instances.list(project=PROJECT, zone=ZONE, maxResults=1).execute()
    cases = [
        (instances.list(project=PROJECT, zone=ZONE, filter="name = a-1", pageToken=first["nextPageToken"]),
         400, "pageToken"),
        (instances.list(project=PROJECT, zone=ZONE, maxResults=501), 400, "maxResults"),
        (instances.list(project=PROJECT, zone=ZONE, filter='name = "a-1'), 400, "filter"),
        (instances.list(project=PROJECT, zone=ZONE, orderBy="creationTimestamp desc"), 501, "orderBy"),
        (instances.list(project=PROJECT, zone="us-east1-q"), 400, "'us-east1-q'. Unknown zone."),
    ]
    for request, status, mention in cases:
        with pytest.raises(HttpError) as caught:
            request.execute()
        assert caught.value.status_code == status, request.uri
        assert mention in json.loads(caught.value.content)["error"]["message"]


def test_an_undeclared_query_parameter_is_refused(fake: F.FakeCompute) -> None:
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=1)
    base = f"{F.API_PREFIX}projects/{PROJECT}/zones/{ZONE}/instances/node-1"
    status, body = fake.handle("POST", f"{base}/detachDisk?device_name=node-1-data-0")
    assert status == 400 and "Unknown name \"device_name\"" in body["error"]["message"]
    status, body = fake.handle("GET", f"{base}?fields=status")
    assert status == 501
    # System parameters also go by a `$` name, as Google's Rust client sends `$alt=json` and
    # `$apiVersion` (which has no other name) on every call.
    assert fake.handle("GET", f"{base}?%24alt=json&%24apiVersion=2026-09-01")[0] == 200
    assert fake.handle("GET", f"{base}?apiVersion=2026-09-01")[0] == 400
    assert fake.handle("GET", f"{base}?$alt=json&prettyPrint=false")[0] == 200
    assert fake.handle("GET", f"{base}?$alt=proto")[0] == 501
    assert fake.handle("GET", f"{base}?$fields=status")[0] == 501
    assert fake.handle("GET", f"{base}?$alt=json&alt=json")[0] == 400
    assert fake.handle("GET", f"{base}?$name=node-1")[0] == 400
    status, _ = fake.handle("DELETE", base)
    assert status == 405
    assert fake.instance(PROJECT, ZONE, "node-1")["disks"][1]["deviceName"] == "node-1-data-0"


def test_aggregated_list_is_keyed_by_zone_and_pages(fake: F.FakeCompute, compute: Any) -> None:
    fake.create_instance(PROJECT, "us-central1-a", "n-1")
    fake.create_instance(PROJECT, "us-central1-a", "n-2")
    fake.create_instance(PROJECT, "us-central1-b", "n-3")
    fake.add_zone(PROJECT, "us-central1-f")
    fake.create_instance("other-project", "us-central1-a", "n-9")
    instances = compute.instances()
    whole = instances.aggregatedList(project=PROJECT).execute()
    assert whole["kind"] == "compute#instanceAggregatedList"
    assert set(whole["items"]) == {"zones/us-central1-a", "zones/us-central1-b", "zones/us-central1-f"}
    assert [i["name"] for i in whole["items"]["zones/us-central1-a"]["instances"]] == ["n-1", "n-2"]
    assert whole["items"]["zones/us-central1-f"]["warning"]["code"] == "NO_RESULTS_ON_PAGE"
    filtered = instances.aggregatedList(project=PROJECT, filter="name = n-3").execute()
    assert "instances" not in filtered["items"]["zones/us-central1-a"]
    assert [i["name"] for i in filtered["items"]["zones/us-central1-b"]["instances"]] == ["n-3"]
    seen = []
    request = instances.aggregatedList(project=PROJECT, maxResults=2)
    while request is not None:
        page = request.execute()
        seen.append(sorted(i["name"] for s in page["items"].values() for i in s.get("instances", [])))
        request = instances.aggregatedList_next(request, page)
    assert seen == [["n-1", "n-2"], ["n-3"]]


def test_disks_report_their_users_zonal_and_regional(fake: F.FakeCompute, compute: Any) -> None:
    node = fake.create_instance(PROJECT, ZONE, "node-1", data_disks=[
        {"name": "pvc-zonal"}, {"name": "pvc-regional", "region": REGION, "replica_zones": [ZONE, "us-central1-c"]},
    ])
    fake.create_disk(PROJECT, "spare", zone=ZONE)
    zonal = compute.disks().get(project=PROJECT, zone=ZONE, disk="pvc-zonal").execute()
    assert zonal["users"] == [node["selfLink"]] and zonal["kind"] == "compute#disk"
    assert zonal["zone"].endswith(f"/zones/{ZONE}") and "region" not in zonal
    regional = compute.regionDisks().get(project=PROJECT, region=REGION, disk="pvc-regional").execute()
    assert regional["users"] == [node["selfLink"]]
    assert regional["region"].endswith(f"/regions/{REGION}") and "zone" not in regional
    assert [z.rsplit("/", 1)[1] for z in regional["replicaZones"]] == [ZONE, "us-central1-c"]
    assert node["disks"][2]["source"] == regional["selfLink"]
    assert "users" not in compute.disks().get(project=PROJECT, zone=ZONE, disk="spare").execute()
    with pytest.raises(HttpError) as caught:
        compute.disks().get(project=PROJECT, zone=ZONE, disk="pvc-regional").execute()
    assert caught.value.status_code == 404


def test_detach_changes_instance_and_disk_only_when_done(fake_clocked: F.FakeCompute, clock: F.FakeClock,
                                                         compute_clocked: Any) -> None:
    fake = fake_clocked
    node = fake.create_instance(PROJECT, ZONE, "node-1",
                                data_disks=[{"name": "pvc-1"}, {"name": "pvc-r", "region": REGION}])
    instances, ops = compute_clocked.instances(), compute_clocked.zoneOperations()
    op = instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="pvc-r").execute()
    assert op["kind"] == "compute#operation" and op["operationType"] == "detachDisk"
    assert op["status"] == "PENDING" and op["targetLink"] == node["selfLink"] and op["targetId"] == node["id"]
    assert op["zone"].endswith(f"/zones/{ZONE}") and op["selfLink"].endswith(f"/operations/{op['name']}")
    still = [d["deviceName"] for d in fake.instance(PROJECT, ZONE, "node-1")["disks"]]
    assert still == ["persistent-disk-0", "pvc-1", "pvc-r"]
    clock.advance(1.0)
    assert ops.get(project=PROJECT, zone=ZONE, operation=op["name"]).execute()["status"] == "RUNNING"
    assert fake.disk(PROJECT, "pvc-r", region=REGION)["users"] == [node["selfLink"]]
    clock.advance(1.0)
    done = ops.get(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    assert done["status"] == "DONE" and done["progress"] == 100 and "endTime" in done and "error" not in done
    assert [d["deviceName"] for d in fake.instance(PROJECT, ZONE, "node-1")["disks"]] == ["persistent-disk-0", "pvc-1"]
    regional = compute_clocked.regionDisks().get(project=PROJECT, region=REGION, disk="pvc-r").execute()
    assert "users" not in regional and "lastDetachTimestamp" in regional
    # Detaching it again: it is not attached any more.
    with pytest.raises(HttpError) as caught:
        instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="pvc-r").execute()
    assert caught.value.status_code == 400


def test_the_same_request_id_returns_the_same_operation(fake_clocked: F.FakeCompute, clock: F.FakeClock,
                                                        compute_clocked: Any) -> None:
    fake = fake_clocked
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=2)
    instances = compute_clocked.instances()
    request_id = str(uuid.uuid4())

    def detach(device: str, rid: str | None = request_id) -> dict[str, Any]:
        kwargs = {"requestId": rid} if rid else {}
        return instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName=device,
                                    **kwargs).execute()

    first = detach("node-1-data-0")
    again = detach("node-1-data-0")
    assert again["name"] == first["name"] and again["id"] == first["id"]
    clock.advance(5)
    after = detach("node-1-data-0")  # a retry after it finished: the same, now DONE operation
    assert after["name"] == first["name"] and after["status"] == "DONE"
    assert len(fake.state()["operations"]) == 1
    # Another id is another request, and a detach in flight refuses a second one.
    second = detach("node-1-data-1", str(uuid.uuid4()))
    assert second["name"] != first["name"]
    with pytest.raises(HttpError) as caught:
        detach("node-1-data-1", None)
    assert caught.value.status_code == 400 and caught.value.error_details[0]["reason"] == "resourceNotReady"
    for bad in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(HttpError) as caught:
            detach("node-1-data-1", bad)
        assert caught.value.status_code == 400 and "requestId" in caught.value.reason


def test_a_boot_disk_is_detached_only_from_a_terminated_instance(fake: F.FakeCompute, compute: Any) -> None:
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=1)
    instances = compute.instances()
    for status in ("RUNNING", "STOPPING", "SUSPENDED", "REPAIRING"):
        fake.set_status(PROJECT, ZONE, "node-1", status)
        with pytest.raises(HttpError) as caught:
            instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1",
                                 deviceName="persistent-disk-0").execute()
        assert caught.value.status_code == 400
        body = json.loads(caught.value.content)["error"]
        assert body["errors"][0]["reason"] == "invalidResourceUsage"
        assert body["message"] == ("Invalid resource usage: 'To detach the boot disk, the instance must be "
                                   "in TERMINATED state.'.")
    with pytest.raises(HttpError) as caught:
        instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="node-1-data-9").execute()
    assert caught.value.status_code == 400
    assert caught.value.reason == "No attached disk found with device name 'node-1-data-9'"
    assert len(fake.instance(PROJECT, ZONE, "node-1")["disks"]) == 2
    # As on GCE, a TERMINATED instance's boot disk can be detached: node-fencer must not ask.
    fake.set_status(PROJECT, ZONE, "node-1", "TERMINATED")
    op = instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="persistent-disk-0").execute()
    compute.zoneOperations().wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    assert [d["deviceName"] for d in fake.instance(PROJECT, ZONE, "node-1")["disks"]] == ["node-1-data-0"]


def test_test_iam_permissions_answers_the_asked_less_the_denied(fake: F.FakeCompute, compute: Any) -> None:
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=[{"name": "pvc-1"}])
    instances = compute.instances()
    asked = ["compute.instances.detachDisk", "compute.instances.get"]

    def granted(resource: str = "node-1") -> list[str] | None:
        answer = instances.testIamPermissions(project=PROJECT, zone=ZONE, resource=resource,
                                              body={"permissions": asked}).execute()
        return answer.get("permissions")

    assert granted() == asked
    fake.deny_permissions(["compute.instances.detachDisk"])
    assert granted() == ["compute.instances.get"]
    disk = compute.disks().testIamPermissions(project=PROJECT, zone=ZONE, resource="pvc-1",
                                              body={"permissions": ["compute.instances.detachDisk"]}).execute()
    assert disk == {}, "nothing granted: the list is left out, as GCE does"
    fake.deny_permissions([])
    assert granted() == asked
    with pytest.raises(HttpError) as gone:
        granted("no-such-vm")
    assert gone.value.resp.status == 404
    with pytest.raises(HttpError) as wildcard:
        instances.testIamPermissions(project=PROJECT, zone=ZONE, resource="node-1",
                                     body={"permissions": ["compute.*"]}).execute()
    assert wildcard.value.resp.status == 400
    with pytest.raises(ValueError):
        fake.deny_permissions("compute.instances.get")  # type: ignore[arg-type]


def test_wait_returns_when_done_or_after_its_bound(fake: F.FakeCompute, compute: Any) -> None:
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=2)
    fake.configure(operation_delay=0.3, wait_timeout=5.0)
    instances, ops = compute.instances(), compute.zoneOperations()
    op = instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="node-1-data-0").execute()
    assert op["status"] == "RUNNING"
    started = time.monotonic()
    done = ops.wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    took = time.monotonic() - started
    assert done["status"] == "DONE" and took < 1.5, took
    fake.configure(operation_delay=30.0, wait_timeout=0.3)
    op = instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="node-1-data-1").execute()
    started = time.monotonic()
    pending = ops.wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    took = time.monotonic() - started
    assert pending["status"] == "RUNNING" and 0.25 <= took < 1.5, took
    with pytest.raises(HttpError) as caught:
        ops.wait(project=PROJECT, zone=ZONE, operation="operation-1-2-3-4").execute()
    assert caught.value.status_code == 404


def test_attach_disk_seeds_what_a_done_attach_leaves_and_refuses_what_gce_refuses(fake: F.FakeCompute,
                                                                                    compute: Any) -> None:
    node = fake.create_instance(PROJECT, ZONE, "node-1")
    other = fake.create_instance(PROJECT, ZONE, "node-2")
    fake.create_disk(PROJECT, "pvc-1", zone=ZONE)
    fake.create_disk(PROJECT, "pvc-r", region=REGION, replica_zones=[ZONE, "us-central1-c"])
    fake.create_disk(PROJECT, "pvc-far", zone="us-central1-f")
    handle = f"projects/{PROJECT}/zones/{ZONE}/disks/pvc-1"
    got = fake.attach_disk(PROJECT, ZONE, "node-1", handle)
    assert [(d["deviceName"], d["index"], d["boot"], d["mode"]) for d in got["disks"]] == [
        ("persistent-disk-0", 0, True, "READ_WRITE"), ("pvc-1", 1, False, "READ_WRITE")]
    served = compute.instances().get(project=PROJECT, zone=ZONE, instance="node-1").execute()
    assert served == got and served["disks"][1]["source"].endswith(f"/{handle}")
    disk = compute.disks().get(project=PROJECT, zone=ZONE, disk="pvc-1").execute()
    assert disk["users"] == [node["selfLink"]] and "lastAttachTimestamp" in disk
    regional = f"projects/{PROJECT}/regions/{REGION}/disks/pvc-r"
    fake.attach_disk(PROJECT, ZONE, "node-1", regional, device_name="data-r")
    assert fake.disk(PROJECT, "pvc-r", region=REGION)["users"] == [node["selfLink"]]
    # What GCE refuses: a disk in use read-write, here or elsewhere; another zone's disk.
    for instance in ("node-1", "node-2"):
        with pytest.raises(ValueError, match="is already being used by 'projects/.*/instances/node-1'"):
            fake.attach_disk(PROJECT, ZONE, instance, handle)
        with pytest.raises(ValueError, match="already being used"):
            fake.attach_disk(PROJECT, ZONE, instance, handle, mode="READ_ONLY")
    with pytest.raises(ValueError, match="same zone"):
        fake.attach_disk(PROJECT, ZONE, "node-2", f"projects/{PROJECT}/zones/us-central1-f/disks/pvc-far")
    for bad in ("pvc-1", f"projects/{PROJECT}/zones/{ZONE}/disks/nope"):
        with pytest.raises(ValueError):
            fake.attach_disk(PROJECT, ZONE, "node-2", bad)
    assert [d["deviceName"] for d in fake.instance(PROJECT, ZONE, "node-2")["disks"]] == ["persistent-disk-0"]
    # Once detached through the API, the disk can be attached elsewhere.
    op = compute.instances().detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="pvc-1").execute()
    compute.zoneOperations().wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    fake.attach_disk(PROJECT, ZONE, "node-2", handle)
    assert fake.disk(PROJECT, "pvc-1", zone=ZONE)["users"] == [other["selfLink"]]
    fake.create_disk(PROJECT, "pvc-2", zone=ZONE)
    with pytest.raises(ValueError, match="device name"):
        fake.attach_disk(PROJECT, ZONE, "node-2", f"projects/{PROJECT}/zones/{ZONE}/disks/pvc-2", device_name="pvc-1")


def test_attach_disk_through_the_api_refuses_what_gce_refuses(fake: F.FakeCompute, compute: Any) -> None:
    """instances.attachDisk, as the PD CSI driver calls it through Google's Go client: a disk in
    use elsewhere is refused at once with resourceInUseByAnotherResource, counting an attach
    still in flight; the attachment shows on the instance and in the disk's users once DONE."""
    fake.configure(operation_delay=0.3)
    node = fake.create_instance(PROJECT, ZONE, "node-1")
    fake.create_instance(PROJECT, ZONE, "node-2")
    fake.create_disk(PROJECT, "pvc-1", zone=ZONE)
    instances = compute.instances()
    source = f"{fake.endpoint}projects/{PROJECT}/zones/{ZONE}/disks/pvc-1"  # a full link, as the driver sends
    body = {"source": source, "deviceName": "pvc-1", "mode": "READ_WRITE", "type": "PERSISTENT",
            "kind": "compute#attachedDisk"}
    op = instances.attachDisk(project=PROJECT, zone=ZONE, instance="node-1", body=body, forceAttach=False).execute()
    assert op["operationType"] == "attachDisk" and op["status"] != "DONE"
    assert fake.disk(PROJECT, "pvc-1", zone=ZONE).get("users", []) == []
    with pytest.raises(HttpError) as in_flight:
        instances.attachDisk(project=PROJECT, zone=ZONE, instance="node-2", body=body).execute()
    assert in_flight.value.resp.status == 400 and b"resourceInUseByAnotherResource" in in_flight.value.content
    compute.zoneOperations().wait(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    assert fake.disk(PROJECT, "pvc-1", zone=ZONE)["users"] == [node["selfLink"]]
    got = instances.get(project=PROJECT, zone=ZONE, instance="node-1").execute()
    assert [(d["deviceName"], d["mode"]) for d in got["disks"][1:]] == [("pvc-1", "READ_WRITE")]
    with pytest.raises(HttpError) as in_use:
        instances.attachDisk(project=PROJECT, zone=ZONE, instance="node-2", body=body).execute()
    assert in_use.value.resp.status == 400 and b"is already being used by" in in_use.value.content
    for bad, status in (({"deviceName": "x"}, 400), ({**body, "sourse": "x"}, 400),
                        ({**body, "source": f"projects/{PROJECT}/zones/{ZONE}/disks/nope"}, 404)):
        with pytest.raises(HttpError) as refused:
            instances.attachDisk(project=PROJECT, zone=ZONE, instance="node-2", body=bad).execute()
        assert refused.value.resp.status == status
    with pytest.raises(HttpError) as forced:
        instances.attachDisk(project=PROJECT, zone=ZONE, instance="node-2", body=body, forceAttach=True).execute()
    assert forced.value.resp.status == 501
    # Of the beta API, the disks alone are served.
    assert fake.handle("GET", f"/compute/beta/projects/{PROJECT}/zones/{ZONE}/disks/pvc-1")[0] == 200
    assert fake.handle("GET", f"/compute/beta/projects/{PROJECT}/zones/{ZONE}/instances/node-1")[0] == 404


def test_the_attached_disk_fields_are_the_documents(compute_doc: dict[str, Any]) -> None:
    assert F.ATTACHED_DISK_FIELDS == set(compute_doc["schemas"]["AttachedDisk"]["properties"])


def test_the_token_stand_ins_answer_as_googles_clients_read_them() -> None:
    with F.FakeCompute() as server:
        base = f"http://127.0.0.1:{server.port}"
        request = urllib.request.Request(base + F.METADATA_TOKEN_PATH, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request) as answer:
            assert answer.headers["Metadata-Flavor"] == "Google"
            assert set(json.load(answer)) == {"access_token", "expires_in", "token_type"}
        with pytest.raises(urllib.error.HTTPError) as no_flavor:
            urllib.request.urlopen(base + F.METADATA_TOKEN_PATH)
        assert no_flavor.value.code == 403
        with urllib.request.urlopen(urllib.request.Request(base + F.TOKEN_PATH, data=b"", method="POST")) as answer:
            assert set(json.load(answer)) == {"accessToken", "expireTime"}
        assert server.exchanges == []


def test_stop_goes_stopping_then_terminated(fake_clocked: F.FakeCompute, clock: F.FakeClock,
                                            compute_clocked: Any) -> None:
    fake = fake_clocked
    fake.create_instance(PROJECT, ZONE, "node-1")
    instances = compute_clocked.instances()
    op = instances.stop(project=PROJECT, zone=ZONE, instance="node-1", requestId=str(uuid.uuid4())).execute()
    assert op["operationType"] == "stop" and op["status"] == "PENDING"
    assert instances.get(project=PROJECT, zone=ZONE, instance="node-1").execute()["status"] == "STOPPING"
    clock.advance(2.0)
    got = instances.get(project=PROJECT, zone=ZONE, instance="node-1").execute()
    assert got["status"] == "TERMINATED" and "lastStopTimestamp" in got
    again = instances.stop(project=PROJECT, zone=ZONE, instance="node-1").execute()
    clock.advance(2.0)
    assert compute_clocked.zoneOperations().get(project=PROJECT, zone=ZONE, operation=again["name"]).execute()[
        "status"] == "DONE"
    assert instances.get(project=PROJECT, zone=ZONE, instance="node-1").execute()["status"] == "TERMINATED"


def test_suspended_and_repairing_are_reported_as_they_are(fake: F.FakeCompute, compute: Any) -> None:
    for name, status in (("node-s", "SUSPENDED"), ("node-r", "REPAIRING"), ("node-x", "STOPPED")):
        fake.create_instance(PROJECT, ZONE, name)
        fake.set_status(PROJECT, ZONE, name, status)
        assert compute.instances().get(project=PROJECT, zone=ZONE, instance=name).execute()["status"] == status
    listed = compute.instances().list(project=PROJECT, zone=ZONE, filter="status = SUSPENDED").execute()
    assert [i["name"] for i in listed["items"]] == ["node-s"]
    with pytest.raises(ValueError):
        fake.set_status(PROJECT, ZONE, "node-s", "HIBERNATED")


def test_a_recreated_instance_has_a_new_id(fake_clocked: F.FakeCompute, clock: F.FakeClock,
                                          compute_clocked: Any) -> None:
    fake, compute = fake_clocked, compute_clocked
    old = fake.create_instance(PROJECT, ZONE, "node-1", data_disks=[{"name": "pvc-1"}])
    old_boot = fake.disk(PROJECT, "node-1", zone=ZONE)
    clock.advance(60)
    new = fake.recreate_instance(PROJECT, ZONE, "node-1")
    got = compute.instances().get(project=PROJECT, zone=ZONE, instance="node-1").execute()
    assert got["id"] == new["id"] != old["id"]
    assert got["creationTimestamp"] > old["creationTimestamp"]
    assert got["selfLink"] == old["selfLink"] and got["status"] == "RUNNING"
    assert [d["deviceName"] for d in got["disks"]] == ["persistent-disk-0", "pvc-1"]
    boot = compute.disks().get(project=PROJECT, zone=ZONE, disk="node-1").execute()
    assert boot["id"] != old_boot["id"] and boot["users"] == [got["selfLink"]]
    fake.delete_instance(PROJECT, ZONE, "node-1")
    with pytest.raises(HttpError):
        compute.instances().get(project=PROJECT, zone=ZONE, instance="node-1").execute()
    assert fake.disk(PROJECT, "node-1", zone=ZONE) is None, "the boot disk is deleted with the instance"
    assert "users" not in compute.disks().get(project=PROJECT, zone=ZONE, disk="pvc-1").execute()


def test_a_stop_of_the_old_instance_leaves_a_recreated_one_running(fake_clocked: F.FakeCompute,
                                                                   clock: F.FakeClock, compute_clocked: Any) -> None:
    fake_clocked.create_instance(PROJECT, ZONE, "node-1")
    compute_clocked.instances().stop(project=PROJECT, zone=ZONE, instance="node-1").execute()
    fake_clocked.recreate_instance(PROJECT, ZONE, "node-1")
    clock.advance(5)
    assert fake_clocked.instance(PROJECT, ZONE, "node-1")["status"] == "RUNNING"


@pytest.mark.parametrize(("status", "reason", "domain"), [(429, "rateLimitExceeded", "usageLimits"),
                                                          (503, "backendError", "global")])
def test_injected_faults_are_shaped_as_gce_answers_them(fake: F.FakeCompute, compute: Any, status: int,
                                                        reason: str, domain: str) -> None:
    fake.create_instance(PROJECT, ZONE, "node-1", data_disks=1)
    fake.inject_fault("compute.instances.detachDisk", status, count=2)
    instances = compute.instances()
    assert instances.get(project=PROJECT, zone=ZONE, instance="node-1").execute()["name"] == "node-1"
    for _ in range(2):
        with pytest.raises(HttpError) as caught:
            instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="node-1-data-0").execute()
        assert caught.value.status_code == status
        entry = json.loads(caught.value.content)["error"]["errors"][0]
        assert (entry["reason"], entry["domain"]) == (reason, domain)
    assert len(fake.instance(PROJECT, ZONE, "node-1")["disks"]) == 2, "a refused call changed nothing"
    op = instances.detachDisk(project=PROJECT, zone=ZONE, instance="node-1", deviceName="node-1-data-0").execute()
    assert op["status"] == "RUNNING"
    fake.inject_fault("*", status)
    with pytest.raises(HttpError):
        compute.zoneOperations().get(project=PROJECT, zone=ZONE, operation=op["name"]).execute()
    with pytest.raises(ValueError):
        fake.inject_fault("compute.instances.delete", status)


# --- as a process, like moto_server ----------------------------------------------------------


def test_runs_as_a_process_seeded_over_http() -> None:
    process = subprocess.Popen(
        [sys.executable, str(FAKE_SCRIPT), "--port", "0", "--operation-delay", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline().strip())
        base = f"http://127.0.0.1:{port}"

        def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            data = json.dumps(body).encode() if body is not None else None
            request = urllib.request.Request(base + path, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, seeded = call("POST", "/_fake/create_instance", {
            "project": PROJECT, "zone": ZONE, "name": "node-1",
            "data_disks": [{"name": "pvc-1"}, {"name": "pvc-2", "region": REGION}],
        })
        assert status == 200 and seeded["name"] == "node-1"
        assert call("POST", "/_fake/set_status", {"project": PROJECT, "zone": ZONE, "name": "node-1",
                                                  "status": "TERMINATED"})[0] == 200
        status, got = call("GET", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/node-1")
        assert status == 200 and got["status"] == "TERMINATED" and got["id"] == seeded["id"]
        assert call("POST", "/_fake/inject_fault", {"method_id": "compute.instances.get", "status": 503})[0] == 200
        assert call("GET", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/node-1")[0] == 503
        status, log = call("GET", "/_fake/requests")
        assert [(e["method_id"], e["status"]) for e in log] == [("compute.instances.get", 200),
                                                               ("compute.instances.get", 503)]
        status, attached = call("POST", "/_fake/attach_disk", {
            "project": PROJECT, "zone": ZONE, "name": "node-1", "disk": f"projects/{PROJECT}/zones/{ZONE}/disks/pvc-1"})
        assert status == 400 and "already being used" in attached["error"]
        assert call("POST", "/_fake/set_status", {"project": PROJECT})[0] == 400
        assert call("POST", "/_fake/no_such_action", {})[0] == 404
    finally:
        process.terminate()
        process.wait(timeout=5)


def test_client_against_a_second_fake_is_independent(fake: F.FakeCompute) -> None:
    with F.FakeCompute() as other:
        other.create_instance(PROJECT, ZONE, "only-here")
        assert client_for(other).instances().get(project=PROJECT, zone=ZONE, instance="only-here").execute()
        fake.add_zone(PROJECT, ZONE)
        with pytest.raises(HttpError):
            client_for(fake).instances().get(project=PROJECT, zone=ZONE, instance="only-here").execute()
