"""OpenTofu checks of infra/ against the providers' real schemas.

`tofu validate` needs the providers' schemas; the registries that serve the
providers cannot be reached here, so the set-up installs a schema-only provider
(tests/infra/schema-provider) as hashicorp/aws, kubernetes, random and google, serving
each provider's schema taken from its CDK for Terraform bindings. Every module
and example is initialised and validated in a copy of infra/; a copy with a
mistake planted in it must fail, so that the check cannot go quiet.
"""

from __future__ import annotations

import json
import re
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


def validation_problems(ws: T.Workspace, directory: str) -> list[str]:
    ws.init(directory)
    result = ws.run(directory, "validate", "-json", "-no-color", check=False)
    report = json.loads(result.stdout)
    problems = [
        f"{d['severity']}: {d['summary']}: {d.get('detail', '')} ({d.get('range', {}).get('filename')}:{d.get('range', {}).get('start', {}).get('line')})"
        for d in report["diagnostics"]
    ]
    if not report["valid"] and not problems:
        problems.append("not valid")
    return problems


def locked_versions(ws: T.Workspace, directory: str) -> dict[str, str]:
    path = ws.root / directory / ".terraform.lock.hcl"
    if not path.exists():
        # A module that requires no provider gets no lock file.
        return {}
    lock = path.read_text(encoding="utf-8")
    return dict(re.findall(r'provider "registry\.opentofu\.org/hashicorp/(\w+)" \{\n\s*version\s*=\s*"([^"]+)"', lock))


def copy_module(module: Path, scratch_root: Path) -> Path:
    """A copy of one module under scratch_root, beside what it reads from its
    neighbours (the shared settings module, the receiver template)."""
    scratch = scratch_root / module.name
    shutil.copytree(module, scratch, ignore=shutil.ignore_patterns(".terraform*"))
    shutil.copytree(L.SETTINGS_MODULE, scratch_root / L.SETTINGS_MODULE.name, ignore=shutil.ignore_patterns(".terraform*"))
    if module == L.GCP_MODULE:
        # The module renders the AWS module's receiver template, beside it.
        shutil.copytree(L.MODULE / "templates", scratch_root / L.MODULE.name / "templates")
    return scratch


@pytest.mark.parametrize("directory", T.MODULES + T.EXAMPLES)
def test_validates_against_the_newest_provider_schemas(workspace: T.Workspace, directory: str):
    problems = validation_problems(workspace, directory)
    assert not problems, f"`tofu validate` of infra/{directory}:\n" + "\n".join(problems)
    newest = {name: versions[-1] for name, versions in T.mirror_versions().items()}
    for name, version in locked_versions(workspace, directory).items():
        assert version == newest[name], f"infra/{directory} was initialised with {name} {version}, not the newest {newest[name]}"


@pytest.fixture(scope="session")
def oldest(tmp_path_factory: pytest.TempPathFactory) -> T.Workspace:
    """A copy of infra/ whose every module takes the oldest release of each provider in the mirror."""
    ws = T.make_workspace(tmp_path_factory.mktemp("tofu-oldest"))
    versions = {name: versions[0] for name, versions in T.mirror_versions().items()}
    for directory in T.MODULES + T.EXAMPLES:
        T.pin(ws.root / directory, versions)
    return ws


@pytest.mark.parametrize("directory", T.MODULES + T.EXAMPLES)
def test_validates_against_the_oldest_provider_schemas(oldest: T.Workspace, directory: str):
    """The schemas of the oldest releases the set-up brackets the floors with
    (see CDK_PACKAGES in tests/stack/setup.sh): an argument newer than the
    floor fails here."""
    problems = validation_problems(oldest, directory)
    assert not problems, f"`tofu validate` of infra/{directory} with the oldest providers:\n" + "\n".join(problems)
    versions = T.mirror_versions()
    locked = locked_versions(oldest, directory)
    assert (locked or not T.required_providers(L.INFRA / directory)) and all(version == versions[name][0] for name, version in locked.items()), (
        f"infra/{directory} was initialised with {locked}, not the oldest releases {({n: v[0] for n, v in versions.items()})}"
    )


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
    scratch = copy_module(L.MODULE, tmp_path)
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


# Two of the same in modules/node-fencer-gcp/main.tf, against the google
# provider's schema (one in an argument of the service, one in a nested block
# of the push subscription); the AWS module's four cover the kinds of mistake.
GCP_PLANTED = {
    "misspelt_argument": ('  ingress             = "INGRESS_TRAFFIC_ALL"\n', '  ingres              = "INGRESS_TRAFFIC_ALL"\n', "Unsupported argument", "ingres"),
    "missing_required_argument": (
        "      service_account_email = local.push_service_account_email\n      audience              = local.push_audience\n",
        "      audience              = local.push_audience\n",
        "Missing required argument",
        '"service_account_email"',
    ),
}


@pytest.mark.parametrize("mistake", sorted(GCP_PLANTED))
def test_a_planted_mistake_fails_validation_of_the_gcp_module(workspace: T.Workspace, tmp_path: Path, mistake: str):
    """The google schema has teeth too: the Cloud Run module with one mistake planted does not validate."""
    old, new, summary, name = GCP_PLANTED[mistake]
    scratch = copy_module(L.GCP_MODULE, tmp_path)
    main_tf = scratch / "main.tf"
    text = main_tf.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{L.rel(L.GCP_MODULE / 'main.tf')} no longer holds {old!r} once: plant the {mistake} elsewhere"
    main_tf.write_text(text.replace(old, new), encoding="utf-8")
    workspace.init(scratch)
    result = workspace.run(scratch, "validate", "-json", "-no-color", check=False)
    report = json.loads(result.stdout)
    assert not report["valid"], f"the GCP module with a {mistake} ({new.strip() or 'removed ' + old.strip()}) still validates"
    found = [(d["summary"], d.get("detail", "")) for d in report["diagnostics"] if d["severity"] == "error"]
    assert any(s == summary and name in d for s, d in found), f"expected {summary!r} naming {name}, got {found}"


def run_blocks(directory: Path) -> int:
    return sum(len(re.findall(r'^run "', f.read_text(encoding="utf-8"), re.M)) for f in directory.glob("tests/*.tftest.hcl"))


@pytest.mark.parametrize("directory", T.MODULES)
def test_the_modules_tofu_tests_pass(workspace: T.Workspace, directory: str):
    """Each module's tests/*.tftest.hcl: its validations, preconditions and switches."""
    runs = run_blocks(workspace.root / directory)
    assert runs, f"infra/{directory}/tests holds no run block"
    workspace.init(directory)
    result = workspace.run(directory, "test", "-no-color", check=False)
    assert result.returncode == 0 and f"Success! {runs} passed, 0 failed." in result.stdout, (
        f"`tofu test` in infra/{directory} ({runs} runs):\n{result.stdout}\n{result.stderr}"
    )


@pytest.mark.parametrize("directory", T.MODULES)
def test_every_validated_variable_has_a_run_that_expects_its_failure(directory: str):
    """A validation added without a run refusing a value would go untested."""
    module = L.INFRA / directory
    validated = sorted(
        name
        for path in module.glob("*.tf")
        for entry in L.parse(path).get("variable", [])
        for name, body in entry.items()
        if body.get("validation")
    )
    expected = set()
    for path in (module / "tests").glob("*.tftest.hcl"):
        for listed in re.findall(r"expect_failures\s*=\s*\[([^\]]*)\]", path.read_text(encoding="utf-8")):
            expected |= set(re.findall(r"var\.([a-z0-9_]+)", listed))
    missing = [v for v in validated if v not in expected]
    assert not missing, f"infra/{directory}: no tofu test run expects the validation of {missing} to fail"


def test_a_loosened_validation_fails_the_gcp_modules_tofu_tests(workspace: T.Workspace, tmp_path: Path):
    """Its runs check several validations each: with one bound moved, the run that holds it fails."""
    scratch = copy_module(L.GCP_MODULE, tmp_path)
    variables_tf = scratch / "variables.tf"
    old = "var.recovery_settle_seconds <= 60"
    text = variables_tf.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{L.rel(L.GCP_MODULE / 'variables.tf')} no longer holds {old!r}: loosen another bound"
    variables_tf.write_text(text.replace(old, "var.recovery_settle_seconds <= 70"), encoding="utf-8")
    name = "out_of_range_values_are_refused"
    tests = scratch / "tests" / "node_fencer_gcp.tftest.hcl"
    source = tests.read_text(encoding="utf-8")
    block = re.search(rf'^run "{name}" \{{\n.*?^\}}\n', source, re.M | re.S)
    assert block, f"{L.rel(L.GCP_MODULE / 'tests' / 'node_fencer_gcp.tftest.hcl')} has no run {name}"
    tests.write_text(source[: source.index('\nrun "')] + "\n" + block.group(0), encoding="utf-8")
    workspace.init(scratch)
    result = workspace.run(scratch, "test", "-no-color", check=False)
    assert result.returncode != 0, f"`tofu test` passed with recovery_settle_seconds allowed up to 70:\n{result.stdout}"
    assert re.search(rf'run "{name}"\.\.\. fail', result.stdout), result.stdout


def test_a_loosened_validation_fails_the_modules_tofu_tests(workspace: T.Workspace, tmp_path: Path):
    """The tofu tests have teeth: with a bound moved, the run that expects it fails."""
    scratch = copy_module(L.MODULE, tmp_path)
    variables_tf = scratch / "variables.tf"
    old = "var.confirm_again_after_seconds <= 120"
    text = variables_tf.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{L.rel(L.MODULE / 'variables.tf')} no longer holds {old!r}: loosen another bound"
    variables_tf.write_text(text.replace(old, "var.confirm_again_after_seconds <= 300"), encoding="utf-8")
    # Only the run that guards this bound (and the file's set-up before the
    # first run), so as not to plan all of them again.
    tests = scratch / "tests" / "node_fencer.tftest.hcl"
    source = tests.read_text(encoding="utf-8")
    block = re.search(r'^run "confirm_again_above_120" \{\n.*?^\}\n', source, re.M | re.S)
    assert block, f"{L.rel(L.MODULE / 'tests' / 'node_fencer.tftest.hcl')} has no run confirm_again_above_120"
    tests.write_text(source[: source.index('\nrun "')] + "\n" + block.group(0), encoding="utf-8")
    workspace.init(scratch)
    result = workspace.run(scratch, "test", "-no-color", check=False)
    assert result.returncode != 0, f"`tofu test` passed with confirm_again_after_seconds allowed up to 300:\n{result.stdout}"
    assert re.search(r'run "confirm_again_above_120"\.\.\. fail', result.stdout), result.stdout
