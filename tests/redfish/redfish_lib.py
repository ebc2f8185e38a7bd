"""Helpers of the Redfish tests: BMCs started with tests/redfish/bmc.py as the Rust harness
starts them (tests/src/redfish.rs), a client for them, and DMTF's Redfish Service Validator
run against them offline. Every package comes from tests/redfish/requirements.txt (the venv
`make setup` builds, NODE_FENCER_REDFISH_VENV); a missing one fails the run, never skips."""

from __future__ import annotations

import dataclasses
import json
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
BMC = HERE / "bmc.py"
SCHEMAS = HERE / "schemas"
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT = 60.0
# The fake driver applies a Reset 1 to 11 s after it is taken, on the next read.
POWER_TIMEOUT = 15.0


def system(name: str, power_state: str) -> dict[str, str]:
    """A systems-file entry with a fresh uuid."""
    return {"uuid": str(uuid.uuid4()), "name": name, "power_state": power_state}


@dataclasses.dataclass
class Bmc:
    """A running launcher and what it announced."""

    proc: subprocess.Popen[bytes]
    dir: Path
    log: Path
    line: dict[str, Any]
    systems_file: Path

    @property
    def url(self) -> str:
        return self.line["url"]

    @property
    def ca(self) -> str:
        return self.line["ca"]

    @property
    def auth(self) -> tuple[str, str]:
        return (self.line["user"], self.line["password"])

    @property
    def verify(self) -> Any:
        return self.ca if self.url.startswith("https://") else False

    def path(self, name: str) -> str:
        return self.line["systems"][name]

    def get(self, path: str, auth: Any = True, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("verify", self.verify)
        kwargs.setdefault("timeout", 10)
        kwargs.setdefault("allow_redirects", False)
        return requests.get(self.url + path, auth=self.auth if auth is True else auth, **kwargs)

    def system(self, name: str) -> dict[str, Any]:
        resp = self.get(self.path(name))
        assert resp.status_code == 200, f"GET {self.path(name)}: {resp.status_code} {resp.text}"
        return resp.json()

    def power(self, name: str) -> str:
        return self.system(name)["PowerState"]

    def reset(self, name: str, kind: str) -> requests.Response:
        target = self.system(name)["Actions"]["#ComputerSystem.Reset"]["target"]
        return requests.post(
            self.url + target, json={"ResetType": kind}, auth=self.auth, verify=self.verify, timeout=10
        )

    def wait_power(self, name: str, state: str, timeout: float = POWER_TIMEOUT) -> float:
        """Polls the System until it reads `state`; the seconds it took."""
        t0 = time.monotonic()
        seen = []
        while time.monotonic() - t0 < timeout:
            seen.append(self.power(name))
            if seen[-1] == state:
                return time.monotonic() - t0
            time.sleep(0.25)
        pytest.fail(f"{name} did not read {state} within {timeout} s (read {sorted(set(seen))})")

    def logged(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signals the launcher and waits for it; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"the launcher did not stop within {timeout} s of signal {sig}; its log:\n{self.logged()}")
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return self.proc.returncode


def spawn(directory: Path, systems: list[dict[str, Any]] | None, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Starts bmc.py with its stderr in DIR/bmc.log, as the harness does."""
    directory.mkdir(parents=True, exist_ok=True)
    systems_file = directory.parent / f"{directory.name}-systems.json"
    if systems is not None:
        systems_file.write_text(json.dumps(systems), encoding="utf-8")
    log = directory.parent / f"{directory.name}-bmc.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(BMC), "--dir", str(directory), "--systems", str(systems_file), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    return proc, log, systems_file


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The launcher's first stdout line, or b"" if it exits or says nothing in time."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            return b""
    return b""


# --- DMTF's Redfish Service Validator --------------------------------------------------

# One result line of its debug log: "<time> - redfish - <LEVEL> - RESULT - PROP (VALUE): MESSAGE",
# or "... - RESULT - MESSAGE" for a result about the whole resource.
RESULT_LINE = re.compile(r" - redfish - [A-Z]+ - (PASS|WARN|FAIL|SKIP) - (.*)$")
PROP_RESULT = re.compile(r"^(/\S*) \((.*)\): ((?:[A-Z][A-Za-z ]*(?:Error|Warning)|Pass|Skip): .*)$")
RESOURCE_TALLY = re.compile(r"- Pass: (\d+), Warn: (\d+), Fail: (\d+), Skip: (\d+)")


@dataclasses.dataclass
class Validation:
    """One run of `rf_service_validator` on one resource."""

    returncode: int
    stdout: str
    log: str
    # (result, property path or "" for the resource, message)
    results: list[tuple[str, str, str]]
    tally: dict[str, int]

    def of(self, kind: str) -> set[tuple[str, str]]:
        """{(property, kind of message)} of the results of `kind` (PASS, WARN, FAIL, SKIP)."""
        return {(prop, message.split(":")[0]) for result, prop, message in self.results if result == kind}

    def result_of(self, prop: str) -> list[str]:
        return [result for result, p, _ in self.results if p == prop]


def run_validator(bmc: Bmc, uri: str, workdir: Path, mockup: Path | None = None) -> Validation:
    """`rf_service_validator --payload Single URI` against `bmc` with basic auth, the CSDL
    schemas from tests/redfish/schemas and no download (--skipschema): offline."""
    exe = VENV_BIN / "rf_service_validator"
    assert exe.is_file(), f"{exe} is missing: the redfish venv lacks redfish_service_validator"
    logdir = workdir / "validator-logs"
    args = [
        str(exe),
        "--config", str(workdir / "no-config.ini"),  # never a config.ini of the working directory
        "--rhost", bmc.url,
        "--user", bmc.auth[0],
        "--password", bmc.auth[1],
        "--authtype", "Basic",
        "--schema_directory", str(SCHEMAS),
        "--skipschema",
        "--logdir", str(logdir),
        "--payload", "Single", uri,
    ]
    if mockup is not None:
        args += ["--mockup", str(mockup)]
    proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=300)
    logs = sorted(logdir.glob("*/RedfishServiceValidatorDebug_*.log"))
    assert len(logs) == 1, f"expected one debug log under {logdir}, found {logs}; stdout:\n{proc.stdout}\n{proc.stderr}"
    log = logs[0].read_text(encoding="utf-8")
    results = []
    for line in log.splitlines():
        m = RESULT_LINE.search(line)
        if not m:
            continue
        body = PROP_RESULT.match(m[2])
        results.append((m[1], body[1], body[3]) if body else (m[1], "", m[2]))
    tallies = RESOURCE_TALLY.findall(proc.stdout)
    assert len(tallies) == 1, f"expected one resource validated, stdout:\n{proc.stdout}\n{proc.stderr}"
    tally = dict(zip(("PASS", "WARN", "FAIL", "SKIP"), map(int, tallies[0])))
    return Validation(proc.returncode, proc.stdout + proc.stderr, log, results, tally)
