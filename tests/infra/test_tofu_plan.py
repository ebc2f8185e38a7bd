"""Plans of the module and the examples, read from `tofu show -json`.

Each case sets the module's switches one way (EKS or self-managed, Function
URL on or off, KMS, VPC, architecture, token store, schedule, active fencing)
and the plan
must create exactly the resources that combination calls for, grant exactly
the AWS calls the code makes for it (aws_iam_policy_document is rendered by
the schema-only provider, or read from the plan's statements when it waits
for values known only after apply), route the EC2 events the function acts
on, and derive the timeout from the waits.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import infra_lib as L
import tofu_lib as T

MODULE = "modules/node-fencer"
KMS_KEY = f"arn:aws:kms:{T.REGION}:{T.ACCOUNT}:key/0a1b2c3d-4e5f-6789-abcd-ef0123456789"
NOTIFICATION_TOPIC = f"arn:aws:sns:{T.REGION}:{T.ACCOUNT}:platform-alerts"
SECRET = f"arn:aws:secretsmanager:{T.REGION}:{T.ACCOUNT}:secret:prod/kubeconfig-AbC123"

# The module's variables for each case, over its defaults.
CASES: dict[str, dict[str, Any]] = {
    "eks_defaults": {"cluster_name": "prod"},
    "eks_without_url": {"cluster_name": "prod", "enable_alertmanager_url": False, "architecture": "arm64"},
    "eks_endpoint_given_no_access_entry": {
        "cluster_name": "prod",
        "cluster_endpoint": "https://0123456789ABCDEF.gr7.eu-west-1.eks.amazonaws.com",
        "cluster_ca_data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
        "eks_access_entry": False,
        "enable_alertmanager_url": False,
        "recovery_schedule": None,
    },
    "self_managed_ssm_kms_vpc": {
        "kubeconfig_ssm_parameter_name": "/node-fencer/kubeconfig",
        "webhook_token_store": "ssm",
        "kms_key_arn": KMS_KEY,
        "vpc_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
        "vpc_security_group_ids": ["sg-0123456789abcdef0"],
        "cluster_vpc_id": "vpc-0123456789abcdef0",
        "cluster_tag": "kubernetes.io/cluster/prod=owned",
        "instance_ids": ["i-0123456789abcdef0"],
        "max_out_of_service_percent": 20,
        "detach_volume_require_tag": False,
    },
    "self_managed_secret_longest_waits": {
        "name": "fencer-b",
        "kubeconfig_secret_arn": SECRET,
        "enable_alertmanager_url": False,
        "not_ready_wait_seconds": 120,
        "confirm_again_after_seconds": 120,
        "volume_detach_timeout_seconds": 180,
        "recovery_settle_seconds": 120,
        # Not passed, nor counted in the timeout, without active fencing.
        "power_off_wait_seconds": 120,
    },
    # Active fencing, with the tag EKS nodes carry (the default): rendered at
    # plan time (no URL, so no token secret whose ARN is known only after apply).
    "eks_active_fencing": {
        "cluster_name": "prod",
        "active_fencing": "stuck",
        "enable_alertmanager_url": False,
    },
    # Active fencing and the Function URL: the policy read from the plan's statements.
    "eks_active_fencing_longest_waits_own_tag": {
        "cluster_name": "prod",
        "active_fencing": True,
        "power_off_instance_tag": {"key": "node-fencer.io/stoppable", "value": "prod"},
        "power_off_after_seconds": 3600,
        "power_off_wait_seconds": 120,
        "partition_percent": 100,
        "not_ready_wait_seconds": 120,
        "confirm_again_after_seconds": 120,
        "volume_detach_timeout_seconds": 180,
        "recovery_settle_seconds": 120,
    },
    "self_managed_active_fencing": {
        "kubeconfig_ssm_parameter_name": "/node-fencer/kubeconfig",
        "enable_alertmanager_url": False,
        "active_fencing": True,
        "power_off_instance_tag": {"key": "kubernetes.io/cluster/lab", "value": "owned"},
        "power_off_after_seconds": 60,
        "power_off_wait_seconds": 10,
        "partition_percent": 1,
        "out_of_service_no_schedule": True,
        "fast_not_ready": False,
        "node_selector": "pool in (db,queue),!spot",
    },
    # Notifications: a topic created with two e-mail subscriptions; the
    # policy waits for the topic's ARN, so it is read from the plan.
    "eks_notifications_created": {
        "cluster_name": "prod",
        "enable_alertmanager_url": False,
        "create_notification_topic": True,
        "notification_emails": ["oncall@example.com", "sre@example.com"],
    },
    # Notifications to a topic of the operator's own: rendered at plan time.
    "self_managed_notification_topic_given": {
        "kubeconfig_ssm_parameter_name": "/node-fencer/kubeconfig",
        "enable_alertmanager_url": False,
        "notification_topic_arn": NOTIFICATION_TOPIC,
    },
    # Control-plane Nodes may be powered off; the detach keyed on this
    # cluster's own volume tag. Rendered at plan time.
    "eks_active_fencing_control_plane_cluster_volumes": {
        "cluster_name": "prod",
        "active_fencing": True,
        "power_off_control_plane": True,
        "detach_volume_cluster_id": "prod",
        "enable_alertmanager_url": False,
    },
}
# The tags of a control-plane instance by default: kOps' (both) and Cluster API's.
CONTROL_PLANE_TAGS = {
    "aws:ResourceTag/k8s.io/role/control-plane": "*",
    "aws:ResourceTag/k8s.io/role/master": "*",
    "aws:ResourceTag/sigs.k8s.io/cluster-api-provider-aws/role": "control-plane",
}


def setting(case: dict[str, Any], name: str) -> Any:
    """A variable of the case, or the module's default."""
    if name in case:
        return case[name]
    default = L.variables_of(L.MODULE / "variables.tf")[name].get("default")
    return L.value(default)


def fencing(case: dict[str, Any]) -> bool:
    """Whether the case switches active fencing on: "stuck" or "on" (true,
    as the variable once was a bool, is "on")."""
    return setting(case, "active_fencing") in ("stuck", "on", "true", True)


def fencing_value(case: dict[str, Any]) -> str:
    """ACTIVE_FENCING as the module passes it, with active fencing on."""
    return "stuck" if setting(case, "active_fencing") == "stuck" else "on"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> T.Workspace:
    return T.make_workspace(tmp_path_factory.mktemp("tofu-plan"))




def module_plan(ws: T.Workspace, case: str) -> dict[str, Any]:
    variables = {"package_path": str(ws.root.parent / "bootstrap.zip"), **CASES[case]}
    return T.plan_of(ws, MODULE, case, variables)


def created(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a: c["change"] for a, c in T.resources(plan).items() if c["mode"] == "managed"}


def expected_resources(case: dict[str, Any]) -> set[str]:
    url = setting(case, "enable_alertmanager_url")
    store = setting(case, "webhook_token_store")
    found = {
        "aws_cloudwatch_event_rule.this",
        "aws_cloudwatch_event_target.this",
        'aws_cloudwatch_log_group.this["main"]',
        "aws_cloudwatch_metric_alarm.dlq_not_empty",
        'aws_cloudwatch_metric_alarm.errors["main"]',
        'aws_cloudwatch_metric_alarm.cap_reached["main"]',
        'aws_cloudwatch_metric_alarm.dependency_errors["main-ec2"]',
        'aws_cloudwatch_metric_alarm.dependency_errors["main-kubernetes"]',
        "aws_cloudwatch_metric_alarm.witness_failing",
        "aws_cloudwatch_dashboard.this",
        "aws_iam_role.this",
        "aws_iam_role_policy.this",
        'aws_lambda_function.this["main"]',
        "aws_lambda_function_event_invoke_config.this",
        "aws_lambda_permission.events",
        "aws_sqs_queue.dlq",
        "aws_sqs_queue_policy.dlq",
    }
    if setting(case, "recovery_schedule") is not None:
        found |= {"aws_cloudwatch_event_rule.recovery[0]", "aws_cloudwatch_event_target.recovery[0]", "aws_lambda_permission.recovery[0]"}
    if url:
        found |= {
            'aws_cloudwatch_log_group.this["webhook"]',
            'aws_cloudwatch_metric_alarm.errors["webhook"]',
            'aws_cloudwatch_metric_alarm.cap_reached["webhook"]',
            'aws_cloudwatch_metric_alarm.dependency_errors["webhook-ec2"]',
            'aws_cloudwatch_metric_alarm.dependency_errors["webhook-kubernetes"]',
            'aws_lambda_function.this["webhook"]',
            "aws_lambda_function_url.this[0]",
            "random_password.webhook_token[0]",
        }
        if store == "secretsmanager":
            found |= {"aws_secretsmanager_secret.webhook_token[0]", "aws_secretsmanager_secret_version.webhook_token[0]"}
        else:
            found.add("aws_ssm_parameter.webhook_token[0]")
    if setting(case, "cluster_name") is not None and setting(case, "eks_access_entry"):
        found.add("aws_eks_access_entry.this[0]")
    if setting(case, "create_notification_topic"):
        found.add("aws_sns_topic.notifications[0]")
        found |= {f'aws_sns_topic_subscription.email["{e}"]' for e in setting(case, "notification_emails")}
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plan_creates_what_the_switches_call_for(workspace: T.Workspace, case: str):
    got = set(created(module_plan(workspace, case)))
    want = expected_resources(CASES[case])
    assert got == want, f"case {case}: planned but not expected {sorted(got - want)}, expected but not planned {sorted(want - got)}"


# --- IAM ---------------------------------------------------------------------------


def statements(plan: dict[str, Any], address: str) -> list[dict[str, Any]]:
    """The statements of an aws_iam_policy_document as IAM JSON: rendered when
    the plan could read it, else from the planned configuration (values known
    only after apply are None)."""
    read = T.read_data(plan)
    if address in read:
        return json.loads(read[address]["json"])["Statement"]
    change = T.resources(plan)[address]["change"]
    assert change["actions"] == ["read"], f"{address}: {change['actions']}"
    out = []
    for s in change["after"]["statement"]:
        st = {"Sid": s["sid"], "Effect": s.get("effect") or "Allow", "Action": s["actions"], "Resource": s["resources"]}
        if s["condition"]:
            st["Condition"] = {c["test"]: {c["variable"]: c["values"]} for c in s["condition"]}
        out.append(st)
    return out


def actions(statement_list: list[dict[str, Any]]) -> set[str]:
    """The actions the statements allow (a Deny allows nothing)."""
    found: set[str] = set()
    for st in statement_list:
        if st.get("Effect", "Allow") == "Deny":
            continue
        action = st["Action"]
        found |= {action} if isinstance(action, str) else set(action)
    return found


def expected_api_actions(case: dict[str, Any]) -> set[str]:
    url = setting(case, "enable_alertmanager_url")
    store = setting(case, "webhook_token_store")
    eks = setting(case, "cluster_name") is not None
    found = {"ec2:DescribeInstances", "ec2:DescribeVolumes", "ec2:DetachVolume"}
    if eks and (setting(case, "cluster_endpoint") is None or setting(case, "cluster_ca_data") is None):
        found.add("eks:DescribeCluster")
    if setting(case, "kubeconfig_ssm_parameter_name") is not None or (url and store == "ssm"):
        found.add("ssm:GetParameter")
    if setting(case, "kubeconfig_secret_arn") is not None or (url and store == "secretsmanager"):
        found.add("secretsmanager:GetSecretValue")
    if fencing(case):
        found |= power_off_actions()
    if notifies(case):
        found |= notify_actions()
    return found


def notifies(case: dict[str, Any]) -> bool:
    return setting(case, "create_notification_topic") or setting(case, "notification_topic_arn") is not None


def notify_actions() -> set[str]:
    """The calls the code makes only with NOTIFY_TOPIC an SNS topic."""
    return set(json.loads(L.MANIFEST.read_text(encoding="utf-8"))["notify_aws_actions"])


def code_actions() -> set[str]:
    return set(json.loads(L.MANIFEST.read_text(encoding="utf-8"))["aws_actions"])


def power_off_actions() -> set[str]:
    """The calls the code makes only with ACTIVE_FENCING=on."""
    return set(json.loads(L.MANIFEST.read_text(encoding="utf-8"))["power_off_aws_actions"])


def power_off_tag(case: dict[str, Any]) -> dict[str, str] | None:
    """The tag ec2:StopInstances must require in this case: the one given, or
    in EKS mode the cluster's own."""
    if not fencing(case):
        return None
    if setting(case, "power_off_instance_tag") is not None:
        return case["power_off_instance_tag"]
    return {"key": f"kubernetes.io/cluster/{case['cluster_name']}", "value": "owned"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_api_policy_grants_the_calls_the_code_makes_in_this_setting(workspace: T.Workspace, case: str):
    granted = actions(statements(module_plan(workspace, case), "data.aws_iam_policy_document.api"))
    want = expected_api_actions(CASES[case])
    # The code's calls for this cluster access, and with active fencing its power-off calls.
    assert want - power_off_actions() - notify_actions() <= code_actions(), f"the test expects calls the code does not make: {sorted(want - code_actions())}"
    assert (want & power_off_actions()) == (power_off_actions() if fencing(CASES[case]) else set())
    assert granted == want, f"case {case}: granted but not needed {sorted(granted - want)}, needed but not granted {sorted(want - granted)}"


def test_every_call_the_code_makes_is_granted_in_some_setting(workspace: T.Workspace):
    granted: set[str] = set()
    for case in CASES:
        granted |= actions(statements(module_plan(workspace, case), "data.aws_iam_policy_document.api"))
    called = code_actions() | power_off_actions() | notify_actions()
    assert granted == called, (
        f"over all cases, granted but not called {sorted(granted - called)}, called but never granted {sorted(called - granted)}"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_notifications_publish_to_their_one_topic_only(workspace: T.Workspace, case: str):
    """sns:Publish on the topic NOTIFY_TOPIC names and nothing else, in the
    one statement that grants it; no sns action at all without a topic."""
    plan = module_plan(workspace, case)
    everything = statements(plan, "data.aws_iam_policy_document.api") + statements(plan, "data.aws_iam_policy_document.runtime")
    granting = [s for s in everything if actions([s]) & notify_actions()]
    env = created(plan)['aws_lambda_function.this["main"]']["after"]["environment"][0]["variables"]
    if not notifies(CASES[case]):
        assert not granting and "NOTIFY_TOPIC" not in env, f"case {case}: {granting} {env.get('NOTIFY_TOPIC')}"
        return
    (publish,) = granting
    assert _one_or_list(publish["Action"]) == ["sns:Publish"], f"case {case}: {publish}"
    given = setting(CASES[case], "notification_topic_arn") or (
        f"arn:aws:sns:{T.REGION}:{T.ACCOUNT}:{setting(CASES[case], 'name')}-notifications")
    assert _one_or_list(publish["Resource"]) == [given], f"case {case}: {publish['Resource']}"
    assert env.get("NOTIFY_TOPIC") == given, f"case {case}: {env.get('NOTIFY_TOPIC')}"


def _one_or_list(v: Any) -> list[Any]:
    """IAM JSON writes a one-element list as its element."""
    return v if isinstance(v, list) else [v]


@pytest.mark.parametrize("case", sorted(CASES))
def test_active_fencing_stops_only_the_clusters_tagged_instances(workspace: T.Workspace, case: str):
    """With active fencing, StopInstances only on the account's instances with
    the cluster's tag (the cluster's own in EKS mode unless another is given),
    DescribeInstanceStatus on "*"; without it, neither anywhere in the role's
    policy."""
    plan = module_plan(workspace, case)
    everything = statements(plan, "data.aws_iam_policy_document.api") + statements(plan, "data.aws_iam_policy_document.runtime")
    tag = power_off_tag(CASES[case])
    if tag is None:
        assert not actions(everything) & power_off_actions(), f"case {case}: active fencing is off, yet {sorted(actions(everything) & power_off_actions())}"
        return
    allowing = [s for s in everything if s.get("Effect", "Allow") == "Allow"]
    granting = {action: [s for s in allowing if action in _one_or_list(s["Action"])] for action in power_off_actions()}
    (stop,) = granting["ec2:StopInstances"]
    assert _one_or_list(stop["Action"]) == ["ec2:StopInstances"]
    assert _one_or_list(stop["Resource"]) == [f"arn:aws:ec2:{T.REGION}:{T.ACCOUNT}:instance/*"], f"case {case}: {stop['Resource']}"
    condition = {test: {k: _one_or_list(v) for k, v in values.items()} for test, values in stop["Condition"].items()}
    assert condition == {"StringEquals": {f"aws:ResourceTag/{tag['key']}": [tag["value"]]}}, f"case {case}: {stop['Condition']}"
    (status,) = granting["ec2:DescribeInstanceStatus"]
    assert _one_or_list(status["Action"]) == ["ec2:DescribeInstanceStatus"]
    assert _one_or_list(status["Resource"]) == ["*"] and "Condition" not in status, f"case {case}: {status}"


def denied(plan: dict[str, Any]) -> dict[str, str]:
    """The tag conditions of the api policy's Deny statements, each of which
    must deny ec2:StopInstances on the account's instances and nothing else."""
    found = {}
    for st in statements(plan, "data.aws_iam_policy_document.api"):
        if st.get("Effect") != "Deny":
            continue
        assert _one_or_list(st["Action"]) == ["ec2:StopInstances"], st
        assert _one_or_list(st["Resource"]) == [f"arn:aws:ec2:{T.REGION}:{T.ACCOUNT}:instance/*"], st
        ((test, condition),) = st["Condition"].items()
        assert test == "StringLike", st
        ((key, values),) = condition.items()
        (value,) = _one_or_list(values)
        assert key not in found, f"{key} denied twice"
        found[key] = value
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_control_plane_instances_cannot_be_stopped_unless_allowed(workspace: T.Workspace, case: str):
    """With active fencing, ec2:StopInstances is denied on instances tagged
    as control plane (one Deny per tag: any one suffices), unless
    power_off_control_plane allows it, which also tells the code."""
    c = CASES[case]
    plan = module_plan(workspace, case)
    want = CONTROL_PLANE_TAGS if fencing(c) and not setting(c, "power_off_control_plane") else {}
    assert denied(plan) == want, f"case {case}: {denied(plan)}"
    for address, after in functions(plan).items():
        environment = after["environment"][0]["variables"]
        allowed = fencing(c) and setting(c, "power_off_control_plane")
        assert environment.get("POWER_OFF_CONTROL_PLANE") == ("true" if allowed else None), f"case {case}: {address}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_detach_keys_on_the_volume_tag_asked_for(workspace: T.Workspace, case: str):
    """The CSI driver's tag of every cluster's volumes by default, this
    cluster's own (written with --k8s-tag-cluster-id) given its id, none
    without the tag requirement."""
    c = CASES[case]
    (detach,) = [s for s in statements(module_plan(workspace, case), "data.aws_iam_policy_document.api") if s["Sid"] == "DetachTaggedVolumes"]
    if not setting(c, "detach_volume_require_tag"):
        assert "Condition" not in detach or not detach["Condition"], f"case {case}: {detach}"
        return
    cluster_id = setting(c, "detach_volume_cluster_id")
    want = {"kubernetes.io/cluster/" + cluster_id: "owned"} if cluster_id else {"ebs.csi.aws.com/cluster": "true"}
    got = {k.removeprefix("aws:ResourceTag/"): _one_or_list(v)[0] for k, v in detach["Condition"]["StringEquals"].items()}
    assert got == want, f"case {case}: {detach['Condition']}"


def test_the_rendered_policy_names_the_clusters_tag(workspace: T.Workspace):
    """Rendered by the provider at plan time (the form IAM receives): the EKS
    default tag is the cluster's."""
    plan = module_plan(workspace, "eks_active_fencing")
    assert "data.aws_iam_policy_document.api" in T.read_data(plan), "the api policy should be rendered at plan time here"
    by_sid = {s["Sid"]: s for s in statements(plan, "data.aws_iam_policy_document.api")}
    assert by_sid["StopClusterInstances"] == {
        "Sid": "StopClusterInstances",
        "Effect": "Allow",
        "Action": "ec2:StopInstances",
        "Resource": f"arn:aws:ec2:{T.REGION}:{T.ACCOUNT}:instance/*",
        "Condition": {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/prod": "owned"}},
    }
    assert by_sid["DescribeInstanceStatus"] == {
        "Sid": "DescribeInstanceStatus",
        "Effect": "Allow",
        "Action": "ec2:DescribeInstanceStatus",
        "Resource": "*",
    }


def test_the_rendered_api_policy_scopes_each_call(workspace: T.Workspace):
    """With everything known at plan time the provider renders the policy: the
    detach is limited to the account's volumes carrying the CSI driver's tag,
    the cluster description to the one cluster."""
    plan = module_plan(workspace, "eks_without_url")
    assert "data.aws_iam_policy_document.api" in T.read_data(plan), "the api policy should be rendered at plan time here"
    by_sid = {s["Sid"]: s for s in statements(plan, "data.aws_iam_policy_document.api")}
    arn = f"arn:aws:ec2:{T.REGION}:{T.ACCOUNT}"
    assert by_sid["DescribeInstancesAndVolumes"]["Resource"] == "*"
    assert by_sid["DetachTaggedVolumes"] == {
        "Sid": "DetachTaggedVolumes",
        "Effect": "Allow",
        "Action": "ec2:DetachVolume",
        "Resource": f"{arn}:volume/*",
        "Condition": {"StringEquals": {"aws:ResourceTag/ebs.csi.aws.com/cluster": "true"}},
    }
    assert by_sid["DetachFromInstances"]["Resource"] == f"{arn}:instance/*" and "Condition" not in by_sid["DetachFromInstances"]
    assert by_sid["DescribeCluster"]["Resource"] == f"arn:aws:eks:{T.REGION}:{T.ACCOUNT}:cluster/prod"
    assert set(by_sid) == {"DescribeInstancesAndVolumes", "DetachTaggedVolumes", "DetachFromInstances", "DescribeCluster"}


def test_without_the_tag_requirement_the_detach_has_no_condition(workspace: T.Workspace):
    by_sid = {s["Sid"]: s for s in statements(module_plan(workspace, "self_managed_ssm_kms_vpc"), "data.aws_iam_policy_document.api")}
    assert "Condition" not in by_sid["DetachTaggedVolumes"]
    assert by_sid["ReadParameters"]["Resource"][0] == f"arn:aws:ssm:{T.REGION}:{T.ACCOUNT}:parameter/node-fencer/kubeconfig"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_runtime_policy_follows_kms_and_vpc(workspace: T.Workspace, case: str):
    sids = {s["Sid"]: s for s in statements(module_plan(workspace, case), "data.aws_iam_policy_document.runtime")}
    want = {"WriteLogs", "OnFailureDestination"}
    if setting(CASES[case], "kms_key_arn") is not None:
        want.add("DecryptParametersAndSecrets")
        assert sids["DecryptParametersAndSecrets"]["Resource"] == [KMS_KEY]
        assert sids["DecryptParametersAndSecrets"]["Condition"] == {
            "StringEquals": {"kms:ViaService": [f"ssm.{T.REGION}.amazonaws.com", f"secretsmanager.{T.REGION}.amazonaws.com"]}
        }
    if setting(CASES[case], "vpc_subnet_ids"):
        want.add("VpcNetworkInterfaces")
    assert set(sids) == want, f"case {case}: runtime statements {sorted(sids)}"


# --- functions, events, timeouts -------------------------------------------------


def functions(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a: c["after"] for a, c in created(plan).items() if a.startswith("aws_lambda_function.this[")}


@pytest.mark.parametrize(("case", "want"), [("eks_active_fencing", "false"), ("self_managed_active_fencing", "true")])
def test_the_no_schedule_pair_is_passed_as_set(workspace: T.Workspace, case: str, want: str):
    for address, after in functions(module_plan(workspace, case)).items():
        got = after["environment"][0]["variables"]["OUT_OF_SERVICE_NO_SCHEDULE"]
        assert got == want, f"case {case}: {address} OUT_OF_SERVICE_NO_SCHEDULE={got}"


@pytest.mark.parametrize(("case", "want"), [("eks_active_fencing", "true"), ("self_managed_active_fencing", "false")])
def test_fast_not_ready_is_on_unless_turned_off(workspace: T.Workspace, case: str, want: str):
    for address, after in functions(module_plan(workspace, case)).items():
        got = after["environment"][0]["variables"]["FAST_NOT_READY"]
        assert got == want, f"case {case}: {address} FAST_NOT_READY={got}"


@pytest.mark.parametrize(("case", "want"), [("eks_active_fencing", None), ("self_managed_active_fencing", "pool in (db,queue),!spot")])
def test_node_selector_is_passed_only_when_set(workspace: T.Workspace, case: str, want: str | None):
    for address, after in functions(module_plan(workspace, case)).items():
        got = after["environment"][0]["variables"].get("NODE_SELECTOR")
        assert got == want, f"case {case}: {address} NODE_SELECTOR={got}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_timeout_is_the_sum_of_the_waits(workspace: T.Workspace, case: str):
    c = CASES[case]
    lease_wait = json.loads(L.MANIFEST.read_text(encoding="utf-8"))["lease_wait_seconds"]
    want = (
        setting(c, "not_ready_wait_seconds")
        + lease_wait
        + setting(c, "confirm_again_after_seconds")
        + 2 * setting(c, "volume_detach_timeout_seconds")
        + setting(c, "recovery_settle_seconds")
        + (setting(c, "power_off_wait_seconds") if fencing(c) else 0)
        + 30
    )
    assert want <= 900, f"case {case}: the waits sum to {want} s, beyond Lambda's 900"
    for address, after in functions(module_plan(workspace, case)).items():
        assert after["timeout"] == want, f"case {case}: {address} timeout {after['timeout']}, waits sum to {want}"


def test_the_emulator_tests_run_under_the_modules_default_timeout(workspace: T.Workspace):
    """The integration tests under AWS's Lambda runtime emulator give the
    function the timeout the module sets at its defaults (tests/src/rie.rs):
    the plan's, so a change of a default wait reaches them."""
    source = (L.REPO / "tests" / "src" / "rie.rs").read_text(encoding="utf-8")
    match = re.search(r"pub const MODULE_DEFAULT_TIMEOUT_SECONDS: u64 = (\d+);", source)
    assert match, "tests/src/rie.rs names MODULE_DEFAULT_TIMEOUT_SECONDS"
    timeouts = {after["timeout"] for after in functions(module_plan(workspace, "eks_defaults")).values()}
    assert timeouts == {int(match.group(1))}, (
        f"the module's default timeouts are {timeouts} s; tests/src/rie.rs says {match.group(1)}"
    )


def test_the_longest_waits_fill_lambdas_900_seconds(workspace: T.Workspace):
    """At every wait's bound: 900 s with active fencing, 120 s (its power-off
    wait) less without."""
    for address, after in functions(module_plan(workspace, "eks_active_fencing_longest_waits_own_tag")).items():
        assert after["timeout"] == 900, address
    (after,) = functions(module_plan(workspace, "self_managed_secret_longest_waits")).values()
    assert after["timeout"] == 900 - 120


ACTIVE_FENCING_ENVIRONMENT = ("ACTIVE_FENCING", "POWER_OFF_AFTER_SECONDS", "POWER_OFF_WAIT_SECONDS", "PARTITION_PERCENT")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_active_fencing_variables_are_set_exactly_when_it_is_on(workspace: T.Workspace, case: str):
    """The code refuses POWER_OFF_*/PARTITION_PERCENT without ACTIVE_FENCING=on:
    all four with it, none without, in both functions; each a variable the code reads."""
    c = CASES[case]
    known = {v["name"] for v in json.loads(L.MANIFEST.read_text(encoding="utf-8"))["variables"]}
    assert set(ACTIVE_FENCING_ENVIRONMENT) <= known, f"not in the manifest: {sorted(set(ACTIVE_FENCING_ENVIRONMENT) - known)}"
    if fencing(c):
        want = {
            "ACTIVE_FENCING": fencing_value(c),
            "POWER_OFF_AFTER_SECONDS": str(setting(c, "power_off_after_seconds")),
            "POWER_OFF_WAIT_SECONDS": str(setting(c, "power_off_wait_seconds")),
            "PARTITION_PERCENT": str(setting(c, "partition_percent")),
        }
    else:
        want = {}
    for address, after in functions(module_plan(workspace, case)).items():
        environment = after["environment"][0]["variables"]
        assert set(environment) <= known, f"case {case}: {address} sets variables the code does not read: {sorted(set(environment) - known)}"
        got = {k: v for k, v in environment.items() if k in ACTIVE_FENCING_ENVIRONMENT}
        assert got == want, f"case {case}: {address} sets {got}, expected {want}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_functions_share_every_setting_but_name_and_concurrency(workspace: T.Workspace, case: str):
    c = CASES[case]
    found = functions(module_plan(workspace, case))
    name = setting(c, "name")
    main = found['aws_lambda_function.this["main"]']
    assert main["function_name"] == name
    assert main["architectures"] == [setting(c, "architecture")]
    assert (len(main["vpc_config"]) == 1) == bool(setting(c, "vpc_subnet_ids"))
    if main["vpc_config"]:
        assert set(main["vpc_config"][0]["subnet_ids"]) == set(c["vpc_subnet_ids"])
    environment = main["environment"][0]["variables"]
    known = {v["name"] for v in json.loads(L.MANIFEST.read_text(encoding="utf-8"))["variables"]}
    assert set(environment) <= known, f"case {case}: variables the code does not read: {sorted(set(environment) - known)}"
    webhook = found.get('aws_lambda_function.this["webhook"]')
    assert (webhook is not None) == setting(c, "enable_alertmanager_url"), f"case {case}: functions {sorted(found)}"
    if webhook is not None:
        assert webhook["function_name"] == f"{name}-webhook"
        differ = {k for k in main if main[k] != webhook[k]}
        assert differ <= {"function_name", "description", "reserved_concurrent_executions", "logging_config"}, f"case {case}: {sorted(differ)}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_function_url_is_the_webhook_functions_alone(workspace: T.Workspace, case: str):
    urls = {a: c["after"] for a, c in created(module_plan(workspace, case)).items() if a.startswith("aws_lambda_function_url.")}
    if not setting(CASES[case], "enable_alertmanager_url"):
        assert not urls
        return
    (url,) = urls.values()
    assert url["authorization_type"] == "NONE"
    assert url["function_name"] == f"{setting(CASES[case], 'name')}-webhook"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_event_rule_matches_the_states_the_function_acts_on(workspace: T.Workspace, case: str):
    rule = created(module_plan(workspace, case))["aws_cloudwatch_event_rule.this"]["after"]
    detail: dict[str, Any] = {"state": ["stopped", "terminated", "running"]}
    if setting(CASES[case], "instance_ids"):
        detail["instance-id"] = CASES[case]["instance_ids"]
    assert json.loads(rule["event_pattern"]) == {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        "detail": detail,
    }


def test_the_token_and_kubeconfig_use_the_kms_key(workspace: T.Workspace):
    plan = created(module_plan(workspace, "self_managed_ssm_kms_vpc"))
    assert plan["aws_ssm_parameter.webhook_token[0]"]["after"]["key_id"] == KMS_KEY
    assert plan["aws_ssm_parameter.webhook_token[0]"]["after"]["type"] == "SecureString"
    environment = functions(module_plan(workspace, "self_managed_ssm_kms_vpc"))['aws_lambda_function.this["main"]']["environment"][0]["variables"]
    assert environment["KUBECONFIG_SSM_PARAMETER"] == "/node-fencer/kubeconfig"
    assert environment["CLUSTER_TAG"] == "kubernetes.io/cluster/prod=owned"
    assert environment["MAX_OUT_OF_SERVICE_PERCENT"] == "20"


# --- the examples ----------------------------------------------------------------


def example_plan(ws: T.Workspace, example: str) -> dict[str, Any]:
    # The example's own terraform.tfvars.example, with the stand-in zip.
    return T.plan_of(ws, f"examples/{example}", example, {"package_path": str(ws.root.parent / "bootstrap.zip")}, "terraform.tfvars.example")


def test_the_eks_example_plans_the_module_the_access_entry_and_the_rbac(workspace: T.Workspace):
    got = set(created(example_plan(workspace, "eks")))
    want = {f"module.node_fencer.{a}" for a in expected_resources({"cluster_name": "prod"})} | {
        "module.rbac.kubernetes_cluster_role_v1.this",
        "module.rbac.kubernetes_cluster_role_binding_v1.this",
        'module.rbac.kubernetes_role_v1.this["kube-system/node-fencer"]',
        'module.rbac.kubernetes_role_binding_v1.this["kube-system/node-fencer"]',
        'module.rbac.kubernetes_role_v1.this["kube-node-lease/node-fencer"]',
        'module.rbac.kubernetes_role_binding_v1.this["kube-node-lease/node-fencer"]',
    }
    assert got == want, f"planned but not expected {sorted(got - want)}, expected but not planned {sorted(want - got)}"
    main = created(example_plan(workspace, "eks"))['module.node_fencer.aws_lambda_function.this["main"]']["after"]
    # The cluster's VPC, read from the cluster.
    assert main["environment"][0]["variables"]["CLUSTER_VPC_ID"] == "vpc-0123456789abcdef0"
    assert main["environment"][0]["variables"]["DRY_RUN"] == "true"


def test_the_self_managed_example_stores_a_kubeconfig_for_the_service_account(workspace: T.Workspace):
    plan = created(example_plan(workspace, "self-managed"))
    assert "module.rbac.kubernetes_service_account_v1.this[0]" in plan
    assert "module.rbac.kubernetes_secret_v1.token[0]" in plan
    assert 'module.rbac.kubernetes_role_binding_v1.service_account["kube-system/node-fencer"]' in plan
    parameter = plan["aws_ssm_parameter.kubeconfig"]["after"]
    assert parameter["type"] == "SecureString" and parameter["name"] == "/node-fencer/kubeconfig"
    assert "module.node_fencer.aws_eks_access_entry.this[0]" not in plan
    main = plan['module.node_fencer.aws_lambda_function.this["main"]']["after"]
    assert main["environment"][0]["variables"]["KUBECONFIG_SSM_PARAMETER"] == "/node-fencer/kubeconfig"


def example_with_active_fencing(ws: T.Workspace, example: str, **variables: Any) -> dict[str, Any]:
    """The example's terraform.tfvars.example with active fencing switched on."""
    values = {"package_path": str(ws.root.parent / "bootstrap.zip"), "active_fencing": True, **variables}
    return T.plan_of(ws, f"examples/{example}", f"{example}-active-fencing", values, "terraform.tfvars.example")


def example_environment(plan: dict[str, Any]) -> dict[str, str]:
    return created(plan)['module.node_fencer.aws_lambda_function.this["main"]']["after"]["environment"][0]["variables"]


@pytest.mark.parametrize("example", ["eks", "self-managed"])
def test_the_examples_leave_active_fencing_off(workspace: T.Workspace, example: str):
    plan = example_plan(workspace, example)
    assert not set(example_environment(plan)) & set(ACTIVE_FENCING_ENVIRONMENT)
    granted = actions(statements(plan, "module.node_fencer.data.aws_iam_policy_document.api"))
    assert not granted & power_off_actions(), f"{example}: {sorted(granted & power_off_actions())} granted with active fencing off"


@pytest.mark.parametrize(
    ("example", "tag"),
    [
        # The module's EKS default, the tag EKS node groups and Karpenter put on their instances.
        ("eks", {"key": "kubernetes.io/cluster/prod", "value": "owned"}),
        # The example's terraform.tfvars.example names the tag its instances carry.
        ("self-managed", {"key": "kubernetes.io/cluster/prod", "value": "owned"}),
    ],
)
def test_the_examples_stop_only_instances_with_the_clusters_tag(workspace: T.Workspace, example: str, tag: dict[str, str]):
    plan = example_with_active_fencing(workspace, example)
    assert example_environment(plan)["ACTIVE_FENCING"] == "on"
    by_sid = {s["Sid"]: s for s in statements(plan, "module.node_fencer.data.aws_iam_policy_document.api")}
    stop = by_sid["StopClusterInstances"]
    condition = {test: {k: _one_or_list(v) for k, v in values.items()} for test, values in stop["Condition"].items()}
    assert condition == {"StringEquals": {f"aws:ResourceTag/{tag['key']}": [tag["value"]]}}, f"{example}: {stop['Condition']}"
    assert _one_or_list(by_sid["DescribeInstanceStatus"]["Resource"]) == ["*"]


def test_the_self_managed_example_refuses_active_fencing_without_a_tag(workspace: T.Workspace):
    directory = "examples/self-managed"
    workspace.init(directory)
    values = {"package_path": str(workspace.root.parent / "bootstrap.zip"), "active_fencing": True, "power_off_instance_tag": None}
    var_path = workspace.root.parent / "self-managed-active-fencing-untagged.tfvars.json"
    var_path.write_text(json.dumps(values), encoding="utf-8")
    result = workspace.run(
        directory, "plan", "-input=false", "-no-color", "-lock=false", "-var-file=terraform.tfvars.example", f"-var-file={var_path}", check=False
    )
    assert result.returncode != 0, f"the self-managed example planned active fencing without a tag:\n{result.stdout}"
    assert "active_fencing needs power_off_instance_tag" in " ".join(result.stderr.split()), result.stderr
