"""node-fencer's on-premises monitoring (infra/onprem/monitoring), held to the code.

promtool (the one `make setup` builds) checks rules.yaml and runs its cases,
rules.test.yaml, which fire each alert and hold it back; a rule broken on
purpose must fail them. The PrometheusRule carries the same groups, the
ServiceMonitor scrapes the Service's metrics port, and every metric and label
the rules and the Grafana dashboard name is one serve's /metrics exposes (the
manifest's prometheus_metrics, written from the code). promtool's check of a
real scrape of serve is the integration test `witness::`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

import infra_lib as L
from test_alertmanager import _output, promtool

MONITORING = L.REPO / "infra" / "onprem" / "monitoring"
RULES = MONITORING / "rules.yaml"
RULES_TEST = MONITORING / "rules.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
SERVICE = L.REPO / "infra" / "onprem" / "kubernetes" / "service.yaml"

# PromQL's words that look like label names inside by (...) / without (...).
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def families() -> dict[str, dict]:
    manifest = json.loads(L.MANIFEST.read_text(encoding="utf-8"))
    found = {f["name"]: f for f in manifest["prometheus_metrics"]}
    assert found, f"prometheus_metrics in {L.rel(L.MANIFEST)} is empty"
    return found


def rules() -> list[dict]:
    return [rule for group in load(RULES)["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def series_named(expr: str) -> list[tuple[str, set[str]]]:
    """Every node_fencer metric EXPR selects, with the labels it matches on or
    groups by (after the selector, up to the next metric)."""
    found = []
    for m in re.finditer(r"\b(node_fencer_[a-z_]+)(\{[^}]*\})?", expr):
        matchers = set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", m.group(2) or ""))
        found.append((m.group(1), matchers))
    grouped = {label.strip() for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for label in clause.split(",")}
    return [(name, labels | grouped) for name, labels in found]


def known(name: str, labels: set[str], catalog: dict[str, dict]) -> list[str]:
    """What EXPR's selection of NAME with LABELS names that serve does not expose."""
    family = catalog.get(name)
    extra: set[str] = set()
    if family is None:
        base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        family = catalog.get(base or "")
        if family is None or family["type"] != "histogram":
            return [f"metric {name}"]
        extra = {"le"} if name.endswith("_bucket") else set()
    unknown = labels - set(family["labels"]) - extra - {"__name__"}
    return [f"label {label} of {name}" for label in sorted(unknown)]


# ---------------------------------------------------------------------------
# promtool
# ---------------------------------------------------------------------------


def test_rules_pass_promtool_check_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, _output(result)


def test_rules_pass_their_cases_and_every_alert_has_one_that_fires_and_one_that_does_not():
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, _output(result)
    cases = [case for test in load(RULES_TEST)["tests"] for case in test["alert_rule_test"]]
    for rule in rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it stays quiet"


@pytest.mark.parametrize(
    "alert, old, new",
    [
        ("NodeFencerFencingFailed", 'outcome="failed"', 'outcome="fenced"'),
        ("NodeFencerRefusedByCap", 'reason="cap_reached"', 'reason="cap"'),
        ("NodeFencerWitnessFailing", "== 1", "== 2"),
        ("NodeFencerNotSweeping", "> 300", "> 3000"),
    ],
)
def test_a_rule_broken_on_purpose_fails_its_cases(tmp_path: Path, alert: str, old: str, new: str):
    groups = load(RULES)
    (rule,) = [r for g in groups["groups"] for r in g["rules"] if r["alert"] == alert]
    assert old in rule["expr"], f"{alert}: {old!r} not in {rule['expr']!r}"
    rule["expr"] = rule["expr"].replace(old, new)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(groups, sort_keys=False), encoding="utf-8")
    shutil.copyfile(RULES_TEST, tmp_path / RULES_TEST.name)
    result = promtool("test", "rules", str(tmp_path / RULES_TEST.name))
    assert result.returncode != 0, f"{alert} with {new!r} for {old!r} still passed:\n{_output(result)}"


# ---------------------------------------------------------------------------
# The operator's objects
# ---------------------------------------------------------------------------


def test_prometheusrule_carries_the_rules_file():
    rule = load(MONITORING / "prometheusrule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "node-fencer"
    assert rule["spec"] == load(RULES), "prometheusrule.yaml's spec and rules.yaml differ"


def test_servicemonitor_scrapes_the_services_metrics_port():
    monitor = load(MONITORING / "servicemonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    service = load(SERVICE)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports, f"the Service has no port {endpoint['port']}: {sorted(ports)}"
        assert endpoint["path"] == "/metrics"
    kustomization = load(MONITORING / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == ["prometheusrule.yaml", "servicemonitor.yaml"]


# ---------------------------------------------------------------------------
# Every name is one the code emits
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["rules", "dashboard"])
def test_queries_name_only_metrics_and_labels_serve_exposes(where: str):
    exprs = [r["expr"] for r in rules()] if where == "rules" else dashboard_exprs()
    assert exprs, f"no queries in the {where}"
    catalog = families()
    unknown = [f"{u} in {e!r}" for e in exprs for name, labels in series_named(e) for u in known(name, labels, catalog)]
    assert not unknown, "\n".join(unknown)


def test_the_name_check_catches_a_planted_name():
    catalog = families()
    for planted in (
        'node_fencer_decision_total{outcome="failed"}',
        'node_fencer_decisions_total{result="failed"}',
        "sum by (zone) (node_fencer_witness_up)",
        "rate(node_fencer_sweeps_total_bucket[5m])",
    ):
        problems = [u for name, labels in series_named(planted) for u in known(name, labels, catalog)]
        assert problems, f"{planted!r} passed the check"


def test_dashboard_shows_every_family_and_the_witness():
    named = {name for e in dashboard_exprs() for name, _ in series_named(e)}
    shown = {next((n[: -len(s)] for s in HISTOGRAM_SUFFIXES if n.endswith(s)), n) for n in named}
    missing = sorted(set(families()) - shown - {"node_fencer_last_witness_timestamp_seconds"})
    assert not missing, f"the dashboard shows nothing of {missing}"
