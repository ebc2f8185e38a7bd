"""checkov over infra/: no failed check, and every skip is an inline, reasoned
`#checkov:skip=CKV_...:reason` beside the resource it concerns.

checkov runs from the same Python environment as pytest (tests/infra/requirements.txt).
--skip-download keeps it offline (no guideline or policy download).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import infra_lib as L

BASE_COMMAND = [sys.executable, "-m", "checkov.main", "--compact", "--skip-download", "-o", "json"]

SKIP_RE = re.compile(r"#\s*checkov:skip=(?P<id>[^:\s]+)(?::(?P<reason>.*))?")
CHECK_ID_RE = re.compile(r"CKV2?_[A-Z0-9]+_\d+")
MIN_REASON_WORDS = 8


def _results(output: str) -> list[dict]:
    data = json.loads(output)
    return data if isinstance(data, list) else [data]


@functools.cache
def run_checkov(directory: Path, framework: str, quiet: bool) -> tuple[list[dict], str]:
    command = [*BASE_COMMAND, "-d", str(directory), "--framework", framework]
    if quiet:
        command.append("--quiet")
    result = subprocess.run(command, cwd=L.REPO, capture_output=True, text=True, timeout=600)
    # 0: no failed check, 1: failed checks; anything else is checkov itself failing.
    assert result.returncode in (0, 1), f"checkov failed to run ({result.returncode}):\n{result.stderr[-4000:]}"
    try:
        return _results(result.stdout), result.stderr
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON:\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}")


def _summary(results: list[dict]) -> dict:
    total = {"passed": 0, "failed": 0, "skipped": 0, "parsing_errors": 0, "resource_count": 0}
    for r in results:
        for key in total:
            total[key] += r.get("summary", {}).get(key, 0)
    return total


def _failed(results: list[dict]) -> list[dict]:
    return [c for r in results for c in r.get("results", {}).get("failed_checks", [])]


def _describe(check: dict) -> str:
    lines = check.get("file_line_range") or ["?", "?"]
    return f"{check['check_id']} {check.get('check_name', '')}: {check['resource']} ({check['file_path']}:{lines[0]}-{lines[1]})"


def test_no_checkov_config_file_skips_checks():
    for directory in (L.REPO, L.INFRA):
        for name in (".checkov.yaml", ".checkov.yml"):
            assert not (directory / name).exists(), f"{L.rel(directory / name)}: skips belong inline, beside the resource"


def test_checkov_terraform_has_no_failed_check():
    """The gate: `checkov -d infra --framework terraform --compact --quiet -o json`."""
    results, stderr = run_checkov(L.INFRA, "terraform", True)
    failed = _failed(results)
    assert not failed, "checkov failed checks:\n" + "\n".join(_describe(c) for c in failed)
    summary = _summary(results)
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0, summary


def test_checkov_terraform_scanned_the_modules():
    results, _ = run_checkov(L.INFRA, "terraform", False)
    summary = _summary(results)
    assert summary["resource_count"] >= 20 and summary["passed"] > 0, f"checkov scanned too little: {summary}"
    resources = {c["resource"] for r in results for k in ("passed_checks", "skipped_checks") for c in r["results"].get(k, [])}
    for expected in (
        "aws_lambda_function.this",
        "aws_iam_policy_document.api",
        "aws_sqs_queue.dlq",
        "kubernetes_cluster_role_v1.this",
        "kubernetes_role_v1.this",
        "aws_lambda_permission.recovery[0]",
        "google_project_iam_member.this",
        "google_logging_project_sink.this",
        "google_pubsub_topic.audit",
        "google_pubsub_topic_iam_member.dead_letter_publisher",
    ):
        assert any(r.endswith(expected) for r in resources), f"checkov did not evaluate {expected}"


def test_every_skip_is_inline_with_a_reason():
    results, _ = run_checkov(L.INFRA, "terraform", False)
    skipped = [c for r in results for c in r["results"].get("skipped_checks", [])]
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment") or ""
        assert len(reason.split()) >= MIN_REASON_WORDS, f"skip without a real reason: {_describe(check)}: {reason!r}"

    # And in the files: every skip comment names one check and gives a reason,
    # and sits inside a resource block (checkov honours it only there).
    problems = []
    for path in L.tf_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            m = SKIP_RE.search(line)
            if not m:
                continue
            where = f"{L.rel(path)}:{number}"
            if not CHECK_ID_RE.fullmatch(m.group("id")):
                problems.append(f"{where}: skip must name one check id, got {m.group('id')!r}")
            reason = (m.group("reason") or "").strip()
            if len(reason.split()) < MIN_REASON_WORDS:
                problems.append(f"{where}: skip needs a reason of at least {MIN_REASON_WORDS} words")
            # The nearest top-level line above must open a resource or data block.
            above = next((i for i in range(number - 2, -1, -1) if lines[i] and not lines[i][0].isspace()), None)
            if above is None or not re.match(r"(resource|data)\s", lines[above]):
                problems.append(f"{where}: skip comment is not inside a resource block")
    assert not problems, "\n".join(problems)


def test_checkov_kubernetes_manifests_have_no_failed_check():
    results, _ = run_checkov(L.INFRA / "kubernetes", "kubernetes", False)
    failed = _failed(results)
    assert not failed, "checkov failed checks on the RBAC manifest:\n" + "\n".join(_describe(c) for c in failed)
    assert _summary(results)["passed"] > 0, "checkov evaluated nothing in infra/kubernetes"
    evaluated = {c["resource"] for r in results for c in r["results"].get("passed_checks", [])}
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert any(r.startswith(f"{kind}.") for r in evaluated), f"checkov did not evaluate the {kind} of the manifest"
