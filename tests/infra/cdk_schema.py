"""Provider schemas, for the schema-only provider, out of CDK for Terraform bindings.

The prebuilt provider packages on npm (`@cdktn/provider-aws`, ...) are generated
from each provider's own schema, and their JavaScript keeps what a schema says:
for every argument its Terraform name, whether it is a nested block, a list or a
set, its element type (the `...ToHclTerraform` literals), whether it is required
(no `reset...` method), and every attribute the provider computes (a getter
with no setter). This module reads that back into the JSON of `terraform
providers schema -json` (one provider, one block per resource type) for the
types a configuration uses, and nothing else: the packages are large, the
schemas small.

Anything it does not recognise is an error naming the file and the member, so a
new generator's output cannot turn into a silently thinner schema.

    python3 cdk_schema.py --package PACKAGE.tgz --types aws_lambda_function,data.aws_region,... -o aws.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Attributes the provider marks sensitive. The bindings do not carry the flag,
# and a plan shows a sensitive value as "(sensitive value)", so the ones the
# modules read or write are kept here.
SENSITIVE = {
    "provider.aws": {"access_key", "secret_key", "token"},
    "provider.kubernetes": {"client_key", "token", "password"},
    "resource.aws_ssm_parameter": {"value", "insecure_value"},
    "resource.aws_secretsmanager_secret_version": {"secret_string", "secret_binary"},
    "resource.random_password": {"result", "bcrypt_hash"},
    "resource.kubernetes_secret_v1": {"data", "binary_data"},
    "data.aws_eks_cluster": set(),
    "resource.google_secret_manager_secret_version": {"secret_data"},
    "data.google_client_config": {"access_token"},
}

# Optional arguments the provider also computes, where the bindings do not say
# so: the older generator (@cdktf/provider-kubernetes) writes no flag comments
# for a resource's own arguments. The ones the modules read are kept here.
OPTIONAL_AND_COMPUTED = {
    "resource.kubernetes_secret_v1": {"data"},
}

PRIMITIVES = {"string": "string", "number": "number", "boolean": "bool"}
GETTERS = {
    "String": "string",
    "Number": "number",
    "Boolean": "bool",
    "List": ["list", "string"],
    "NumberList": ["list", "number"],
    "BooleanList": ["list", "bool"],
    "StringMap": ["map", "string"],
    "NumberMap": ["map", "number"],
    "BooleanMap": ["map", "bool"],
    "AnyMap": ["map", "dynamic"],
}
COMPUTED_MAPS = {"StringMap": "string", "NumberMap": "number", "BooleanMap": "bool", "AnyMap": "dynamic"}


class SchemaError(Exception):
    """The bindings hold something this converter does not understand."""


@dataclass
class Source:
    """One generated file: its classes and its `...ToHclTerraform` functions, by name."""

    where: str
    classes: dict[str, str]
    functions: dict[str, str]

    @classmethod
    def parse(cls, text: str, where: str) -> "Source":
        classes: dict[str, str] = {}
        functions: dict[str, str] = {}
        # Generated files put every class and function at column 0, closed by a "}" there.
        for m in re.finditer(r"^(class|function) (\w+)\b.*?^\}", text, re.S | re.M):
            (classes if m.group(1) == "class" else functions)[m.group(2)] = m.group(0)
        return cls(where, classes, functions)


HCL_ATTR = re.compile(
    r'^\s*"?([A-Za-z0-9_-]+)"?: \{\n\s*value: [^\n]*\n\s*isBlock: (true|false),\n'
    r'\s*type: "(\w+)",\n\s*storageClassType: "(\w+)",',
    re.M,
)
COMMENT = re.compile(r"^\s*// ([a-z0-9_]+) - computed: (true|false), optional: (true|false), required: (true|false)$", re.M)
GETTER = re.compile(r"^    get (\w+)\(\) \{\n\s*return (.*?);\n    \}", re.M | re.S)


def lower_first(name: str) -> str:
    return name[:1].lower() + name[1:]


def camel(tf_name: str) -> str:
    head, *rest = tf_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def hcl_attrs(body: str) -> dict[str, tuple[bool, str, str]]:
    """The configurable arguments a class or struct function writes: name -> (is_block, kind, storage)."""
    return {m.group(1): (m.group(2) == "true", m.group(3), m.group(4)) for m in HCL_ATTR.finditer(body)}


def comments(body: str) -> dict[str, tuple[bool, bool, bool]]:
    return {m.group(1): (m.group(2) == "true", m.group(3) == "true", m.group(4) == "true") for m in COMMENT.finditer(body)}


class Converter:
    def __init__(self, source: Source, sensitive: set[str], computed: set[str] = frozenset()):
        self.src = source
        self.sensitive = sensitive
        self.computed = computed

    def fail(self, what: str) -> SchemaError:
        return SchemaError(f"{self.src.where}: {what}")

    def struct_of(self, storage: str) -> str:
        for suffix in ("OutputReference", "List", "Map"):
            if storage.endswith(suffix):
                return storage[: -len(suffix)]
        return storage

    def block(self, cls_name: str | None, hcl_body: str, top: bool = False) -> dict[str, Any]:
        """The schema block of one class (resource, data source, provider, or a
        nested struct's OutputReference) and its HCL function."""
        body = self.src.classes.get(cls_name, "") if cls_name else ""
        configurable = hcl_attrs(hcl_body)
        flags = comments(body)
        attributes: dict[str, Any] = {}
        block_types: dict[str, Any] = {}
        for name, (is_block, kind, storage) in configurable.items():
            computed, optional, required = self.flags(name, body, flags)
            if is_block:
                block_types[name] = self.nested_block(name, kind, storage, body, required)
                continue
            attribute: dict[str, Any] = {"type": self.value_type(name, kind, storage, body)}
            attribute.update(self.mode(computed, optional, required))
            attributes[name] = attribute
        for name, expr in self.computed_only(body, configurable):
            attributes[name] = {"type": self.getter_type(name, expr, body), "computed": True}
        for name in attributes:
            if top and name in self.sensitive:
                attributes[name]["sensitive"] = True
            if top and name in self.computed and attributes[name].get("optional"):
                attributes[name]["computed"] = True
        out: dict[str, Any] = {}
        if attributes:
            out["attributes"] = dict(sorted(attributes.items()))
        if block_types:
            out["block_types"] = dict(sorted(block_types.items()))
        return out

    def flags(self, name: str, body: str, flags: dict[str, tuple[bool, bool, bool]]) -> tuple[bool, bool, bool]:
        if name in flags:
            return flags[name]
        if not body:
            # A provider's nested blocks have no class: nothing in them is marked required.
            return False, True, False
        optional = re.search(rf"^    reset{re.escape(camel(name)[:1].upper() + camel(name)[1:])}\(\)", body, re.M) is not None
        return name == "id", optional, not optional

    @staticmethod
    def mode(computed: bool, optional: bool, required: bool) -> dict[str, bool]:
        if required:
            return {"required": True}
        out = {"optional": True} if optional else {}
        if computed:
            out["computed"] = True
        return out or {"computed": True}

    def value_type(self, name: str, kind: str, storage: str, body: str) -> Any:
        if kind == "simple":
            if storage not in PRIMITIVES:
                raise self.fail(f"argument {name}: unknown simple storage {storage!r}")
            return PRIMITIVES[storage]
        collection = {"list": "list", "set": "set", "map": "map"}.get(kind)
        m = re.fullmatch(r"(string|number|boolean|any)(List|Map)", storage)
        if collection and m:
            element = {"any": "dynamic"}.get(m.group(1), PRIMITIVES.get(m.group(1)))
            return [collection, element]
        struct = self.struct_of(storage)
        element = self.object_type(struct)
        if kind == "struct":
            return element
        if collection in ("list", "set"):
            return [collection, element]
        raise self.fail(f"argument {name}: unknown type {kind!r}/{storage!r}")

    def object_type(self, struct: str) -> Any:
        if f"{struct}OutputReference" not in self.src.classes:
            # Kept in a file this one was not given: an empty object would be a thinner schema.
            raise self.fail(f"{struct}: no class {struct}OutputReference")
        nested = self.block(f"{struct}OutputReference", self.src.functions.get(f"{lower_first(struct)}ToHclTerraform", ""))
        if nested.get("block_types"):
            raise self.fail(f"{struct}: blocks inside a nested attribute are not supported")
        return ["object", {n: a["type"] for n, a in nested.get("attributes", {}).items()}]

    def nested_block(self, name: str, kind: str, storage: str, body: str, required: bool) -> dict[str, Any]:
        struct = self.struct_of(storage)
        hcl = self.src.functions.get(f"{lower_first(struct)}ToHclTerraform")
        if hcl is None:
            raise self.fail(f"block {name}: no function {lower_first(struct)}ToHclTerraform")
        nested: dict[str, Any] = {"nesting_mode": "set" if kind == "set" else "list"}
        nested["block"] = self.block(f"{struct}OutputReference" if body else None, hcl)
        # A block with at most one element has an OutputReference of its own in the class.
        if re.search(rf'= new {struct}OutputReference\(this, "{name}"\)', body):
            nested["max_items"] = 1
        if required:
            nested["min_items"] = 1
        return nested

    def computed_only(self, body: str, configurable: dict[str, Any]) -> list[tuple[str, str]]:
        found = []
        for m in GETTER.finditer(body):
            getter, expr = m.group(1), m.group(2)
            if getter.endswith("Input") or getter in ("internalValue",) or "\n" in expr:
                continue
            name = self.tf_name(getter, expr, body)
            if name is None or name in configurable:
                continue
            if re.search(rf"^    set {getter}\(", body, re.M):
                continue
            found.append((name, expr))
        return found

    def tf_name(self, getter: str, expr: str, body: str) -> str | None:
        m = re.search(r"\(this, \"([^\"]+)\"|Attribute\('([^']+)'\)", expr)
        if m:
            return m.group(1) or m.group(2)
        field = re.fullmatch(r"this\._(\w+)", expr)
        if field:
            init = re.search(rf"_{field.group(1)} = new [\w.]+\(this, \"([^\"]+)\"", body)
            return init.group(1) if init else None
        return None

    def getter_type(self, name: str, expr: str, body: str) -> Any:
        m = re.fullmatch(r"(?:cdkt[nf]\.Fn\.tolist\()?this\.get(\w*)Attribute\('[^']+'\)\)?", expr)
        if m:
            if m.group(1) not in GETTERS:
                raise self.fail(f"attribute {name}: unknown getter get{m.group(1)}Attribute")
            kind = GETTERS[m.group(1)]
            if expr.startswith(("cdktn.Fn.tolist", "cdktf.Fn.tolist")):
                kind = ["set", kind[1]]
            return kind
        if expr.startswith("this.interpolationForAttribute("):
            return "dynamic"
        m = re.fullmatch(r"new cdkt[nf]\.(\w+)\(this, \"[^\"]+\"\)", expr)
        if m and m.group(1) in COMPUTED_MAPS:
            return ["map", COMPUTED_MAPS[m.group(1)]]
        field = re.fullmatch(r"this\._(\w+)", expr)
        if field:
            # A computed map kept in a field (the google bindings' default_labels).
            init = re.search(rf"_{field.group(1)} = new cdkt[nf]\.(\w+)\(this, \"[^\"]+\"\)", body)
            if init and init.group(1) in COMPUTED_MAPS:
                return ["map", COMPUTED_MAPS[init.group(1)]]
            init = re.search(rf"_{field.group(1)} = new (\w+)\(this, \"[^\"]+\"(?:, (true|false))?\)", body)
            if init:
                struct = self.struct_of(init.group(1))
                element = self.object_type(struct)
                if init.group(1).endswith("OutputReference"):
                    return element
                return ["set" if init.group(2) == "true" else "list", element]
        raise self.fail(f"attribute {name}: unknown getter {expr!r}")


def lib_dir(kind: str, type_name: str) -> str:
    """The package folder of a type: aws_lambda_function -> lambda-function,
    data.aws_region -> data-aws-region, the provider -> provider."""
    if kind == "provider":
        return "provider"
    if kind == "data":
        return "data-" + type_name.replace("_", "-")
    return type_name.split("_", 1)[1].replace("_", "-")


def convert_one(text: str, where: str, kind: str, type_name: str) -> tuple[dict[str, Any], str]:
    """(schema block, provider version) of one resource, data source or provider file."""
    src = Source.parse(text, where)
    base = {"provider": "TerraformProvider", "data": "TerraformDataSource", "resource": "TerraformResource"}[kind]
    main = [name for name, body in src.classes.items() if re.match(rf"class \w+ extends cdkt[nf]\.{base} ", body)]
    if len(main) != 1:
        raise SchemaError(f"{where}: expected one class extending {base}, found {main}")
    body = src.classes[main[0]]
    if kind != "provider":
        # Newer generators declare it in the class, older ones assign it after.
        declared = re.search(rf'(?:static |^{main[0]}\.)tfResourceType = "([^"]+)"', text, re.M)
        if not declared or declared.group(1) != type_name:
            raise SchemaError(f"{where}: holds {declared.group(1) if declared else 'no type'}, not {type_name}")
    version = re.search(r"providerVersion: '([^']+)'", body)
    synth = re.search(r"^    synthesizeHclAttributes\(\) \{.*?^    \}", body, re.S | re.M)
    if not synth:
        raise SchemaError(f"{where}: no synthesizeHclAttributes")
    key = f"{kind}.{type_name}"
    block = Converter(src, SENSITIVE.get(key, set()), OPTIONAL_AND_COMPUTED.get(key, set())).block(main[0], synth.group(0), top=True)
    return block, version.group(1) if version else ""


# Where a large type keeps its nested structs: files beside its index.js
# (the google bindings' index-structs/structs0.js, ...), which refer to each
# other through the module objects they require.
STRUCT_FILE = re.compile(r"(package/lib/[^/]+)/index-structs/[^/]+\.js")
MODULE_ALIAS = re.compile(r"\b(?:index|index_structs|structs\d+)_1\.")


def read_members(package: Path, wanted: set[str]) -> dict[str, str]:
    """The wanted files of a tarball, in one pass over it (a gzip stream
    cannot seek), each with the struct files of its folder appended."""
    found: dict[str, str] = {}
    structs: dict[str, list[tuple[str, str]]] = {}
    with tarfile.open(package, "r|gz") as tar:
        for info in tar:
            m = STRUCT_FILE.fullmatch(info.name)
            if info.name not in wanted and not (m and f"{m.group(1)}/index.js" in wanted):
                continue
            f = tar.extractfile(info)
            assert f is not None
            text = f.read().decode("utf-8")
            if m:
                structs.setdefault(f"{m.group(1)}/index.js", []).append((info.name, text))
            else:
                found[info.name] = text
    merged = {}
    for name, text in found.items():
        parts = [text] + [s for _, s in sorted(structs.get(name, []))]
        merged[name] = MODULE_ALIAS.sub("", "\n".join(parts))
    return merged


def convert(package: Path, provider: str, types: list[str]) -> dict[str, Any]:
    """The schema of `provider` restricted to `types` ("aws_x" resources, "data.aws_y" data sources)."""
    out: dict[str, Any] = {"provider": provider, "package": package.name, "resource_schemas": {}, "data_source_schemas": {}}
    wanted = [("provider", provider)] + [("data", t[5:]) if t.startswith("data.") else ("resource", t) for t in types]
    members = {f"package/lib/{lib_dir(kind, type_name)}/index.js": (kind, type_name) for kind, type_name in wanted}
    texts = read_members(package, set(members))
    versions = set()
    for member, (kind, type_name) in members.items():
        if member not in texts:
            raise SchemaError(f"{package.name}: no {member} for {kind} {type_name}")
        block, version = convert_one(texts[member], f"{package.name}:{member}", kind, type_name)
        if version:
            versions.add(version)
        if kind == "provider":
            # `alias` is a meta-argument the bindings add to every provider; Terraform keeps it for itself.
            block.get("attributes", {}).pop("alias", None)
            out["provider_schema"] = {"version": 0, "block": block}
        else:
            out[f"{'data_source' if kind == 'data' else 'resource'}_schemas"][type_name] = {"version": 0, "block": block}
    if len(versions) != 1:
        raise SchemaError(f"{package.name}: expected one provider version, found {sorted(versions)}")
    out["version"] = versions.pop()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, required=True, help="the npm tarball of the bindings")
    parser.add_argument("--provider", required=True, help="the provider's type name, e.g. aws")
    parser.add_argument("--types", required=True, help="comma-separated: resource types, and data sources as data.TYPE")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    types = sorted({t for t in args.types.split(",") if t})
    try:
        schema = convert(args.package, args.provider, types)
    except SchemaError as e:
        print(f"cdk_schema.py: {e}", file=sys.stderr)
        return 1
    args.output.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
