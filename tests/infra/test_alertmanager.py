"""The Alertmanager examples and the module's receiver, checked by the real tools.

amtool (Alertmanager's own configuration loader) checks infra/examples/alertmanager/
alertmanager.yaml and the receiver the module renders; promtool checks the rule groups of
the PrometheusRule example and runs the rules unit test in tests/infra/alertmanager/. The
tools are the ones `make setup` builds (tests/stack/setup.sh), found through
NODE_FENCER_AMTOOL and NODE_FENCER_PROMTOOL; a missing one fails, never skips. The last
tests break each input on purpose and expect the same check to fail, so a check that stops
looking cannot pass unnoticed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import infra_lib as L

RULES_UNIT_TEST = Path(__file__).resolve().parent / "alertmanager" / "kube-node-not-ready.test.yaml"
# The file name the unit test's rule_files names.
RULES_FILE_NAME = "node-fencer.rules.yaml"


def _tool(variable: str) -> str:
    binary = os.environ.get(variable)
    if not binary:
        pytest.fail(
            f"{variable} is not set: run `make setup` (tests/stack/setup.sh builds amtool and promtool) "
            "and source ~/.cache/node-fencer/env.sh, as `make infra-test` does"
        )
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"{variable}={binary} is not an executable file: run `make setup`")
    return binary


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def amtool_check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return _run(_tool("NODE_FENCER_AMTOOL"), "check-config", str(path))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return _run(_tool("NODE_FENCER_PROMTOOL"), *args)


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def receiver_in_config(rendered: str) -> dict:
    """The rendered route and receiver merged into the smallest alertmanager.yml
    around them (a root route and its default receiver), as its header says to."""
    fragment = yaml.safe_load(rendered)
    assert set(fragment) == {"route", "receivers"}, f"unexpected top-level keys {sorted(fragment)}"
    assert set(fragment["route"]) == {"routes"}, "the fragment's route should hold only its routes"
    return {
        "route": {"receiver": "default", "routes": fragment["route"]["routes"]},
        "receivers": [{"name": "default"}, *fragment["receivers"]],
    }


def rule_groups() -> dict:
    """The PrometheusRule example's spec.groups as a Prometheus rules file."""
    rule = _load(L.ALERTMANAGER_EXAMPLE / "prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    return {"groups": rule["spec"]["groups"]}


def run_rules_unit_test(directory: Path, groups: dict) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of the unit test against GROUPS, in DIRECTORY."""
    _write(directory / RULES_FILE_NAME, groups)
    test = directory / RULES_UNIT_TEST.name
    shutil.copyfile(RULES_UNIT_TEST, test)
    return promtool("test", "rules", str(test))


def _the_rule(groups: dict) -> dict:
    (rule,) = [r for g in groups["groups"] for r in g["rules"] if r.get("alert") == "KubeNodeNotReady"]
    return rule


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


def test_alertmanager_example_passes_amtool_check_config():
    result = amtool_check_config(L.ALERTMANAGER_EXAMPLE / "alertmanager.yaml")
    assert result.returncode == 0 and "SUCCESS" in result.stdout, _output(result)


def test_rendered_receiver_passes_amtool_check_config(tmp_path: Path):
    config = _write(tmp_path / "alertmanager.yaml", receiver_in_config(L.rendered_receiver()))
    result = amtool_check_config(config)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, _output(result)


def test_prometheusrule_groups_pass_promtool_check_rules(tmp_path: Path):
    rules = _write(tmp_path / RULES_FILE_NAME, rule_groups())
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, _output(result)


def test_kube_node_not_ready_fires_after_for_with_node_labels(tmp_path: Path):
    """The unit test: a NotReady node fires after `for:` with the node and
    node_fencer="true" labels, not before; a node back in time and a Ready node
    never fire."""
    result = run_rules_unit_test(tmp_path, rule_groups())
    assert result.returncode == 0 and "SUCCESS" in result.stdout, _output(result)


# ---------------------------------------------------------------------------
# Each check fails on a broken input
# ---------------------------------------------------------------------------


def test_amtool_rejects_a_route_to_an_undefined_receiver(tmp_path: Path):
    config = _load(L.ALERTMANAGER_EXAMPLE / "alertmanager.yaml")
    config["route"]["routes"][0]["receiver"] = "no-such-receiver"
    result = amtool_check_config(_write(tmp_path / "alertmanager.yaml", config))
    assert result.returncode != 0, _output(result)
    assert "no-such-receiver" in result.stdout + result.stderr, _output(result)


def test_amtool_rejects_a_rendered_receiver_with_a_bad_url(tmp_path: Path):
    values = {**L.RECEIVER_TEST_VALUES, "url": "not a url"}
    rendered = L.render_template(L.RECEIVER_TEMPLATE.read_text(encoding="utf-8"), values)
    result = amtool_check_config(_write(tmp_path / "alertmanager.yaml", receiver_in_config(rendered)))
    assert result.returncode != 0, _output(result)
    assert "invalid URL" in result.stdout + result.stderr, _output(result)


def test_promtool_check_rules_rejects_a_bad_expression(tmp_path: Path):
    groups = rule_groups()
    _the_rule(groups)["expr"] = "max by (node) (kube_node_status_condition{condition=\"Ready\"} =="
    result = promtool("check", "rules", str(_write(tmp_path / RULES_FILE_NAME, groups)))
    assert result.returncode != 0, _output(result)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda rule: rule.update({"for": "3m"}), id="for-3m"),
        pytest.param(lambda rule: rule.update({"for": "1m"}), id="for-1m"),
        pytest.param(lambda rule: rule["labels"].pop("node_fencer"), id="no-node_fencer-label"),
        pytest.param(
            lambda rule: rule.update({"expr": 'max(kube_node_status_condition{condition="Ready",status="true"}) == 0'}),
            id="node-label-aggregated-away",
        ),
        pytest.param(
            lambda rule: rule.update({"expr": 'kube_node_status_condition{condition="Ready",status="true"} == 0'}),
            id="one-alert-per-replica",
        ),
        pytest.param(
            lambda rule: rule.update({"expr": 'max by (node) (kube_node_status_condition{condition="Ready"}) == 0'}),
            id="every-status-series",
        ),
    ],
)
def test_rules_unit_test_fails_for_a_wrong_rule(tmp_path: Path, change):
    groups = rule_groups()
    change(_the_rule(groups))
    result = run_rules_unit_test(tmp_path, groups)
    assert result.returncode != 0, _output(result)
    assert "FAILED" in result.stdout + result.stderr, _output(result)


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("a: %{ if true }x%{ endif }", id="directive"),
        pytest.param("a: ${unknown}", id="unknown-variable"),
        pytest.param("a: ${upper(name)}", id="expression"),
        pytest.param("a: ${~ name}", id="strip-marker"),
    ],
)
def test_render_template_refuses_what_it_does_not_implement(template: str):
    with pytest.raises(ValueError):
        L.render_template(template, L.RECEIVER_TEST_VALUES)


def test_render_template_escapes_and_interpolates():
    rendered = L.render_template("n: ${name} $${name} %%{ if }", L.RECEIVER_TEST_VALUES)
    assert rendered == "n: node-fencer ${name} %{ if }"
