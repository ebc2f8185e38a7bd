"""The Redfish BMC the tests fence through (bmc.py: sushy-tools' emulator, fake driver), held
to what the Rust harness and node-fencer's Redfish client rely on, and to DMTF's Redfish
Service Validator run offline with DMTF's CSDL schemas (tests/redfish/schemas)."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import pytest
import requests
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from redfish_lib import BMC, SCHEMAS, Bmc, read_line, run_validator, spawn, system

Launch = Callable[..., Bmc]
EDM = "{http://docs.oasis-open.org/odata/ns/edm}"


@pytest.fixture
def machines() -> list[dict[str, str]]:
    return [system("node-on", "On"), system("node-off", "Off")]


@pytest.fixture
def bmc(launch: Launch, machines: list[dict[str, str]]) -> Bmc:
    return launch("bmc", machines)


# --- the launcher ----------------------------------------------------------------------


def test_the_launcher_announces_one_json_line_then_serves(bmc: Bmc, machines: list[dict[str, str]]) -> None:
    line = bmc.line
    assert set(line) == {"url", "ca", "user", "password", "systems"}
    assert re.fullmatch(r"https://127\.0\.0\.1:[0-9]{2,5}", line["url"]), line["url"]
    assert line["ca"] == str(bmc.dir.resolve() / "ca.pem") and Path(line["ca"]).is_file()
    assert (line["user"], line["password"]) == ("admin", "fencer-test-password")
    assert line["systems"] == {m["name"]: f"/redfish/v1/Systems/{m['uuid']}" for m in machines}
    # It answers now, and the System paths it announced are the ones the service lists.
    members = bmc.get("/redfish/v1/Systems").json()["Members"]
    assert sorted(m["@odata.id"] for m in members) == sorted(line["systems"].values())
    # The state and the config are in its directory, nowhere else.
    assert (bmc.dir / "state" / "fakedriver.sqlite").is_file()
    conf = (bmc.dir / "emulator.conf").read_text()
    assert f"SUSHY_EMULATOR_STATE_DIR = {str(bmc.dir.resolve() / 'state')!r}" in conf
    assert f"SUSHY_EMULATOR_LISTEN_PORT = {int(line['url'].rsplit(':', 1)[1])}" in conf


def test_nothing_but_the_line_reaches_stdout(tmp_path: Path, machines: list[dict[str, str]]) -> None:
    proc, log, _ = spawn(tmp_path / "b", machines)
    first = read_line(proc, 60)
    assert first, log.read_text()
    requests.get(json.loads(first)["url"] + "/redfish/v1/", verify=json.loads(first)["ca"], timeout=10)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert rest == b"", rest
    # The access log, one plain line per request, went to stderr.
    assert re.search(r'"GET /redfish/v1/ HTTP/1\.1" 200', log.read_text()), log.read_text()
    assert "\x1b[" not in log.read_text()


def test_the_certificate_is_for_127_0_0_1_and_localhost_signed_by_the_ca(bmc: Bmc) -> None:
    ca = x509.load_pem_x509_certificate(Path(bmc.ca).read_bytes())
    cert = x509.load_pem_x509_certificate((bmc.dir / "server.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca)
    ca.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # The keys are the launcher's user's alone.
    assert (bmc.dir / "server.key").stat().st_mode & 0o077 == 0


def test_tls_verifies_against_its_ca_and_nothing_else(bmc: Bmc) -> None:
    assert requests.get(bmc.url + "/redfish/v1/", verify=bmc.ca, timeout=10).status_code == 200
    port = bmc.url.rsplit(":", 1)[1]
    # The DNS name of the certificate too.
    assert requests.get(f"https://localhost:{port}/redfish/v1/", verify=bmc.ca, timeout=10).status_code == 200
    # The public roots do not trust it.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(bmc.url + "/redfish/v1/", verify=True, timeout=10)


def test_tls_is_1_2_as_sushy_emulator_serves_it(bmc: Bmc) -> None:
    port = int(bmc.url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=bmc.ca)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            assert tls.version() == "TLSv1.2"
    only_13 = ssl.create_default_context(cafile=bmc.ca)
    only_13.minimum_version = ssl.TLSVersion.TLSv1_3
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with pytest.raises(ssl.SSLError):
            only_13.wrap_socket(sock, server_hostname="127.0.0.1")


def test_plain_http_with_http(launch: Launch, machines: list[dict[str, str]]) -> None:
    bmc = launch("plain", machines, "--http")
    assert re.fullmatch(r"http://127\.0\.0\.1:[0-9]{2,5}", bmc.url), bmc.url
    assert bmc.get(bmc.path("node-on"), auth=None).status_code == 401
    assert bmc.system("node-on")["PowerState"] == "On"


def test_other_credentials(launch: Launch, machines: list[dict[str, str]]) -> None:
    bmc = launch("creds", machines, "--user", "fencer", "--password", "s3cret:with colon")
    assert bmc.auth == ("fencer", "s3cret:with colon")
    assert bmc.system("node-on")["Name"] == "node-on"
    assert bmc.get(bmc.path("node-on"), auth=("admin", "fencer-test-password")).status_code == 401
    assert (bmc.dir / "htpasswd").read_text().startswith("fencer:$2b$")


@pytest.mark.parametrize(
    ("systems", "message"),
    [
        ([{"uuid": "8a7f0d4c-58b8-4a4f-8d8e-6b2f1c3e9a01", "name": "n", "power_state": "Dimmed"}], "power_state"),
        ([{"uuid": "not-a-uuid", "name": "n", "power_state": "On"}], "is not a UUID"),
        ([{"uuid": "8a7f0d4c-58b8-4a4f-8d8e-6b2f1c3e9a01", "name": "n", "power_state": "On", "serial": "x"}], "unknown keys"),
        (
            [
                {"uuid": "8a7f0d4c-58b8-4a4f-8d8e-6b2f1c3e9a01", "name": "n", "power_state": "On"},
                {"uuid": "8a7f0d4c-58b8-4a4f-8d8e-6b2f1c3e9a02", "name": "n", "power_state": "On"},
            ],
            "appears twice",
        ),
        ([], "non-empty JSON list"),
        (None, "cannot read the systems file"),
    ],
    ids=["power-state", "uuid", "unknown-key", "duplicate-name", "empty", "missing-file"],
)
def test_a_bad_systems_file_fails_loudly(tmp_path: Path, systems: Any, message: str) -> None:
    proc, log, _ = spawn(tmp_path / "bad", systems)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert out == b""
    assert message in log.read_text(), log.read_text()


def test_a_port_in_use_fails_loudly(tmp_path: Path, machines: list[dict[str, str]]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc, log, _ = spawn(tmp_path / "busy", machines, "--port", str(taken.getsockname()[1]))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and out == b""
    assert "in use" in log.read_text(), log.read_text()


def test_a_fixed_port(launch: Launch, machines: list[dict[str, str]]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bmc = launch("fixed", machines, "--port", str(port))
    assert bmc.url == f"https://127.0.0.1:{port}"


def test_part_of_a_certificate_set_fails_loudly(tmp_path: Path, machines: list[dict[str, str]]) -> None:
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "ca.pem").write_text("left over")
    proc, log, _ = spawn(tmp_path / "partial", machines)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and out == b""
    assert "but not all" in log.read_text(), log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_it_cleanly(launch: Launch, machines: list[dict[str, str]], sig: int) -> None:
    bmc = launch("sig", machines)
    assert bmc.stop(sig) == 0
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(bmc.url + "/redfish/v1/", verify=bmc.ca, timeout=5)


def test_it_stops_when_its_parent_dies(tmp_path: Path, machines: list[dict[str, str]]) -> None:
    """A parent that is killed (no signal reaches the launcher) leaves no BMC behind."""
    systems_file = tmp_path / "systems.json"
    systems_file.write_text(json.dumps(machines))
    log = tmp_path / "orphan.log"
    # The parent: starts the launcher, passes its pid and line on, then waits to be killed.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=open(sys.argv[1], 'wb'))\n"
            "line = child.stdout.readline()\n"
            "print(child.pid, flush=True)\n"
            "sys.stdout.write(line.decode()); sys.stdout.flush()\n"
            "time.sleep(3600)\n",
            str(log),
            sys.executable, str(BMC), "--dir", str(tmp_path / "orphan"), "--systems", str(systems_file),
        ],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    line = json.loads(parent.stdout.readline())
    assert requests.get(line["url"] + "/redfish/v1/", verify=line["ca"], timeout=10).status_code == 200
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.1)
    assert not alive(child), "the launcher outlived its parent"
    assert "is gone: stopping" in log.read_text()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(line["url"] + "/redfish/v1/", verify=line["ca"], timeout=5)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# --- what a client sees ----------------------------------------------------------------


def test_the_service_root_is_open_and_lists_the_systems(bmc: Bmc) -> None:
    root = bmc.get("/redfish/v1/", auth=None)
    assert root.status_code == 200
    assert root.json()["Systems"] == {"@odata.id": "/redfish/v1/Systems"}
    assert root.json()["@odata.type"].startswith("#ServiceRoot.")


@pytest.mark.parametrize("auth", [None, ("admin", "wrong"), ("root", "fencer-test-password")], ids=["none", "wrong-password", "wrong-user"])
def test_a_system_needs_credentials(bmc: Bmc, auth: Any) -> None:
    for path in (bmc.path("node-on"), "/redfish/v1/Systems"):
        resp = bmc.get(path, auth=auth)
        assert resp.status_code == 401, resp.text
        assert resp.headers["WWW-Authenticate"].startswith("Basic ")
        assert resp.headers["Content-Type"] == "application/json"
        error = resp.json()["error"]
        assert error["code"] == "Base.1.0.GeneralError"
        assert error["message"] == ("Authorization required" if auth is None else "Incorrect username or password")
        assert error["@Message.ExtendedInfo"][0]["MessageId"] == "Base.1.0.GeneralError"
    # Nor can a Reset be sent without them.
    target = f"{bmc.url}{bmc.path('node-on')}/Actions/ComputerSystem.Reset"
    resp = requests.post(target, json={"ResetType": "ForceOff"}, auth=auth, verify=bmc.ca, timeout=10)
    assert resp.status_code == 401


def test_a_system_as_the_fake_driver_serves_it(bmc: Bmc, machines: list[dict[str, str]]) -> None:
    on = machines[0]
    resp = bmc.get(bmc.path("node-on"))
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "application/json"
    doc = resp.json()
    assert doc["@odata.id"] == f"/redfish/v1/Systems/{on['uuid']}"
    assert doc["@odata.type"] == "#ComputerSystem.v1_13_0.ComputerSystem"
    assert doc["Id"] == doc["UUID"] == on["uuid"]
    assert doc["Name"] == "node-on"
    assert doc["PowerState"] == "On"
    assert "SerialNumber" not in doc
    reset = doc["Actions"]["#ComputerSystem.Reset"]
    assert reset["target"] == f"/redfish/v1/Systems/{on['uuid']}/Actions/ComputerSystem.Reset"
    assert reset["ResetType@Redfish.AllowableValues"] == [
        "On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn",
    ]
    # The validator does not check annotations: every allowable value is one of DMTF's
    # Resource.ResetType members.
    assert set(reset["ResetType@Redfish.AllowableValues"]) <= schema_enum("Resource_v1.xml", "ResetType")
    # The name is an alias the driver redirects.
    alias = bmc.get("/redfish/v1/Systems/node-on")
    assert alias.status_code == 307 and alias.headers["Location"].endswith(doc["@odata.id"])


def test_a_system_configured_off_reads_off(bmc: Bmc) -> None:
    assert bmc.power("node-off") == "Off"
    assert bmc.power("node-on") == "On"


def test_force_off_turns_it_off_and_on_turns_it_on(bmc: Bmc) -> None:
    resp = bmc.reset("node-on", "ForceOff")
    assert resp.status_code == 204 and resp.content == b""
    took_off = bmc.wait_power("node-on", "Off")
    resp = bmc.reset("node-on", "On")
    assert resp.status_code == 204
    took_on = bmc.wait_power("node-on", "On")
    # Applied 1 to 11 s after the Reset, seen on the next read (polled every 0.25 s).
    assert took_off < 13 and took_on < 13, (took_off, took_on)
    # The other System was not touched.
    assert bmc.power("node-off") == "Off"
    posts = re.findall(r'"POST (\S+) HTTP/1\.1" 204', bmc.logged())
    assert posts == [f"{bmc.path('node-on')}/Actions/ComputerSystem.Reset"] * 2


def test_a_reset_it_cannot_do_is_refused(bmc: Bmc) -> None:
    nmi = bmc.reset("node-on", "Nmi")
    assert nmi.status_code == 501 and nmi.json()["error"]["message"] == "Power state Nmi is not supported"
    gone = requests.post(
        f"{bmc.url}/redfish/v1/Systems/00000000-0000-4000-8000-000000000000/Actions/ComputerSystem.Reset",
        json={"ResetType": "ForceOff"}, auth=bmc.auth, verify=bmc.ca, timeout=10,
    )
    assert gone.status_code == 404
    not_json = requests.post(
        f"{bmc.url}{bmc.path('node-on')}/Actions/ComputerSystem.Reset",
        data='{"ResetType": "ForceOff"}', auth=bmc.auth, verify=bmc.ca, timeout=10,
    )
    assert not_json.status_code == 415


def test_two_bmcs_share_no_state(launch: Launch, machines: list[dict[str, str]]) -> None:
    """The same machines on two BMCs side by side: a Reset on one is not seen on the other."""
    a = launch("a", machines)
    b = launch("b", machines)
    assert a.url != b.url
    assert Path(a.ca).read_bytes() != Path(b.ca).read_bytes()
    # Each trusts its own CA only.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(a.url + "/redfish/v1/", verify=b.ca, timeout=10)
    assert a.reset("node-on", "ForceOff").status_code == 204
    assert b.reset("node-off", "On").status_code == 204
    a.wait_power("node-on", "Off")
    b.wait_power("node-off", "On")
    assert a.power("node-off") == "Off"
    assert b.power("node-on") == "On"


def test_a_restart_on_the_same_dir_keeps_its_identity_and_the_power_state(launch: Launch, machines: list[dict[str, str]]) -> None:
    first = launch("same", machines)
    ca = Path(first.ca).read_bytes()
    assert first.reset("node-on", "ForceOff").status_code == 204
    first.wait_power("node-on", "Off")
    assert first.stop() == 0
    again = launch("same", None)  # the same systems file
    assert Path(again.ca).read_bytes() == ca
    assert again.power("node-on") == "Off"
    assert again.power("node-off") == "Off"


# --- DMTF's Redfish Service Validator --------------------------------------------------

# What the validator reports against sushy-tools 2.2.0's System, and why. None concerns what
# node-fencer reads; a change here (a new failure, or one gone) fails the test.
KNOWN_FAILURES = {
    # sushy's system.json spells the Status property "HealthRollUp"; the schema's is "HealthRollup".
    ("/Status/HealthRollUp", "Unknown Property Error"),
    ("/ProcessorSummary/Status/HealthRollUp", "Unknown Property Error"),
    ("/MemorySummary/Status/HealthRollUp", "Unknown Property Error"),
    # The System links to .../Memory, a route sushy does not serve (404).
    ("/Memory", "Resource Error"),
    # sushy answers "@Redfish.Copyright", which the specification keeps for mockups.
    ("/@Redfish.Copyright", "Copyright Annotation Error"),
}
KNOWN_WARNINGS = {
    ("/ProcessorSummary/Status", "Deprecated Property Warning"),
    ("/MemorySummary/Status", "Deprecated Property Warning"),
    ("/IndicatorLED", "Deprecated Property Warning"),
}
# What node-fencer's Redfish client reads of a System.
RELIED_ON = [
    "/@odata.id",
    "/@odata.type",
    "/Id",
    "/Name",
    "/UUID",
    "/PowerState",
    "/Actions/#ComputerSystem.Reset",
    "/Actions/#ComputerSystem.Reset/target",
]


@pytest.mark.parametrize("name", ["node-on", "node-off"])
def test_dmtf_validator_finds_only_the_known_deviations(bmc: Bmc, tmp_path: Path, name: str) -> None:
    v = run_validator(bmc, bmc.path(name), tmp_path)
    # Every definition was found in the vendored schemas: it ran offline, completely.
    assert not [r for r in v.results if "Schema Error" in r[2]], v.log
    assert v.of("FAIL") == KNOWN_FAILURES, v.stdout
    assert v.of("WARN") == KNOWN_WARNINGS, v.stdout
    for prop in RELIED_ON:
        assert v.result_of(prop) == ["PASS"], (prop, v.result_of(prop))
    # Its own tally agrees with the lines read, and it exits 1 because of the failures.
    assert v.tally["FAIL"] == len(KNOWN_FAILURES) and v.tally["WARN"] == len(KNOWN_WARNINGS)
    assert v.tally["PASS"] == len([r for r in v.results if r[0] == "PASS"]) >= 30
    assert v.returncode == 1
    assert f"PowerState ({'On' if name == 'node-on' else 'Off'}): Pass" in v.log


def test_dmtf_validator_catches_a_planted_mistake(bmc: Bmc, tmp_path: Path) -> None:
    """The same System with a PowerState, an Id and a Reset target no BMC may answer, as a
    mockup (the validator's own way to override a response): each is a failure."""
    path = bmc.path("node-on")
    doc = bmc.system("node-on")
    doc["PowerState"] = "Dimmed"
    doc["Id"] = "someone-else"
    doc["Actions"]["#ComputerSystem.Reset"]["target"] = "/redfish/v1/Systems/elsewhere/Actions/ComputerSystem.Reset"
    mockup = tmp_path / "mockup"
    (mockup / path.strip("/")).mkdir(parents=True)
    (mockup / path.strip("/") / "index.json").write_text(json.dumps(doc))
    v = run_validator(bmc, path, tmp_path, mockup=mockup)
    assert v.returncode == 1
    failures = v.of("FAIL")
    assert ("/PowerState", "Property Value Error") in failures, v.stdout
    assert ("/Actions/#ComputerSystem.Reset/target", "Action URI Error") in failures, v.stdout
    assert ("/Id", "Invalid Identifier Error") in failures, v.stdout
    assert ("", "Mockup Used Warning") in v.of("WARN")


def test_the_vendored_schemas_are_dmtfs_files(tmp_path: Path) -> None:
    """tests/redfish/schemas holds DMTF's files unchanged, as its README lists them."""
    readme = (SCHEMAS / "README.md").read_text()
    listed = dict(re.findall(r"^([0-9a-f]{64})  (\S+_v1\.xml)$", readme, re.M))
    present = {p.name for p in SCHEMAS.glob("*.xml")}
    assert set(listed.values()) == present and len(present) == 9
    for digest, name in listed.items():
        assert hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest() == digest, name
        ET.parse(SCHEMAS / name)
    assert "BSD 3-Clause License" in (SCHEMAS / "LICENSE.md").read_text()


def schema_enum(filename: str, name: str) -> set[str]:
    """The members of the EnumType `name` in a vendored CSDL file."""
    root = ET.parse(SCHEMAS / filename).getroot()
    members = {
        m.get("Name")
        for enum in root.iter(f"{EDM}EnumType")
        if enum.get("Name") == name
        for m in enum.iter(f"{EDM}Member")
    }
    assert members, f"no EnumType {name} in {filename}"
    return members  # type: ignore[return-value]
