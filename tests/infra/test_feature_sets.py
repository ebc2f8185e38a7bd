"""Each shipped build's dependencies are compiled as the tests compile them.

The Lambda zip, the Cloud Run image and the on-premises image each build the `node-fencer`
package with its own features (docs/packaging.md). Cargo gives a shared crate the union of
the features the packages of one build ask for, so a shared crate (tokio, hyper, ...) built
with other features than in the test build is compiled again, and every crate above it: the
AWS SDK, once per feature set, about 10 minutes of a cold `make test` on 2 cores. The
crate's feature-unification dependencies (handler/Cargo.toml) keep each shipped build's
(crate, features) pairs among the test build's; this fails when an update moves them apart.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The simulator (tests/sim) runs on tokio's paused clock, its `test-util` feature, which no
# shipped build carries: with it in the workspace, the test build's tokio, and every crate
# above it, are compiled apart from the shipped builds' (docs/simulator.md says what that
# costs). That one difference is allowed; the shipped builds are held to the rest.
SIMULATOR = "node-fencer-sim"

# The feature sets of the shipped builds (docs/packaging.md).
SHIPPED = {
    "the Lambda zip": [],
    "the Cloud Run image": ["--features", "serve,google-cloud"],
    "the on-premises image": ["--features", "serve,redfish"],
}


def built(*selection: str) -> set[str]:
    """Every crate of a build and the features it is built with, as `cargo tree` shows them."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", "--offline", "-e", "normal,build", "--prefix", "none",
         "-f", "{p} [{f}]", *selection],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "CARGO_TERM_COLOR": "never"},
    )
    assert out.returncode == 0, f"cargo tree {' '.join(selection)}: {out.stderr}"
    return {line.replace(" (*)", "") for line in out.stdout.splitlines() if line.strip()}


def drift(tests: set[str], shipped: set[str]) -> list[str]:
    """The crates the shipped build compiles with other features than the tests do; the
    package itself differs by design."""
    return sorted(line for line in shipped - tests if not line.startswith("node-fencer v"))


@pytest.mark.parametrize("artefact", SHIPPED)
def test_a_shipped_build_compiles_no_crate_the_tests_did_not(artefact: str):
    tests = built("--workspace", "--exclude", SIMULATOR)
    shipped = built("-p", "node-fencer", *SHIPPED[artefact])
    assert drift(tests, shipped) == [], (
        f"{artefact} builds these crates with other features than the tests: give the "
        "feature-unification dependencies of handler/Cargo.toml the features the tests' build has"
    )


def test_the_simulator_adds_nothing_but_tokios_paused_clock():
    added = built("--workspace") - built("--workspace", "--exclude", SIMULATOR)
    others = sorted(
        line for line in added
        if not line.startswith(f"{SIMULATOR} v")
        and not (line.startswith("tokio v") and "test-util" in line)
    )
    assert others == [], (
        "the simulator builds these crates with other features than the rest of the tests: "
        "give its dependencies the workspace's features"
    )


def test_drift_is_found():
    tests = {"tokio v1.54.1 [process,rt]", "node-fencer v0.1.0 (/src/handler) [default,serve]"}
    shipped = {"tokio v1.54.1 [rt]", "node-fencer v0.1.0 (/src/handler) [default]"}
    assert drift(tests, shipped) == ["tokio v1.54.1 [rt]"]
    assert drift(tests, {"tokio v1.54.1 [process,rt]"}) == []
