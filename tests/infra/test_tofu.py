"""OpenTofu checks of infra/ against the providers' real schemas.

`tofu validate` needs the providers' schemas; the registries that serve the
providers cannot be reached here, so the set-up installs a schema-only provider
(tests/infra/schema-provider) as hashicorp/aws, kubernetes and random, serving
each provider's schema taken from its CDK for Terraform bindings. Every module
and example is initialised and validated in a copy of infra/; a copy with a
mistake planted in it must fail, so that the check cannot go quiet.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import infra_lib as L
import tofu_lib as T


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> T.Workspace:
    return T.make_workspace(tmp_path_factory.mktemp("tofu"))


def test_tofu_fmt_finds_nothing_to_change(workspace: T.Workspace):
    result = workspace.run(".", "fmt", "-check", "-recursive", "-diff", "-no-color", check=False)
    assert result.returncode == 0, f"`tofu fmt -check -recursive` would change files under infra/ (run `tofu fmt -recursive infra`):\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("directory", T.MODULES + T.EXAMPLES)
def test_validates_against_the_provider_schemas(workspace: T.Workspace, directory: str):
    workspace.init(directory)
    result = workspace.run(directory, "validate", "-json", "-no-color", check=False)
    report = json.loads(result.stdout)
    problems = [f"{d['severity']}: {d['summary']}: {d.get('detail', '')} ({d.get('range', {}).get('filename')}:{d.get('range', {}).get('start', {}).get('line')})" for d in report["diagnostics"]]
    assert report["valid"] and not problems, f"`tofu validate` of infra/{directory}:\n" + "\n".join(problems)


# Each: what to replace in modules/node-fencer/main.tf, with what, and the
# summary and the name tofu validate must report.
PLANTED = {
    "misspelt_argument": ('authorization_type = "NONE"', 'authorisation_type = "NONE"', "Unsupported argument", "authorisation_type"),
    "missing_required_argument": ("  role          = aws_iam_role.this.arn\n", "", "Missing required argument", '"role"'),
    "wrong_type": ("architectures    = [var.architecture]", "architectures    = var.architecture", "Incorrect attribute value type", "architectures"),
    "unknown_block": ("  tracing_config {\n", "  tracing_configuration {\n", "Unsupported block type", "tracing_configuration"),
}


@pytest.mark.parametrize("mistake", sorted(PLANTED))
def test_a_planted_mistake_fails_validation(workspace: T.Workspace, tmp_path: Path, mistake: str):
    """The check has teeth: the module with one mistake planted does not validate."""
    old, new, summary, name = PLANTED[mistake]
    scratch = tmp_path / "node-fencer"
    shutil.copytree(L.MODULE, scratch, ignore=shutil.ignore_patterns(".terraform*"))
    main_tf = scratch / "main.tf"
    text = main_tf.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{L.rel(L.MODULE / 'main.tf')} no longer holds {old!r} once: plant the {mistake} elsewhere"
    main_tf.write_text(text.replace(old, new), encoding="utf-8")
    workspace.init(scratch)
    result = workspace.run(scratch, "validate", "-json", "-no-color", check=False)
    report = json.loads(result.stdout)
    assert not report["valid"], f"the module with a {mistake} ({new.strip() or 'removed ' + old.strip()}) still validates"
    found = [(d["summary"], d.get("detail", "")) for d in report["diagnostics"] if d["severity"] == "error"]
    assert any(s == summary and name in d for s, d in found), f"expected {summary!r} naming {name}, got {found}"
