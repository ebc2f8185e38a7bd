"""infra/onprem: node-fencer off the cluster it fences, through the machines' BMCs.

Checked here: every YAML of infra/onprem parses; the fenced cluster's RBAC is
infra/kubernetes/rbac.yaml reused through kustomize, not a copy, and built by
`kubectl kustomize` it grants exactly the rules of infra/manifest.json, to the
ServiceAccount the off-cluster fencer authenticates with as well; the Deployment and
the systemd env example set only variables docs/configuration.md lists, the same
ones both ways; the container runs non-root on a read-only root, without
privilege escalation or a token of the cluster it runs in, probed on what
`serve` answers; the inventory example follows the inventory's rules (and a
planted mistake in it is caught); the NetworkPolicy admits the serve port only;
checkov finds nothing; the systemd unit passes `systemd-analyze verify` (a planted
mistake does not) and its sandbox stays within a `systemd-analyze security`
threshold; the Alertmanager example passes `amtool check-config`.

kubectl (for kustomize) and amtool are the ones `make setup` builds, through
NODE_FENCER_KUBE_BIN and NODE_FENCER_AMTOOL: a missing one fails, never skips.
systemd-analyze is the host's (tests/stack/setup.sh installs Debian's systemd
package where it is missing): a missing one fails, never skips.
"""

from __future__ import annotations

import configparser
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

import infra_lib as L

ONPREM = L.INFRA / "onprem"
KUBERNETES = ONPREM / "kubernetes"
FENCED = KUBERNETES / "fenced-cluster"
UNIT = ONPREM / "node-fencer.service"
ENV_EXAMPLE = ONPREM / "node-fencer.env.example"
INVENTORY_EXAMPLE = ONPREM / "inventory.example.json"
ALERTMANAGER = ONPREM / "alertmanager.yaml"
SECRETS_EXAMPLE = KUBERNETES / "secrets.example.yaml"
# rbac.yaml's directory, a kustomize base of its own.
RBAC_DIR = L.RBAC_YAML.parent
CONFIGURATION_MD = L.REPO / "docs" / "configuration.md"
SERVE_RS = L.REPO / "handler" / "src" / "entry" / "serve.rs"

# The settings that only mean something with ACTIVE_FENCING=stuck or on; the code
# refuses each of them without it.
ACTIVE_FENCING_TUNING = {"POWER_OFF_AFTER_SECONDS", "POWER_OFF_WAIT_SECONDS", "PARTITION_PERCENT", "POWER_OFF_CONTROL_PLANE"}
# What every off-cluster run needs set.
REQUIRED = {"KUBECONFIG", "REDFISH_INVENTORY", "WEBHOOK_TOKEN", "SERVE_ROUTES", "SWEEP_INTERVAL_SECONDS"}
# The on-premises image's placeholder (docs/packaging.md).
IMAGE_PLACEHOLDER = "europe-docker.pkg.dev/PROJECT/REPO/node-fencer-onprem:TAG"
NAME = "node-fencer"
SERVICE_ACCOUNT = {"kind": "ServiceAccount", "name": NAME, "namespace": "kube-system"}


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(ONPREM.rglob("*.yaml"))


def documents(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kube_objects(directory: Path = KUBERNETES) -> list[dict]:
    """The Kubernetes objects of one directory's YAML files (not its kustomization)."""
    found = []
    for path in sorted(directory.glob("*.yaml")):
        found.extend(d for d in documents(path) if d["kind"] != "Kustomization")
    return found


def one(objects: list[dict], kind: str, name: str = NAME) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def deployment() -> dict:
    return one(kube_objects(), "Deployment")


def pod_spec() -> dict:
    return deployment()["spec"]["template"]["spec"]


def container() -> dict:
    (only,) = pod_spec()["containers"]
    return only


def deployment_env() -> dict[str, dict]:
    return {e["name"]: e for e in container().get("env", [])}


ENV_LINE = re.compile(r"^(#)?([A-Z][A-Z0-9_]*)=(.*)$")


def env_example() -> tuple[dict[str, str], set[str]]:
    """The env example's settings (NAME=value) and the optional ones it shows
    commented out (#NAME=value)."""
    settings: dict[str, str] = {}
    optional: set[str] = set()
    for number, line in enumerate(ENV_EXAMPLE.read_text(encoding="utf-8").splitlines(), start=1):
        m = ENV_LINE.match(line)
        if m is None:
            assert not line.strip() or line.startswith("#"), (
                f"{L.rel(ENV_EXAMPLE)}:{number}: an EnvironmentFile line is NAME=value or a comment: {line!r}"
            )
            continue
        if m.group(1):
            optional.add(m.group(2))
            continue
        name, value = m.group(2), m.group(3)
        assert name not in settings, f"{L.rel(ENV_EXAMPLE)}:{number}: {name} is set twice"
        assert not value.startswith(("'", '"')) and value == value.strip(), (
            f"{L.rel(ENV_EXAMPLE)}:{number}: {name}: no quotes and no blanks around the value"
        )
        settings[name] = value
    return settings, optional


def documented_variables() -> set[str]:
    """The variables of docs/configuration.md's table (first column), as
    test_terraform reads it; the AWS SDK's own are not node-fencer's."""
    text = CONFIGURATION_MD.read_text(encoding="utf-8")
    table = text.split("# Configuration", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| (`[A-Z][^|]*?) \|", table, flags=re.M)
    rows = {name for cell in cells for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cell)}
    rows = {r for r in rows if not r.startswith("AWS_")}
    assert rows, f"no variables found in {L.rel(CONFIGURATION_MD)}'s table"
    return rows


def manifest() -> dict:
    if not L.MANIFEST.is_file():
        pytest.fail(f"{L.rel(L.MANIFEST)} does not exist: run `make manifest`")
    return json.loads(L.MANIFEST.read_text(encoding="utf-8"))


def manifest_rules(key: str) -> set[tuple[str, str, str]]:
    entries = manifest()[key]
    assert entries, f"{key} in {L.rel(L.MANIFEST)} is empty"
    return {(rule["group"], rule["resource"], verb) for rule in entries for verb in rule["verbs"]}


def granted(role: dict) -> set[tuple[str, str, str]]:
    found = set()
    for rule in role["rules"]:
        for field in rule:
            assert not any("*" in item for item in rule[field]), f"wildcard in {field} of {rule}"
        found |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return found


def _executable(path: str, what: str) -> str:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"{what}: {path} is not an executable file: run `make setup`")
    return path


def kubectl() -> str:
    directory = os.environ.get("NODE_FENCER_KUBE_BIN")
    if not directory:
        pytest.fail(
            "NODE_FENCER_KUBE_BIN is not set: run `make setup` and source ~/.cache/node-fencer/env.sh, "
            "as `make infra-test` does (its kubectl builds the kustomizations)"
        )
    return _executable(os.path.join(directory, "kubectl"), "NODE_FENCER_KUBE_BIN/kubectl")


def kustomize(directory: Path) -> list[dict]:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {L.rel(directory)} failed:\n{result.stderr}"
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


# ---------------------------------------------------------------------------
# Every YAML parses; the kustomizations hold what they should
# ---------------------------------------------------------------------------


def test_onprem_has_its_files():
    for path in (UNIT, ENV_EXAMPLE, INVENTORY_EXAMPLE, ALERTMANAGER, SECRETS_EXAMPLE, ONPREM / "README.md"):
        assert path.is_file(), f"{L.rel(path)} is missing"
    assert len(yaml_files()) >= 9, f"too few YAML files under {L.rel(ONPREM)}: {[L.rel(p) for p in yaml_files()]}"


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(ONPREM)))
def test_onprem_yaml_parses(path: Path):
    docs = documents(path)
    assert docs, f"{L.rel(path)} holds no document"
    if KUBERNETES in path.parents:
        for doc in docs:
            assert isinstance(doc, dict) and {"apiVersion", "kind"} <= set(doc), f"{L.rel(path)}: not a Kubernetes object: {doc!r:.200}"
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == NAME, f"{L.rel(path)}: {doc['kind']} lacks the app label"


def test_onprem_management_kustomization_applies_everything_but_the_secrets():
    (kustomization,) = documents(KUBERNETES / "kustomization.yaml")
    listed = kustomization["resources"]
    present = sorted(p.name for p in KUBERNETES.glob("*.yaml") if p.name not in ("kustomization.yaml", SECRETS_EXAMPLE.name))
    assert sorted(listed) == present, f"the management kustomization must list {present}, lists {listed}"
    assert SECRETS_EXAMPLE.name not in listed, "the Secrets' placeholders must never be applied as they are"
    built = kustomize(KUBERNETES)
    kinds = sorted(o["kind"] for o in built)
    assert kinds == ["ConfigMap", "Deployment", "Namespace", "NetworkPolicy", "Service"], kinds
    for obj in built:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAME, f"{obj['kind']} outside the namespace {NAME}"
    namespace = one(built, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ---------------------------------------------------------------------------
# The fenced cluster: rbac.yaml reused, and the ServiceAccount bound to it
# ---------------------------------------------------------------------------


def test_onprem_fenced_cluster_reuses_rbac_yaml_rather_than_a_copy():
    (fenced,) = documents(FENCED / "kustomization.yaml")
    bases = [(FENCED / r).resolve() for r in fenced["resources"]]
    assert RBAC_DIR in bases, f"{L.rel(FENCED)}/kustomization.yaml must apply {L.rel(RBAC_DIR)} (rbac.yaml's kustomization)"
    (base,) = documents(RBAC_DIR / "kustomization.yaml")
    assert base["resources"] == [L.RBAC_YAML.name], f"{L.rel(RBAC_DIR)}/kustomization.yaml must apply rbac.yaml alone"
    assert set(base) == {"apiVersion", "kind", "resources"}, f"rbac.yaml's kustomization must not transform it: {sorted(base)}"
    # No role is restated under infra/onprem: the rules live in rbac.yaml only.
    for path in yaml_files():
        for doc in documents(path):
            assert doc.get("kind") not in ("Role", "ClusterRole"), f"{L.rel(path)} restates a {doc['kind']}: rbac.yaml is the one source"


def test_onprem_fenced_cluster_rbac_equals_the_manifest():
    built = kustomize(FENCED)
    roles = [o for o in built if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    # rbac.yaml's six objects, unchanged by the build.
    original = documents(L.RBAC_YAML)
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    for obj in original:
        (same,) = [o for o in roles if key(o) == key(obj)]
        assert same == obj, f"kustomize changed {key(obj)} of {L.rel(L.RBAC_YAML)}"
    # Its rules are exactly what the code calls, by the manifest.
    cluster_role = one(built, "ClusterRole")
    assert granted(cluster_role) == manifest_rules("kubernetes_rules"), "the ClusterRole is not kubernetes_rules of the manifest"
    control = [o for o in built if o["kind"] == "Role" and o["metadata"]["namespace"] == "kube-system"]
    node_lease = [o for o in built if o["kind"] == "Role" and o["metadata"]["namespace"] == "kube-node-lease"]
    assert len(control) == 1 and len(node_lease) == 1, [key(o) for o in built if o["kind"] == "Role"]
    assert granted(control[0]) == manifest_rules("control_rules"), "the Role in kube-system is not control_rules of the manifest"
    assert granted(node_lease[0]) == manifest_rules("node_lease_rules"), "the Role in kube-node-lease is not node_lease_rules"
    # Nothing beyond rbac.yaml grants anything.
    assert sorted(key(o) for o in built if o["kind"] in ("Role", "ClusterRole")) == sorted(
        key(o) for o in original if o["kind"] in ("Role", "ClusterRole")
    )


def test_onprem_fenced_cluster_service_account_is_bound_to_every_role():
    built = kustomize(FENCED)
    account = one(built, "ServiceAccount")
    assert account["metadata"]["namespace"] == "kube-system"
    assert account["automountServiceAccountToken"] is False, "no pod of the fenced cluster uses it"
    token = one(built, "Secret", f"{NAME}-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["namespace"] == "kube-system"
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == NAME

    def bound(binding: dict) -> bool:
        return SERVICE_ACCOUNT in binding["subjects"]

    cluster_bindings = [b for b in built if b["kind"] == "ClusterRoleBinding" and bound(b)]
    assert [b["roleRef"] for b in cluster_bindings] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}
    ], "the ServiceAccount must be bound to the ClusterRole, once"
    for role in (o for o in built if o["kind"] == "Role"):
        namespace = role["metadata"]["namespace"]
        bindings = [
            b
            for b in built
            if b["kind"] == "RoleBinding" and b["metadata"]["namespace"] == namespace and bound(b)
        ]
        assert [b["roleRef"] for b in bindings] == [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
        ], f"the ServiceAccount must be bound to the Role in {namespace}, once"
    for binding in (b for b in built if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and bound(b)):
        assert binding["subjects"] == [SERVICE_ACCOUNT], f"{binding['metadata']['name']} binds more than the ServiceAccount"


# ---------------------------------------------------------------------------
# The settings: documented variables only, the same both ways
# ---------------------------------------------------------------------------


def test_onprem_deployment_env_names_only_documented_variables():
    documented = documented_variables()
    env = deployment_env()
    unknown = sorted(set(env) - documented)
    assert not unknown, f"the Deployment sets {unknown}, which {L.rel(CONFIGURATION_MD)}'s table does not list"
    missing = sorted(REQUIRED - set(env))
    assert not missing, f"the Deployment must set {missing}"
    for name, entry in env.items():
        if name == "WEBHOOK_TOKEN":
            ref = entry["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("node-fencer-webhook", "token"), ref
            assert "value" not in entry, "the token comes from its Secret, never inline"
        else:
            assert isinstance(entry.get("value"), str), f"{name}: a plain string value"


def test_onprem_env_example_names_only_documented_variables():
    documented = documented_variables()
    settings, optional = env_example()
    unknown = sorted((set(settings) | optional) - documented)
    assert not unknown, f"{L.rel(ENV_EXAMPLE)} names {unknown}, which {L.rel(CONFIGURATION_MD)}'s table does not list"
    missing = sorted(REQUIRED - set(settings))
    assert not missing, f"{L.rel(ENV_EXAMPLE)} must set {missing}"
    assert "PORT" not in settings, "the unit passes the port with --port"


def test_onprem_both_ways_run_the_same_settings():
    settings, optional = env_example()
    env = deployment_env()
    assert set(settings) == set(env), (
        f"the env example and the Deployment disagree: only in the example {sorted(set(settings) - set(env))}, "
        f"only in the Deployment {sorted(set(env) - set(settings))}"
    )
    for name, value in settings.items():
        if name != "WEBHOOK_TOKEN":
            assert env[name]["value"] == value, f"{name}: {value!r} under systemd, {env[name]['value']!r} in the Deployment"
    assert "ACTIVE_FENCING" in optional and ACTIVE_FENCING_TUNING <= optional, "the example shows active fencing, commented out"


@pytest.mark.parametrize("where", ["deployment", "env example"])
def test_onprem_settings_are_the_on_premises_ones(where: str):
    values = (
        {n: e.get("value") for n, e in deployment_env().items()} if where == "deployment" else env_example()[0]
    )
    assert values["SERVE_ROUTES"] == "alertmanager", "on-premises there is no Pub/Sub or Eventarc: the webhook only"
    assert 30 <= int(values["SWEEP_INTERVAL_SECONDS"]) <= 3600, "SWEEP_INTERVAL_SECONDS takes 30..=3600"
    assert values["DRY_RUN"] == "true", "the examples start in dry run"
    tuning = sorted(ACTIVE_FENCING_TUNING & set(values))
    if values.get("ACTIVE_FENCING") not in ("stuck", "on"):
        assert not tuning, f"{tuning} without ACTIVE_FENCING=stuck or on: the code refuses to start"
    for name in ("PUSH_AUDIENCE", "PUSH_SERVICE_ACCOUNT", "GKE_CLUSTER", "CLUSTER_NAME"):
        assert name not in values, f"{name} has no place off-cluster on-premises"
    if where == "env example":
        assert values["WEBHOOK_TOKEN"].startswith("REPLACE"), "the example token is a marked placeholder"


def test_onprem_env_example_paths_are_the_units():
    """The files the env example names are under /etc/node-fencer, which the
    unit leaves readable (ProtectSystem=strict) and not hidden (ProtectHome)."""
    settings, _ = env_example()
    for name in ("KUBECONFIG", "REDFISH_INVENTORY", "REDFISH_CREDENTIALS_DIR"):
        assert settings[name].startswith("/etc/node-fencer/"), f"{name}={settings[name]}"
    assert settings["REDFISH_CREDENTIALS_DIR"] == "/etc/node-fencer/bmc", "the documented default"


# ---------------------------------------------------------------------------
# The Deployment
# ---------------------------------------------------------------------------


def serve_port() -> int:
    args = container()["args"]
    assert args[0] == "serve", f"the container runs `serve`, not {args}"
    assert args[1:] in ([], ["--port", "8080"]), args
    return 8080


def metrics_port() -> int:
    """The port serve answers /metrics on: the Deployment's METRICS_PORT."""
    return int(deployment_env()["METRICS_PORT"]["value"])


def test_onprem_deployment_is_one_recreated_replica_of_the_image():
    spec = deployment()["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}, "never an old and a new pod side by side"
    assert container()["image"] == IMAGE_PLACEHOLDER
    cloud_run = IMAGE_PLACEHOLDER.replace("node-fencer-onprem:", "node-fencer:")
    assert cloud_run in (L.GCP_MODULE / "variables.tf").read_text(encoding="utf-8"), (
        "the placeholder must be the Cloud Run module's, with the on-premises image's name"
    )
    ports = container()["ports"]
    assert ports == [
        {"name": "http", "containerPort": serve_port(), "protocol": "TCP"},
        {"name": "metrics", "containerPort": metrics_port(), "protocol": "TCP"},
    ], ports


def test_onprem_container_is_non_root_read_only_without_escalation():
    pod = pod_spec()
    c = container()
    assert pod["automountServiceAccountToken"] is False, "it talks to ANOTHER cluster: no token of this one"
    assert pod.get("enableServiceLinks") is False
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), key
    pod_context = pod["securityContext"]
    assert pod_context["runAsNonRoot"] is True
    assert pod_context["runAsUser"] != 0 and pod_context["runAsGroup"] != 0
    assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
    context = c["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context.get("runAsUser", pod_context["runAsUser"]) != 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["capabilities"] == {"drop": ["ALL"]}, "every capability dropped, none added"
    for mount in c["volumeMounts"]:
        assert mount.get("readOnly") is True, f"{mount['name']} must be mounted read-only"
    resources = c["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], resources


def test_onprem_probes_ask_what_serve_answers():
    source = SERVE_RS.read_text(encoding="utf-8")
    assert re.search(r'Method::GET && path == "/healthz"', source), f"{L.rel(SERVE_RS)} no longer answers GET /healthz"
    c = container()
    for probe in ("readinessProbe", "livenessProbe"):
        check = c[probe]["httpGet"]
        assert check["path"] == "/healthz", f"{probe}: {check}"
        assert check["port"] in ("http", serve_port()), f"{probe}: {check}"


def projected_files() -> dict[str, tuple[str, str, str]]:
    """Every file the Deployment's volumes put in the container: its path,
    and the (kind, object, key) it comes from."""
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    files: dict[str, tuple[str, str, str]] = {}
    for volume in pod_spec()["volumes"]:
        root = mounts[volume["name"]]
        sources = volume["projected"]["sources"] if "projected" in volume else [volume]
        for source in sources:
            for kind in ("configMap", "secret"):
                if kind in source:
                    ref = source[kind]
                    name = ref.get("name", ref.get("secretName"))
                    for item in ref["items"]:
                        path = f"{root}/{item['path']}"
                        assert path not in files, f"{path} projected twice"
                        files[path] = (kind, name, item["key"])
    return files


def configmap_inventory() -> dict:
    configmap = one(kube_objects(), "ConfigMap", "node-fencer-inventory")
    return json.loads(configmap["data"]["inventory.json"])


def credentials_names(inventory: dict) -> set[str]:
    return {m.get("credentials", m["name"]) for m in inventory["machines"]}


def test_onprem_deployment_reads_its_files_where_the_settings_say():
    files = projected_files()
    env = deployment_env()
    assert files[env["KUBECONFIG"]["value"]] == ("secret", "node-fencer-kubeconfig", "kubeconfig")
    assert files[env["REDFISH_INVENTORY"]["value"]] == ("configMap", "node-fencer-inventory", "inventory.json")
    inventory = configmap_inventory()
    with INVENTORY_EXAMPLE.open(encoding="utf-8") as f:
        assert inventory == json.load(f), f"the ConfigMap's inventory.json must be {L.rel(INVENTORY_EXAMPLE)}"
    bundles = {inventory.get("caBundle")} | {m.get("caBundle") for m in inventory["machines"]}
    for bundle in bundles - {None}:
        assert bundle in files, f"the inventory's caBundle {bundle} is not projected"
    directory = env["REDFISH_CREDENTIALS_DIR"]["value"]
    secrets = {(s["metadata"]["name"]): s for s in documents(SECRETS_EXAMPLE)}
    for name in credentials_names(inventory):
        for file in ("username", "password"):
            path = f"{directory}/{name}/{file}"
            assert path in files, f"credentials {name}: {path} is not projected"
            kind, secret, key = files[path]
            assert kind == "secret" and key in secrets[secret]["stringData"], f"{path}: {secret}/{key} is not in the Secrets example"


def test_onprem_secrets_example_holds_marked_placeholders_only():
    for secret in documents(SECRETS_EXAMPLE):
        assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == NAME
        assert "data" not in secret, "stringData only, so the placeholders read as such"
        for key, value in secret["stringData"].items():
            assert "REPLACE" in value, f"{secret['metadata']['name']}/{key} is not a marked placeholder"
    referenced = {(kind, name) for kind, name, _ in projected_files().values()}
    referenced.add(("secret", deployment_env()["WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]))
    examples = {("secret", s["metadata"]["name"]) for s in documents(SECRETS_EXAMPLE)}
    assert {r for r in referenced if r[0] == "secret"} == examples, "every Secret the Deployment reads is in the example, and no other"


def test_onprem_network_policy_admits_the_serve_and_metrics_ports_only():
    objects = kube_objects()
    policy = one(objects, "NetworkPolicy")
    pod_labels = deployment()["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items(), "the policy must select the fencer's pod"
    assert "Ingress" in policy["spec"]["policyTypes"]
    rules = policy["spec"]["ingress"]
    assert rules, "an empty ingress list would refuse the webhook too"
    admitted = [rule.get("ports") for rule in rules]
    allowed = [[{"protocol": "TCP", "port": serve_port()}], [{"protocol": "TCP", "port": metrics_port()}]]
    assert admitted == allowed, f"ingress beyond the serve and metrics ports: {rules}"
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http", "metrics"]


def test_onprem_checkov_kubernetes_has_no_failed_check():
    command = [sys.executable, "-m", "checkov.main", "--compact", "--skip-download", "-o", "json"]
    result = subprocess.run(
        [*command, "-d", str(KUBERNETES), "--framework", "kubernetes"], cwd=L.REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode in (0, 1), f"checkov failed to run ({result.returncode}):\n{result.stderr[-4000:]}"
    data = json.loads(result.stdout)
    results = data if isinstance(data, list) else [data]
    failed = [c for r in results for c in r.get("results", {}).get("failed_checks", [])]
    assert not failed, "checkov failed checks:\n" + "\n".join(f"{c['check_id']} {c['resource']} ({c['file_path']})" for c in failed)
    passed = sum(r.get("summary", {}).get("passed", 0) for r in results)
    assert passed > 50, f"checkov evaluated too little in {L.rel(KUBERNETES)}: {passed} passed"
    for check in (c for r in results for c in r["results"].get("skipped_checks", [])):
        reason = (check.get("check_result") or {}).get("suppress_comment") or ""
        assert len(reason.split()) >= 8, f"skip without a real reason: {check['check_id']} {check['resource']}: {reason!r}"


# ---------------------------------------------------------------------------
# The inventory
# ---------------------------------------------------------------------------

MACHINE_NAME = re.compile(r"[a-z0-9.-]{1,63}")
INVENTORY_KEYS = {"nodeLabel", "caBundle", "machines"}
MACHINE_KEYS = {"name", "node", "endpoint", "system", "credentials", "caBundle"}


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def inventory_problems(inventory: dict) -> list[str]:
    """What the documented inventory rules find wrong (docs/onprem.md): a
    machine is named by `name` (lowercase letters, digits, `-`, `.`, at most
    63), unique; its endpoint is https://, or http:// to a loopback address; it
    has a `node`, or the inventory a `nodeLabel` to find its Node by; `system`,
    when given, is a path /redfish/v1/Systems/ID; `credentials` is a name too."""
    problems = []
    unknown = set(inventory) - INVENTORY_KEYS
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}")
    machines = inventory.get("machines")
    if not isinstance(machines, list) or not machines:
        return [*problems, "machines: a non-empty list"]
    label = inventory.get("nodeLabel")
    names = [m.get("name") for m in machines]
    for machine in machines:
        name = machine.get("name")
        at = f"machine {name!r}"
        unknown = set(machine) - MACHINE_KEYS
        if unknown:
            problems.append(f"{at}: unknown keys {sorted(unknown)}")
        if not isinstance(name, str) or not MACHINE_NAME.fullmatch(name):
            problems.append(f"{at}: a name is 1 to 63 lowercase letters, digits, `-` or `.`")
        if names.count(name) > 1:
            problems.append(f"{at}: the name is used twice")
        endpoint = urlsplit(machine.get("endpoint", ""))
        if endpoint.scheme == "http":
            if not _loopback(endpoint.hostname or ""):
                problems.append(f"{at}: http:// only to a loopback address")
        elif endpoint.scheme != "https" or not endpoint.hostname:
            problems.append(f"{at}: the endpoint must be https://HOST")
        if endpoint.path not in ("", "/") or endpoint.query or endpoint.username:
            problems.append(f"{at}: the endpoint is scheme, host and port only")
        if "node" not in machine and not label:
            problems.append(f"{at}: no node, and no nodeLabel to find its Node by")
        system = machine.get("system")
        if system is not None and not re.fullmatch(r"/redfish/v1/Systems/[A-Za-z0-9._~-]+", system):
            problems.append(f"{at}: system {system!r} is not /redfish/v1/Systems/ID")
        credentials = machine.get("credentials")
        if credentials is not None and not MACHINE_NAME.fullmatch(credentials):
            problems.append(f"{at}: credentials {credentials!r} is not a name")
    return problems


def example_inventory() -> dict:
    with INVENTORY_EXAMPLE.open(encoding="utf-8") as f:
        return json.load(f)


def test_onprem_inventory_example_is_valid():
    inventory = example_inventory()
    assert inventory_problems(inventory) == []
    # The example shows both ways of naming a Node, and the recommended label
    # prefix, which kubelets cannot set on themselves (NodeRestriction).
    assert inventory["nodeLabel"].startswith("node-restriction.kubernetes.io/")
    assert any("node" in m for m in inventory["machines"]) and any("node" not in m for m in inventory["machines"])
    assert any("system" in m for m in inventory["machines"]) and any("credentials" in m for m in inventory["machines"])


def _planted(change) -> dict:
    inventory = example_inventory()
    change(inventory)
    return inventory


@pytest.mark.parametrize(
    "mistake, change",
    [
        ("a name used twice", lambda i: i["machines"][1].update(name=i["machines"][0]["name"])),
        ("an uppercase name", lambda i: i["machines"][0].update(name="Rack1-U07")),
        ("a name of 64 characters", lambda i: i["machines"][0].update(name="a" * 64)),
        ("plain http to a BMC", lambda i: i["machines"][0].update(endpoint="http://10.20.0.7")),
        ("no scheme", lambda i: i["machines"][0].update(endpoint="10.20.0.7")),
        ("a path in the endpoint", lambda i: i["machines"][0].update(endpoint="https://10.20.0.7/redfish/v1")),
        ("no node and no label", lambda i: i.pop("nodeLabel")),
        ("a system outside Systems", lambda i: i["machines"][0].update(system="/redfish/v1/Managers/1")),
        ("a misspelt key", lambda i: i["machines"][0].update(endpiont="https://10.20.0.9")),
        ("no machines", lambda i: i.update(machines=[])),
    ],
)
def test_onprem_inventory_check_catches_a_planted_mistake(mistake: str, change):
    assert inventory_problems(_planted(change)), f"the inventory check let {mistake} through"


def test_onprem_inventory_check_takes_a_loopback_tunnel():
    inventory = _planted(lambda i: i["machines"][0].update(endpoint="http://127.0.0.1:8443"))
    assert inventory_problems(inventory) == []


# ---------------------------------------------------------------------------
# The systemd unit
# ---------------------------------------------------------------------------


def unit() -> configparser.ConfigParser:
    """The unit as INI; a key given twice (SystemCallFilter=) keeps its values
    joined by newlines."""

    class Multi(dict):
        def __setitem__(self, key, value):
            if key in self and isinstance(value, list) and isinstance(self[key], list):
                self[key].extend(value)
            else:
                super().__setitem__(key, value)

    parser = configparser.RawConfigParser(dict_type=Multi, strict=False, interpolation=None, empty_lines_in_values=False)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(UNIT.read_text(encoding="utf-8"), source=str(UNIT))
    return parser


# Each hardening key and the value it must have ("" = set and empty).
HARDENING = {
    "User": "node-fencer",
    "Group": "node-fencer",
    "EnvironmentFile": "/etc/node-fencer/node-fencer.env",
    "Restart": "always",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
}


def test_onprem_unit_hardening_keys():
    """Always, with or without systemd-analyze: the unit as text holds the
    sandbox the docs describe."""
    service = unit()["Service"]
    for key, expected in HARDENING.items():
        assert key in service, f"{L.rel(UNIT)}: [Service] lacks {key}="
        assert service[key].strip() == expected, f"{L.rel(UNIT)}: {key}={service[key]!r}, expected {expected!r}"
    assert "DynamicUser" not in service, "a static user owns the credentials and the kubeconfig"
    assert re.fullmatch(r"/usr/local/bin/node-fencer serve --port (\d+)", service["ExecStart"]), service["ExecStart"]
    assert int(service["ExecStart"].rsplit(" ", 1)[1]) == serve_port(), "the same port as the Deployment's"
    filters = [line.strip() for line in service["SystemCallFilter"].splitlines() if line.strip()]
    assert filters[0] == "@system-service", filters
    assert re.fullmatch(r"\d+[KMG]", service["MemoryMax"]), service["MemoryMax"]
    assert service["TasksMax"].isdigit()
    assert "network-online.target" in unit()["Unit"]["After"]
    assert unit()["Install"]["WantedBy"] == "multi-user.target"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found is not None, (
        "systemd-analyze is not installed: tests/stack/setup.sh installs it (Debian's systemd package); "
        "node-fencer.service is checked by systemd itself, not as text only"
    )
    return found


def _unit_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit in a temporary directory, its binary a stub: verify requires
    ExecStart's program to exist."""
    stub = tmp_path / "node-fencer"
    stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stub.chmod(0o755)
    text = UNIT.read_text(encoding="utf-8") if text is None else text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace("/usr/local/bin/node-fencer", str(stub)), encoding="utf-8")
    return copy


def _verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([systemd_analyze(), "verify", str(path)], capture_output=True, text=True, timeout=120)


def test_onprem_unit_passes_systemd_analyze_verify(tmp_path: Path):
    result = _verify(_unit_copy(tmp_path))
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not output, f"systemd-analyze verify {UNIT.name}: exit {result.returncode}\n{output}"


@pytest.mark.parametrize(
    "old, new",
    [("ProtectSystem=strict", "ProtectSytem=strict"), ("Restart=always", "Restart=sometimes")],
)
def test_onprem_unit_verify_finds_a_planted_mistake(tmp_path: Path, old: str, new: str):
    text = UNIT.read_text(encoding="utf-8")
    assert old in text
    result = _verify(_unit_copy(tmp_path, text.replace(old, new)))
    assert result.returncode != 0 or (result.stdout + result.stderr).strip(), f"verify let {new!r} through"


# systemd-analyze security's overall exposure, times ten ("1.2 OK" is 12):
# at most 2.0, well within its "OK" band (below 3.0).
EXPOSURE_THRESHOLD = 20


def test_onprem_unit_sandbox_is_within_the_exposure_threshold(tmp_path: Path):
    copy = _unit_copy(tmp_path)
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", f"--threshold={EXPOSURE_THRESHOLD}", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert level, f"no exposure level in systemd-analyze security's output:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
    assert result.returncode == 0, f"exposure {level.group(1)} is over {EXPOSURE_THRESHOLD / 10}:\n{result.stdout[-3000:]}"


# ---------------------------------------------------------------------------
# Alertmanager
# ---------------------------------------------------------------------------


def amtool() -> str:
    binary = os.environ.get("NODE_FENCER_AMTOOL")
    if not binary:
        pytest.fail("NODE_FENCER_AMTOOL is not set: run `make setup` and source ~/.cache/node-fencer/env.sh")
    return _executable(binary, "NODE_FENCER_AMTOOL")


def test_onprem_alertmanager_example_passes_amtool():
    result = subprocess.run([amtool(), "check-config", str(ALERTMANAGER)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"amtool check-config {L.rel(ALERTMANAGER)}:\n{result.stdout}\n{result.stderr}"


def test_onprem_alertmanager_example_posts_to_serve_with_the_token():
    config = documents(ALERTMANAGER)[0]
    example = documents(L.ALERTMANAGER_EXAMPLE / "alertmanager.yaml")[0]
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == NAME]
    (expected,) = [r for r in example["route"]["routes"] if r["receiver"] == NAME]
    assert route == expected, "the route must be the one of infra/examples/alertmanager (the PrometheusRule's label)"
    (receiver,) = [r for r in config["receivers"] if r["name"] == NAME]
    (webhook,) = receiver["webhook_configs"]
    url = urlsplit(webhook["url"])
    assert url.scheme == "https" and url.path == "/alertmanager", f"serve's webhook route over TLS: {webhook['url']}"
    assert webhook["send_resolved"] is True, "a resolved alert asks for recovery"
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"
    assert "credentials_file" in webhook["http_config"]["authorization"], "the token from a file, not inline"


# ---------------------------------------------------------------------------
# The docs
# ---------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


@pytest.mark.parametrize("page", ["infra/onprem/README.md", "docs/onprem.md"])
def test_onprem_docs_links_resolve(page: str):
    path = L.REPO / page
    assert path.is_file(), f"{page} is missing"
    broken = []
    for target, _ in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        if not (path.parent / target).exists():
            broken.append(target)
    assert not broken, f"{page} links to missing files: {broken}"
