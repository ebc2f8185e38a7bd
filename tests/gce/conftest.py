"""Fixtures of the GCE tests: the fake Compute Engine, Google's client pointed at it, and
Google's description of the API. Every package comes from tests/gce/requirements.txt (the
venv `make setup` builds, NODE_FENCER_GCE_VENV); a missing one fails the run, never skips."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from fake_compute import FakeClock, FakeCompute
from gce_lib import DISCOVERY_DOCUMENT, client_for


@pytest.fixture(scope="session")
def compute_doc() -> dict[str, Any]:
    """compute.v1.json as google-api-python-client ships it."""
    if not DISCOVERY_DOCUMENT.is_file():
        pytest.fail(f"google-api-python-client ships no {DISCOVERY_DOCUMENT.name} at {DISCOVERY_DOCUMENT}")
    doc = json.loads(DISCOVERY_DOCUMENT.read_text(encoding="utf-8"))
    assert doc["name"] == "compute" and doc["version"] == "v1", "not the Compute Engine v1 document"
    return doc


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    """A fake on the wall clock, operations done 50 ms after they start, wait bounded at 2 s."""
    with FakeCompute(operation_delay=0.05, wait_timeout=2.0) as server:
        yield server


@pytest.fixture
def fake_clocked(clock: FakeClock) -> Iterator[FakeCompute]:
    """A fake whose operations move only with `clock`: PENDING 1 s, DONE after 2 s."""
    with FakeCompute(clock=clock, operation_pending=1.0, operation_delay=2.0, wait_timeout=0.2) as server:
        yield server


@pytest.fixture
def compute(fake: FakeCompute) -> Any:
    return client_for(fake)


@pytest.fixture
def compute_clocked(fake_clocked: FakeCompute) -> Any:
    return client_for(fake_clocked)
