"""A Redfish BMC for the tests: OpenStack's sushy-tools emulator with its fake systems driver.

Nobody on the team wrote the Redfish service node-fencer is tested against: it is
`sushy_tools.emulator.main.app` from the sushy-tools package (pinned in
tests/redfish/requirements.txt), the Flask application `sushy-emulator` runs, configured
for the fake driver (`sushy_tools/emulator/resources/systems/fakedriver.py`). This launcher
only writes its configuration, its certificates and its password file, and serves that
application with werkzeug's threaded server as `sushy-emulator` itself does (`app.run`), in
this process, so that it stops with it.

    "$NODE_FENCER_REDFISH_VENV/bin/python" tests/redfish/bmc.py --dir DIR --systems FILE \\
        [--port N] [--http] [--user U --password P]

--systems FILE is a JSON list of {"uuid": "...", "name": "...", "power_state": "On"|"Off"}
(optionally "nics": [{"mac": "...", "ip": "..."}]; no other key). Each entry is handed to
the fake driver as is, with "nics": [] when absent (the driver reads that key for the
EthernetInterfaces collection and fails without it) and "external_notifier": false (else
the driver PUTs every change to an outside URL).

Written in DIR (made if missing):

    ca.pem                  a self-signed CA (RSA 2048, 30 days): what a client trusts
    server.pem, server.key  the serving certificate for IP 127.0.0.1 and DNS localhost, signed
                            by that CA (its key is not kept); kept, with ca.pem, when DIR
                            already holds all three, so a restarted BMC keeps its identity
    htpasswd                Apache htpasswd, one bcrypt entry (cost 4: every request checks it)
                            for --user (default admin) and --password (default
                            fencer-test-password)
    emulator.conf           the sushy emulator's configuration (Python); `sushy-emulator
                            --config DIR/emulator.conf` serves the same BMC by hand
    state/                  SUSHY_EMULATOR_STATE_DIR: the driver's SQLite state (power
                            states, pending Resets), so parallel BMCs never share state. A
                            restart on the same DIR keeps it, as a real BMC reboot leaves the
                            machine as it was: a system already held keeps its power state
                            (its power_state in the file is then not read); a state holding
                            another system, or one under another name, is refused.

Bound to 127.0.0.1:--port (0 or absent: a free port the kernel picks, no race), HTTPS
unless --http. Once GET /redfish/v1/ answers (and, with the credentials, every configured
system is listed under /redfish/v1/Systems), one JSON line goes to stdout, flushed:

    {"url": "https://127.0.0.1:PORT", "ca": "DIR/ca.pem", "user": "...", "password": "...",
     "systems": {"<name>": "/redfish/v1/Systems/<uuid>", ...}}

("url" is http:// with --http; "ca" is always the absolute path of DIR/ca.pem, unused over
plain HTTP). Nothing else is written to stdout: logs, one line per request, go to stderr. It
then serves until SIGTERM or SIGINT, or until its parent process is gone (checked every
0.2 s: the process is re-parented), and exits 0 once the server is closed. Any problem
before that (a bad systems file, a port in use, the emulator not answering within 30 s)
exits non-zero with a message on stderr.

What the fake driver serves (sushy-tools 2.2.0, feature set "full", the default), as
measured by tests/redfish/test_emulator.py:

- System ids are the configured uuids: GET /redfish/v1/Systems lists
  /redfish/v1/Systems/<uuid>. The name works as an alias: /redfish/v1/Systems/<name>
  answers 307 with Location /redfish/v1/Systems/<uuid>.
- GET /redfish/v1/Systems/<uuid> answers 200, application/json, "@odata.type"
  "#ComputerSystem.v1_13_0.ComputerSystem", "Id" and "UUID" both the uuid, "Name" the name,
  "PowerState" "On" or "Off", "Manufacturer" "Sushy Emulator", Status Enabled/OK, Boot,
  ProcessorSummary, MemorySummary, links to Memory, SecureBoot, Storage,
  EthernetInterfaces, VirtualMedia, Links.Chassis and Links.ManagedBy, and
  "Actions": {"#ComputerSystem.Reset": {"target":
  "/redfish/v1/Systems/<uuid>/Actions/ComputerSystem.Reset",
  "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown",
  "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"]}}. No SerialNumber, no Model, no
  ETag header. It also carries "@Redfish.Copyright", which the Redfish specification
  reserves for mockups.
- POST .../Actions/ComputerSystem.Reset {"ResetType": "ForceOff"} answers 204 with no body
  and changes nothing at once: the driver records a pending change due 1 to 11 s later
  (random whole seconds, from int(time.time())), applied on the first read after that
  time. Until then PowerState reads as before. "GracefulShutdown" does the same as
  ForceOff; "On" and "ForceOn" power on the same way; "GracefulRestart" and "ForceRestart"
  read Off at once, On 1 to 11 s later. A Reset to the state the system reads records
  nothing (an "On" does not cancel a pending ForceOff); one while a change is pending
  replaces it, with a new delay. "Nmi" is in the allowable values but
  the driver refuses it: 501, Base.1.0.GeneralError "Power state Nmi is not supported". A
  Reset of an unknown system: 404; a body sent without Content-Type: application/json: 415.
- Without credentials, or with a wrong user or password, every path but /, /redfish and
  /redfish/v1 answers 401 with WWW-Authenticate: Basic realm="Baremetal API",
  Content-Type application/json and {"error": {"code": "Base.1.0.GeneralError", "message":
  "Authorization required" (none sent) or "Incorrect username or password",
  "@Message.ExtendedInfo": [{"@odata.type": "/redfish/v1/$metadata#Message.1.0.0.Message",
  "MessageId": "Base.1.0.GeneralError"}]}}.
- TLS: sushy-emulator serves TLS 1.2 only (ssl.PROTOCOL_TLSv1_2); so does this launcher.
- It serves no /redfish/v1/$metadata and no /redfish/v1/odata (404), so schema-driven
  clients and DMTF's validator get the CSDL schemas elsewhere (tests/redfish/schemas).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import logging
import os
import signal
import ssl
import sys
import threading
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any, NoReturn

LOG = logging.getLogger("bmc")

DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "fencer-test-password"
READY_TIMEOUT = 30.0
SYSTEM_KEYS = {"uuid", "name", "power_state", "nics"}
POWER_STATES = {"On", "Off"}


class LaunchError(Exception):
    """A problem that stops the launch; its message goes to stderr."""


def fail(message: str) -> NoReturn:
    print(f"bmc.py: error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


# --- inputs ----------------------------------------------------------------------------


def load_systems(path: Path) -> list[dict[str, Any]]:
    """The systems file, checked strictly, as the fake driver's SUSHY_EMULATOR_FAKE_SYSTEMS."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise LaunchError(f"cannot read the systems file {path}: {err}") from err
    except json.JSONDecodeError as err:
        raise LaunchError(f"the systems file {path} is not JSON: {err}") from err
    if not isinstance(raw, list) or not raw:
        raise LaunchError(f"the systems file {path} must hold a non-empty JSON list")
    systems: list[dict[str, Any]] = []
    names: set[str] = set()
    uuids: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"{path}: entry {i}"
        if not isinstance(entry, dict):
            raise LaunchError(f"{where} is not an object")
        unknown = set(entry) - SYSTEM_KEYS
        if unknown:
            raise LaunchError(f"{where} has unknown keys {sorted(unknown)} (allowed: {sorted(SYSTEM_KEYS)})")
        for key in ("uuid", "name", "power_state"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise LaunchError(f"{where} needs a non-empty string {key!r}")
        try:
            canonical = str(uuidlib.UUID(entry["uuid"]))
        except ValueError as err:
            raise LaunchError(f"{where}: uuid {entry['uuid']!r} is not a UUID") from err
        if canonical != entry["uuid"]:
            raise LaunchError(f"{where}: write the uuid in its canonical form {canonical!r}")
        if entry["power_state"] not in POWER_STATES:
            raise LaunchError(f"{where}: power_state {entry['power_state']!r} is not one of {sorted(POWER_STATES)}")
        if "/" in entry["name"] or entry["name"] in uuids | {canonical}:
            raise LaunchError(f"{where}: name {entry['name']!r} cannot be a URI segment of its own")
        if entry["name"] in names:
            raise LaunchError(f"{where}: name {entry['name']!r} appears twice")
        if canonical in uuids:
            raise LaunchError(f"{where}: uuid {canonical} appears twice")
        nics = entry.get("nics", [])
        if not isinstance(nics, list) or not all(isinstance(n, dict) and isinstance(n.get("mac"), str) for n in nics):
            raise LaunchError(f"{where}: nics must be a list of objects with a string 'mac'")
        names.add(entry["name"])
        uuids.add(canonical)
        systems.append(
            {
                "uuid": canonical,
                "name": entry["name"],
                "power_state": entry["power_state"],
                "nics": nics,
                "external_notifier": False,
            }
        )
    return systems


# --- files -----------------------------------------------------------------------------


def write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def ensure_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """ca.pem, server.pem, server.key in DIR: kept if all three are there, else made anew."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    present = [p.exists() for p in (ca_path, cert_path, key_path)]
    if all(present):
        LOG.info("keeping the certificates in %s", directory)
        return ca_path, cert_path, key_path
    if any(present):
        raise LaunchError(
            f"{directory} holds some of ca.pem, server.pem, server.key but not all: remove them or use a new --dir"
        )

    now = dt.datetime.now(dt.timezone.utc)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=30)

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-fencer test BMC CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    # Last: its presence means the set is complete.
    write_private(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM))
    LOG.info("wrote a CA and a certificate for 127.0.0.1 and localhost in %s", directory)
    return ca_path, cert_path, key_path


def write_htpasswd(path: Path, user: str, password: str) -> None:
    import bcrypt

    digest = bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(rounds=4)).decode("ascii")
    write_private(path, f"{user}:{digest}\n".encode("utf-8"))


def write_config(path: Path, settings: dict[str, Any]) -> None:
    lines = ["# Written by tests/redfish/bmc.py; sushy-emulator --config reads it as Python."]
    lines += [f"{name} = {value!r}" for name, value in settings.items()]
    write_private(path, ("\n".join(lines) + "\n").encode("utf-8"))


# --- the server ------------------------------------------------------------------------


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """What sushy-emulator builds (ssl.PROTOCOL_TLSv1_2), without the deprecated constant."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def wait_ready(url: str, ca: Path, http: bool, auth: tuple[str, str], paths: dict[str, str]) -> None:
    """Polls GET /redfish/v1/ until it answers, then checks that the Systems collection,
    read with the credentials, lists exactly the configured systems. No System itself is
    read: the tests count the reads of each in the access log."""
    import requests

    verify: Any = False if http else str(ca)
    deadline = time.monotonic() + READY_TIMEOUT
    last: object = None
    while True:
        try:
            root = requests.get(f"{url}/redfish/v1/", verify=verify, timeout=5)
            if root.status_code == 200 and root.json().get("Systems", {}).get("@odata.id"):
                break
            last = f"HTTP {root.status_code}: {root.text[:200]}"
        except (requests.RequestException, ValueError) as err:
            last = err
        if time.monotonic() > deadline:
            raise LaunchError(f"GET {url}/redfish/v1/ did not answer within {READY_TIMEOUT:.0f} s: {last}")
        time.sleep(0.1)

    collection_uri = root.json()["Systems"]["@odata.id"]
    resp = requests.get(f"{url}{collection_uri}", auth=auth, verify=verify, timeout=10)
    if resp.status_code != 200:
        raise LaunchError(f"GET {collection_uri} with the credentials answered {resp.status_code}: {resp.text[:300]}")
    listed = sorted(m["@odata.id"] for m in resp.json().get("Members", []))
    if listed != sorted(paths.values()):
        raise LaunchError(
            f"GET {collection_uri} lists {listed}, not the configured systems {sorted(paths.values())}: "
            "a state left in --dir by another systems file? use a new --dir"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, type=Path, help="where the certificates, config and state go")
    parser.add_argument("--systems", required=True, type=Path, help="JSON list of the fake driver's systems")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 or absent: a free one)")
    parser.add_argument("--http", action="store_true", help="plain HTTP instead of HTTPS")
    parser.add_argument("--user", default=DEFAULT_USER)
    parser.add_argument("--password", default=DEFAULT_PASSWORD)
    args = parser.parse_args(argv)

    # stdout carries the one JSON line and nothing else: whatever else writes to it (a
    # library's print, a C extension) is sent to stderr.
    announce = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    if not 0 <= args.port <= 65535:
        fail(f"--port {args.port} is not a TCP port")
    if not args.user or ":" in args.user:
        fail("--user must be non-empty and without ':'")
    if not args.password:
        fail("--password must not be empty")

    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    try:
        systems = load_systems(args.systems)
        directory = args.dir.resolve()
        directory.mkdir(parents=True, exist_ok=True)
        ca, cert, key = ensure_certificates(directory)
        auth_file = directory / "htpasswd"
        write_htpasswd(auth_file, args.user, args.password)
        state_dir = directory / "state"
        state_dir.mkdir(exist_ok=True)

        import werkzeug.serving
        from werkzeug.serving import make_server

        # Plain access log lines (the tests read them), never terminal colours.
        werkzeug.serving._log_add_style = False

        # Bound first (port 0: the kernel picks a free one), so the config names the real port.
        server = make_server(
            "127.0.0.1",
            args.port,
            app=lambda environ, start_response: [],
            threaded=True,
            ssl_context=None if args.http else server_tls_context(cert, key),
        )
        port = server.server_address[1]
        config = directory / "emulator.conf"
        settings: dict[str, Any] = {
            "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
            "SUSHY_EMULATOR_LISTEN_PORT": port,
        }
        if not args.http:
            settings["SUSHY_EMULATOR_SSL_CERT"] = str(cert)
            settings["SUSHY_EMULATOR_SSL_KEY"] = str(key)
        settings.update(
            {
                "SUSHY_EMULATOR_AUTH_FILE": str(auth_file),
                "SUSHY_EMULATOR_STATE_DIR": str(state_dir),
                "SUSHY_EMULATOR_FEATURE_SET": "full",
                "SUSHY_EMULATOR_FAKE_DRIVER": True,
                "SUSHY_EMULATOR_FAKE_SYSTEMS": systems,
                # The System links to its Storage collection, which the static storage
                # driver answers 500 for a system it has no entry for: an empty one each.
                "SUSHY_EMULATOR_STORAGE": {s["uuid"]: [] for s in systems},
            }
        )
        write_config(config, settings)

        # The emulator's own application, configured from that file as `sushy-emulator
        # --config` configures it (the auth middleware included).
        from sushy_tools.emulator import main as emulator

        app = emulator.app
        app.configure(config_file=str(config))
        if app.systems.driver != "<fake>":
            raise LaunchError(f"the emulator loaded the {app.systems.driver} systems driver, not the fake one")
        held = set(app.systems.systems)
        missing = {s["uuid"] for s in systems} - held
        if missing:
            raise LaunchError(f"the fake driver does not hold {sorted(missing)}")
        paths = {}
        for entry in systems:
            if app.systems.name(entry["uuid"]) != entry["name"]:
                raise LaunchError(
                    f"the fake driver holds {entry['uuid']} as {app.systems.name(entry['uuid'])!r}, "
                    f"not {entry['name']!r}: a state left in --dir by another systems file? use a new --dir"
                )
            paths[entry["name"]] = f"/redfish/v1/Systems/{entry['uuid']}"
        server.app = app

        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        thread.start()
        scheme = "http" if args.http else "https"
        url = f"{scheme}://127.0.0.1:{port}"
        wait_ready(url, ca, args.http, (args.user, args.password), paths)
    except LaunchError as err:
        fail(str(err))

    LOG.info("serving %s (state in %s)", url, state_dir)
    announce.write(
        json.dumps({"url": url, "ca": str(ca), "user": args.user, "password": args.password, "systems": paths}) + "\n"
    )
    announce.flush()

    if parent == 1:
        LOG.warning("started with no parent process to watch: only a signal stops this BMC")
    while not stop.wait(0.2):
        if parent != 1 and os.getppid() != parent:
            LOG.info("the parent process %d is gone: stopping", parent)
            break
    LOG.info("stopping")
    server.shutdown()
    thread.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
