"""Plans of the Google Cloud module and the GKE example, read from `tofu show -json`.

Each case sets the module's switches one way (Eventarc, a token secret of
one's own, a zonal cluster, VPC egress, the longest waits, the VM name
prefix) and the plan must create exactly the resources that combination
calls for, grant the custom role exactly the permissions the code needs,
pass the service exactly the settings the code reads, push to /pubsub with
the OIDC token the service checks, and let through the sink exactly the
audit log entries the code acts on.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest

import infra_lib as L
import logging_filter as F
import tofu_lib as T

MODULE = "modules/node-fencer-gcp"
BASE = {
    "project_id": T.GCP_PROJECT,
    "region": "europe-west1",
    "image": "europe-docker.pkg.dev/my-project/node-fencer/node-fencer:1.0.0",
    "cluster_name": "prod",
    "cluster_location": "europe-west1",
    "cluster_endpoint": "203.0.113.10",
    "cluster_ca_data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
}
OWN_SECRET = f"projects/{T.GCP_PROJECT}/secrets/alertmanager-token"

# The module's variables for each case, over BASE and its defaults.
CASES: dict[str, dict[str, Any]] = {
    "gcp_defaults": {},
    "gcp_eventarc_own_secret_zonal_vpc_longest_waits": {
        "name": "fencer-b",
        "cluster_location": "europe-west1-b",
        "eventarc": True,
        "webhook_token_secret_id": OWN_SECRET,
        "vpc_network": f"projects/{T.GCP_PROJECT}/global/networks/prod",
        "vpc_subnetwork": f"projects/{T.GCP_PROJECT}/regions/europe-west1/subnetworks/prod",
        "not_ready_wait_seconds": 120,
        "confirm_again_after_seconds": 120,
        "volume_detach_timeout_seconds": 120,
        "recovery_settle_seconds": 60,
        "detach_disks_per_node": 2,
        "max_out_of_service_percent": 20,
        "push_audience": "https://fencer-b.example.com/push",
        "max_delivery_attempts": 20,
        "notification_channels": [f"projects/{T.GCP_PROJECT}/notificationChannels/1234567890"],
        # GKE shortens long cluster names in its VM names.
        "cluster_name": "payments-production-eu",
        "cluster_endpoint": "https://203.0.113.20",
        "dry_run": True,
        "fast_not_ready": False,
        "node_selector": "cloud.google.com/gke-nodepool=stateful",
        "out_of_service_no_schedule": True,
        "sweep_schedule": None,
        "webhook_max_instances": 2,
        "webhook_max_instance_request_concurrency": 4,
        "max_instances": 5,
    },
    # Eventarc with the default audience (the events service's URL, which
    # Eventarc's tokens name too), every VM of the project.
    "gcp_eventarc_every_vm": {
        "eventarc": True,
        "instance_name_prefix": "",
    },
    # Notifications to a topic the module creates, with its pull subscription.
    "gcp_notifications_created": {
        "create_notification_topic": True,
    },
    # Notifications to a topic of the operator's own, in another project.
    "gcp_notification_topic_given": {
        "notification_topic": "projects/platform-alerts/topics/k8s-fencing",
    },
    # Active fencing (issue 36): the stop on the node VMs, its settings, its wait.
    "gcp_active_fencing": {
        "active_fencing": "stuck",
        "power_off_after_seconds": 90,
        "power_off_wait_seconds": 120,
        "partition_percent": 40,
    },
}
LONG_NAMES = "gcp_eventarc_own_secret_zonal_vpc_longest_waits"

# What the code reads only on AWS: the module must not pass them.
AWS_ONLY = {
    "CLUSTER_VPC_ID",
    "CLUSTER_TAG",
    "CLUSTER_NAME",
    "POWER_OFF_CONTROL_PLANE",
    "FENCE_HIBERNATED",
    "KUBECONFIG",
    "KUBECONFIG_SSM_PARAMETER",
    "KUBECONFIG_SECRET_ID",
    "WEBHOOK_TOKEN_SECRET_ID",
    "WEBHOOK_TOKEN_SSM_PARAMETER",
}
# What the service cannot run without on Google Cloud.
REQUIRED = {"GKE_CLUSTER", "CLUSTER_ENDPOINT", "CLUSTER_CA_DATA", "PUSH_AUDIENCE", "PUSH_SERVICE_ACCOUNT", "WEBHOOK_TOKEN"}
# The two services, by their key in the module, and the routes each answers.
SERVICES = {"events": "events", "webhook": "alertmanager"}
EVENTS = 'google_cloud_run_v2_service.this["events"]'
WEBHOOK = 'google_cloud_run_v2_service.this["webhook"]'


def setting(case: dict[str, Any], name: str) -> Any:
    """A variable of the case (over BASE), or the module's default."""
    values = {**BASE, **case}
    if name in values:
        return values[name]
    return L.value(L.variables_of(L.GCP_MODULE / "variables.tf")[name].get("default"))


def fencing(case: dict[str, Any]) -> bool:
    """Whether the case switches active fencing on: "stuck" or "on" (true,
    as the variable once was a bool, is "on")."""
    return setting(case, "active_fencing") in ("stuck", "on", "true", True)


def fencing_value(case: dict[str, Any]) -> str:
    """ACTIVE_FENCING as the module passes it, with active fencing on."""
    return "stuck" if setting(case, "active_fencing") == "stuck" else "on"


def manifest() -> dict[str, Any]:
    return json.loads(L.MANIFEST.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> T.Workspace:
    return T.make_workspace(tmp_path_factory.mktemp("tofu-plan-gcp"))




def module_plan(ws: T.Workspace, case: str) -> dict[str, Any]:
    return T.plan_of(ws, MODULE, case, {**BASE, **CASES[case]})


def created(plan: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """The managed resources the plan creates, by address less `prefix`."""
    return {a.removeprefix(prefix): c["change"]["after"] for a, c in T.resources(plan).items() if c["mode"] == "managed"}


def expected_resources(case: dict[str, Any]) -> set[str]:
    found = {
        "google_service_account.this",
        "google_service_account.push",
        "google_project_iam_custom_role.this",
        "google_project_iam_member.this",
        "google_project_iam_custom_role.node_vms",
        "google_project_iam_member.node_vms",
        "google_secret_manager_secret_iam_member.webhook_token",
        EVENTS,
        WEBHOOK,
        "google_cloud_run_v2_service_iam_member.public",
        "google_cloud_run_v2_service_iam_member.push",
        "google_service_account_iam_member.push_token_creator",
        "google_pubsub_topic.audit",
        "google_logging_project_sink.this",
        "google_pubsub_topic_iam_member.sink",
        "google_pubsub_subscription.push",
        "google_pubsub_topic.dead_letter",
        "google_pubsub_subscription.dead_letter",
        "google_pubsub_topic_iam_member.dead_letter_publisher",
        "google_pubsub_subscription_iam_member.dead_letter_subscriber",
        "google_monitoring_alert_policy.dead_letter",
        "google_monitoring_alert_policy.errors",
        "google_monitoring_alert_policy.witness",
        "google_monitoring_dashboard.this",
        *(f'google_logging_metric.this["{m["name"]}"]' for m in manifest()["metrics"]["metrics"]),
    }
    if setting(case, "webhook_token_secret_id") is None:
        found |= {
            "random_password.webhook_token[0]",
            "google_secret_manager_secret.webhook_token[0]",
            "google_secret_manager_secret_version.webhook_token[0]",
        }
    if setting(case, "sweep_schedule") is not None:
        found.add("google_cloud_scheduler_job.sweep[0]")
    if setting(case, "eventarc"):
        found |= {"google_eventarc_trigger.stop[0]", "google_project_iam_member.push_event_receiver[0]"}
    if setting(case, "create_notification_topic"):
        found |= {"google_pubsub_topic.notifications[0]", "google_pubsub_subscription.notifications[0]"}
    if setting(case, "create_notification_topic") or setting(case, "notification_topic") is not None:
        found.add("google_pubsub_topic_iam_member.notifications[0]")
    return found


def service(plan: dict[str, Any], prefix: str = "", key: str = "events") -> dict[str, Any]:
    return created(plan, prefix)[f'google_cloud_run_v2_service.this["{key}"]']


def container(plan: dict[str, Any], prefix: str = "", key: str = "events") -> dict[str, Any]:
    (found,) = service(plan, prefix, key)["template"][0]["containers"]
    return found


def environment(plan: dict[str, Any], prefix: str = "", key: str = "events") -> dict[str, dict[str, Any]]:
    """The container's env blocks by name."""
    found: dict[str, dict[str, Any]] = {}
    for env in container(plan, prefix, key)["env"]:
        assert env["name"] not in found, f"{env['name']} is set twice"
        found[env["name"]] = env
    return found


def values(plan: dict[str, Any], prefix: str = "", key: str = "events") -> dict[str, str]:
    return {name: env["value"] for name, env in environment(plan, prefix, key).items() if env["value"] is not None}


def seconds(duration: str) -> int:
    m = re.fullmatch(r"(\d+)s", duration)
    assert m, f"not a duration in seconds: {duration!r}"
    return int(m.group(1))


def email(account: dict[str, Any]) -> str:
    return f"{account['account_id']}@{account['project']}.iam.gserviceaccount.com"


# --- resources ---------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plan_creates_what_the_switches_call_for(workspace: T.Workspace, case: str):
    got = set(created(module_plan(workspace, case)))
    want = expected_resources(CASES[case])
    assert got == want, f"case {case}: planned but not expected {sorted(got - want)}, expected but not planned {sorted(want - got)}"


# --- IAM ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_custom_roles_grant_exactly_the_permissions_the_code_needs(workspace: T.Workspace, case: str):
    resources = created(module_plan(workspace, case))
    role = resources["google_project_iam_custom_role.this"]
    node_vms = resources["google_project_iam_custom_role.node_vms"]
    granted = set(role["permissions"]) | set(node_vms["permissions"])
    # The stop only with active fencing, and then on the node VMs alone.
    power_off = set(manifest()["power_off_gcp_permissions"]) if fencing(CASES[case]) else set()
    needed = set(manifest()["gcp_permissions"]) | power_off
    assert granted == needed, f"case {case}: granted but not needed {sorted(granted - needed)}, needed but not granted {sorted(needed - granted)}"
    assert set(node_vms["permissions"]) == {"compute.instances.detachDisk"} | power_off and not set(role["permissions"]) & set(node_vms["permissions"])
    assert role["role_id"] == setting(CASES[case], "name").replace("-", "_")
    assert node_vms["role_id"] == setting(CASES[case], "name").replace("-", "_") + "_node_vms"
    assert role["project"] == node_vms["project"] == T.GCP_PROJECT


def node_vm_prefix(case: dict[str, Any]) -> str:
    """The node VMs' name prefix: the one given, or GKE's for the cluster."""
    given = setting(case, "instance_name_prefix")
    if given is not None:
        return given
    cluster = setting(case, "cluster_name")
    return f"gke-{cluster}-" if len(cluster) <= 16 else f"gke-{cluster[:16]}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_detach_is_granted_on_the_clusters_node_vms_only(workspace: T.Workspace, case: str):
    """An IAM condition on the VM's resource name (Compute Engine supports
    resource names in conditions, not labels): the detach only on VMs named
    like the cluster's nodes; with the prefix "", on every VM."""
    plan = module_plan(workspace, case)
    resources = created(plan)
    binding = resources["google_project_iam_member.node_vms"]
    assert "google_service_account.this.member" in configuration(plan, "google_project_iam_member.node_vms")["member"]["references"]
    assert "google_project_iam_custom_role.node_vms.name" in configuration(plan, "google_project_iam_member.node_vms")["role"]["references"]
    prefix = node_vm_prefix(CASES[case])
    if prefix == "":
        assert binding["condition"] == [], f"case {case}: {binding['condition']}"
        return
    (condition,) = binding["condition"]
    assert condition["expression"] == (
        'resource.type == "compute.googleapis.com/Instance" && '
        f'resource.name.extract("/instances/{{name}}").startsWith("{prefix}")'
    ), f"case {case}: {condition['expression']}"
    assert resources["google_project_iam_member.this"]["condition"] == [], "the reads are project-wide"


def configuration(plan: dict[str, Any], address: str) -> dict[str, Any]:
    """The configuration of one resource of the root module, as the plan records it."""
    for resource in plan["configuration"]["root_module"]["resources"]:
        if resource["address"] == address:
            return resource["expressions"]
    raise AssertionError(f"no {address} in the plan's configuration")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_service_account_holds_the_custom_role_and_reads_one_secret(workspace: T.Workspace, case: str):
    plan = module_plan(workspace, case)
    resources = created(plan)
    project_members = {a: r for a, r in resources.items() if a.startswith("google_project_iam_member.")}
    binding = project_members.pop("google_project_iam_member.this")
    project_members.pop("google_project_iam_member.node_vms")
    assert "google_project_iam_custom_role.this.name" in configuration(plan, "google_project_iam_member.this")["role"]["references"]
    assert "google_service_account.this.member" in configuration(plan, "google_project_iam_member.this")["member"]["references"]
    assert binding["project"] == T.GCP_PROJECT
    # The only other project role: Eventarc's receiver, for the push account, with the trigger.
    assert {r["role"] for r in project_members.values()} == ({"roles/eventarc.eventReceiver"} if setting(CASES[case], "eventarc") else set())
    secret = resources["google_secret_manager_secret_iam_member.webhook_token"]
    assert secret["role"] == "roles/secretmanager.secretAccessor"
    if setting(CASES[case], "webhook_token_secret_id") is not None:
        assert secret["secret_id"] == OWN_SECRET
    else:
        # The generated secret's id: known once it is created.
        change = T.resources(plan)["google_secret_manager_secret_iam_member.webhook_token"]["change"]
        assert change["after_unknown"].get("secret_id") is True and "google_secret_manager_secret.webhook_token[0]" in resources
    # Everything Cloud Run runs, both services, runs as the one account.
    for key in SERVICES:
        assert service(plan, key=key)["template"][0]["service_account"] == email(resources["google_service_account.this"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_pubsubs_service_agent_signs_the_push_tokens_and_moves_dead_letters(workspace: T.Workspace, case: str):
    resources = created(module_plan(workspace, case))
    agent = f"serviceAccount:service-{T.GCP_PROJECT_NUMBER}@gcp-sa-pubsub.iam.gserviceaccount.com"
    creator = resources["google_service_account_iam_member.push_token_creator"]
    assert (creator["role"], creator["member"]) == ("roles/iam.serviceAccountTokenCreator", agent)
    publisher = resources["google_pubsub_topic_iam_member.dead_letter_publisher"]
    assert (publisher["role"], publisher["member"], publisher["topic"]) == ("roles/pubsub.publisher", agent, resources["google_pubsub_topic.dead_letter"]["name"])
    subscriber = resources["google_pubsub_subscription_iam_member.dead_letter_subscriber"]
    assert (subscriber["role"], subscriber["member"], subscriber["subscription"]) == (
        "roles/pubsub.subscriber",
        agent,
        resources["google_pubsub_subscription.push"]["name"],
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_anyone_may_invoke_the_webhook_service_and_only_the_push_account_the_events_service(workspace: T.Workspace, case: str):
    """The public webhook is a service of its own; the events service (the
    push subscription, the sweep, Eventarc) takes no caller without the push
    account's identity, whatever the service itself checks."""
    plan = module_plan(workspace, case)
    resources = created(plan)
    invokers = {a: r for a, r in resources.items() if a.startswith("google_cloud_run_v2_service_iam_member.")}
    assert set(invokers) == {"google_cloud_run_v2_service_iam_member.public", "google_cloud_run_v2_service_iam_member.push"}
    public, push = invokers["google_cloud_run_v2_service_iam_member.public"], invokers["google_cloud_run_v2_service_iam_member.push"]
    assert (public["name"], public["member"]) == (service(plan, key="webhook")["name"], "allUsers"), f"case {case}: {public}"
    # The push account's member is known once the account exists.
    assert push["name"] == service(plan)["name"], f"case {case}: {push}"
    assert configuration(plan, "google_cloud_run_v2_service_iam_member.push")["member"]["references"][0] == "google_service_account.push.member"
    assert {r["role"] for r in invokers.values()} == {"roles/run.invoker"}
    assert {r["location"] for r in invokers.values()} == {BASE["region"]}


# --- the service's settings ----------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("key", sorted(SERVICES))
def test_the_services_get_exactly_the_settings_the_code_reads(workspace: T.Workspace, case: str, key: str):
    c = CASES[case]
    plan = module_plan(workspace, case)
    env = environment(plan, key=key)
    known = {v["name"] for v in manifest()["variables"]}
    assert set(env) <= known, f"case {case}: variables the code does not read: {sorted(set(env) - known)}"
    assert REQUIRED <= set(env), f"case {case}: missing {sorted(REQUIRED - set(env))}"
    assert not set(env) & AWS_ONLY, f"case {case}: AWS-only variables {sorted(set(env) & AWS_ONLY)}"
    got = values(plan, key=key)
    endpoint = setting(c, "cluster_endpoint")
    want = {
        "GKE_CLUSTER": f"projects/{T.GCP_PROJECT}/locations/{setting(c, 'cluster_location')}/clusters/{setting(c, 'cluster_name')}",
        "CLUSTER_ENDPOINT": endpoint if endpoint.startswith("https://") else f"https://{endpoint}",
        "CLUSTER_CA_DATA": setting(c, "cluster_ca_data"),
        "PUSH_AUDIENCE": ",".join(audiences(plan, c)),
        "PUSH_SERVICE_ACCOUNT": email(created(plan)["google_service_account.push"]),
        "DRY_RUN": str(setting(c, "dry_run")).lower(),
        "FAST_NOT_READY": str(setting(c, "fast_not_ready")).lower(),
        "OUT_OF_SERVICE_NO_SCHEDULE": str(setting(c, "out_of_service_no_schedule")).lower(),
        "MAX_OUT_OF_SERVICE": str(setting(c, "max_out_of_service")),
        "FENCING_MODE": setting(c, "fencing_mode"),
        "CONFIRM_AGAIN_AFTER_SECONDS": str(setting(c, "confirm_again_after_seconds")),
        "VOLUME_DETACH_TIMEOUT_SECONDS": str(setting(c, "volume_detach_timeout_seconds")),
        "RECOVERY_SETTLE_SECONDS": str(setting(c, "recovery_settle_seconds")),
        "NOT_READY_WAIT_SECONDS": str(setting(c, "not_ready_wait_seconds")),
        "RECOVERY": setting(c, "recovery"),
        "CONTROL_NAMESPACE": setting(c, "control_namespace"),
        "LOG_FORMAT": "json",
        "RUST_LOG": setting(c, "log_level"),
        "SERVE_ROUTES": SERVICES[key],
        # The service's own timeout: every wait of a request ends before it.
        "REQUEST_TIMEOUT_SECONDS": str(seconds(service(plan, key=key)["template"][0]["timeout"])),
    }
    if setting(c, "max_out_of_service_percent") is not None:
        want["MAX_OUT_OF_SERVICE_PERCENT"] = str(c["max_out_of_service_percent"])
    if setting(c, "node_selector") is not None:
        want["NODE_SELECTOR"] = setting(c, "node_selector")
    if setting(c, "create_notification_topic"):
        want["NOTIFY_TOPIC"] = f"projects/{T.GCP_PROJECT}/topics/{setting(c, 'name')}-notifications"
    elif setting(c, "notification_topic") is not None:
        want["NOTIFY_TOPIC"] = setting(c, "notification_topic")
    if fencing(c):
        want |= {
            "ACTIVE_FENCING": fencing_value(c),
            "POWER_OFF_AFTER_SECONDS": str(setting(c, "power_off_after_seconds")),
            "POWER_OFF_WAIT_SECONDS": str(setting(c, "power_off_wait_seconds")),
            "PARTITION_PERCENT": str(setting(c, "partition_percent")),
        }
    assert got == want, f"case {case}, {key}: {sorted(set(got.items()) ^ set(want.items()))}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_notifications_are_published_by_the_service_account_to_their_topic_only(workspace: T.Workspace, case: str):
    c = CASES[case]
    resources = created(module_plan(workspace, case))
    member = resources.get("google_pubsub_topic_iam_member.notifications[0]")
    want = values(module_plan(workspace, case)).get("NOTIFY_TOPIC")
    if want is None:
        assert member is None, f"case {case}: {member}"
        return
    assert (member["topic"], member["role"]) == (want, "roles/pubsub.publisher"), f"case {case}: {member}"
    # The one permission the role holds is the one the code needs.
    assert manifest()["notify_gcp_permissions"] == ["pubsub.topics.publish"]
    if setting(c, "create_notification_topic"):
        kept = resources["google_pubsub_subscription.notifications[0]"]
        assert kept["message_retention_duration"] == "604800s", kept


def events_url(plan: dict[str, Any]) -> str:
    """The events service's deterministic URL, https://SERVICE-PROJECT_NUMBER.REGION.run.app."""
    return f"https://{service(plan)['name']}-{T.GCP_PROJECT_NUMBER}.{BASE['region']}.run.app"


def push_audience(plan: dict[str, Any], case: dict[str, Any]) -> str:
    """The push subscription's and the sweep's audience: the case's, or the events service's URL."""
    given = setting(case, "push_audience")
    return given if given is not None else events_url(plan)


def audiences(plan: dict[str, Any], case: dict[str, Any]) -> list[str]:
    """Every audience the module's requests carry, once each: the push
    subscription's and the sweep's, and Eventarc's, which name the events
    service's URL with or without the route's path."""
    found = [push_audience(plan, case)]
    if setting(case, "eventarc"):
        found += [a for a in (events_url(plan), f"{events_url(plan)}/eventarc") if a not in found]
    return found


def service_accepts_audience(url: str) -> bool:
    """An entry of PUSH_AUDIENCE the service starts with, and matches a token
    for exactly as written: audience_url of handler/src/core/inbound/oidc.rs (https,
    a lowercase host, a port 1-65535, a path of plain segments), less the
    trailing '/' it would drop."""
    m = re.fullmatch(r"https://([^/:]+)(?::(\d{1,5}))?((?:/[^/]+)*)", url)
    if not m:
        return False
    host, port, path = m.groups()
    host_ok = len(host) <= 253 and not host.startswith((".", "-")) and re.fullmatch(r"[a-z0-9.-]+", host) is not None
    port_ok = port is None or 0 < int(port) <= 65535
    path_ok = all(s not in (".", "..") and re.fullmatch(r"[A-Za-z0-9._~-]+", s) for s in path.split("/")[1:])
    return host_ok and port_ok and path_ok


def test_the_audience_rule_is_the_services():
    """The rule above refuses what the service refuses at start."""
    for url in ("https://node-fencer-987654321098.europe-west1.run.app", "https://a.example:8443/push/v1", "https://x.example/a.b~c_d-e"):
        assert service_accepts_audience(url), url
    for url in ("node-fencer", "http://a.example", "https://A.example", "https://a.example/", "https://a.example:0", "https://a.example/x/../y", "https://a.example/x?y", "https://-a.example", "https://a.example//x"):
        assert not service_accepts_audience(url), url


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_service_starts_with_the_audiences_it_is_given(workspace: T.Workspace, case: str):
    """Each entry of PUSH_AUDIENCE is a URL the service accepts: it refuses to
    start on any other (a plain name like the module's former "node-fencer")."""
    for key in SERVICES:
        entries = values(module_plan(workspace, case), key=key)["PUSH_AUDIENCE"].split(",")
        refused = [e for e in entries if not service_accepts_audience(e)]
        assert not refused, f"case {case}, {key}: the service refuses to start with PUSH_AUDIENCE entries {refused}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_cloud_run_lets_the_push_tokens_through_to_the_service(workspace: T.Workspace, case: str):
    """Cloud Run's invoker check of the events service refuses, before the
    service sees it, a token whose audience is neither the service's run.app
    URL (with or without a path) nor one of its custom audiences."""
    plan = module_plan(workspace, case)
    resources = created(plan)
    allowed = [events_url(plan), *(service(plan)["custom_audiences"] or [])]
    sent = {"the push subscription": resources["google_pubsub_subscription.push"]["push_config"][0]["oidc_token"][0]["audience"]}
    if "google_cloud_scheduler_job.sweep[0]" in resources:
        sent["the sweep"] = resources["google_cloud_scheduler_job.sweep[0]"]["http_target"][0]["oidc_token"][0]["audience"]
    for who, audience in sent.items():
        assert audience in allowed or audience.startswith(f"{events_url(plan)}/"), f"case {case}: Cloud Run refuses {who}'s tokens for {audience!r} (accepts {allowed})"
    # Only an audience of one's own is added; the webhook service takes no token.
    assert service(plan)["custom_audiences"] == ([c] if (c := setting(CASES[case], "push_audience")) is not None else None)
    assert service(plan, key="webhook")["custom_audiences"] is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_push_audience_names_every_audience_of_the_modules_requests(workspace: T.Workspace, case: str):
    """PUSH_AUDIENCE lists the audience of the push subscription and of the
    sweep first, then those of Eventarc's tokens, each once."""
    plan = module_plan(workspace, case)
    resources = created(plan)
    env = values(plan)["PUSH_AUDIENCE"].split(",")
    subscription = resources["google_pubsub_subscription.push"]["push_config"][0]["oidc_token"][0]["audience"]
    assert subscription in env
    if "google_cloud_scheduler_job.sweep[0]" in resources:
        assert resources["google_cloud_scheduler_job.sweep[0]"]["http_target"][0]["oidc_token"][0]["audience"] in env
    assert env == audiences(plan, CASES[case]), f"case {case}: {env}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_webhook_token_comes_from_secret_manager(workspace: T.Workspace, case: str):
    token = environment(module_plan(workspace, case))["WEBHOOK_TOKEN"]
    assert token["value"] is None, "the token itself never sits in the service's configuration"
    (source,) = token["value_source"]
    (ref,) = source["secret_key_ref"]
    if setting(CASES[case], "webhook_token_secret_id") is not None:
        assert ref == {"secret": OWN_SECRET, "version": "latest"}
    else:
        # The generated secret and its version: known once created.
        assert ref == {}, f"case {case}: {ref}"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("key", sorted(SERVICES))
def test_each_service_runs_serve_with_instances_of_its_own(workspace: T.Workspace, case: str, key: str):
    c = CASES[case]
    plan = module_plan(workspace, case)
    svc = service(plan, key=key)
    name = setting(c, "name")
    assert svc["name"] == (name if key == "events" else f"{name}-webhook")
    # Pub/Sub push and Cloud Scheduler come from outside any VPC: the events
    # service is kept to the push account by its invoker binding instead.
    assert svc["ingress"] == "INGRESS_TRAFFIC_ALL"
    assert svc["location"] == BASE["region"]
    (template,) = svc["template"]
    prefix = "" if key == "events" else "webhook_"
    assert template["scaling"][0]["min_instance_count"] == 0
    assert template["scaling"][0]["max_instance_count"] == setting(c, f"{prefix}max_instances")
    assert template["max_instance_request_concurrency"] == setting(c, f"{prefix}max_instance_request_concurrency")
    (resources,) = container(plan, key=key)["resources"]
    assert resources["cpu_idle"] is True, "CPU only while a request runs: every step is done before the answer"
    assert container(plan, key=key)["args"] == ["serve"] and container(plan, key=key)["image"] == BASE["image"]
    assert (len(template["vpc_access"]) == 1) == (setting(c, "vpc_network") is not None)
    assert template["timeout"] == service(plan)["template"][0]["timeout"]


# --- timeouts ----------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_timeout_is_the_sum_of_the_waits_and_the_acknowledgement_deadline(workspace: T.Workspace, case: str):
    c = CASES[case]
    plan = module_plan(workspace, case)
    # One node's worst case: each of its disks' detach operations followed
    # for up to 60 s (DETACH_WAIT of the Compute Engine client), one after
    # the other.
    want = (
        setting(c, "not_ready_wait_seconds")
        + manifest()["lease_wait_seconds"]
        + setting(c, "confirm_again_after_seconds")
        + (setting(c, "power_off_wait_seconds") if fencing(c) else 0)
        + setting(c, "detach_disks_per_node") * 60
        + setting(c, "volume_detach_timeout_seconds")
        + setting(c, "recovery_settle_seconds")
        + 30
    )
    assert want <= 600, f"case {case}: the waits sum to {want} s, beyond Pub/Sub's 600 s acknowledgement deadline"
    assert seconds(service(plan)["template"][0]["timeout"]) == want
    assert created(plan)["google_pubsub_subscription.push"]["ack_deadline_seconds"] == want


def test_the_longest_waits_fill_pubsubs_600_seconds(workspace: T.Workspace):
    plan = module_plan(workspace, "gcp_eventarc_own_secret_zonal_vpc_longest_waits")
    assert seconds(service(plan)["template"][0]["timeout"]) == 600


# --- the push subscription ------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_push_subscription_carries_the_token_the_service_checks(workspace: T.Workspace, case: str):
    plan = module_plan(workspace, case)
    resources = created(plan)
    subscription = resources["google_pubsub_subscription.push"]
    env = values(plan)
    (push,) = subscription["push_config"]
    (oidc,) = push["oidc_token"]
    assert oidc["audience"] == push_audience(plan, CASES[case]) and oidc["audience"] in env["PUSH_AUDIENCE"].split(",")
    assert oidc["service_account_email"] == env["PUSH_SERVICE_ACCOUNT"] == email(resources["google_service_account.push"])
    assert push["no_wrapper"] == [], "the service reads the push request's message wrapper"
    assert subscription["retry_policy"] == [{"minimum_backoff": "10s", "maximum_backoff": "600s"}]
    (dead_letter,) = subscription["dead_letter_policy"]
    assert dead_letter["max_delivery_attempts"] == setting(CASES[case], "max_delivery_attempts")
    assert "google_pubsub_topic.dead_letter" in configuration(plan, "google_pubsub_subscription.push")["dead_letter_policy"][0]["dead_letter_topic"]["references"]
    assert subscription["expiration_policy"] == [{"ttl": ""}], "the subscription never expires"
    assert "google_pubsub_topic.audit" in configuration(plan, "google_pubsub_subscription.push")["topic"]["references"]
    # The dead letters are kept for reading.
    assert resources["google_pubsub_subscription.dead_letter"]["message_retention_duration"] == "604800s"


def test_the_sweep_posts_to_its_route_with_the_token_the_service_checks(workspace: T.Workspace):
    plan = module_plan(workspace, "gcp_defaults")
    resources = created(plan)
    job = resources["google_cloud_scheduler_job.sweep[0]"]
    env = values(plan)
    (target,) = job["http_target"]
    assert target["http_method"] == "POST"
    (oidc,) = target["oidc_token"]
    assert oidc["audience"] == env["PUSH_AUDIENCE"]
    assert oidc["service_account_email"] == env["PUSH_SERVICE_ACCOUNT"]
    assert job["schedule"] == setting(CASES["gcp_defaults"], "sweep_schedule")
    assert seconds(job["attempt_deadline"]) == seconds(service(plan)["template"][0]["timeout"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_eventarc_trigger_sends_stop_to_the_eventarc_route(workspace: T.Workspace, case: str):
    resources = created(module_plan(workspace, case))
    if not setting(CASES[case], "eventarc"):
        assert "google_eventarc_trigger.stop[0]" not in resources
        return
    trigger = resources["google_eventarc_trigger.stop[0]"]
    criteria = {m["attribute"]: m["value"] for m in trigger["matching_criteria"]}
    assert criteria == {"type": "google.cloud.audit.log.v1.written", "serviceName": "compute.googleapis.com", "methodName": "v1.compute.instances.stop"}
    (run,) = trigger["destination"][0]["cloud_run_service"]
    assert run["path"] == "/eventarc" and run["region"] == BASE["region"]
    assert run["service"] == service(module_plan(workspace, case))["name"], "Eventarc calls the events service"
    assert trigger["service_account"] == email(resources["google_service_account.push"])
    # The zonal cluster's region: a regional trigger sees that region's VMs.
    assert trigger["location"] == re.sub(r"-[a-z]$", "", setting(CASES[case], "cluster_location"))


# --- the sink ------------------------------------------------------------------------

DOWN = ["v1.compute.instances.stop", "v1.compute.instances.delete", "beta.compute.instances.stop", "beta.compute.instances.delete"]
UP = ["v1.compute.instances.start", "v1.compute.instances.resume"]
SYSTEM_EVENTS = [
    "compute.instances.guestTerminate",
    "compute.instances.preempted",
    "compute.instances.hostError",
    "compute.instances.terminateOnHostMaintenance",
]


def sink_filter(plan: dict[str, Any]) -> str:
    sink = created(plan)["google_logging_project_sink.this"]
    assert sink["unique_writer_identity"] is True
    return sink["filter"]


def fixture_entries() -> list[dict[str, Any]]:
    """The audit log entries of the trigger fixtures, as the routes receive them."""
    entries = []
    for path in sorted(L.GCE_FIXTURES.glob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        if path.name.endswith(".pubsub.json"):
            entries.append(json.loads(base64.b64decode(body["message"]["data"])))
        else:
            entries.append(body["body"])
    assert len(entries) >= 3, f"too few fixtures in {L.rel(L.GCE_FIXTURES)}"
    return entries


def entry(method: str, name: str, operation: dict[str, Any] | None) -> dict[str, Any]:
    found = copy.deepcopy(fixture_entries()[0])
    found["protoPayload"]["methodName"] = method
    found["protoPayload"]["resourceName"] = f"projects/{T.GCP_PROJECT}/zones/europe-west1-b/instances/{name}"
    found.pop("operation", None)
    if operation is not None:
        found["operation"] = operation
    return found


def node_name(case: dict[str, Any]) -> str:
    """A VM name of the case's cluster, as GKE names nodes (the cluster's name
    shortened to 20 characters at most)."""
    return f"gke-{setting(case, 'cluster_name')[:20]}-default-pool-1a2b3c4d-x7k9"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_sink_names_every_method_the_code_acts_on(workspace: T.Workspace, case: str):
    text = sink_filter(module_plan(workspace, case))
    assert 'resource.type="gce_instance"' in text
    for method in DOWN + UP + SYSTEM_EVENTS:
        assert f'protoPayload.methodName="{method}"' in text, f"case {case}: {method} is not in the sink filter"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_sink_lets_through_what_the_code_acts_on_and_nothing_else(workspace: T.Workspace, case: str):
    c = CASES[case]
    admits = F.compile_filter(sink_filter(module_plan(workspace, case)))
    node = node_name(c)
    last = {"id": "operation-1", "producer": "compute.googleapis.com", "last": True}
    first = {"id": "operation-1", "producer": "compute.googleapis.com", "first": True}
    for method in DOWN + UP:
        assert admits(entry(method, node, last)), f"case {case}: the end of {method} is filtered out"
        assert not admits(entry(method, node, first)), f"case {case}: the start of {method} gets through"
        assert not admits(entry(method, node, None)), f"case {case}: {method} without an operation gets through"
    for method in SYSTEM_EVENTS:
        assert admits(entry(method, node, None)), f"case {case}: {method} with no operation is filtered out"
        assert admits(entry(method, node, {"id": "systemevent-1", "first": True, "last": True})), f"case {case}: {method} is filtered out"
    for method in ("v1.compute.instances.reset", "v1.compute.instances.setMetadata", "v1.compute.disks.delete", "alpha.compute.instances.stopped"):
        assert not admits(entry(method, node, last)), f"case {case}: {method} gets through"
    disk = entry("v1.compute.instances.stop", node, last)
    disk["resource"]["type"] = "gce_disk"
    assert not admits(disk), f"case {case}: an entry of another resource type gets through"
    other = entry("v1.compute.instances.stop", "gke-other-default-pool-1a2b3c4d-x7k9", last)
    prefix = setting(c, "instance_name_prefix")
    assert admits(other) == (prefix == ""), f"case {case}: another cluster's VM {'is filtered out' if prefix == '' else 'gets through'}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_sink_takes_the_fixtures_of_the_trigger_routes(workspace: T.Workspace, case: str):
    """The entries the code's own fixtures hold get through, for a VM of the case's cluster."""
    admits = F.compile_filter(sink_filter(module_plan(workspace, case)))
    for found in fixture_entries():
        found["protoPayload"]["resourceName"] = re.sub(r"/instances/.*", f"/instances/{node_name(CASES[case])}", found["protoPayload"]["resourceName"])
        assert admits(found), f"case {case}: {found['protoPayload']['methodName']} of the fixtures is filtered out"


def test_a_long_cluster_name_is_matched_by_its_first_16_characters(workspace: T.Workspace):
    admits = F.compile_filter(sink_filter(module_plan(workspace, LONG_NAMES)))
    last = {"id": "operation-1", "last": True}
    # GKE shortens long cluster names in its VM names.
    assert admits(entry("v1.compute.instances.stop", "gke-payments-product-default-pool-1a2b3c4d-x7k9", last))
    assert not admits(entry("v1.compute.instances.stop", "gke-payroll-default-pool-1a2b3c4d-x7k9", last))


def test_the_filter_evaluator_refuses_what_it_cannot_read():
    """The evaluator's own teeth: AND and OR mixed without parentheses, an
    unknown operator, an unclosed parenthesis are errors, not matches."""
    for text in ('a="1" AND b="2" OR c="3"', 'a>"1"', '(a="1" AND b="2"', 'a="1" b="2"'):
        with pytest.raises(F.FilterError):
            F.compile_filter(text)
    assert F.compile_filter('(a="1" AND b.c:"X") OR NOT d="true"')({"a": "1", "b": {"c": "wxy"}, "d": True})


# --- the GKE example -------------------------------------------------------------------

PREFIX = "module.node_fencer."


def example_plan(ws: T.Workspace) -> dict[str, Any]:
    return T.plan_of(ws, "examples/gke", "gke", {}, "terraform.tfvars.example")


def test_the_gke_example_plans_the_module_and_binds_the_service_account_as_a_user(workspace: T.Workspace):
    plan = example_plan(workspace)
    got = set(T.resources(plan))
    # The example turns the notifications on by default.
    want = {f"{PREFIX}{a}" for a in expected_resources({"create_notification_topic": True})} | {
        "module.rbac.kubernetes_cluster_role_v1.this",
        "module.rbac.kubernetes_cluster_role_binding_v1.this",
        "module.rbac.kubernetes_cluster_role_binding_v1.users[0]",
        'module.rbac.kubernetes_role_v1.this["kube-system/node-fencer"]',
        'module.rbac.kubernetes_role_binding_v1.this["kube-system/node-fencer"]',
        'module.rbac.kubernetes_role_binding_v1.users["kube-system/node-fencer"]',
        'module.rbac.kubernetes_role_v1.this["kube-node-lease/node-fencer"]',
        'module.rbac.kubernetes_role_binding_v1.this["kube-node-lease/node-fencer"]',
        'module.rbac.kubernetes_role_binding_v1.users["kube-node-lease/node-fencer"]',
    }
    assert got == want, f"planned but not expected {sorted(got - want)}, expected but not planned {sorted(want - got)}"
    resources = {a: c["change"]["after"] for a, c in T.resources(plan).items()}
    runs_as = resources[f"{PREFIX}{EVENTS}"]["template"][0]["service_account"]
    user = [f"{s['kind']}/{s['name']}" for s in resources["module.rbac.kubernetes_cluster_role_binding_v1.users[0]"]["subject"]]
    assert user == [f"User/{runs_as}"], f"the ClusterRole binds {user}, the service runs as {runs_as}"
    role_user = [f"{s['kind']}/{s['name']}" for s in resources['module.rbac.kubernetes_role_binding_v1.users["kube-system/node-fencer"]']["subject"]]
    assert role_user == [f"User/{runs_as}"]


def test_the_gke_example_passes_the_clusters_endpoint_and_ca(workspace: T.Workspace):
    plan = example_plan(workspace)
    got = {a.removeprefix(PREFIX): c for a, c in T.resources(plan).items()}
    env = {e["name"]: e["value"] for e in got[EVENTS]["change"]["after"]["template"][0]["containers"][0]["env"]}
    cluster = json.loads(T.DATA_SOURCES.read_text(encoding="utf-8"))["google_container_cluster"]
    assert env["GKE_CLUSTER"] == f"projects/{T.GCP_PROJECT}/locations/europe-west1/clusters/prod"
    assert env["CLUSTER_ENDPOINT"] == f"https://{cluster['endpoint']}"
    assert env["CLUSTER_CA_DATA"] == cluster["master_auth"][0]["cluster_ca_certificate"]
    assert env["DRY_RUN"] == "true", "the example starts in dry-run"


# --- log-based metrics and the dashboard -------------------------------------------


def catalog() -> dict[str, dict[str, Any]]:
    """The metrics the code emits, from the manifest: name -> unit and dimensions."""
    return {m["name"]: m for m in manifest()["metrics"]["metrics"]}


def test_the_log_based_metrics_are_the_manifests_catalog(workspace: T.Workspace):
    """One log-based metric per metric the code writes on Cloud Run, with a
    label per dimension (Function included), a counter for a count and a
    distribution of `value` for a latency, reading only both services' entries
    of that metric."""
    plan = module_plan(workspace, "gcp_defaults")
    resources = created(plan)
    found = {r["name"].split("/", 1)[1]: r for a, r in resources.items() if a.startswith("google_logging_metric.this[")}
    want = catalog()
    assert set(found) == set(want), f"log-based metrics {sorted(found)}, the code emits {sorted(want)}"
    services = [service(plan, key=key)["name"] for key in SERVICES]
    for name, metric in found.items():
        descriptor = metric["metric_descriptor"][0]
        dims = want[name]["dimensions"]
        assert sorted(label["key"] for label in descriptor["labels"]) == sorted(dims), name
        assert metric["label_extractors"] == {d: f"EXTRACT(jsonPayload.{d})" for d in dims}, name
        latency = want[name]["unit"] == "Milliseconds"
        assert descriptor["value_type"] == ("DISTRIBUTION" if latency else "INT64"), name
        assert (metric.get("value_extractor") == "EXTRACT(jsonPayload.value)") == latency, name
        assert f'jsonPayload.metric="{name}"' in metric["filter"], metric["filter"]
        assert all(f'"{svc}"' in metric["filter"] for svc in services), metric["filter"]


def test_the_dashboard_reads_only_metrics_the_code_emits(workspace: T.Workspace):
    """Each chart's metric is a log-based metric of the module, and each label
    it groups or filters by is a dimension of that metric in the manifest;
    every metric is on the dashboard."""
    plan = module_plan(workspace, "gcp_defaults")
    resources = created(plan)
    names = {r["name"]: r["name"].split("/", 1)[1] for a, r in resources.items() if a.startswith("google_logging_metric.this[")}
    dashboard = json.loads(resources["google_monitoring_dashboard.this"]["dashboard_json"])
    want = catalog()
    shown: set[str] = set()
    tiles = dashboard["mosaicLayout"]["tiles"]
    assert tiles, "an empty dashboard"
    for tile in tiles:
        for data in tile["widget"]["xyChart"]["dataSets"]:
            query = data["timeSeriesQuery"]["timeSeriesFilter"]
            m = re.search(r'metric\.type="logging\.googleapis\.com/user/([^"]+)"', query["filter"])
            assert m and m.group(1) in names, f"{tile['widget']['title']}: {query['filter']}"
            metric = names[m.group(1)]
            used = {f.removeprefix("metric.label.") for f in query["aggregation"]["groupByFields"]}
            used |= set(re.findall(r"metric\.label\.([A-Za-z]+)=", query["filter"]))
            assert used <= set(want[metric]["dimensions"]), f"{tile['widget']['title']}: {sorted(used)} of {metric}"
            shown.add(metric)
    assert shown == set(want), f"not on the dashboard: {sorted(set(want) - shown)}"
    # No two tiles overlap on the 12-column grid.
    cells = [(t["xPos"] + dx, t["yPos"] + dy) for t in tiles for dx in range(t["width"]) for dy in range(t["height"])]
    assert len(cells) == len(set(cells)) and all(x < 12 for x, _ in cells)


def test_the_dashboard_picture_is_drawn_from_its_definition(workspace: T.Workspace):
    """docs/dashboard-gcp.svg is the layout the module plans, as
    tests/infra/dashboard_picture.py draws it."""
    import os

    import dashboard_picture

    planned = created(module_plan(workspace, "gcp_defaults"))["google_monitoring_dashboard.this"]
    drawn = dashboard_picture.draw_gcp(json.loads(planned["dashboard_json"]))
    picture = dashboard_picture.GCP_PICTURE
    if os.environ.get("NODE_FENCER_WRITE_PICTURES") == "1":
        picture.write_text(drawn, encoding="utf-8")
    assert picture.is_file() and picture.read_text(encoding="utf-8") == drawn, (
        f"{L.rel(picture)} is stale: run NODE_FENCER_WRITE_PICTURES=1 make infra-test"
    )
