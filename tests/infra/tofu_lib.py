"""OpenTofu against the providers' real schemas, offline: a copy of infra/ in
a temporary directory, a CLI configuration of its own that installs
hashicorp/aws, kubernetes, random and google from the set-up's filesystem
mirror (the schema-only provider, tests/infra/schema-provider), and helpers to
run `tofu` there and read its plans.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

import infra_lib as L

# What the schema-only provider returns for the data sources the modules read
# (it calls no API): an account, a region, an EKS cluster; a Google project, a
# GKE cluster and the client's config.
DATA_SOURCES = Path(__file__).resolve().parent / "fixtures" / "data-sources.json"
ACCOUNT = "123456789012"
REGION = "eu-west-1"

MODULES = ["modules/node-fencer", "modules/kubernetes-rbac", "modules/node-fencer-gcp", "modules/settings"]
EXAMPLES = ["examples/eks", "examples/self-managed", "examples/gke"]
# The fixture's Google project and GKE cluster.
GCP_PROJECT = "my-project"
GCP_PROJECT_NUMBER = "987654321098"


def tool(variable: str, what: str) -> str:
    """The path in environment variable `variable`; fails loudly when the set-up did not provide it."""
    path = os.environ.get(variable)
    if not path:
        pytest.fail(f"{variable} is not set: run `make setup` (tests/stack/setup.sh builds {what}) and source its env.sh")
    if not os.path.exists(path):
        pytest.fail(f"{variable}={path} does not exist: run `make setup` again")
    return path


@dataclass
class Workspace:
    """A copy of infra/ and the environment tofu runs with there."""

    root: Path
    env: dict[str, str]
    tofu: str

    def run(self, directory: str | Path, *args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
        cwd = self.root / directory
        result = subprocess.run([self.tofu, *args], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(f"`tofu {' '.join(args)}` failed in infra/{directory} (a copy in {self.root}):\n{result.stdout}\n{result.stderr}")
        return result

    def init(self, directory: str | Path) -> None:
        if not (self.root / directory / ".terraform.lock.hcl").exists():
            self.run(directory, "init", "-backend=false", "-input=false", "-no-color")


def cli_config(mirror: str) -> str:
    # Only the mirror: a provider it lacks fails init instead of reaching for a registry.
    return (
        "provider_installation {\n"
        "  filesystem_mirror {\n"
        f"    path    = {json.dumps(mirror)}\n"
        '    include = ["registry.opentofu.org/hashicorp/*"]\n'
        "  }\n"
        "}\n"
    )


def make_workspace(directory: Path) -> Workspace:
    tofu = tool("NODE_FENCER_TOFU", "OpenTofu")
    mirror = tool("NODE_FENCER_TF_MIRROR", "the schema-only provider's mirror")
    root = directory / "infra"
    shutil.copytree(L.INFRA, root, ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl", "*.tfstate*", "terraform.tfvars"))
    config = directory / "tofu.rc"
    config.write_text(cli_config(mirror), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "AWS_", "KUBE", "GOOGLE_", "CLOUDSDK_"))}
    env.update(
        TF_CLI_CONFIG_FILE=str(config),
        TF_IN_AUTOMATION="1",
        TF_INPUT="0",
        CHECKPOINT_DISABLE="1",
        SCHEMA_PROVIDER_DATA=str(DATA_SOURCES),
    )
    # A stand-in for the cargo-lambda zip: the module hashes it at plan time.
    (directory / "bootstrap.zip").write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    return Workspace(root, env, tofu)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def mirror_versions() -> dict[str, list[str]]:
    """The releases of each provider the mirror holds, oldest first."""
    mirror = Path(tool("NODE_FENCER_TF_MIRROR", "the schema-only provider's mirror"))
    found: dict[str, list[str]] = {}
    for directory in mirror.glob("registry.opentofu.org/hashicorp/*/*"):
        found.setdefault(directory.parent.name, []).append(directory.name)
    return {name: sorted(versions, key=version_key) for name, versions in found.items()}


def required_providers(directory: Path) -> list[str]:
    """The providers a module's versions.tf requires, by local name (none for
    the settings module)."""
    names = []
    for block in L.parse(directory / "versions.tf").get("terraform", []):
        for entry in block.get("required_providers", []):
            names.extend(entry)
    return sorted(names)


def pin(directory: Path, versions: dict[str, str]) -> None:
    """Pins the providers a module requires to `versions`, with an override
    file, so that init takes those releases instead of the newest."""
    if not required_providers(directory):
        return
    lines = ["terraform {", "  required_providers {"]
    for name in required_providers(directory):
        lines.append(f'    {name} = {{ source = "hashicorp/{name}", version = "{versions[name]}" }}')
    lines += ["  }", "}", ""]
    (directory / "pinned_override.tf").write_text("\n".join(lines), encoding="utf-8")


_plans: dict[tuple[str, str, str], dict[str, Any]] = {}


def plan_of(ws: Workspace, directory: str, name: str, variables: dict[str, Any], var_file: str | None = None) -> dict[str, Any]:
    """`tofu plan` of `directory` in `ws` with `variables` (and `var_file`), as
    `tofu show -json` gives it; planned once per workspace, directory and name."""
    key = (str(ws.root), directory, name)
    if key not in _plans:
        ws.init(directory)
        var_path = ws.root.parent / f"{name}.tfvars.json"
        var_path.write_text(json.dumps(variables), encoding="utf-8")
        out = ws.root.parent / f"{name}.tfplan"
        args = ["plan", "-input=false", "-no-color", "-lock=false", f"-out={out}"]
        if var_file:
            args.append(f"-var-file={var_file}")
        ws.run(directory, *args, f"-var-file={var_path}")
        _plans[key] = json.loads(ws.run(directory, "show", "-json", str(out)).stdout)
    return _plans[key]


def resources(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every managed resource the plan creates, and every data source it reads
    at apply time, by address, with its planned values (`after`) and which of
    them are unknown (`after_unknown`)."""
    found = {}
    for change in plan.get("resource_changes", []):
        if change["change"]["actions"] == ["no-op"]:
            continue
        found[change["address"]] = change
    return found


def read_data(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data sources read while planning, by address, with their values."""

    def walk(module: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from module.get("resources", [])
        for child in module.get("child_modules", []):
            yield from walk(child)

    root = plan.get("prior_state", {}).get("values", {}).get("root_module", {})
    return {r["address"]: r["values"] for r in walk(root) if r["mode"] == "data"}
