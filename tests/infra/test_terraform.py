"""Static checks of the Terraform in infra/.

The configuration checked as text: it parses, it is canonically formatted, the
IAM policy grants exactly the AWS calls the code makes, the ClusterRole and the
Role grant exactly what the code needs, and the wiring (EventBridge pattern and
schedule, timeout, variables) holds what the function expects. The same
configuration validated and planned by OpenTofu against the providers' schemas:
test_tofu.py and test_tofu_plan.py.
"""

from __future__ import annotations

import ast
import difflib
import importlib.metadata
import itertools
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import infra_lib as L

# ---------------------------------------------------------------------------
# Parsing and formatting
# ---------------------------------------------------------------------------


def test_infra_has_terraform():
    assert L.tf_files(), f"no .tf file under {L.rel(L.INFRA)}"


@pytest.mark.parametrize("path", L.tf_files(), ids=L.rel)
def test_tf_file_parses(path: Path):
    parsed = L.parse(path)
    assert parsed, f"{L.rel(path)} parsed to nothing"


def test_one_hcl2_distribution_installed():
    # python-hcl2 and bc-python-hcl2 both install the "hcl2" import package; with
    # both, the later install overwrites the other's files and breaks checkov.
    installed = []
    for dist in ("python-hcl2", "bc-python-hcl2"):
        try:
            installed.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    assert installed and installed[0].startswith("bc-python-hcl2") and len(installed) == 1, (
        f"expected only bc-python-hcl2 (checkov's parser) to provide 'hcl2', found {installed}; "
        "recreate the venv from tests/infra/requirements.txt"
    )


def _hclfmt() -> str:
    binary = os.environ.get("NODE_FENCER_HCLFMT")
    if not binary:
        pytest.fail(
            "NODE_FENCER_HCLFMT is not set: point it at an hclfmt binary, e.g. "
            "`GOBIN=$PWD/.bin go install github.com/hashicorp/hcl/v2/cmd/hclfmt@v2.24.0` "
            "and NODE_FENCER_HCLFMT=$PWD/.bin/hclfmt (the project setup script does this)"
        )
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"NODE_FENCER_HCLFMT={binary} is not an executable file")
    return binary


def test_hcl_is_canonically_formatted():
    """Every .tf and .tfvars.example file is exactly what hclfmt would write
    (the formatting `terraform fmt` applies: 2-space indent, aligned `=`)."""
    hclfmt = _hclfmt()
    problems = []
    for path in L.hcl_files():
        # Without -w, hclfmt prints the formatted file; -check would only check syntax.
        result = subprocess.run([hclfmt, str(path)], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            problems.append(f"{L.rel(path)}: hclfmt failed:\n{result.stderr}")
            continue
        original = path.read_text(encoding="utf-8")
        if result.stdout != original:
            diff = difflib.unified_diff(
                original.splitlines(keepends=True),
                result.stdout.splitlines(keepends=True),
                fromfile=L.rel(path),
                tofile=f"{L.rel(path)} (hclfmt)",
            )
            problems.append("".join(diff))
    assert not problems, "not canonically formatted (run hclfmt -w on them):\n" + "\n".join(problems)


# ---------------------------------------------------------------------------
# IAM: exactly the calls the code makes
# ---------------------------------------------------------------------------

# What the Lambda platform does with the role on the function's behalf, not the
# code: allowed only in the "runtime" policy document, each for its reason.
PLATFORM_ACTIONS = {
    "logs:CreateLogStream": "write the function's log group",
    "logs:PutLogEvents": "write the function's log group",
    "sqs:SendMessage": "deliver failed asynchronous invocations to the dead-letter queue",
    "kms:Decrypt": "decrypt SecureString parameters and secrets under a customer key, via SSM/Secrets Manager only",
    "ec2:AssignPrivateIpAddresses": "attach the function to a VPC",
    "ec2:CreateNetworkInterface": "attach the function to a VPC",
    "ec2:DeleteNetworkInterface": "attach the function to a VPC",
    "ec2:DescribeNetworkInterfaces": "attach the function to a VPC",
    "ec2:DescribeSubnets": "attach the function to a VPC",
    "ec2:UnassignPrivateIpAddresses": "attach the function to a VPC",
}

# Actions IAM authorizes only on "*" (no resource-level permissions), or that
# Lambda checks on "*" when attaching a function to a VPC.
STAR_RESOURCE_ACTIONS = {
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceStatus",
    "ec2:DescribeVolumes",
    "ec2:AssignPrivateIpAddresses",
    "ec2:CreateNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:UnassignPrivateIpAddresses",
}

ACTION_RE = re.compile(r"[a-z0-9-]+:[A-Za-z0-9]+")


def manifest() -> dict:
    """infra/manifest.json: what the function's code needs (AWS actions,
    Kubernetes rules, environment variables, the Lease wait), as
    `node-fencer manifest` prints it; a Rust test keeps the file current."""
    if not L.MANIFEST.is_file():
        pytest.fail(f"{L.rel(L.MANIFEST)} does not exist: run `make manifest`")
    return json.loads(L.MANIFEST.read_text(encoding="utf-8"))


def _manifest_actions(key: str) -> set[str]:
    strings = manifest()[key]
    bad = [s for s in strings if not ACTION_RE.fullmatch(s)]
    assert not bad, f"{key} in {L.rel(L.MANIFEST)} holds entries that are not service:Action: {bad}"
    assert strings, f"{key} in {L.rel(L.MANIFEST)} is empty"
    dupes = sorted({s for s in strings if strings.count(s) > 1})
    assert not dupes, f"{key} in {L.rel(L.MANIFEST)} lists {dupes} more than once"
    return set(strings)


def code_actions() -> set[str]:
    """The AWS API actions the code calls (AWS_ACTIONS of handler/src/core/settings/permissions.rs)."""
    return _manifest_actions("aws_actions")


def power_off_actions() -> set[str]:
    """The AWS API actions the code calls only with ACTIVE_FENCING=on."""
    found = _manifest_actions("power_off_aws_actions")
    both = found & code_actions()
    assert not both, f"{sorted(both)} are in both aws_actions and power_off_aws_actions of {L.rel(L.MANIFEST)}"
    return found


# The for_each of the api document's statements that exist only with active
# fencing: its power-off actions, and nothing else.
ACTIVE_FENCING_FOR_EACH = re.compile(r"local\.active_fencing \? \[.*\] : \[\]")


def module() -> dict:
    return L.parse_dir(L.MODULE)


# The module's two Lambda functions (for_each over local.functions): "main" takes
# EventBridge events, the recovery schedule and direct invocations; "webhook"
# alone serves the public Function URL.
MAIN_FUNCTION = 'aws_lambda_function.this["main"]'
WEBHOOK_FUNCTION = 'aws_lambda_function.this["webhook"]'


def policy_documents(mod: dict) -> dict[str, dict]:
    return L.blocks(mod, "data", "aws_iam_policy_document")


def role_policy_documents(mod: dict) -> dict[str, dict]:
    """The documents merged into the role's one inline policy."""
    docs = policy_documents(mod)
    role_policies = L.blocks(mod, "resource", "aws_iam_role_policy")
    assert list(role_policies) == ["this"], f"expected one inline role policy, found {list(role_policies)}"
    assert L.expr(role_policies["this"]["policy"]) == "data.aws_iam_policy_document.this.json"
    sources = [L.expr(s) for s in L.string_list(docs["this"]["source_policy_documents"])]
    assert sources == [
        "data.aws_iam_policy_document.api.json",
        "data.aws_iam_policy_document.runtime.json",
    ], f"the role policy must merge exactly the api and runtime documents, found {sources}"
    for key in ("statement", "dynamic", "override_policy_documents", "policy_id"):
        assert key not in docs["this"], f"aws_iam_policy_document.this must only merge, found {key}"
    return {"api": docs["api"], "runtime": docs["runtime"]}


def is_deny(statement: dict) -> bool:
    return L.value(statement.get("effect", "Allow")) == "Deny"


def actions_of(document: dict) -> list[str]:
    """The actions the document's statements allow (a Deny grants nothing)."""
    found = []
    for statement in L.statements(document):
        assert "not_actions" not in statement, "NotAction grants everything else: not allowed"
        if not is_deny(statement):
            found.extend(L.string_list(statement["actions"]))
    return found


def test_no_managed_or_extra_policies_on_the_role():
    mod = module()
    for kind in ("aws_iam_role_policy_attachment", "aws_iam_policy", "aws_iam_role_policies_exclusive"):
        assert not L.blocks(mod, "resource", kind), f"the module must not add {kind}: all permissions live in the tested inline policy"
    role = L.blocks(mod, "resource", "aws_iam_role")["this"]
    assert "managed_policy_arns" not in role and "inline_policy" not in role


def test_api_policy_equals_code_actions():
    """The `api` document grants exactly AWS_ACTIONS of handler/src/core/settings/permissions.rs,
    with active fencing its power-off actions, and with a notification topic sns:Publish."""
    expected = code_actions() | power_off_actions() | _manifest_actions("notify_aws_actions")
    granted = actions_of(role_policy_documents(module())["api"])
    assert set(granted) == expected, (
        f"IAM policy and code disagree: granted but not called {sorted(set(granted) - expected)}, "
        f"called but not granted {sorted(expected - set(granted))}"
    )


def test_power_off_actions_are_granted_only_with_active_fencing():
    """Every statement that grants a power-off action exists only when
    local.active_fencing is true, and grants nothing else; no other statement
    grants one."""
    api = role_policy_documents(module())["api"]
    gated = []
    for dynamic in api.get("dynamic", []):
        if "statement" not in dynamic:
            continue
        for_each = L.expr(dynamic["statement"]["for_each"])
        for statement in dynamic["statement"]["content"]:
            if is_deny(statement):
                continue
            actions = set(L.string_list(statement["actions"]))
            if ACTIVE_FENCING_FOR_EACH.fullmatch(for_each):
                assert actions <= power_off_actions(), f"{L.value(statement['sid'])}: {sorted(actions - power_off_actions())} granted only with active fencing"
                gated.extend(actions)
            else:
                assert not actions & power_off_actions(), f"{L.value(statement['sid'])} grants {sorted(actions & power_off_actions())} whatever active_fencing is"
    for statement in api.get("statement", []):
        actions = set(L.string_list(statement["actions"]))
        assert not actions & power_off_actions(), f"{L.value(statement['sid'])} grants {sorted(actions & power_off_actions())} always"
    assert sorted(gated) == sorted(power_off_actions()), f"granted with active fencing: {sorted(gated)}"
    runtime = role_policy_documents(module())["runtime"]
    assert not set(actions_of(runtime)) & power_off_actions()


def test_role_policy_is_code_actions_plus_logs_and_platform():
    """All actions of the role, less logs:* and the documented platform actions,
    equal AWS_ACTIONS; the platform actions appear only in the runtime document."""
    expected = code_actions() | power_off_actions() | _manifest_actions("notify_aws_actions")
    docs = role_policy_documents(module())
    everything = set(actions_of(docs["api"])) | set(actions_of(docs["runtime"]))
    remaining = {a for a in everything if not a.startswith("logs:") and a not in PLATFORM_ACTIONS}
    assert remaining == expected, f"role grants {sorted(remaining)} beyond logs/platform, code calls {sorted(expected)}"

    runtime = set(actions_of(docs["runtime"]))
    unexplained = runtime - set(PLATFORM_ACTIONS)
    assert not unexplained, f"runtime document grants actions with no documented platform reason: {sorted(unexplained)}"
    leaked = set(actions_of(docs["api"])) & (set(PLATFORM_ACTIONS) - expected)
    assert not leaked, f"platform actions belong in the runtime document, not api: {sorted(leaked)}"


def test_no_wildcard_actions_anywhere():
    problems = []
    for path in L.tf_files():
        for entry in L.parse(path).get("data", []):
            for name, document in entry.get("aws_iam_policy_document", {}).items():
                for action in actions_of(document):
                    if "*" in action or "?" in action or not ACTION_RE.fullmatch(action):
                        problems.append(f"{L.rel(path)}: aws_iam_policy_document.{name}: {action}")
    assert not problems, "wildcard or malformed actions:\n" + "\n".join(problems)
    # Policies written as JSON strings would escape the checks above.
    for path in L.tf_files():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r'"Action"\s*[:=]', text), f"{L.rel(path)}: write policies with aws_iam_policy_document"


def test_star_resources_only_where_iam_allows_nothing_narrower():
    for name, document in role_policy_documents(module()).items():
        for statement in L.statements(document):
            resources = L.string_list(statement["resources"])
            if "*" in resources:
                actions = set(L.string_list(statement["actions"]))
                assert actions <= STAR_RESOURCE_ACTIONS, (
                    f"{name}: {sorted(actions - STAR_RESOURCE_ACTIONS)} on '*' can be scoped to resources"
                )


def _statement(document: dict, sid: str) -> dict:
    for statement in L.statements(document):
        if L.value(statement.get("sid")) == sid:
            return statement
    raise AssertionError(f"no statement {sid}")


def test_scoped_statements():
    docs = role_policy_documents(module())
    api, runtime = docs["api"], docs["runtime"]

    volume = _statement(api, "DetachTaggedVolumes")
    assert L.string_list(volume["resources"]) == ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:volume/*"]
    conditions = L.nested(volume, "condition")
    assert len(conditions) == 1, "DetachVolume on volumes must carry the tag condition"
    condition = conditions[0]
    assert L.value(condition["test"]) == "StringEquals"
    assert L.value(condition["variable"]) == "aws:ResourceTag/${condition.value.key}"
    assert L.string_list(condition["values"]) == ["${condition.value.value}"]
    tag_toggle = [d for d in volume.get("dynamic", []) if "condition" in d]
    assert L.expr(tag_toggle[0]["condition"]["for_each"]) == "var.detach_volume_require_tag ? ['${local.detach_volume_tag}'] : []"
    # This cluster's own tag, as the EBS CSI driver writes it with
    # --k8s-tag-cluster-id, when its id is given; else the given one.
    assert L.expr(L.locals_of(module())["detach_volume_tag"]) == (
        "var.detach_volume_cluster_id != None ? {'key': 'kubernetes.io/cluster/${var.detach_volume_cluster_id}', 'value': 'owned'} : "
        "{'key': '${var.detach_volume_tag_key}', 'value': '${var.detach_volume_tag_value}'}"
    )

    variables = L.variables_of(L.MODULE / "variables.tf")
    assert L.value(variables["detach_volume_tag_key"]["default"]) == "ebs.csi.aws.com/cluster"
    assert L.value(variables["detach_volume_tag_value"]["default"]) == "true"
    assert L.value(variables["detach_volume_require_tag"]["default"]) is True
    assert L.value(variables["detach_volume_cluster_id"]["default"]) is None

    instance = _statement(api, "DetachFromInstances")
    assert L.string_list(instance["resources"]) == ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]

    # Active fencing: the status checks on "*" (no resource-level permissions),
    # the power-off on the account's instances carrying the cluster's tag.
    status = _statement(api, "DescribeInstanceStatus")
    assert L.string_list(status["actions"]) == ["ec2:DescribeInstanceStatus"]
    assert L.string_list(status["resources"]) == ["*"]
    stop = _statement(api, "StopClusterInstances")
    assert L.string_list(stop["actions"]) == ["ec2:StopInstances"]
    assert L.string_list(stop["resources"]) == ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]
    (condition,) = L.nested(stop, "condition")
    assert L.value(condition["test"]) == "StringEquals"
    assert L.value(condition["variable"]) == "aws:ResourceTag/${statement.value.key}"
    assert L.string_list(condition["values"]) == ["${statement.value.value}"]
    (precondition,) = api["lifecycle"][0]["precondition"]
    assert L.expr(precondition["condition"]) == "!local.active_fencing || local.power_off_instance_tag != None"
    assert L.value(L.variables_of(L.MODULE / "variables.tf")["power_off_instance_tag"]["default"]) is None

    cluster = _statement(api, "DescribeCluster")
    assert L.string_list(cluster["resources"]) == ["arn:${local.partition}:eks:${local.region}:${local.account_id}:cluster/${var.cluster_name}"]

    assert L.string_list(_statement(api, "ReadParameters")["resources"]) == ["${local.ssm_parameter_arns}"]
    assert L.string_list(_statement(api, "ReadSecrets")["resources"]) == ["${local.secret_arns}"]

    # The log groups of both functions, however many there are.
    logs = _statement(runtime, "WriteLogs")
    assert L.string_list(logs["resources"]) == ['${[for group in aws_cloudwatch_log_group.this : "${group.arn}:*"]}']
    assert L.string_list(_statement(runtime, "OnFailureDestination")["resources"]) == ["${aws_sqs_queue.dlq.arn}"]
    kms = _statement(runtime, "DecryptParametersAndSecrets")
    assert L.string_list(kms["resources"]) == ["${var.kms_key_arn}"]
    assert [L.value(c["variable"]) for c in L.nested(kms, "condition")] == ["kms:ViaService"]

    # Conditional statements only exist when their input is set.
    for_each = {
        d["statement"]["content"][0]["sid"][0]: L.expr(d["statement"]["for_each"])
        for doc in (api, runtime)
        for d in doc.get("dynamic", [])
        if "statement" in d
    }
    assert for_each["DescribeCluster"] == "local.describe_cluster ? [True] : []"
    assert for_each["DescribeInstanceStatus"] == "local.active_fencing ? [True] : []"
    assert for_each["StopClusterInstances"] == "local.active_fencing ? ['${local.power_off_instance_tag}'] : []"
    assert for_each["DenyStopControlPlane${statement.key}"] == "local.deny_control_plane_stop ? var.control_plane_instance_tags : []"
    assert for_each["DecryptParametersAndSecrets"] == "var.kms_key_arn != None ? [True] : []"


def test_control_plane_instances_are_never_stopped_unless_allowed():
    """With active fencing, an explicit Deny of ec2:StopInstances on instances
    carrying any control-plane tag (kOps' and Cluster API's by default), one
    statement per tag so that any one tag suffices; dropped only with
    power_off_control_plane, which also tells the code."""
    mod = module()
    api = role_policy_documents(mod)["api"]
    denies = [
        (L.expr(d["statement"]["for_each"]), statement)
        for d in api.get("dynamic", [])
        if "statement" in d
        for statement in d["statement"]["content"]
        if is_deny(statement)
    ]
    assert not [st for st in api.get("statement", []) if is_deny(st)], "a Deny exists only with active fencing"
    ((for_each, deny),) = denies
    assert for_each == "local.deny_control_plane_stop ? var.control_plane_instance_tags : []"
    assert L.expr(L.locals_of(mod)["deny_control_plane_stop"]) == "local.active_fencing && !var.power_off_control_plane"
    assert L.string_list(deny["actions"]) == ["ec2:StopInstances"]
    assert L.string_list(deny["resources"]) == ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]
    (condition,) = L.nested(deny, "condition")
    assert L.value(condition["test"]) == "StringLike"
    assert L.value(condition["variable"]) == "aws:ResourceTag/${statement.value.key}"
    assert L.string_list(condition["values"]) == ["${statement.value.value}"]

    variables = L.variables_of(L.MODULE / "variables.tf")
    assert L.value(variables["power_off_control_plane"]["default"]) is False
    tags = {(t["key"], t["value"]) for t in L.value(variables["control_plane_instance_tags"]["default"])}
    assert tags == {
        ("k8s.io/role/control-plane", "*"),
        ("k8s.io/role/master", "*"),
        ("sigs.k8s.io/cluster-api-provider-aws/role", "control-plane"),
    }, tags
    environment = environment_text(mod)
    assert "local.active_fencing && var.power_off_control_plane ? {'POWER_OFF_CONTROL_PLANE': 'true'} : {}" in environment


def settings_call(mod: dict) -> dict:
    """The module's call of the shared settings module: every argument the
    module's own variable of that name, every variable of the settings module given."""
    calls = {name: body for entry in mod.get("module", []) for name, body in entry.items()}
    call = calls["settings"]
    assert L.value(call["source"]) == "../settings"
    arguments = {k: v for k, v in call.items() if not k.startswith("__") and k != "source"}
    for name, v in arguments.items():
        assert L.value(v) == f"${{var.{name}}}", f"module.settings.{name} must be passed var.{name}, not {L.value(v)}"
    wanted = set(L.variables_of(L.SETTINGS_MODULE / "variables.tf"))
    assert set(arguments) == wanted, f"module.settings: not given {sorted(wanted - set(arguments))}, unknown {sorted(set(arguments) - wanted)}"
    return call


def environment_text(mod: dict) -> str:
    """The module's environment expression, with the shared settings' own
    (module.settings.environment, the first thing it merges) written out."""
    settings_call(mod)
    environment = L.expr(L.locals_of(mod)["environment"])
    assert environment.startswith("merge(module.settings.environment,"), f"the environment must start from the shared settings': {environment}"
    shared = L.expr(L.locals_of(L.parse_dir(L.SETTINGS_MODULE))["environment"])
    return shared + "\n" + environment


# Environment variables of the function and the module variables they come from.
INTEGER_VARIABLES = {
    "MAX_OUT_OF_SERVICE": "max_out_of_service",
    "MAX_OUT_OF_SERVICE_PERCENT": "max_out_of_service_percent",
    "CONFIRM_AGAIN_AFTER_SECONDS": "confirm_again_after_seconds",
    "VOLUME_DETACH_TIMEOUT_SECONDS": "volume_detach_timeout_seconds",
    "RECOVERY_SETTLE_SECONDS": "recovery_settle_seconds",
    "NOT_READY_WAIT_SECONDS": "not_ready_wait_seconds",
    "POWER_OFF_AFTER_SECONDS": "power_off_after_seconds",
    "POWER_OFF_WAIT_SECONDS": "power_off_wait_seconds",
    "PARTITION_PERCENT": "partition_percent",
}
# Passed all together, only with active fencing on: the code refuses the
# settings without ACTIVE_FENCING=on.
ACTIVE_FENCING_VARIABLES = {
    "ACTIVE_FENCING": "${local.active_fencing_scope}",
    "POWER_OFF_AFTER_SECONDS": "${tostring(var.power_off_after_seconds)}",
    "POWER_OFF_WAIT_SECONDS": "${tostring(var.power_off_wait_seconds)}",
    "PARTITION_PERCENT": "${tostring(var.partition_percent)}",
}
ENV_VARIABLES = {
    **INTEGER_VARIABLES,
    "FENCING_MODE": "fencing_mode",
    "CONTROL_NAMESPACE": "control_namespace",
    "RECOVERY": "recovery",
}


def test_env_names_are_the_contract():
    """The function reads these variables; the module must not invent others nor
    pass the plain WEBHOOK_TOKEN (local use only)."""
    contract = {
        "DRY_RUN",
        "FAST_NOT_READY",
        "NODE_SELECTOR",
        "FENCE_HIBERNATED",
        "OUT_OF_SERVICE_NO_SCHEDULE",
        "CLUSTER_VPC_ID",
        "CLUSTER_TAG",
        "MAX_OUT_OF_SERVICE",
        "MAX_OUT_OF_SERVICE_PERCENT",
        "FENCING_MODE",
        "CONFIRM_AGAIN_AFTER_SECONDS",
        "RECOVERY_SETTLE_SECONDS",
        "RECOVERY",
        "NOT_READY_WAIT_SECONDS",
        "CONTROL_NAMESPACE",
        "VOLUME_DETACH_TIMEOUT_SECONDS",
        "CLUSTER_NAME",
        "CLUSTER_ENDPOINT",
        "CLUSTER_CA_DATA",
        "KUBECONFIG_SSM_PARAMETER",
        "KUBECONFIG_SECRET_ID",
        "WEBHOOK_TOKEN_SECRET_ID",
        "WEBHOOK_TOKEN_SSM_PARAMETER",
        "LOG_FORMAT",
        "RUST_LOG",
        *ACTIVE_FENCING_VARIABLES,
        "POWER_OFF_CONTROL_PLANE",
        "NOTIFY_TOPIC",
    }
    mod = module()
    function = L.blocks(mod, "resource", "aws_lambda_function")["this"]
    assert L.expr(function["environment"][0]["variables"]) == "local.environment"
    environment = environment_text(mod)
    names = set(re.findall(r"'([A-Z][A-Z0-9_]*)':", environment))
    assert names == contract, f"unexpected {sorted(names - contract)}, missing {sorted(contract - names)}"
    assert "'WEBHOOK_TOKEN':" not in environment
    assert "'VOLUME_DETACH_TIMEOUT_SECONDS': '${tostring(var.volume_detach_timeout_seconds)}'" in environment
    for name, variable in ENV_VARIABLES.items():
        passed = f"tostring(var.{variable})" if variable in INTEGER_VARIABLES.values() else f"var.{variable}"
        assert f"'{name}': '${{{passed}}}'" in environment, f"{name} must be passed from var.{variable}"
    # Active fencing: the four together, only when it is on.
    active = "local.active_fencing ? {" + ", ".join(f"'{k}': '{v}'" for k, v in ACTIVE_FENCING_VARIABLES.items()) + "} : {}"
    assert active in environment, f"the active fencing variables must be passed together, only with active fencing: {environment}"
    # off, stuck or on, and the bool the variable once was.
    local = L.locals_of(mod)
    assert L.expr(local["active_fencing"]) == "contains(['stuck', 'on', 'true'],var.active_fencing)"
    assert L.expr(local["active_fencing_scope"]) == 'var.active_fencing == "stuck" ? "stuck" : "on"'
    for name in ACTIVE_FENCING_VARIABLES:
        assert environment.count(f"'{name}':") == 1, f"{name} is passed outside the active fencing map"
    # Unset means no percentage cap: the variable is passed only when set.
    assert (
        "var.max_out_of_service_percent != None ? "
        "{'MAX_OUT_OF_SERVICE_PERCENT': '${tostring(var.max_out_of_service_percent)}'} : {}"
    ) in environment
    # Unset means every Node: the selector is passed only when set.
    assert "var.node_selector != None ? {'NODE_SELECTOR': '${var.node_selector}'} : {}" in environment

    code = code_variables()
    unknown = names - set(code)
    assert not unknown, f"the module passes {sorted(unknown)}, which VARIABLES of {L.rel(L.CONFIG_RS)} does not list"


def code_variables() -> dict[str, str]:
    """Every environment variable the function reads, with what it accepts
    ("integer 0..=300 (default 30): ..."), from the manifest."""
    pairs = {v["name"]: v["accepts"] for v in manifest()["variables"]}
    assert pairs, f"variables in {L.rel(L.MANIFEST)} is empty"
    return pairs


@pytest.mark.parametrize("page", ["docs/configuration.md"])
def test_configuration_tables_list_every_variable_once(page: str):
    """docs/configuration.md's table names every variable the code reads,
    once, and no other (the README links to it rather than repeat it)."""
    text = (L.REPO / page).read_text(encoding="utf-8")
    section = text.split("# Configuration", 1)
    assert len(section) == 2, f"{page} has no configuration section"
    table = section[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| (`[A-Z][^|]*?) \|", table, flags=re.M)
    rows = [name for cell in first_cells for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cell)]
    # The AWS SDK reads its own variables (AWS_REGION, ...): documented there, not ours.
    rows = [r for r in rows if not r.startswith("AWS_")]
    dupes = sorted({r for r in rows if rows.count(r) > 1})
    assert not dupes, f"{page}'s configuration table lists {dupes} twice"
    code = set(code_variables())
    assert set(rows) == code, (
        f"{page}'s configuration table and {L.rel(L.MANIFEST)} disagree: "
        f"missing {sorted(code - set(rows))}, unknown {sorted(set(rows) - code)}"
    )


def validated(variable: str, module_dir: Path) -> dict:
    """The declaration of a module's variable that carries its validation: the
    module's own, or for a setting it passes through, the shared settings
    module's (never both)."""
    own = L.variables_of(module_dir / "variables.tf")[variable]
    shared = L.variables_of(L.SETTINGS_MODULE / "variables.tf").get(variable, {})
    assert not (own.get("validation") and shared.get("validation")), f"var.{variable} is validated both in {L.rel(module_dir)} and in the settings module"
    return own if own.get("validation") else shared


def _bounds(variable: str, module_dir: Path = L.MODULE) -> tuple[int, int, object]:
    """Lower and upper bound of a whole-number module variable's validation, and its default."""
    body = validated(variable, module_dir)
    condition = L.expr(body["validation"][0]["condition"])
    lower = re.search(rf"var\.{variable}\s*>=\s*(\d+)", condition)
    upper = re.search(rf"var\.{variable}\s*<=\s*(\d+)", condition)
    assert lower and upper, f"var.{variable} must be validated with >= and <= bounds: {condition}"
    assert f"floor(var.{variable}) == var.{variable}" in condition, f"var.{variable} must be validated as a whole number"
    default = L.value(L.variables_of(module_dir / "variables.tf")[variable].get("default"))
    return int(lower.group(1)), int(upper.group(1)), default


def test_variables_validate_what_the_code_accepts():
    """Each behaviour variable accepts no value the function would reject at
    cold start, and defaults to what the function assumes when it is unset."""
    code = code_variables()
    variables = L.variables_of(L.MODULE / "variables.tf")
    for name, variable in INTEGER_VARIABLES.items():
        assert name in code, f"{name} is not in VARIABLES of {L.rel(L.CONFIG_RS)}"
        m = re.match(r"integer (\d+)\.\.=(\d+) \(default (\w+)[;)]", code[name])
        assert m, f"{name}: cannot read its range from {code[name]!r}"
        code_lower, code_upper, code_default = int(m.group(1)), int(m.group(2)), m.group(3)
        lower, upper, default = _bounds(variable)
        assert code_lower <= lower <= upper <= code_upper, (
            f"var.{variable} accepts {lower}..={upper}, the code {code_lower}..={code_upper}"
        )
        assert L.value(variables[variable]["type"]) == "${number}", variable
        if code_default == "unset":
            assert default is None, f"var.{variable} must default to null (unset), not {default!r}"
            condition = L.expr(validated(variable, L.MODULE)["validation"][0]["condition"])
            assert condition.startswith(f"var.{variable} == None ? True :"), f"var.{variable} must accept null: {condition}"
        else:
            assert default == int(code_default), f"var.{variable} defaults to {default}, the code to {code_default}"
            assert lower <= default <= upper, variable

    # ACTIVE_FENCING off|stuck|on: the module's string, with the code's
    # default; true and false (it was a bool) taken too.
    m = re.match(r"(off\|stuck\|on) \(default (off|stuck|on)\)", code["ACTIVE_FENCING"])
    assert m, f"ACTIVE_FENCING: cannot read its values from {code['ACTIVE_FENCING']!r}"
    active = validated("active_fencing", L.MODULE)
    assert L.value(active["type"]) == "${string}"
    assert L.value(active["default"]) == m.group(2), f"var.active_fencing must default to {m.group(2)}"
    condition = L.expr(active["validation"][0]["condition"])
    values = m.group(1).split("|") + ["true", "false"]
    assert condition == f"contains({values},var.active_fencing)", condition

    m = re.match(r"([a-z|]+) \(default (\w+)\)", code["FENCING_MODE"])
    assert m, f"FENCING_MODE: cannot read its values from {code['FENCING_MODE']!r}"
    mode = validated("fencing_mode", L.MODULE)
    condition = L.expr(mode["validation"][0]["condition"])
    allowed = re.fullmatch(r"contains\(\[(.*)\],\s*var\.fencing_mode\)", condition)
    assert allowed, f"var.fencing_mode must be validated with contains([...], var.fencing_mode): {condition}"
    assert sorted(ast.literal_eval(f"[{allowed.group(1)}]")) == sorted(m.group(1).split("|"))
    assert L.value(variables["fencing_mode"]["default"]) == m.group(2)

    m = re.search(r"\(default ([a-z0-9-]+)\)", code["CONTROL_NAMESPACE"])
    assert m, f"CONTROL_NAMESPACE: cannot read its default from {code['CONTROL_NAMESPACE']!r}"
    assert L.value(variables["control_namespace"]["default"]) == m.group(1)
    namespace = validated("control_namespace", L.MODULE)
    pattern = re.fullmatch(r'can\(regex\("(.*)",\s*var\.control_namespace\)\)', L.expr(namespace["validation"][0]["condition"]))
    assert pattern, "var.control_namespace must be validated with can(regex(...))"
    # The code accepts RFC 1123 labels: lowercase letters, digits, '-' inside, up to 63.
    regex = re.compile(pattern.group(1).replace("\\\\", "\\"))
    for good in ("kube-system", "node-fencer", "a", "0", "a" * 63):
        assert regex.fullmatch(good), f"var.control_namespace rejects {good!r}, which the code accepts"
    for bad in ("", "Kube_System", "-a", "a-", "a.b", "a" * 64):
        assert not regex.fullmatch(bad), f"var.control_namespace accepts {bad!r}, which the code rejects"


def test_function_package_and_runtime():
    mod = module()
    function = L.blocks(mod, "resource", "aws_lambda_function")["this"]
    assert L.value(function["runtime"]) == "provided.al2023"
    assert L.value(function["handler"]) == "bootstrap"
    assert L.string_list(function["architectures"]) == ["${var.architecture}"]
    assert L.expr(function["filename"]) == "var.package_path"
    assert L.expr(function["source_code_hash"]) == "filebase64sha256(var.package_path)"
    variables = L.variables_of(L.MODULE / "variables.tf")
    assert L.value(variables["architecture"]["default"]) == "x86_64"
    assert L.value(variables["memory_size"]["default"]) == 256
    log_group = L.blocks(mod, "resource", "aws_cloudwatch_log_group")["this"]
    assert L.expr(log_group["for_each"]) == "local.functions"
    assert L.value(log_group["name"]) == "/aws/lambda/${each.value.name}"
    assert L.value(L.locals_of(mod)["all_functions"]["main"]["name"]) == "${var.name}"
    assert L.value(variables["log_retention_days"]["default"]) == 30


# ---------------------------------------------------------------------------
# Lambda timeout versus the waits of one invocation
# ---------------------------------------------------------------------------

LAMBDA_MAX_TIMEOUT = 900

# The module variables whose waits add up within one invocation.
WAIT_VARIABLES = (
    "volume_detach_timeout_seconds",
    "confirm_again_after_seconds",
    "recovery_settle_seconds",
    "not_ready_wait_seconds",
    "power_off_wait_seconds",
)


def code_lease_wait() -> int:
    """How long an invocation waits for the fencing Lease before it gives up
    (LEASE_WAIT of handler/src/core/rules/control.rs), from the manifest."""
    return int(manifest()["lease_wait_seconds"])


def _evaluate(expression: str, values: dict[str, int]) -> int:
    """Evaluate an arithmetic Terraform expression of the given var.* and local.* names."""
    source = expression
    # Longest names first, so no name is replaced inside a longer one.
    for name in sorted(values, key=len, reverse=True):
        source = source.replace(name, str(values[name]))
    tree = ast.parse(source, mode="eval")
    allowed_calls = {"min": min, "max": max}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name) and node.func.id in allowed_calls, f"unsupported call in {expression}"
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Mult, ast.Sub, ast.Name, ast.Load)):
            raise AssertionError(f"unsupported syntax {type(node).__name__} in {expression}")
        if isinstance(node, ast.Name):
            assert node.id in allowed_calls, f"unresolved name {node.id} in {expression}"
    return eval(compile(tree, "<timeout>", "eval"), {"__builtins__": {}}, allowed_calls)  # noqa: S307


def test_timeout_covers_every_wait():
    """Worst case of one invocation: a Node still Ready while its instance is
    off, the Lease, the second EC2 confirmation, the detach wait of several
    nodes, a requested recovery's settle delay, with active fencing the wait
    for a powered-off instance to stop, and room for the calls around them;
    within Lambda's maximum at every bound, active fencing on or off."""
    mod = module()
    function = L.blocks(mod, "resource", "aws_lambda_function")["this"]
    timeout = L.expr(function["timeout"])
    m = re.fullmatch(r"local\.(\w+)", timeout)
    local_values = L.locals_of(mod)
    expression = L.expr(local_values[m.group(1)]) if m else timeout
    # The power-off wait counts only with active fencing (the function never
    # powers off without it), through a local of its own.
    assert L.expr(local_values["power_off_wait_seconds"]) == "local.active_fencing ? var.power_off_wait_seconds : 0"
    assert "local.power_off_wait_seconds" in expression, f"timeout {expression!r} does not count the power-off wait"
    expression = expression.replace("local.power_off_wait_seconds", "var.power_off_wait_seconds")
    for variable in WAIT_VARIABLES:
        assert f"var.{variable}" in expression, f"timeout {expression!r} is not derived from var.{variable}"

    lease = code_lease_wait()
    assert "local.lease_wait_seconds" in expression, f"timeout {expression!r} does not count the Lease wait"
    assert L.value(local_values["lease_wait_seconds"]) == lease, (
        f"local.lease_wait_seconds must equal LEASE_WAIT of {L.rel(L.CONTROL_RS)} ({lease} s)"
    )

    points = {}
    for variable in WAIT_VARIABLES:
        lower, upper, default = _bounds(variable)
        assert lower <= default <= upper, variable
        points[variable] = sorted({lower, default, upper})
    detach = points["volume_detach_timeout_seconds"]
    points["volume_detach_timeout_seconds"] = sorted({*detach, *range(detach[0], detach[-1] + 1, 7)})

    waits = itertools.product(*(points[v] for v in WAIT_VARIABLES), (False, True))
    for detach, confirm, settle, not_ready, power_off, active in waits:
        values = {
            "var.volume_detach_timeout_seconds": detach,
            "var.confirm_again_after_seconds": confirm,
            "var.recovery_settle_seconds": settle,
            "var.not_ready_wait_seconds": not_ready,
            # What local.power_off_wait_seconds is (checked above).
            "var.power_off_wait_seconds": power_off if active else 0,
            "local.lease_wait_seconds": lease,
        }
        seconds = _evaluate(expression, values)
        # Twice the detach wait: a second node's wait in the same invocation;
        # 30 s: the Kubernetes and EC2 calls around the waits; the power-off
        # wait with active fencing.
        needed = not_ready + lease + confirm + 2 * detach + settle + (power_off if active else 0) + 30
        assert seconds >= needed, f"timeout {seconds}s below the {needed}s the waits need at {values}"
        assert seconds <= LAMBDA_MAX_TIMEOUT, f"timeout {seconds}s exceeds Lambda's {LAMBDA_MAX_TIMEOUT}s at {values}"


# ---------------------------------------------------------------------------
# EventBridge and asynchronous delivery
# ---------------------------------------------------------------------------


def test_eventbridge_rule():
    mod = module()
    rule = L.blocks(mod, "resource", "aws_cloudwatch_event_rule")["this"]
    assert L.expr(rule["event_pattern"]) == "jsonencode(local.event_pattern)"
    local_values = L.locals_of(mod)
    pattern = local_values["event_pattern"]
    assert pattern["source"] == ["aws.ec2"]
    assert pattern["detail-type"] == ["EC2 Instance State-change Notification"]
    m = re.search(r"'state': '\$\{local\.(\w+)\}'", pattern["detail"])
    assert m, f"detail.state must come from a local list: {pattern['detail']}"
    assert set(local_values[m.group(1)]) == {"stopped", "terminated", "running"}
    assert "'instance-id': '${var.instance_ids}'" in pattern["detail"]

    target = L.blocks(mod, "resource", "aws_cloudwatch_event_target")["this"]
    assert L.expr(target["arn"]) == f"{MAIN_FUNCTION}.arn"
    retry = target["retry_policy"][0]
    assert "maximum_event_age_in_seconds" in retry and "maximum_retry_attempts" in retry
    assert L.expr(target["dead_letter_config"][0]["arn"]) == "aws_sqs_queue.dlq.arn"

    permission = L.blocks(mod, "resource", "aws_lambda_permission")["events"]
    assert L.value(permission["principal"]) == "events.amazonaws.com"
    assert L.expr(permission["source_arn"]) == "aws_cloudwatch_event_rule.this.arn"

    invoke_config = L.blocks(mod, "resource", "aws_lambda_function_event_invoke_config")["this"]
    on_failure = invoke_config["destination_config"][0]["on_failure"][0]
    assert L.expr(on_failure["destination"]) == "aws_sqs_queue.dlq.arn"

    queue = L.blocks(mod, "resource", "aws_sqs_queue")["dlq"]
    assert L.value(queue["sqs_managed_sse_enabled"]) is True or "kms_master_key_id" in queue


RECOVERY_INPUT = '{"action":"sweep"}'


def _jsonencode(expression: str) -> str:
    """The JSON Terraform's jsonencode() writes for a constant argument: compact,
    keys sorted."""
    m = re.fullmatch(r"jsonencode\((.*)\)", expression, re.S)
    assert m, f"expected jsonencode(<constant>), got {expression}"
    try:
        argument = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        raise AssertionError(f"jsonencode argument is not a constant: {m.group(1)}") from None
    return json.dumps(argument, separators=(",", ":"), sort_keys=True)


def test_recovery_schedule():
    """A schedule invokes the function with exactly {"action":"sweep"} (it fences
    what no event named, and re-checks the fenced nodes); a null recovery_schedule creates
    none of rule, target and permission."""
    mod = module()
    enabled = "var.recovery_schedule != None ? 1 : 0"

    rule = L.blocks(mod, "resource", "aws_cloudwatch_event_rule")["recovery"]
    assert L.expr(rule["count"]) == enabled
    assert L.expr(rule["schedule_expression"]) == "var.recovery_schedule"
    assert "event_pattern" not in rule, "the recovery rule is a schedule, not an event pattern"

    variable = L.variables_of(L.MODULE / "variables.tf")["recovery_schedule"]
    assert L.value(variable["type"]) == "${string}"
    assert L.value(variable["default"]) == "rate(10 minutes)"
    condition = L.expr(variable["validation"][0]["condition"])
    assert condition.startswith("var.recovery_schedule == None ||"), f"null must disable the schedule: {condition}"

    target = L.blocks(mod, "resource", "aws_cloudwatch_event_target")["recovery"]
    assert L.expr(target["count"]) == enabled
    assert L.expr(target["rule"]) == "aws_cloudwatch_event_rule.recovery[0].name"
    assert L.expr(target["arn"]) == f"{MAIN_FUNCTION}.arn"
    assert _jsonencode(L.expr(target["input"])) == RECOVERY_INPUT
    for key in ("input_path", "input_transformer"):
        assert key not in target, f"the recovery target's input must be the constant {RECOVERY_INPUT}, not {key}"
    assert L.expr(target["dead_letter_config"][0]["arn"]) == "aws_sqs_queue.dlq.arn"

    permission = L.blocks(mod, "resource", "aws_lambda_permission")["recovery"]
    assert L.expr(permission["count"]) == enabled
    assert L.value(permission["action"]) == "lambda:InvokeFunction"
    assert L.value(permission["principal"]) == "events.amazonaws.com"
    assert L.expr(permission["function_name"]) == f"{MAIN_FUNCTION}.function_name"
    assert L.expr(permission["source_arn"]) == "aws_cloudwatch_event_rule.recovery[0].arn"
    statement_ids = [L.value(p["statement_id"]) for p in L.blocks(mod, "resource", "aws_lambda_permission").values()]
    assert len(statement_ids) == len(set(statement_ids)), f"statement ids must differ: {statement_ids}"

    # The dead-letter queue admits EventBridge only from the module's own rules.
    policy = L.blocks(mod, "data", "aws_iam_policy_document")["dlq"]
    (statement,) = L.statements(policy)
    (condition,) = L.nested(statement, "condition")
    assert L.value(condition["variable"]) == "aws:SourceArn"
    arns = L.value(condition["values"])
    assert "aws_cloudwatch_event_rule.this.arn" in arns and "aws_cloudwatch_event_rule.recovery[*].arn" in arns, arns

    outputs = {}
    for entry in L.parse(L.MODULE / "outputs.tf")["output"]:
        outputs.update(entry)
    assert L.expr(outputs["recovery_rule_arn"]["value"]) == "one(aws_cloudwatch_event_rule.recovery[*].arn)"


def test_alarms():
    alarms = L.blocks(module(), "resource", "aws_cloudwatch_metric_alarm")
    metrics = {(L.value(a["namespace"]), L.value(a["metric_name"])): a for a in alarms.values()}
    for key in (("AWS/SQS", "ApproximateNumberOfMessagesVisible"), ("AWS/Lambda", "Errors")):
        alarm = metrics[key]
        assert L.value(alarm["comparison_operator"]) == "GreaterThanThreshold" and L.value(alarm["threshold"]) == 0, key
        assert L.expr(alarm["alarm_actions"]) == "local.alarm_actions", key


def emitted_metrics() -> dict[str, set[str]]:
    """Each metric the code emits, with its full dimension set, from the manifest."""
    m = manifest()["metrics"]
    assert m["namespace"] == "NodeFencer", m["namespace"]
    return {metric["name"]: set(metric["dimensions"]) for metric in m["metrics"]}


# `SELECT FN(Metric) FROM SCHEMA(Namespace, Dim, ...)`: a Metrics Insights query
# over one exact dimension set.
INSIGHTS = re.compile(r"SELECT (?:SUM|AVG|MIN|MAX|COUNT)\((\w+)\) FROM SCHEMA\((\w+), ([\w, ]+)\)(?: WHERE (\w+) = '\w+')?(?: GROUP BY ([\w, ]+))?$")


def dashboard_queries() -> list[tuple[str, str, set[str], set[str]]]:
    """Each metric the dashboard reads: (title, metric, dimensions, dimensions filtered or grouped on)."""
    body = json.loads(L.DASHBOARD_TEMPLATE.read_text(encoding="utf-8"))
    found = []
    for widget in body["widgets"]:
        title = widget["properties"]["title"]
        for row in widget["properties"]["metrics"]:
            if isinstance(row[0], dict):
                query = row[0]["expression"]
                match = INSIGHTS.fullmatch(query)
                assert match, f"{title}: not a Metrics Insights query over one dimension set: {query}"
                metric, namespace, dims, where, group = match.groups()
                assert namespace == "NodeFencer", f"{title}: {namespace}"
                used = {where} if where else set()
                used |= {d.strip() for d in (group or "").split(",") if d.strip()}
                found.append((title, metric, {d.strip() for d in dims.split(",")}, used))
            else:
                namespace, metric, *rest = [c for c in row if not isinstance(c, dict)]
                if namespace != "NodeFencer":
                    continue
                dims = set(rest[0::2])
                found.append((title, metric, dims, dims))
    return found


def test_the_dashboard_reads_only_metrics_the_code_emits():
    """Issue 37: every widget's metric is one the code emits, asked with the
    exact dimension set its lines carry (CloudWatch matches a metric by its
    whole dimension set: one dimension more or less and the widget is empty)."""
    emitted = emitted_metrics()
    queries = dashboard_queries()
    assert len(queries) >= 9, queries
    for title, metric, dims, used in queries:
        assert metric in emitted, f"{title}: {metric} is not emitted (manifest: {sorted(emitted)})"
        assert dims == emitted[metric], f"{title}: {metric} is emitted with {sorted(emitted[metric])}, asked with {sorted(dims)}"
        assert used <= dims, f"{title}: filters or groups on {sorted(used - dims)}, which {metric} does not carry"
    shown = {metric for _, metric, _, _ in queries}
    for needed in ("Decisions", "PowerOffs", "Recoveries", "Errors", "TaintLatency", "DetachLatency"):
        assert needed in shown, f"the dashboard shows no {needed}"
    # The clouds told apart: errors by dependency (EC2, ComputeEngine, Kubernetes).
    assert any(m == "Errors" and "Dependency" in used for _, m, _, used in queries)
    mod = module()
    dashboard = L.blocks(mod, "resource", "aws_cloudwatch_dashboard")["this"]
    assert "templates/dashboard.json.tftpl" in L.expr(dashboard["dashboard_body"])


def test_the_dashboard_picture_is_drawn_from_its_definition():
    """docs/dashboard-aws.svg is the layout the template defines, as
    tests/infra/dashboard_picture.py draws it."""
    import dashboard_picture

    drawn = dashboard_picture.draw(json.loads(L.DASHBOARD_TEMPLATE.read_text(encoding="utf-8")))
    picture = dashboard_picture.PICTURE
    assert picture.is_file() and picture.read_text(encoding="utf-8") == drawn, (
        f"{L.rel(picture)} is stale: run python3 tests/infra/dashboard_picture.py"
    )


def test_the_metric_alarms_watch_metrics_the_code_emits():
    """The alarms on node-fencer's own metrics (the cap, the dependencies) name
    a metric the code emits with its exact dimension set, and notify."""
    emitted = emitted_metrics()
    alarms = L.blocks(module(), "resource", "aws_cloudwatch_metric_alarm")
    own = {k: a for k, a in alarms.items() if L.value(a["namespace"]) == "NodeFencer"}
    assert set(own) == {"cap_reached", "dependency_errors", "witness_failing"}, sorted(own)
    for key, alarm in own.items():
        metric = L.value(alarm["metric_name"])
        dimensions = L.value(alarm["dimensions"])
        dims = set(dimensions)
        assert metric in emitted and dims == emitted[metric], f"{key}: {metric} {sorted(dims)} vs {sorted(emitted.get(metric, []))}"
        assert L.expr(alarm["alarm_actions"]) == "local.alarm_actions", key
    cap = L.value(own["cap_reached"]["dimensions"])
    assert (cap["Outcome"], cap["Reason"]) == ("skipped", "cap_reached"), cap


def test_function_url_is_optional_and_token_backed():
    mod = module()
    url = L.blocks(mod, "resource", "aws_lambda_function_url")["this"]
    assert L.value(url["authorization_type"]) == "NONE"
    assert L.expr(url["count"]) == "var.enable_alertmanager_url ? 1 : 0"
    assert "random_password" in {k for e in mod["resource"] for k in e}
    outputs = {}
    for entry in L.parse(L.MODULE / "outputs.tf")["output"]:
        outputs.update(entry)
    assert L.value(outputs["webhook_token"].get("sensitive")) is True
    for name in ("function_name", "function_arn", "role_arn", "function_url", "dlq_url", "alertmanager_receiver"):
        assert name in outputs, f"module output {name} missing"


# ---------------------------------------------------------------------------
# The Function URL's own function: no caller without the webhook token can
# delay fencing
# ---------------------------------------------------------------------------

# What may differ between the two functions, and where each takes it from.
FUNCTION_SETTINGS = {
    "main": {
        "name": "${var.name}",
        "reserved_concurrent_executions": "${var.reserved_concurrent_executions}",
    },
    "webhook": {
        "name": "${local.webhook_function_name}",
        "reserved_concurrent_executions": "${var.webhook_reserved_concurrent_executions}",
    },
}
# The function block's only attributes that depend on which function it is.
PER_FUNCTION_ATTRIBUTES = {
    ("function_name",): "${each.value.name}",
    ("description",): "${each.value.description}",
    ("reserved_concurrent_executions",): "${each.value.reserved_concurrent_executions}",
    ("logging_config", "log_group"): "${aws_cloudwatch_log_group.this[each.key].name}",
}


def _all_functions(mod: dict) -> dict[str, dict]:
    found = L.locals_of(mod)["all_functions"]
    assert isinstance(found, dict), f"local.all_functions must be a map of the functions' settings: {found!r}"
    return found


def _strings(v, path: tuple[str, ...] = ()):
    """(path, string) of every string in a parsed block, nested blocks included."""
    if isinstance(v, str):
        yield path, v
    elif isinstance(v, list):
        for item in v:
            yield from _strings(item, path)
    elif isinstance(v, dict):
        for key, item in v.items():
            if not key.startswith("__"):
                yield from _strings(item, (*path, key))


def _holds(condition: str, values: dict[str, object]) -> bool:
    """Evaluate a boolean Terraform condition of the given names (||, &&, !, ==, !=)."""
    source = condition.replace("||", " or ").replace("&&", " and ")
    source = re.sub(r"!(?!=)", " not ", source)
    for name in sorted(values, key=len, reverse=True):
        source = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w.])", repr(values[name]), source)
    tree = ast.parse(source.strip(), mode="eval")
    allowed = (ast.Expression, ast.BoolOp, ast.Or, ast.And, ast.UnaryOp, ast.Not, ast.Compare, ast.Eq, ast.NotEq, ast.Constant)
    for node in ast.walk(tree):
        assert isinstance(node, allowed), f"unsupported {type(node).__name__} in condition {condition!r}"
    return bool(eval(compile(tree, "<condition>", "eval"), {"__builtins__": {}}))  # noqa: S307


def test_webhook_function_exists_only_with_enable_alertmanager_url():
    """local.functions, which every per-function resource iterates, holds the
    webhook function exactly when enable_alertmanager_url is true, and the main
    function always; so do the URL and the outputs that name the webhook function."""
    mod = module()
    assert set(_all_functions(mod)) == {"main", "webhook"}
    expression = L.expr(L.locals_of(mod)["functions"])
    m = re.fullmatch(r"\{for (\w+) , (\w+) in local\.all_functions : \1 => \2 if (.*)\}", expression)
    assert m, f"local.functions must select from local.all_functions by key: {expression}"
    for enabled, expected in ((True, {"main", "webhook"}), (False, {"main"})):
        chosen = {key for key in _all_functions(mod) if _holds(m.group(3), {m.group(1): key, "var.enable_alertmanager_url": enabled})}
        assert chosen == expected, f"enable_alertmanager_url = {enabled}: local.functions holds {sorted(chosen)}, not {sorted(expected)}"

    for kind, name in (("aws_lambda_function", "this"), ("aws_cloudwatch_log_group", "this"), ("aws_cloudwatch_metric_alarm", "errors")):
        body = L.blocks(mod, "resource", kind)[name]
        assert L.expr(body["for_each"]) == "local.functions", f"{kind}.{name} must exist once per function"
    url = L.blocks(mod, "resource", "aws_lambda_function_url")["this"]
    assert L.expr(url["count"]) == "var.enable_alertmanager_url ? 1 : 0"

    outputs = {}
    for entry in L.parse(L.MODULE / "outputs.tf")["output"]:
        outputs.update(entry)
    for name, attribute in (
        ("webhook_function_name", f"{WEBHOOK_FUNCTION}.function_name"),
        ("webhook_function_arn", f"{WEBHOOK_FUNCTION}.arn"),
        ("webhook_log_group_name", 'aws_cloudwatch_log_group.this["webhook"].name'),
    ):
        assert L.expr(outputs[name]["value"]) == f"var.enable_alertmanager_url ? {attribute} : None", name
    assert L.expr(outputs["function_name"]["value"]) == f"{MAIN_FUNCTION}.function_name"
    assert L.expr(outputs["function_url"]["value"]) == "one(aws_lambda_function_url.this[*].function_url)"


def test_function_url_belongs_to_the_webhook_function():
    mod = module()
    urls = L.blocks(mod, "resource", "aws_lambda_function_url")
    assert list(urls) == ["this"], f"expected one Function URL, found {list(urls)}"
    url = urls["this"]
    assert L.expr(url["function_name"]) == f"{WEBHOOK_FUNCTION}.function_name", (
        "the public Function URL must invoke the webhook function, whose concurrency is its own"
    )
    assert L.value(url["authorization_type"]) == "NONE"
    assert "qualifier" not in url
    # Both functions unreserved would let URL callers take the account's
    # unreserved concurrency, which the main function would then run on.
    conditions = [L.expr(p["condition"]) for p in url["lifecycle"][0]["precondition"]]
    assert "var.reserved_concurrent_executions != -1 || var.webhook_reserved_concurrent_executions != -1" in conditions


def test_main_function_has_no_url_and_takes_the_events():
    """Nothing public reaches the main function: no Function URL and no
    permission for one; the EventBridge rule, the recovery schedule and the
    asynchronous configuration are the main function's."""
    mod = module()
    for name, url in L.blocks(mod, "resource", "aws_lambda_function_url").items():
        assert "webhook" in L.expr(url["function_name"]), f"aws_lambda_function_url.{name} is not on the webhook function"
    for name, permission in L.blocks(mod, "resource", "aws_lambda_permission").items():
        assert L.value(permission["action"]) == "lambda:InvokeFunction", name
        assert L.value(permission["principal"]) == "events.amazonaws.com", name
        assert "function_url_auth_type" not in permission, name
        assert L.expr(permission["function_name"]) == f"{MAIN_FUNCTION}.function_name", name
    for name, target in L.blocks(mod, "resource", "aws_cloudwatch_event_target").items():
        assert L.expr(target["arn"]) == f"{MAIN_FUNCTION}.arn", f"aws_cloudwatch_event_target.{name} must invoke the main function"
    (invoke_config,) = L.blocks(mod, "resource", "aws_lambda_function_event_invoke_config").values()
    assert L.expr(invoke_config["function_name"]) == f"{MAIN_FUNCTION}.function_name"

    # Only the URL (and the outputs) name the webhook function.
    for kind in ("resource", "data"):
        for entry in mod.get(kind, []):
            for type_, bodies in entry.items():
                for name, body in bodies.items():
                    named = any(WEBHOOK_FUNCTION in text for _, text in _strings(body))
                    assert not named or (type_, name) == ("aws_lambda_function_url", "this"), (
                        f"{type_}.{name} names the webhook function"
                    )


def test_webhook_function_has_its_own_concurrency_and_log_group():
    mod = module()
    functions = _all_functions(mod)
    for key, settings in FUNCTION_SETTINGS.items():
        for setting, wanted in settings.items():
            assert L.value(functions[key][setting]) == wanted, f"local.all_functions.{key}.{setting} must be {wanted}"
    assert L.value(L.locals_of(mod)["webhook_function_name"]) == "${var.name}-webhook"

    function = L.blocks(mod, "resource", "aws_lambda_function")["this"]
    assert L.expr(function["reserved_concurrent_executions"]) == "each.value.reserved_concurrent_executions"
    assert L.expr(function["logging_config"][0]["log_group"]) == "aws_cloudwatch_log_group.this[each.key].name"
    log_group = L.blocks(mod, "resource", "aws_cloudwatch_log_group")["this"]
    assert L.expr(log_group["for_each"]) == "local.functions"
    assert L.value(log_group["name"]) == "/aws/lambda/${each.value.name}"
    assert L.expr(log_group["retention_in_days"]) == "var.log_retention_days"
    assert L.expr(log_group["kms_key_id"]) == "var.log_kms_key_arn"

    # Validated like the main function's: -1 or a whole number >= 1, default 1.
    variables = L.variables_of(L.MODULE / "variables.tf")
    main, webhook = variables["reserved_concurrent_executions"], variables["webhook_reserved_concurrent_executions"]
    assert L.value(webhook["type"]) == "${number}"
    assert L.value(webhook["default"]) == 1 == L.value(main["default"])
    main_condition = L.expr(main["validation"][0]["condition"])
    assert L.expr(webhook["validation"][0]["condition"]) == main_condition.replace(
        "var.reserved_concurrent_executions", "var.webhook_reserved_concurrent_executions"
    )

    # Each function's errors alarm watches that function.
    alarm = L.blocks(mod, "resource", "aws_cloudwatch_metric_alarm")["errors"]
    assert L.value(alarm["alarm_name"]) == "${each.value.name}-errors"
    assert L.value(alarm["dimensions"]) == {"FunctionName": "${aws_lambda_function.this[each.key].function_name}"}


def test_both_functions_share_every_other_setting():
    """One resource block serves both functions, and only its name, description,
    reserved concurrency and log group depend on which: the package, handler,
    runtime, environment, role, timeout, memory, VPC, tracing and code signing
    are the same, so the webhook function fences exactly as the main one does."""
    mod = module()
    for key, settings in _all_functions(mod).items():
        assert set(settings) - {"__start_line__", "__end_line__"} == {"name", "description", "reserved_concurrent_executions"}, (
            f"local.all_functions.{key} may set only name, description and reserved_concurrent_executions"
        )
    function = L.blocks(mod, "resource", "aws_lambda_function")["this"]
    per_function = {path: text for path, text in _strings(function) if re.search(r"\beach\.", text)}
    assert per_function == PER_FUNCTION_ATTRIBUTES, f"attributes that differ between the functions: {sorted(per_function)}"

    shared = {
        "role": "aws_iam_role.this.arn",
        "filename": "var.package_path",
        "source_code_hash": "filebase64sha256(var.package_path)",
        "timeout": "local.function_timeout",
        "memory_size": "var.memory_size",
        "code_signing_config_arn": "var.code_signing_config_arn",
    }
    for attribute, wanted in shared.items():
        assert L.expr(function[attribute]) == wanted, attribute
    assert L.expr(function["environment"][0]["variables"]) == "local.environment"
    # One role, so the one EKS access entry maps both functions to the group node-fencer.
    assert list(L.blocks(mod, "resource", "aws_iam_role")) == ["this"]
    entry = L.blocks(mod, "resource", "aws_eks_access_entry")["this"]
    assert L.expr(entry["principal_arn"]) == "aws_iam_role.this.arn"


# ---------------------------------------------------------------------------
# Kubernetes RBAC
# ---------------------------------------------------------------------------

# The most the ClusterRole may ever grant (the agreed design). What it grants is
# exactly KUBERNETES_RULES of handler/src/core/settings/permissions.rs, which must fit in here.
ALLOWED_RULES = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "patch"),
    # FAST_NOT_READY=true: the Ready condition of a Node proven dead.
    ("", "nodes/status", "patch"),
    ("storage.k8s.io", "volumeattachments", "get"),
    ("storage.k8s.io", "volumeattachments", "list"),
    ("", "persistentvolumes", "get"),
    ("", "persistentvolumes", "list"),
    ("events.k8s.io", "events", "create"),
    # FENCING_MODE=legacy (or auto before Kubernetes 1.26, which has no
    # out-of-service taint): force-delete the dead node's pods and VolumeAttachments.
    ("", "pods", "list"),
    ("", "pods", "delete"),
    ("storage.k8s.io", "volumeattachments", "delete"),
}

# The most the Role in the control namespace may ever grant: the Lease that
# serialises fencing and the kill-switch ConfigMap, both named node-fencer.
ALLOWED_CONTROL_RULES = {
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    ("", "configmaps", "get"),
}
# FAST_NOT_READY=true: read a Node's kubelet Lease, nothing else.
ALLOWED_NODE_LEASE_RULES = {
    ("coordination.k8s.io", "leases", "get"),
}
CONTROL_OBJECT = "node-fencer"
CENSUS_OBJECT = "node-fencer-census"
WITNESS_OBJECT = "node-fencer-witness"
CONTROL_NAMESPACE = "kube-system"
NODE_LEASE_NAMESPACE = "kube-node-lease"


def _code_rules(key: str) -> set[tuple[str, str, str]]:
    """A list of {group, resource, verbs} rules of the manifest, flattened."""
    rules = set()
    entries = manifest()[key]
    assert entries, f"{key} in {L.rel(L.MANIFEST)} is empty"
    for rule in entries:
        for verb in rule["verbs"]:
            rules.add((rule["group"], rule["resource"], verb))
    return rules


def code_kubernetes_rules() -> set[tuple[str, str, str]]:
    """KUBERNETES_RULES of handler/src/core/settings/permissions.rs: (API group, resource, verb)
    for every cluster-wide Kubernetes call the code makes."""
    return _code_rules("kubernetes_rules")


def code_control_rules() -> set[tuple[str, str, str]]:
    """CONTROL_RULES of handler/src/core/settings/permissions.rs: (API group, resource, verb)
    for every call the code makes in its control namespace (the Lease and the
    kill-switch ConfigMap)."""
    return _code_rules("control_rules")


def code_node_lease_rules() -> set[tuple[str, str, str]]:
    """NODE_LEASE_RULES of handler/src/core/permissions.rs: (API group, resource,
    verb) for every call the code makes in kube-node-lease."""
    return _code_rules("node_lease_rules")


def rbac_documents() -> list[dict]:
    with L.RBAC_YAML.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _one(kind: str, namespace: str = CONTROL_NAMESPACE) -> dict:
    """The one object of `kind` (in `namespace`, for a namespaced kind)."""
    (document,) = [
        d for d in rbac_documents() if d["kind"] == kind and d["metadata"].get("namespace", namespace) == namespace
    ]
    return document


def test_rbac_manifest_holds_the_six_objects():
    kinds = sorted((d["kind"], d["metadata"].get("namespace", "")) for d in rbac_documents())
    assert kinds == [
        ("ClusterRole", ""),
        ("ClusterRoleBinding", ""),
        ("Role", NODE_LEASE_NAMESPACE),
        ("Role", CONTROL_NAMESPACE),
        ("RoleBinding", NODE_LEASE_NAMESPACE),
        ("RoleBinding", CONTROL_NAMESPACE),
    ], f"{L.rel(L.RBAC_YAML)} holds {kinds}"
    for document in rbac_documents():
        assert document["apiVersion"] == "rbac.authorization.k8s.io/v1", document["kind"]
        assert document["metadata"]["name"] == "node-fencer", document["kind"]


def granted_by(rule: dict) -> set[tuple[str, str, str]]:
    """The (group, resource, verb) triples an RBAC rule grants; a wildcard in
    any of its fields fails the test."""
    for field in rule:
        assert not any("*" in item for item in rule[field]), f"wildcard in {field} of {rule}"
    return {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_cluster_role_is_exactly_what_the_code_needs():
    documents = rbac_documents()
    role = next(d for d in documents if d["kind"] == "ClusterRole")
    assert role["apiVersion"] == "rbac.authorization.k8s.io/v1"
    assert role["metadata"]["name"] == "node-fencer"
    assert "aggregationRule" not in role
    granted = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected keys in {rule} (resourceNames, nonResourceURLs?)"
        granted |= granted_by(rule)
    expected = code_kubernetes_rules()
    assert expected <= ALLOWED_RULES, f"the code needs rules beyond the agreed design: {sorted(expected - ALLOWED_RULES)}"
    assert granted == expected, (
        f"{L.rel(L.RBAC_YAML)} and KUBERNETES_RULES of {L.rel(L.PERMISSIONS_RS)} disagree: "
        f"granted but not called {sorted(granted - expected)}, called but not granted {sorted(expected - granted)}"
    )


def test_role_is_exactly_what_the_code_needs_in_the_control_namespace():
    """The Role grants exactly CONTROL_RULES, in kube-system (the function's
    default CONTROL_NAMESPACE), and every verb that names an object only on
    the objects named node-fencer; create cannot be restricted by name."""
    role = _one("Role")
    assert role["metadata"]["namespace"] == CONTROL_NAMESPACE
    variables = L.variables_of(L.MODULE / "variables.tf")
    assert L.value(variables["control_namespace"]["default"]) == CONTROL_NAMESPACE
    granted = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, f"unexpected keys in {rule}"
        names = rule.get("resourceNames")
        for verb in rule["verbs"]:
            if verb == "create":
                # RBAC authorizes create before the object, and so its name, exists.
                assert names is None, f"create with resourceNames is never allowed by RBAC: {rule}"
            else:
                # Leases: the fencing Lease, the sweep's census and the witness's record; the kill switch alone otherwise.
                allowed = (
                    [CONTROL_OBJECT, CENSUS_OBJECT, WITNESS_OBJECT] if rule["resources"] == ["leases"] else [CONTROL_OBJECT]
                )
                assert names == allowed, f"{verb} must be restricted to resourceNames {allowed!r}: {rule}"
        granted |= granted_by(rule)
    expected = code_control_rules()
    assert expected <= ALLOWED_CONTROL_RULES, (
        f"the code needs control rules beyond the agreed design: {sorted(expected - ALLOWED_CONTROL_RULES)}"
    )
    assert granted == expected, (
        f"the Role in {L.rel(L.RBAC_YAML)} and CONTROL_RULES of {L.rel(L.PERMISSIONS_RS)} disagree: "
        f"granted but not called {sorted(granted - expected)}, called but not granted {sorted(expected - granted)}"
    )


def test_node_lease_role_is_exactly_what_the_code_needs_in_kube_node_lease():
    """The Role in kube-node-lease grants exactly NODE_LEASE_RULES: reading a
    kubelet's Lease, whose name is its Node's and so cannot be listed."""
    role = _one("Role", NODE_LEASE_NAMESPACE)
    granted = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected keys in {rule}"
        granted |= granted_by(rule)
    expected = code_node_lease_rules()
    assert expected <= ALLOWED_NODE_LEASE_RULES, (
        f"the code needs rules in {NODE_LEASE_NAMESPACE} beyond the agreed design: "
        f"{sorted(expected - ALLOWED_NODE_LEASE_RULES)}"
    )
    assert granted == expected, (
        f"the Role in {NODE_LEASE_NAMESPACE} of {L.rel(L.RBAC_YAML)} and NODE_LEASE_RULES of "
        f"{L.rel(L.PERMISSIONS_RS)} disagree: granted but not called {sorted(granted - expected)}, "
        f"called but not granted {sorted(expected - granted)}"
    )


@pytest.mark.parametrize("namespace", [CONTROL_NAMESPACE, NODE_LEASE_NAMESPACE])
def test_role_binding_binds_the_group_to_the_role(namespace: str):
    binding = _one("RoleBinding", namespace)
    assert binding["metadata"]["namespace"] == _one("Role", namespace)["metadata"]["namespace"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "node-fencer"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "node-fencer"}]


def test_cluster_role_binding_binds_the_group():
    binding = next(d for d in rbac_documents() if d["kind"] == "ClusterRoleBinding")
    assert binding["metadata"]["name"] == "node-fencer"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-fencer"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "node-fencer"}]

    # The EKS access entry maps the role into that same group.
    entry = L.blocks(module(), "resource", "aws_eks_access_entry")["this"]
    assert L.string_list(entry["kubernetes_groups"]) == ["node-fencer"]
    assert L.value(entry["type"]) == "STANDARD"
    assert L.expr(entry["principal_arn"]) == "aws_iam_role.this.arn"


def test_rbac_module_applies_the_manifest_instead_of_restating_it():
    rbac = L.parse_dir(L.RBAC_MODULE)
    local_values = L.locals_of(rbac)
    assert "kubernetes/rbac.yaml" in local_values["manifest_path"]
    assert "yamldecode" in local_values["documents"] and "file(local.manifest_path)" in local_values["documents"]
    role = L.blocks(rbac, "resource", "kubernetes_cluster_role_v1")["this"]
    assert "rule" not in role, "ClusterRole rules must come from the manifest, not be written in HCL"
    dynamic_rule = next(d["rule"] for d in role["dynamic"] if "rule" in d)
    assert L.expr(dynamic_rule["for_each"]) == "local.cluster_rules"
    # The module may only leave a rule of the manifest out (grant_node_status), never write one.
    assert re.search(
        r"for r in local\.cluster_role\.rules\b.*\bif var\.grant_node_status\b",
        L.expr(local_values["cluster_rules"]),
        re.S,
    )
    binding = L.blocks(rbac, "resource", "kubernetes_cluster_role_binding_v1")["this"]
    assert "subject" not in binding
    assert L.expr(next(d["subject"] for d in binding["dynamic"] if "subject" in d)["for_each"]) == "local.cluster_role_binding.subjects"

    roles = L.blocks(rbac, "resource", "kubernetes_role_v1")["this"]
    assert L.expr(roles["for_each"]) == "local.roles"
    assert "rule" not in roles, "Role rules must come from the manifest, not be written in HCL"
    assert L.expr(next(d["rule"] for d in roles["dynamic"] if "rule" in d)["for_each"]) == "each.value.rules"
    assert re.search(r"for d in local\.documents\b.*\bif d\.kind == \"Role\"", L.expr(local_values["roles"]), re.S)
    role_bindings = L.blocks(rbac, "resource", "kubernetes_role_binding_v1")["this"]
    assert L.expr(role_bindings["for_each"]) == "local.role_bindings"
    assert "subject" not in role_bindings
    assert L.expr(next(d["subject"] for d in role_bindings["dynamic"] if "subject" in d)["for_each"]) == "each.value.subjects"
    assert re.search(r"for d in local\.documents\b.*\bif d\.kind == \"RoleBinding\"", L.expr(local_values["role_bindings"]), re.S)
    assert L.expr(role_bindings["role_ref"][0]["name"]).startswith("kubernetes_role_v1.this[")

    source = "".join(p.read_text(encoding="utf-8") for p in sorted(L.INFRA.rglob("*.tf")))
    for word in ("volumeattachments", "persistentvolumes", "coordination.k8s.io", "leases", "configmaps"):
        assert word not in source, f"'{word}' restated in Terraform: the rules live in {L.rel(L.RBAC_YAML)} only"


def test_service_account_for_self_managed_clusters():
    rbac = L.parse_dir(L.RBAC_MODULE)
    account = L.blocks(rbac, "resource", "kubernetes_service_account_v1")["this"]
    variables = L.variables_of(L.RBAC_MODULE / "variables.tf")
    assert L.value(variables["service_account_name"]["default"]) == "node-fencer"
    assert L.value(variables["service_account_namespace"]["default"]) == "kube-system"
    assert L.value(account["automount_service_account_token"]) is False
    token = L.blocks(rbac, "resource", "kubernetes_secret_v1")["token"]
    assert L.value(token["type"]) == "kubernetes.io/service-account-token"
    annotations = L.value(token["metadata"][0]["annotations"])
    assert "kubernetes.io/service-account.name" in annotations
    binding = L.blocks(rbac, "resource", "kubernetes_cluster_role_binding_v1")["service_account"]
    assert L.expr(binding["role_ref"][0]["name"]) == "kubernetes_cluster_role_v1.this.metadata[0].name"
    # The ServiceAccount needs the Role as well, in each Role's namespace.
    role_binding = L.blocks(rbac, "resource", "kubernetes_role_binding_v1")["service_account"]
    for_each = L.expr(role_binding["for_each"])
    assert "local.roles" in for_each and "var.create_service_account" in for_each, for_each
    assert L.value(role_binding["role_ref"][0]["kind"]) == "Role"
    assert L.expr(role_binding["role_ref"][0]["name"]) == "kubernetes_role_v1.this[each.key].metadata[0].name"
    assert L.expr(role_binding["metadata"][0]["namespace"]) == "kubernetes_role_v1.this[each.key].metadata[0].namespace"
    assert L.value(role_binding["subject"][0]["kind"]) == "ServiceAccount"


# ---------------------------------------------------------------------------
# Variables and outputs
# ---------------------------------------------------------------------------


def test_every_variable_has_description_and_type():
    problems = []
    for path in L.tf_files():
        for entry in L.parse(path).get("variable", []):
            for name, body in entry.items():
                if not str(L.value(body.get("description", ""))).strip():
                    problems.append(f"{L.rel(path)}: variable {name} has no description")
                if "type" not in body:
                    problems.append(f"{L.rel(path)}: variable {name} has no type")
    assert not problems, "\n".join(problems)


def test_every_output_has_description():
    problems = []
    for path in L.tf_files():
        for entry in L.parse(path).get("output", []):
            for name, body in entry.items():
                if not str(L.value(body.get("description", ""))).strip():
                    problems.append(f"{L.rel(path)}: output {name} has no description")
    assert not problems, "\n".join(problems)


def test_examples_use_the_modules():
    eks = L.parse_dir(L.INFRA / "examples" / "eks")
    calls = {name: body for e in eks["module"] for name, body in e.items()}
    assert L.value(calls["node_fencer"]["source"]) == "../../modules/node-fencer"
    assert "cluster_name" in calls["node_fencer"]
    # EC2 events are per region: the EKS example names the cluster's VPC so that
    # other clusters' instances cost no Kubernetes request.
    assert L.expr(calls["node_fencer"]["cluster_vpc_id"]) == "data.aws_eks_cluster.this.vpc_config[0].vpc_id"
    assert L.value(calls["rbac"]["source"]) == "../../modules/kubernetes-rbac"

    self_managed = L.parse_dir(L.INFRA / "examples" / "self-managed")
    calls = {name: body for e in self_managed["module"] for name, body in e.items()}
    assert L.expr(calls["node_fencer"]["kubeconfig_ssm_parameter_name"]) == "aws_ssm_parameter.kubeconfig.name"
    parameter = L.blocks(self_managed, "resource", "aws_ssm_parameter")["kubeconfig"]
    assert L.value(parameter["type"]) == "SecureString"
    variable = L.variables_of(L.INFRA / "examples" / "self-managed" / "variables.tf")["function_kubeconfig"]
    assert L.value(variable["sensitive"]) is True
    for example in ("eks", "self-managed", "gke"):
        assert (L.INFRA / "examples" / example / "terraform.tfvars.example").is_file()

    # GKE: the cluster read once, its coordinates passed on, the service
    # account bound as the user GKE knows it as.
    gke = L.parse_dir(L.GKE_EXAMPLE)
    calls = {name: body for e in gke["module"] for name, body in e.items()}
    assert L.value(calls["node_fencer"]["source"]) == "../../modules/node-fencer-gcp"
    assert L.expr(calls["node_fencer"]["cluster_endpoint"]) == "data.google_container_cluster.this.endpoint"
    assert L.expr(calls["node_fencer"]["cluster_ca_data"]) == "data.google_container_cluster.this.master_auth[0].cluster_ca_certificate"
    assert L.value(calls["rbac"]["source"]) == "../../modules/kubernetes-rbac"
    assert L.string_list(calls["rbac"]["users"]) == ["${module.node_fencer.service_account_email}"]
    (kubernetes,) = [p["kubernetes"] for p in gke["provider"] if "kubernetes" in p]
    assert L.expr(kubernetes["token"]) == "data.google_client_config.this.access_token"


# ---------------------------------------------------------------------------
# Alertmanager
# ---------------------------------------------------------------------------


def _check_alertmanager_config(config: dict, where: str) -> dict:
    receivers = {r["name"]: r for r in config["receivers"]}
    receiver = receivers.get("node-fencer")
    assert receiver, f"{where}: no node-fencer receiver"
    (webhook,) = receiver["webhook_configs"]
    assert webhook["send_resolved"] is True, where
    assert webhook["max_alerts"] == 0, where
    authorization = webhook["http_config"]["authorization"]
    assert authorization.get("type", "Bearer") == "Bearer", where
    assert ("credentials_file" in authorization) != ("credentials" in authorization), where
    routes = [r for r in config["route"]["routes"] if r["receiver"] == "node-fencer"]
    assert len(routes) == 1, f"{where}: expected one route to node-fencer"
    route = routes[0]
    assert "node" in route["group_by"], f"{where}: group by node so each node is its own notification"
    return route


def _matchers(route: dict) -> dict[str, str]:
    found = {}
    for matcher in route["matchers"]:
        m = re.fullmatch(r'\s*(\w+)\s*=\s*"?([^"]*)"?\s*', matcher)
        assert m, f"only equality matchers expected: {matcher}"
        found[m.group(1)] = m.group(2)
    return found


def test_alertmanager_example_routes_the_rule():
    config = yaml.safe_load((L.ALERTMANAGER_EXAMPLE / "alertmanager.yaml").read_text(encoding="utf-8"))
    route = _check_alertmanager_config(config, "alertmanager.yaml")
    assert config["route"]["receiver"] in {r["name"] for r in config["receivers"]}

    rule_file = yaml.safe_load((L.ALERTMANAGER_EXAMPLE / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert rule_file["kind"] == "PrometheusRule"
    rules = [r for g in rule_file["spec"]["groups"] for r in g["rules"] if r.get("alert") == "KubeNodeNotReady"]
    assert len(rules) == 1
    rule = rules[0]
    assert 'kube_node_status_condition{condition="Ready",status="true"}' in rule["expr"]
    assert rule["expr"].rstrip().endswith("== 0")
    # The alert must keep the node label: either no aggregation or one by node.
    aggregation = re.search(r"\bby\s*\(([^)]*)\)", rule["expr"])
    assert aggregation is None or "node" in [s.strip() for s in aggregation.group(1).split(",")]
    assert rule["for"] == "2m"

    alert_labels = {"alertname": rule["alert"], **rule.get("labels", {})}
    for name, wanted in _matchers(route).items():
        assert alert_labels.get(name) == wanted, f"route matcher {name}={wanted!r} does not match the rule's alert {alert_labels}"


def test_rendered_receiver_output_matches_the_example():
    config = yaml.safe_load(L.rendered_receiver())
    route = _check_alertmanager_config(config, "alertmanager-receiver.yaml.tftpl")
    example = yaml.safe_load((L.ALERTMANAGER_EXAMPLE / "alertmanager.yaml").read_text(encoding="utf-8"))
    example_route = next(r for r in example["route"]["routes"] if r["receiver"] == "node-fencer")
    assert route == example_route, "module output and example route differ"


# ---------------------------------------------------------------------------
# Google Cloud: the Cloud Run module
# ---------------------------------------------------------------------------

GCP_PERMISSION_RE = re.compile(r"[a-z]+\.[A-Za-z]+\.[A-Za-z]+")

# The service's settings that come straight from a module variable, as on AWS.
GCP_ENV_VARIABLES = {
    **{k: v for k, v in INTEGER_VARIABLES.items() if k not in ACTIVE_FENCING_VARIABLES},
    "FENCING_MODE": "fencing_mode",
    "CONTROL_NAMESPACE": "control_namespace",
    "RECOVERY": "recovery",
    "CLUSTER_CA_DATA": "cluster_ca_data",
}
# What the code reads only on AWS.
AWS_ONLY_VARIABLES = {
    "CLUSTER_VPC_ID",
    "CLUSTER_TAG",
    "CLUSTER_NAME",
    "FENCE_HIBERNATED",
    "KUBECONFIG",
    "KUBECONFIG_SSM_PARAMETER",
    "KUBECONFIG_SECRET_ID",
    "WEBHOOK_TOKEN_SECRET_ID",
    "WEBHOOK_TOKEN_SSM_PARAMETER",
    # GKE's control plane has no Nodes.
    "POWER_OFF_CONTROL_PLANE",
}


def gcp_module() -> dict:
    return L.parse_dir(L.GCP_MODULE)


def code_gcp_permissions() -> set[str]:
    """The Compute Engine and GKE permissions the code needs (gcp_permissions of the manifest)."""
    strings = manifest()["gcp_permissions"]
    assert strings, f"gcp_permissions in {L.rel(L.MANIFEST)} is empty"
    bad = [s for s in strings if not GCP_PERMISSION_RE.fullmatch(s)]
    assert not bad, f"gcp_permissions in {L.rel(L.MANIFEST)} holds entries that are not service.resource.verb: {bad}"
    assert len(strings) == len(set(strings)), f"gcp_permissions in {L.rel(L.MANIFEST)} repeats an entry"
    return set(strings)


def test_gcp_custom_role_equals_the_code_permissions():
    """The two custom roles grant exactly gcp_permissions of the manifest
    between them: none the code does not use, none it uses missing; no
    wildcard. The node VMs' role holds the detach, the other the reads."""
    mod = gcp_module()
    roles = L.blocks(mod, "resource", "google_project_iam_custom_role")
    assert set(roles) == {"this", "node_vms"}, sorted(roles)
    assert L.expr(roles["this"]["permissions"]) == "local.read_permissions"
    assert L.expr(roles["node_vms"]["permissions"]) == "local.node_vm_permissions"
    local_values = L.locals_of(mod)
    assert L.expr(local_values["read_permissions"]) == "sort(setsubtract(local.gcp_permissions,local.node_vm_permissions))"
    # The calls that change a VM: the detach, and with active fencing the
    # stop, which is exactly power_off_gcp_permissions of the manifest.
    assert L.expr(local_values["node_vm_permissions"]) == "concat(['compute.instances.detachDisk'],local.active_fencing ? local.power_off_permissions : [])", L.expr(local_values["node_vm_permissions"])
    assert local_values["power_off_permissions"] == manifest()["power_off_gcp_permissions"] == ["compute.instances.stop"]
    granted = local_values["gcp_permissions"]
    assert all(isinstance(p, str) and GCP_PERMISSION_RE.fullmatch(p) for p in granted), f"wildcard or malformed permissions: {granted}"
    assert len(granted) == len(set(granted)), f"a permission is listed twice: {granted}"
    expected = code_gcp_permissions()
    assert set(granted) == expected, (
        f"custom role and code disagree: granted but not needed {sorted(set(granted) - expected)}, "
        f"needed but not granted {sorted(expected - set(granted))}"
    )


def test_gcp_service_account_holds_only_the_custom_role_and_its_secret():
    """No predefined role on the project for the service's account: the
    custom role, and read access to the one token secret."""
    mod = gcp_module()
    for kind in ("google_project_iam_binding", "google_project_iam_policy", "google_secret_manager_secret_iam_binding", "google_secret_manager_secret_iam_policy"):
        assert not L.blocks(mod, "resource", kind), f"the module must not use {kind}: it replaces others' grants"
    members = L.blocks(mod, "resource", "google_project_iam_member")
    assert set(members) == {"this", "node_vms", "push_event_receiver"}, f"project-level grants: {sorted(members)}"
    assert L.expr(members["this"]["role"]) == "google_project_iam_custom_role.this.name"
    assert L.expr(members["this"]["member"]) == "google_service_account.this.member"
    assert "condition" not in members["this"] and "dynamic" not in members["this"], "the reads are project-wide"
    assert L.expr(members["node_vms"]["role"]) == "google_project_iam_custom_role.node_vms.name"
    assert L.expr(members["node_vms"]["member"]) == "google_service_account.this.member"
    # Eventarc only: the push account receives events, nothing else.
    assert L.value(members["push_event_receiver"]["role"]) == "roles/eventarc.eventReceiver"
    assert L.expr(members["push_event_receiver"]["member"]) == "google_service_account.push.member"
    assert L.expr(members["push_event_receiver"]["count"]) == "var.eventarc ? 1 : 0"
    (secret,) = L.blocks(mod, "resource", "google_secret_manager_secret_iam_member").values()
    assert L.value(secret["role"]) == "roles/secretmanager.secretAccessor"
    assert L.expr(secret["secret_id"]) == "local.webhook_token_secret"
    assert L.expr(secret["member"]) == "google_service_account.this.member"
    # The webhook service is anyone's to invoke, the events service the push account's alone.
    invokers = L.blocks(mod, "resource", "google_cloud_run_v2_service_iam_member")
    assert {
        (L.expr(b["name"]), L.value(b["member"])) for b in invokers.values()
    } == {
        ('google_cloud_run_v2_service.this["webhook"].name', "allUsers"),
        ('google_cloud_run_v2_service.this["events"].name', "${google_service_account.push.member}"),
    }, {name: (L.value(b["name"]), L.value(b["member"])) for name, b in invokers.items()}
    assert {L.value(b["role"]) for b in invokers.values()} == {"roles/run.invoker"}


def test_gcp_detach_only_on_the_clusters_node_vms():
    """The detach is granted on the VMs whose name starts with the cluster's
    node prefix (the sink's), through an IAM condition on the resource name,
    which Compute Engine supports; an empty prefix drops the condition."""
    mod = gcp_module()
    member = L.blocks(mod, "resource", "google_project_iam_member")["node_vms"]
    (dynamic,) = [d["condition"] for d in member["dynamic"] if "condition" in d]
    assert L.expr(dynamic["for_each"]) == "local.node_vm_condition != None ? ['${local.node_vm_condition}'] : []"
    assert L.value(dynamic["content"][0]["expression"]) == "${condition.value}"
    condition = L.expr(L.locals_of(mod)["node_vm_condition"])
    assert condition == (
        'local.instance_name_prefix != "" ? '
        '"resource.type == \\"compute.googleapis.com/Instance\\" && '
        'resource.name.extract(\\"/instances/{name}\\").startsWith(\\"${local.instance_name_prefix}\\")" : None'
    ), condition


def test_gcp_env_names_are_the_contract():
    """The service reads these on Google Cloud, each a variable of the
    manifest; none of the AWS ones; the webhook token from Secret Manager."""
    mod = gcp_module()
    environment = environment_text(mod)
    service = L.blocks(mod, "resource", "google_cloud_run_v2_service")["this"]
    (container,) = service["template"][0]["containers"]
    (dynamic_env,) = [d["env"] for d in container["dynamic"] if "env" in d]
    for_each = L.expr(dynamic_env["for_each"])
    assert for_each == "merge(local.environment,{'SERVE_ROUTES': '${each.value.routes}'})", for_each
    names = set(re.findall(r"'([A-Z][A-Z0-9_]*)':", environment + for_each))
    contract = {
        "SERVE_ROUTES",
        "GKE_CLUSTER",
        "CLUSTER_ENDPOINT",
        "CLUSTER_CA_DATA",
        "PUSH_AUDIENCE",
        "PUSH_SERVICE_ACCOUNT",
        "DRY_RUN",
        "FAST_NOT_READY",
        "NODE_SELECTOR",
        "OUT_OF_SERVICE_NO_SCHEDULE",
        "MAX_OUT_OF_SERVICE",
        "MAX_OUT_OF_SERVICE_PERCENT",
        "FENCING_MODE",
        "CONFIRM_AGAIN_AFTER_SECONDS",
        "VOLUME_DETACH_TIMEOUT_SECONDS",
        "RECOVERY_SETTLE_SECONDS",
        "RECOVERY",
        "NOT_READY_WAIT_SECONDS",
        "CONTROL_NAMESPACE",
        "LOG_FORMAT",
        "RUST_LOG",
        *ACTIVE_FENCING_VARIABLES,
        "NOTIFY_TOPIC",
        "REQUEST_TIMEOUT_SECONDS",
    }
    assert names == contract, f"unexpected {sorted(names - contract)}, missing {sorted(contract - names)}"
    assert not names & AWS_ONLY_VARIABLES
    # The topic only when one is created or given.
    assert "local.notification_topic != None ? {'NOTIFY_TOPIC': '${local.notification_topic}'} : {}" in environment
    # Active fencing's four, all together and only with it on (issue 36).
    for name, value in ACTIVE_FENCING_VARIABLES.items():
        assert f"'{name}': '{value}'" in environment, f"{name} must be {value} with active fencing"
    assert "local.active_fencing ? {'ACTIVE_FENCING': '${local.active_fencing_scope}'" in environment, environment
    code = set(code_variables())
    unknown = (names | {"WEBHOOK_TOKEN"}) - code
    assert not unknown, f"the module passes {sorted(unknown)}, which the manifest's variables do not list"
    for name, variable in GCP_ENV_VARIABLES.items():
        passed = f"tostring(var.{variable})" if variable in INTEGER_VARIABLES.values() else f"var.{variable}"
        assert f"'{name}': '${{{passed}}}'" in environment, f"{name} must be passed from var.{variable}"
    # Each service its own routes.
    services = L.locals_of(mod)["services"]
    assert {key: L.value(v["routes"]) for key, v in services.items()} == {"events": "events", "webhook": "alertmanager"}
    assert "'PUSH_SERVICE_ACCOUNT': '${local.push_service_account_email}'" in environment
    # Every audience of the module's own requests.
    assert "'PUSH_AUDIENCE': '${join(\",\",local.push_audiences)}'" in environment, environment
    assert "'GKE_CLUSTER': '${local.cluster_id}'" in environment
    # Issue 58, item 5: the service bounds each request by the timeout Cloud Run keeps.
    assert "'REQUEST_TIMEOUT_SECONDS': '${tostring(local.request_timeout_seconds)}'" in environment, environment
    assert "'CLUSTER_ENDPOINT': '${local.cluster_endpoint}'" in environment
    assert (
        "var.max_out_of_service_percent != None ? "
        "{'MAX_OUT_OF_SERVICE_PERCENT': '${tostring(var.max_out_of_service_percent)}'} : {}"
    ) in environment
    # Unset means every Node: the selector is passed only when set.
    assert "var.node_selector != None ? {'NODE_SELECTOR': '${var.node_selector}'} : {}" in environment

    (token,) = container["env"]
    assert L.value(token["name"]) == "WEBHOOK_TOKEN" and "value" not in token, "the token comes from Secret Manager, never as a value"
    ref = token["value_source"][0]["secret_key_ref"][0]
    assert L.expr(ref["secret"]) == "local.webhook_token_secret"
    assert L.string_list(container["args"]) == ["serve"]
    assert L.expr(container["image"]) == "var.image"


def test_gcp_variables_validate_what_the_code_accepts():
    """As on AWS: each behaviour variable accepts no value the service would
    reject at start, and defaults to what it assumes when it is unset."""
    code = code_variables()
    variables = L.variables_of(L.GCP_MODULE / "variables.tf")
    for name, variable in INTEGER_VARIABLES.items():
        m = re.match(r"integer (\d+)\.\.=(\d+) \(default (\w+)[;)]", code[name])
        assert m, f"{name}: cannot read its range from {code[name]!r}"
        code_lower, code_upper, code_default = int(m.group(1)), int(m.group(2)), m.group(3)
        lower, upper, default = _bounds(variable, L.GCP_MODULE)
        assert code_lower <= lower <= upper <= code_upper, f"var.{variable} accepts {lower}..={upper}, the code {code_lower}..={code_upper}"
        if code_default == "unset":
            assert default is None, f"var.{variable} must default to null (unset), not {default!r}"
        else:
            assert default == int(code_default), f"var.{variable} defaults to {default}, the code to {code_default}"
    # The settings both modules pass through: validated once, in the settings
    # module, never again in either module; the same defaults on both.
    aws = L.variables_of(L.MODULE / "variables.tf")
    shared = L.variables_of(L.SETTINGS_MODULE / "variables.tf")
    for variable, body in shared.items():
        assert "default" not in body, f"the settings module's var.{variable} must be required: the modules hold the defaults"
        for name, declared in (("AWS", aws), ("Google Cloud", variables)):
            assert L.value(declared[variable]["type"]) == L.value(body["type"]), f"var.{variable} has another type on {name}"
        assert L.value(variables[variable].get("default")) == L.value(aws[variable].get("default")), f"var.{variable} defaults otherwise on AWS and Google Cloud"
        if body.get("validation"):
            assert "validation" not in variables[variable] and "validation" not in aws[variable], f"var.{variable} is validated in the settings module and again in a module"


# Pub/Sub's longest acknowledgement deadline: the push subscription waits
# this long at most for an answer before it delivers the entry again. Cloud
# Run's own limit, 3600 s, is the looser.
PUBSUB_MAX_ACK_DEADLINE = 600
CLOUD_RUN_MAX_TIMEOUT = 3600
GCP_WAIT_VARIABLES = (*WAIT_VARIABLES[:4], "detach_disks_per_node")


def code_detach_wait() -> int:
    """How long the service follows one Compute Engine detach operation
    (DETACH_WAIT of handler/src/shell/cloud/gce.rs)."""
    m = re.search(r"const DETACH_WAIT: Duration = Duration::from_secs\((\d+)\);", L.GCE_RS.read_text(encoding="utf-8"))
    assert m, f"no DETACH_WAIT in {L.rel(L.GCE_RS)}: find how long a detach operation is followed now"
    return int(m.group(1))


def test_gcp_timeout_covers_one_nodes_worst_case():
    """Worst case of one node in one request: the NotReady wait, the Lease,
    the second confirmation, each of detach_disks_per_node detach operations
    followed to its end, the wait for the disks, a requested recovery's
    settle delay, and room for the calls around them. The request timeout is
    the push subscription's acknowledgement deadline too: a plan past Pub/Sub's
    600 s fails (a precondition of the services), never a timeout cut short."""
    mod = gcp_module()
    local_values = L.locals_of(mod)
    expression = L.expr(local_values["request_timeout_seconds"])
    for variable in GCP_WAIT_VARIABLES:
        assert f"var.{variable}" in expression, f"timeout {expression!r} is not derived from var.{variable}"
    assert "var.detach_disks_per_node * local.detach_operation_wait_seconds" in expression, expression
    # With active fencing, the wait for a stopped VM (its stop's operation
    # followed within it).
    assert "local.power_off_wait_seconds" in expression, expression
    assert L.expr(local_values["power_off_wait_seconds"]) == "local.active_fencing ? var.power_off_wait_seconds : 0"
    lease = code_lease_wait()
    assert L.value(local_values["lease_wait_seconds"]) == lease, f"local.lease_wait_seconds must equal LEASE_WAIT ({lease} s)"
    detach_wait = code_detach_wait()
    assert L.value(local_values["detach_operation_wait_seconds"]) == detach_wait, f"local.detach_operation_wait_seconds must equal DETACH_WAIT ({detach_wait} s)"
    ceiling = L.value(local_values["max_request_timeout_seconds"])
    assert ceiling == PUBSUB_MAX_ACK_DEADLINE <= CLOUD_RUN_MAX_TIMEOUT
    service = L.blocks(mod, "resource", "google_cloud_run_v2_service")["this"]
    assert L.value(service["template"][0]["timeout"]) == "${local.request_timeout_seconds}s"
    conditions = [L.expr(p["condition"]) for p in service["lifecycle"][0]["precondition"]]
    assert "local.request_timeout_seconds <= local.max_request_timeout_seconds" in conditions, conditions
    subscription = L.blocks(mod, "resource", "google_pubsub_subscription")["push"]
    assert L.expr(subscription["ack_deadline_seconds"]) == "local.request_timeout_seconds"
    sweep = L.blocks(mod, "resource", "google_cloud_scheduler_job")["sweep"]
    assert L.value(sweep["attempt_deadline"]) == "${local.request_timeout_seconds}s"

    points = {}
    for variable in GCP_WAIT_VARIABLES:
        lower, upper, default = _bounds(variable, L.GCP_MODULE)
        assert lower <= default <= upper, variable
        points[variable] = sorted({lower, default, upper})
    fits_at_defaults = None
    for detach, confirm, settle, not_ready, disks in itertools.product(*(points[v] for v in GCP_WAIT_VARIABLES)):
        values = {
            "var.volume_detach_timeout_seconds": detach,
            "var.confirm_again_after_seconds": confirm,
            "var.recovery_settle_seconds": settle,
            "var.not_ready_wait_seconds": not_ready,
            "var.detach_disks_per_node": disks,
            "local.lease_wait_seconds": lease,
            "local.detach_operation_wait_seconds": detach_wait,
            "local.power_off_wait_seconds": 0,
        }
        seconds = _evaluate(expression, values)
        needed = not_ready + lease + confirm + disks * detach_wait + detach + settle + 30
        # With active fencing, the wait for a stopped VM on top, every second of it.
        power_off = _bounds("power_off_wait_seconds", L.GCP_MODULE)[1]
        assert _evaluate(expression, values | {"local.power_off_wait_seconds": power_off}) == seconds + power_off
        assert seconds >= needed, f"timeout {seconds}s below the {needed}s one node needs at {values}"
        defaults = {v: _bounds(v, L.GCP_MODULE)[2] for v in GCP_WAIT_VARIABLES}
        if (detach, confirm, settle, not_ready, disks) == tuple(defaults[v] for v in GCP_WAIT_VARIABLES):
            fits_at_defaults = seconds <= ceiling
    assert fits_at_defaults, "the defaults must fit Pub/Sub's 600 s"
    # The bound of detach_disks_per_node: its largest value fits with the
    # other waits at their least, one more would not.
    lower = {v: _bounds(v, L.GCP_MODULE)[0] for v in GCP_WAIT_VARIABLES}
    most = _bounds("detach_disks_per_node", L.GCP_MODULE)[1]
    least = {f"var.{v}": n for v, n in lower.items()} | {
        "local.lease_wait_seconds": lease,
        "local.detach_operation_wait_seconds": detach_wait,
        "local.power_off_wait_seconds": 0,
    }
    assert _evaluate(expression, least | {"var.detach_disks_per_node": most}) <= ceiling
    assert _evaluate(expression, least | {"var.detach_disks_per_node": most + 1}) > ceiling


def test_gcp_routes_and_the_token_the_push_presents():
    """The push subscription posts to /pubsub with an OIDC token for
    PUSH_AUDIENCE as PUSH_SERVICE_ACCOUNT, the values the service is given;
    Eventarc posts to /eventarc as the same account; Alertmanager's URL is
    /alertmanager; the sink writes to the topic the subscription reads."""
    mod = gcp_module()
    local_values = L.locals_of(mod)
    subscription = L.blocks(mod, "resource", "google_pubsub_subscription")["push"]
    push = subscription["push_config"][0]
    assert L.value(push["push_endpoint"]) == '${"${google_cloud_run_v2_service.this["events"].uri}/pubsub"}'
    sweep = L.blocks(mod, "resource", "google_cloud_scheduler_job")["sweep"]["http_target"][0]
    assert L.value(sweep["uri"]) == '${"${google_cloud_run_v2_service.this["events"].uri}/sweep"}'
    assert L.expr(sweep["oidc_token"][0]["audience"]) == "local.push_audience"
    assert L.expr(sweep["oidc_token"][0]["service_account_email"]) == "local.push_service_account_email"
    oidc = push["oidc_token"][0]
    assert L.expr(oidc["audience"]) == "local.push_audience"
    # Null: the events service's own URL, which Cloud Run's invoker check
    # accepts; one's own, a custom audience of that service.
    assert L.expr(local_values["push_audience"]) == "var.push_audience != None ? var.push_audience : local.events_service_url"
    service = L.blocks(mod, "resource", "google_cloud_run_v2_service")["this"]
    assert L.expr(service["custom_audiences"]) == 'each.key == "events" && var.push_audience != None ? [\'${var.push_audience}\'] : None'
    assert L.expr(oidc["service_account_email"]) == "local.push_service_account_email"
    assert L.value(local_values["push_service_account_email"]) == "${var.name}-push@${var.project_id}.iam.gserviceaccount.com"
    account = L.blocks(mod, "resource", "google_service_account")["push"]
    assert L.value(account["account_id"]) == "${var.name}-push"
    assert L.expr(subscription["topic"]) == "google_pubsub_topic.audit.id"
    assert L.expr(subscription["dead_letter_policy"][0]["dead_letter_topic"]) == "google_pubsub_topic.dead_letter.id"
    assert L.expr(subscription["dead_letter_policy"][0]["max_delivery_attempts"]) == "var.max_delivery_attempts"
    assert L.value(L.variables_of(L.GCP_MODULE / "variables.tf")["max_delivery_attempts"]["default"]) == 10

    sink = L.blocks(mod, "resource", "google_logging_project_sink")["this"]
    assert L.value(sink["destination"]) == "pubsub.googleapis.com/${google_pubsub_topic.audit.id}"
    assert L.value(sink["unique_writer_identity"]) is True
    writer = L.blocks(mod, "resource", "google_pubsub_topic_iam_member")["sink"]
    assert L.expr(writer["member"]) == "google_logging_project_sink.this.writer_identity"
    assert L.expr(writer["topic"]) == "google_pubsub_topic.audit.name"

    trigger = L.blocks(mod, "resource", "google_eventarc_trigger")["stop"]
    destination = trigger["destination"][0]["cloud_run_service"][0]
    assert L.value(destination["path"]) == "/eventarc"
    assert L.expr(destination["service"]) == 'google_cloud_run_v2_service.this["events"].name'
    assert L.expr(trigger["service_account"]) == "local.push_service_account_email"
    assert L.value(L.variables_of(L.GCP_MODULE / "variables.tf")["eventarc"]["default"]) is False

    assert L.value(local_values["alertmanager_url"]) == '${"${google_cloud_run_v2_service.this["webhook"].uri}/alertmanager"}'
    # Every audience of the module's own requests: the push subscription's and
    # the sweep's, and Eventarc's, which name the events service's URL, known
    # before it exists (Cloud Run's deterministic URL).
    assert L.value(local_values["events_service_url"]) == "https://${var.name}-${data.google_project.this.number}.${var.region}.run.app"
    assert L.expr(local_values["push_audiences"]) == (
        "distinct(concat(['${local.push_audience}'],var.eventarc ? ['${local.events_service_url}', '${local.events_service_url}/eventarc'] : []))"
    ), L.expr(local_values["push_audiences"])
    outputs = {}
    for entry in L.parse(L.GCP_MODULE / "outputs.tf")["output"]:
        outputs.update(entry)
    for name in (
        "service_url",
        "webhook_service_url",
        "alertmanager_url",
        "service_account_email",
        "webhook_token_secret_id",
        "audit_topic",
        "dead_letter_topic",
        "alertmanager_receiver",
    ):
        assert name in outputs, f"module output {name} missing"
    assert L.value(outputs["webhook_token"].get("sensitive")) is True


def test_gcp_receiver_output_is_the_aws_template_at_the_alertmanager_route():
    """One receiver template for both clouds; on Google Cloud its URL is the service's /alertmanager."""
    receiver = L.locals_of(gcp_module())["alertmanager_receiver"]
    m = re.fullmatch(r"\$\{templatefile\(\"\$\{path\.module\}/\.\./node-fencer/templates/([^\"]+)\", ?\{(.*)\}\)\}", receiver, re.S)
    assert m, f"the receiver must render the node-fencer module's template: {receiver}"
    assert (L.GCP_MODULE / ".." / "node-fencer" / "templates" / m.group(1)).resolve() == L.RECEIVER_TEMPLATE
    assert set(re.findall(r"'(\w+)': '([^']+)'", m.group(2))) == {
        ("name", "${var.name}"),
        ("url", "${local.alertmanager_url}"),
        ("credentials_file", "${var.alertmanager_credentials_file}"),
    }


def test_gcp_alert_policies_watch_the_dead_letters_5xx_and_the_witness():
    policies = L.blocks(gcp_module(), "resource", "google_monitoring_alert_policy")
    assert set(policies) == {"dead_letter", "errors", "witness"}
    # The parser keeps the HCL string's escapes.
    filters = {name: L.value(p["conditions"][0]["condition_threshold"][0]["filter"]).replace('\\"', '"') for name, p in policies.items()}
    assert 'metric.type = "pubsub.googleapis.com/subscription/num_undelivered_messages"' in filters["dead_letter"]
    assert "${google_pubsub_subscription.dead_letter.name}" in filters["dead_letter"]
    assert 'metric.labels.response_code_class = "5xx"' in filters["errors"]
    # The witness's policy reads the log-based metric of WitnessFailures.
    assert 'google_logging_metric.this["WitnessFailures"].name' in filters["witness"]
    for name, policy in policies.items():
        threshold = policy["conditions"][0]["condition_threshold"][0]
        assert L.value(threshold["comparison"]) == "COMPARISON_GT" and L.value(threshold["threshold_value"]) == 0, name
        assert L.expr(policy["notification_channels"]) == "var.notification_channels", name
    assert L.value(L.variables_of(L.GCP_MODULE / "variables.tf")["notification_channels"]["default"]) == []
