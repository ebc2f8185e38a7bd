"""The fake Pub/Sub publish method (fake_pubsub.py), held to Google's description of the API
(pubsub.v1.json as google-api-python-client ships it) and driven by Google's own client."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import googleapiclient
import pytest
from googleapiclient.errors import HttpError

import fake_pubsub as P
from fake_compute import FakeCompute
from gce_lib import google_client
from test_fake_compute import SchemaWalk

DOCUMENT = Path(googleapiclient.__file__).resolve().parent / "discovery_cache" / "documents" / "pubsub.v1.json"
TOPIC = "projects/nf-project/topics/node-fencer"


@pytest.fixture(scope="module")
def pubsub_doc() -> dict[str, Any]:
    if not DOCUMENT.is_file():
        pytest.fail(f"google-api-python-client ships no {DOCUMENT.name} at {DOCUMENT}")
    doc = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    assert doc["name"] == "pubsub" and doc["version"] == "v1"
    return doc


@pytest.fixture
def server() -> Iterator[FakeCompute]:
    with FakeCompute() as fake:
        fake.create_topic("nf-project", "node-fencer")
        yield fake


@pytest.fixture
def client(server: FakeCompute) -> Any:
    return google_client("pubsub", server.url)


def publish_method(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["resources"]["projects"]["resources"]["topics"]["methods"]["publish"]


def test_the_route_is_the_documents_publish_method(pubsub_doc: dict[str, Any]) -> None:
    method = publish_method(pubsub_doc)
    assert method["id"] == "pubsub.projects.topics.publish"
    assert method["httpMethod"] == "POST"
    path = "/" + method["flatPath"].replace("{projectsId}", "p").replace("{topicsId}", "t")
    assert P.PUBLISH_PATH.match(path), path
    assert method["request"]["$ref"] == "PublishRequest"
    assert set(pubsub_doc["schemas"]["PublishRequest"]["properties"]) == P.REQUEST_FIELDS


def test_the_message_fields_are_the_documents(pubsub_doc: dict[str, Any]) -> None:
    properties = pubsub_doc["schemas"]["PubsubMessage"]["properties"]
    assert set(properties) == P.MESSAGE_FIELDS | P.OUTPUT_ONLY_FIELDS
    for field in P.OUTPUT_ONLY_FIELDS:
        assert "must not be populated" in properties[field]["description"], field


def test_googles_client_publishes_and_the_answer_is_held_to_the_schema(
        pubsub_doc: dict[str, Any], server: FakeCompute, client: Any) -> None:
    data = base64.b64encode(b'{"kind":"fencing"}').decode()
    answer = client.projects().topics().publish(
        topic=TOPIC, body={"messages": [{"data": data, "attributes": {"kind": "fencing"}}]}).execute()
    walk = SchemaWalk(pubsub_doc)
    walk.check(answer, "PublishResponse")
    assert not walk.problems, walk.problems
    assert answer["messageIds"] == ["1"]
    (message,) = server.pubsub.published()[TOPIC]
    assert message["text"] == '{"kind":"fencing"}'
    stored = {k: v for k, v in message.items() if k != "text"}
    walk.check(stored, "PubsubMessage")
    assert not walk.problems, walk.problems


@pytest.mark.parametrize("body, says", [
    ({"messages": []}, "no messages"),
    ({"messages": [{"data": "e30=", "extra": 1}]}, "Unknown name"),
    ({"messages": [{"data": "e30="}], "topic": "x"}, "Unknown name"),
    ({"messages": [{"data": "not base64!"}]}, "Base64"),
    ({"messages": [{}]}, "needs data or at least one attribute"),
    ({"messages": [{"data": "e30=", "messageId": "1"}]}, "set by the server"),
    ({"messages": [{"data": "e30=", "attributes": {"k": 1}}]}, "map of strings"),
    ({"messages": [{"data": "e30=", "attributes": {"k": "v" * 1025}}]}, "longer than"),
])
def test_a_request_pubsub_refuses_is_refused(server: FakeCompute, client: Any, body: dict[str, Any],
                                             says: str) -> None:
    with pytest.raises(HttpError) as refused:
        client.projects().topics().publish(topic=TOPIC, body=body).execute()
    assert refused.value.resp.status == 400
    error = json.loads(refused.value.content)["error"]
    assert error["status"] == "INVALID_ARGUMENT" and says in error["message"], error
    assert server.pubsub.published()[TOPIC] == []


def test_a_missing_topic_is_not_found_and_faults_are_injected(server: FakeCompute, client: Any) -> None:
    with pytest.raises(HttpError) as missing:
        client.projects().topics().publish(
            topic="projects/nf-project/topics/other", body={"messages": [{"data": "e30="}]}).execute()
    assert missing.value.resp.status == 404
    server.inject_publish_fault(503, 1)
    with pytest.raises(HttpError) as fault:
        client.projects().topics().publish(topic=TOPIC, body={"messages": [{"data": "e30="}]}).execute()
    assert fault.value.resp.status == 503
    client.projects().topics().publish(topic=TOPIC, body={"messages": [{"data": "e30="}]}).execute()
    assert len(server.pubsub.published()[TOPIC]) == 1


def test_the_control_routes_seed_and_list_over_http(server: FakeCompute) -> None:
    request = urllib.request.Request(server.url + "_fake/create_topic", method="POST",
                                     data=json.dumps({"project": "p2", "topic": "t2"}).encode())
    with urllib.request.urlopen(request) as answer:
        assert json.load(answer) == {"name": "projects/p2/topics/t2"}
    with urllib.request.urlopen(server.url + "_fake/published") as answer:
        assert json.load(answer) == {TOPIC: [], "projects/p2/topics/t2": []}
