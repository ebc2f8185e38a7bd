"""The converter of CDK for Terraform bindings into provider schemas
(cdk_schema.py), on a sample of generated code and on the schemas the set-up
wrote into the mirror."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest

import cdk_schema
import tofu_lib as T

# The shape of the generated code: a nested block (a set), a block of at most
# one element, a computed-only list of objects, comments with the flags.
SAMPLE = '''
function exampleThingRuleToHclTerraform(struct) {
    const attrs = {
        verbs: {
            value: cdktn.listMapperHcl(cdktn.stringToHclTerraform, false)(struct.verbs),
            isBlock: false,
            type: "set",
            storageClassType: "stringList",
        },
    };
}
class ExampleThingRuleOutputReference extends cdktn.ComplexObject {
    // verbs - computed: false, optional: false, required: true
    _verbs;
    get verbs() {
        return cdktn.Fn.tolist(this.getListAttribute('verbs'));
    }
    set verbs(value) {
        this._verbs = value;
    }
}
function exampleThingConfigToHclTerraform(struct) {
    const attrs = {
        size: {
            value: cdktn.numberToHclTerraform(struct.size),
            isBlock: false,
            type: "simple",
            storageClassType: "number",
        },
    };
}
class ExampleThingConfigOutputReference extends cdktn.ComplexObject {
    _size;
    get size() {
        return this.getNumberAttribute('size');
    }
    set size(value) {
        this._size = value;
    }
    resetSize() {
        this._size = undefined;
    }
}
class ExampleThingStatusOutputReference extends cdktn.ComplexObject {
    get phase() {
        return this.getStringAttribute('phase');
    }
}
class ExampleThing extends cdktn.TerraformResource {
    static tfResourceType = "example_thing";
    constructor(scope, id, config) {
        super(scope, id, {
            terraformGeneratorMetadata: {
                providerName: 'example',
                providerVersion: '1.2.3',
            },
        });
    }
    // name - computed: false, optional: false, required: true
    _name;
    get name() {
        return this.getStringAttribute('name');
    }
    set name(value) {
        this._name = value;
    }
    // tags - computed: true, optional: true, required: false
    _tags;
    get tags() {
        return this.getStringMapAttribute('tags');
    }
    set tags(value) {
        this._tags = value;
    }
    resetTags() {
        this._tags = undefined;
    }
    // arn - computed: true, optional: false, required: false
    get arn() {
        return this.getStringAttribute('arn');
    }
    // rule - computed: false, optional: true, required: false
    _rule = new ExampleThingRuleList(this, "rule", true);
    get rule() {
        return this._rule;
    }
    resetRule() {
        this._rule.internalValue = undefined;
    }
    // config - computed: false, optional: false, required: true
    _config = new ExampleThingConfigOutputReference(this, "config");
    get config() {
        return this._config;
    }
    // status - computed: true, optional: false, required: false
    _status = new ExampleThingStatusList(this, "status", false);
    get status() {
        return this._status;
    }
    synthesizeHclAttributes() {
        const attrs = {
            name: {
                value: cdktn.stringToHclTerraform(this._name),
                isBlock: false,
                type: "simple",
                storageClassType: "string",
            },
            tags: {
                value: cdktn.hashMapperHcl(cdktn.stringToHclTerraform)(this._tags),
                isBlock: false,
                type: "map",
                storageClassType: "stringMap",
            },
            rule: {
                value: cdktn.listMapperHcl(exampleThingRuleToHclTerraform, true)(this._rule.internalValue),
                isBlock: true,
                type: "set",
                storageClassType: "ExampleThingRuleList",
            },
            config: {
                value: exampleThingConfigToHclTerraform(this._config.internalValue),
                isBlock: true,
                type: "list",
                storageClassType: "ExampleThingConfigList",
            },
        };
    }
}
'''


def test_converts_the_generated_code_into_a_schema_block():
    block, version = cdk_schema.convert_one(SAMPLE, "sample.js", "resource", "example_thing")
    assert version == "1.2.3"
    assert block["attributes"] == {
        "name": {"type": "string", "required": True},
        "tags": {"type": ["map", "string"], "optional": True, "computed": True},
        "arn": {"type": "string", "computed": True},
        "status": {"type": ["list", ["object", {"phase": "string"}]], "computed": True},
    }
    assert block["block_types"] == {
        "config": {
            "nesting_mode": "list",
            "max_items": 1,
            "min_items": 1,
            # No comments: a reset method marks the optional ones.
            "block": {"attributes": {"size": {"type": "number", "optional": True}}},
        },
        "rule": {"nesting_mode": "set", "block": {"attributes": {"verbs": {"type": ["set", "string"], "required": True}}}},
    }


def test_a_type_it_does_not_hold_is_an_error():
    with pytest.raises(cdk_schema.SchemaError, match="holds example_thing, not example_other"):
        cdk_schema.convert_one(SAMPLE, "sample.js", "resource", "example_other")


def test_a_getter_it_does_not_know_is_an_error_not_a_thinner_schema():
    sample = SAMPLE.replace("this.getStringAttribute('arn')", "this.getFancyAttribute('arn')")
    with pytest.raises(cdk_schema.SchemaError, match=r"sample.js: attribute arn: unknown getter getFancyAttribute"):
        cdk_schema.convert_one(sample, "sample.js", "resource", "example_thing")


def test_an_unknown_storage_is_an_error():
    sample = SAMPLE.replace('storageClassType: "number"', 'storageClassType: "duration"')
    with pytest.raises(cdk_schema.SchemaError, match="argument size: unknown simple storage 'duration'"):
        cdk_schema.convert_one(sample, "sample.js", "resource", "example_thing")


def split_sample(tmp_path: Path, with_structs: bool = True) -> Path:
    """SAMPLE as the google bindings lay out a large type: the status struct in
    index-structs/structs0.js, required as index_1, and a computed map in a
    field; packed as a package tarball."""
    struct = re.search(r"^class ExampleThingStatusOutputReference .*?^\}\n", SAMPLE, re.S | re.M).group(0)
    index = SAMPLE.replace(struct, "").replace("new ExampleThingStatusList(", "new index_1.ExampleThingStatusList(")
    index = index.replace(
        "    synthesizeHclAttributes() {",
        '    _defaultLabels = new cdktn.StringMap(this, "default_labels");\n'
        "    get defaultLabels() {\n        return this._defaultLabels;\n    }\n"
        "    synthesizeHclAttributes() {",
    )
    files = {"package/lib/example-thing/index.js": index, "package/lib/other-thing/index-structs/structs0.js": struct}
    if with_structs:
        files["package/lib/example-thing/index-structs/structs0.js"] = struct
    package = tmp_path / "example.tgz"
    with tarfile.open(package, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return package


def test_reads_the_structs_kept_beside_a_types_file(tmp_path: Path):
    member = "package/lib/example-thing/index.js"
    texts = cdk_schema.read_members(split_sample(tmp_path), {member})
    assert set(texts) == {member}
    block, _ = cdk_schema.convert_one(texts[member], member, "resource", "example_thing")
    assert block["attributes"]["status"] == {"type": ["list", ["object", {"phase": "string"}]], "computed": True}
    assert block["attributes"]["default_labels"] == {"type": ["map", "string"], "computed": True}


def test_a_struct_it_cannot_find_is_an_error_not_an_empty_object(tmp_path: Path):
    member = "package/lib/example-thing/index.js"
    texts = cdk_schema.read_members(split_sample(tmp_path, with_structs=False), {member})
    with pytest.raises(cdk_schema.SchemaError, match="ExampleThingStatus: no class ExampleThingStatusOutputReference"):
        cdk_schema.convert_one(texts[member], member, "resource", "example_thing")


# --- the schemas the set-up wrote ----------------------------------------------


def all_mirror_schemas() -> list[dict]:
    mirror = Path(T.tool("NODE_FENCER_TF_MIRROR", "the schema-only provider's mirror"))
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(mirror.glob("registry.opentofu.org/hashicorp/*/*/*/schema.json"))]


def mirror_schemas() -> dict[str, dict]:
    """The newest release's schema of each provider."""
    found: dict[str, dict] = {}
    for schema in all_mirror_schemas():
        name = schema["provider"]
        if name not in found or T.version_key(schema["version"]) > T.version_key(found[name]["version"]):
            found[name] = schema
    assert set(found) == {"aws", "google", "kubernetes", "random"}, f"the mirror holds schemas of {sorted(found)}"
    return found


def used_types() -> set[str]:
    found = set()
    for path in T.L.tf_files():
        for m in re.finditer(r'^(resource|data) "([a-z0-9_]+)"', path.read_text(encoding="utf-8"), re.M):
            found.add(("data." if m.group(1) == "data" else "") + m.group(2))
    return found


def test_every_release_in_the_mirror_holds_exactly_the_types_infra_uses():
    releases: dict[str, set[str]] = {}
    for schema in all_mirror_schemas():
        releases.setdefault(schema["version"], set())
        held = set(schema["resource_schemas"]) | {f"data.{t}" for t in schema["data_source_schemas"]}
        want = {t for t in used_types() if t.removeprefix("data.").startswith(schema["provider"] + "_")}
        assert held == want, f"{schema['provider']} {schema['version']}: extra {sorted(held - want)}, missing {sorted(want - held)} (rerun make setup)"
    assert len(all_mirror_schemas()) == 8, "the newest and the oldest release of each of the four providers"


def test_the_aws_schema_is_the_providers():
    aws = mirror_schemas()["aws"]
    function = aws["resource_schemas"]["aws_lambda_function"]["block"]
    assert function["attributes"]["function_name"] == {"type": "string", "required": True}
    assert function["attributes"]["role"] == {"type": "string", "required": True}
    assert function["attributes"]["arn"] == {"type": "string", "computed": True}
    assert function["block_types"]["environment"]["max_items"] == 1
    assert function["block_types"]["vpc_config"]["block"]["attributes"]["subnet_ids"]["type"] == ["set", "string"]
    statement = aws["data_source_schemas"]["aws_iam_policy_document"]["block"]["block_types"]["statement"]
    assert statement["nesting_mode"] == "list"
    assert statement["block"]["block_types"]["principals"]["nesting_mode"] == "set"
    assert mirror_schemas()["random"]["resource_schemas"]["random_password"]["block"]["attributes"]["result"]["sensitive"] is True


def test_the_kubernetes_secrets_data_is_computed_as_the_provider_says():
    # The older bindings do not say so; the kept list in cdk_schema.py does.
    secret = mirror_schemas()["kubernetes"]["resource_schemas"]["kubernetes_secret_v1"]["block"]
    assert secret["attributes"]["data"] == {"type": ["map", "string"], "optional": True, "computed": True, "sensitive": True}


def test_the_google_schema_is_the_providers():
    google = mirror_schemas()["google"]
    service = google["resource_schemas"]["google_cloud_run_v2_service"]["block"]
    assert service["attributes"]["name"] == {"type": "string", "required": True}
    assert service["attributes"]["uri"] == {"type": "string", "computed": True}
    template = service["block_types"]["template"]
    assert template["max_items"] == 1 and template["min_items"] == 1
    env = template["block"]["block_types"]["containers"]["block"]["block_types"]["env"]
    assert env["nesting_mode"] == "set"
    ref = env["block"]["block_types"]["value_source"]["block"]["block_types"]["secret_key_ref"]["block"]
    assert ref["attributes"]["secret"] == {"type": "string", "required": True}
    push = google["resource_schemas"]["google_pubsub_subscription"]["block"]["block_types"]["push_config"]["block"]
    assert push["attributes"]["push_endpoint"] == {"type": "string", "required": True}
    assert push["block_types"]["oidc_token"]["block"]["attributes"]["service_account_email"] == {"type": "string", "required": True}
    version = google["resource_schemas"]["google_secret_manager_secret_version"]["block"]["attributes"]["secret_data"]
    assert version["sensitive"] is True
    # A data source's nested structs, kept in files of their own by the bindings.
    cluster = google["data_source_schemas"]["google_container_cluster"]["block"]["attributes"]
    assert cluster["master_auth"]["type"][1][1]["cluster_ca_certificate"] == "string"
    assert cluster["endpoint"] == {"type": "string", "computed": True}
