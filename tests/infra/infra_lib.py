"""Shared helpers of the infrastructure tests: where things are, and reading HCL.

The HCL parser is the `hcl2` package of bc-python-hcl2 (the one checkov uses).
It returns every attribute value wrapped in a one-element list and every
expression as a "${...}" string; `value()` unwraps the former, `expr()` the
latter.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Iterator

import hcl2

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
MODULE = INFRA / "modules" / "node-fencer"
GCP_MODULE = INFRA / "modules" / "node-fencer-gcp"
# The fencing policy both modules pass through (validations, environment).
SETTINGS_MODULE = INFRA / "modules" / "settings"
GKE_EXAMPLE = INFRA / "examples" / "gke"
RBAC_MODULE = INFRA / "modules" / "kubernetes-rbac"
RBAC_YAML = INFRA / "kubernetes" / "rbac.yaml"
ALERTMANAGER_EXAMPLE = INFRA / "examples" / "alertmanager"
RECEIVER_TEMPLATE = MODULE / "templates" / "alertmanager-receiver.yaml.tftpl"
# The CloudWatch dashboard: JSON whose ${...} placeholders all sit in strings.
DASHBOARD_TEMPLATE = MODULE / "templates" / "dashboard.json.tftpl"
# What the module passes templatefile() for the receiver, with test values.
RECEIVER_TEST_VALUES = {
    "name": "node-fencer",
    "url": "https://abc.lambda-url.eu-west-1.on.aws/",
    "credentials_file": "/etc/alertmanager/secrets/node-fencer-webhook/token",
}
PERMISSIONS_RS = REPO / "handler" / "src" / "core" / "permissions.rs"
CONFIG_RS = REPO / "handler" / "src" / "core" / "config.rs"
CONTROL_RS = REPO / "handler" / "src" / "core" / "control.rs"
GCE_RS = REPO / "handler" / "src" / "shell" / "cloud" / "gce.rs"
MANIFEST = INFRA / "manifest.json"
# Compute Engine audit log entries as the trigger routes receive them.
GCE_FIXTURES = REPO / "handler" / "tests" / "fixtures" / "gce"


def rel(path: Path) -> str:
    """Path relative to the repository root, for messages."""
    return str(path.relative_to(REPO))


def _tracked(paths: Iterator[Path]) -> list[Path]:
    # Skip provider caches of a local `terraform init` in an example.
    return sorted(p for p in paths if ".terraform" not in p.parts)


def tf_files() -> list[Path]:
    return _tracked(INFRA.rglob("*.tf"))


def hcl_files() -> list[Path]:
    """Every HCL file that must be canonically formatted."""
    return _tracked(INFRA.rglob("*.tf")) + _tracked(INFRA.rglob("*.tfvars.example"))


@functools.cache
def parse(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        return hcl2.load(f)


def parse_dir(directory: Path) -> dict[str, list[Any]]:
    """All top-level blocks of the .tf files of one module, merged by block type."""
    merged: dict[str, list[Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        for kind, blocks in parse(path).items():
            merged.setdefault(kind, []).extend(blocks)
    return merged


def value(v: Any) -> Any:
    """Unwrap the one-element list the parser puts around attribute values."""
    if isinstance(v, list) and len(v) == 1:
        return v[0]
    return v


def expr(v: Any) -> str:
    """The expression text of an attribute, without its "${...}" wrapper."""
    v = value(v)
    assert isinstance(v, str), f"expected an expression, got {v!r}"
    m = re.fullmatch(r"\$\{(.*)\}", v, re.S)
    return m.group(1) if m else v


def blocks(module: dict[str, list[Any]], kind: str, type_: str) -> dict[str, dict[str, Any]]:
    """Resources or data sources of one type, by name."""
    found: dict[str, dict[str, Any]] = {}
    for entry in module.get(kind, []):
        for name, body in entry.get(type_, {}).items():
            found[name] = body
    return found


def locals_of(module: dict[str, list[Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for entry in module.get("locals", []):
        for name, v in entry.items():
            if not name.startswith("__"):
                found[name] = value(v)
    return found


def variables_of(path: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in parse(path).get("variable", []):
        found.update(entry)
    return found


def nested(body: dict[str, Any], block: str) -> list[dict[str, Any]]:
    """Static and `dynamic` nested blocks of one kind (the content of a dynamic one)."""
    found = list(body.get(block, []))
    for dyn in body.get("dynamic", []):
        if block in dyn:
            found.extend(dyn[block]["content"])
    return found


def statements(policy_document: dict[str, Any]) -> list[dict[str, Any]]:
    return nested(policy_document, "statement")


def string_list(v: Any) -> list[str]:
    v = value(v)
    if isinstance(v, str):
        return [v]
    return list(v)


_TEMPLATE_TOKEN = re.compile(r"\$\$\{|%%\{|\$\{|%\{")


def render_template(text: str, variables: dict[str, str], where: str = "template") -> str:
    """Terraform's templatefile() for what the templates here use: `${name}`
    interpolation of a variable passed in, and the `$${` and `%%{` escapes.
    Anything else, a directive (`%{ if }`, `%{ for }`), a strip marker or an
    expression, raises ValueError, so a template that grows one cannot pass
    unchecked: teach this renderer first."""
    out = []
    pos = 0
    for m in _TEMPLATE_TOKEN.finditer(text):
        out.append(text[pos : m.start()])
        line = text.count("\n", 0, m.start()) + 1
        token = m.group()
        if token in ("$${", "%%{"):
            out.append(token[1:])
            pos = m.end()
            continue
        if token == "%{":
            raise ValueError(f"{where}:{line}: template directive %{{...}} is not supported by render_template")
        close = text.find("}", m.end())
        name = text[m.end() : close].strip() if close >= 0 else ""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"{where}:{line}: only ${{variable}} interpolation is supported, not {text[m.start() : close + 1]!r}")
        if name not in variables:
            raise ValueError(f"{where}:{line}: unknown template variable {name!r} (given: {sorted(variables)})")
        out.append(variables[name])
        pos = close + 1
    out.append(text[pos:])
    return "".join(out)


def rendered_receiver() -> str:
    """The module's alertmanager_receiver output, rendered with RECEIVER_TEST_VALUES."""
    return render_template(RECEIVER_TEMPLATE.read_text(encoding="utf-8"), RECEIVER_TEST_VALUES, rel(RECEIVER_TEMPLATE))
