"""tflint with its bundled terraform ruleset (every rule) over infra/: clean,
and not clean once a mistake it knows is planted."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import infra_lib as L
import tofu_lib as T

CONFIG = Path(__file__).resolve().parent / "tflint.hcl"


def tflint(directory: Path) -> list[dict]:
    binary = T.tool("NODE_FENCER_TFLINT", "tflint")
    result = subprocess.run(
        [binary, "--recursive", "--config", str(CONFIG), "--format", "json", "--no-color"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(result.stdout)
    assert not report["errors"], f"tflint could not check {directory}: {report['errors']}"
    return report["issues"]


def describe(issues: list[dict]) -> str:
    return "\n".join(f"{i['range']['filename']}:{i['range']['start']['line']}: {i['message']} ({i['rule']['name']})" for i in issues)


def test_tflint_finds_nothing_in_infra(tmp_path: Path):
    copy = tmp_path / "infra"
    shutil.copytree(L.INFRA, copy, ignore=shutil.ignore_patterns(".terraform*"))
    issues = tflint(copy)
    assert not issues, "tflint (tests/infra/tflint.hcl) finds, in infra/:\n" + describe(issues)


def test_tflint_finds_a_planted_unused_variable(tmp_path: Path):
    copy = tmp_path / "infra"
    shutil.copytree(L.INFRA, copy, ignore=shutil.ignore_patterns(".terraform*"))
    with (copy / "modules" / "node-fencer" / "variables.tf").open("a", encoding="utf-8") as f:
        f.write('\nvariable "planted_unused" {\n  description = "Read by nothing."\n  type        = string\n}\n')
    rules = {i["rule"]["name"] for i in tflint(copy)}
    assert "terraform_unused_declarations" in rules, f"tflint missed the planted unused variable: {sorted(rules)}"
