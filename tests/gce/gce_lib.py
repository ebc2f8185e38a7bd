"""Shared by the GCE tests: the names the fake is seeded with, where Google's description of
the Compute Engine API is, and Google's client built against a fake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import googleapiclient
from google.auth.credentials import AnonymousCredentials
from googleapiclient import discovery

from fake_compute import FakeCompute

PROJECT = "nf-project"
ZONE = "us-central1-a"
REGION = "us-central1"
DISCOVERY_DOCUMENT = (
    Path(googleapiclient.__file__).resolve().parent / "discovery_cache" / "documents" / "compute.v1.json"
)


def client_for(server: FakeCompute) -> Any:
    """Google's Compute Engine client, built from the document it ships, pointed at `server`."""
    return google_client("compute", server.endpoint)


def google_client(api: str, endpoint: str) -> Any:
    """Google's client of `api` v1, built from the document it ships, pointed at `endpoint`."""
    return discovery.build(
        api, "v1",
        credentials=AnonymousCredentials(),
        static_discovery=True,
        cache_discovery=False,
        client_options={"api_endpoint": endpoint},
    )
