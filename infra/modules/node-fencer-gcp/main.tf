# node-fencer on Google Cloud: the same binary as on AWS, run by Cloud Run as
# an HTTP server (`node-fencer serve`). Compute Engine's audit log entries of
# the cluster's node VMs reach it through a Logging sink, a Pub/Sub topic and a
# push subscription (/pubsub), optionally through Eventarc (/eventarc), and
# Alertmanager's webhook reaches it with a bearer token (/alertmanager) on a
# second service of its own, <name>-webhook: the only public one, whose
# callers cannot take the instances the event routes need.

# The fencing policy both platforms share: validated once there, rendered as
# the environment the binary reads (infra/modules/settings).
module "settings" {
  source = "../settings"

  dry_run                       = var.dry_run
  fast_not_ready                = var.fast_not_ready
  out_of_service_no_schedule    = var.out_of_service_no_schedule
  max_out_of_service            = var.max_out_of_service
  max_out_of_service_percent    = var.max_out_of_service_percent
  node_selector                 = var.node_selector
  fencing_mode                  = var.fencing_mode
  control_namespace             = var.control_namespace
  confirm_again_after_seconds   = var.confirm_again_after_seconds
  volume_detach_timeout_seconds = var.volume_detach_timeout_seconds
  not_ready_wait_seconds        = var.not_ready_wait_seconds
  recovery_settle_seconds       = var.recovery_settle_seconds
  recovery                      = var.recovery
  log_format                    = var.log_format
  log_level                     = var.log_level
}

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  # Active fencing: "stuck" or "on" (true and false, as the variable once
  # was, are "on" and "off"); the code takes "stuck" and "on".
  active_fencing       = contains(["stuck", "on", "true"], var.active_fencing)
  active_fencing_scope = var.active_fencing == "stuck" ? "stuck" : "on"

  cluster_id       = "projects/${var.project_id}/locations/${var.cluster_location}/clusters/${var.cluster_name}"
  cluster_endpoint = startswith(var.cluster_endpoint, "https://") ? var.cluster_endpoint : "https://${var.cluster_endpoint}"
  # The region of a zonal cluster's zone, or the regional cluster's own.
  cluster_region = replace(var.cluster_location, "/-[a-z]$/", "")

  # Pub/Sub's service agent: it signs the push requests' OIDC tokens as the
  # push service account, and moves undeliverable messages to the dead-letter
  # topic.
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  # The service accounts' emails, known before the accounts exist (a plan
  # shows them): the service runs as the first, which the cluster knows as
  # the Kubernetes user of that name; PUSH_SERVICE_ACCOUNT and the push
  # subscription's OIDC token name the second.
  service_account_email      = "${var.name}@${var.project_id}.iam.gserviceaccount.com"
  push_service_account_email = "${var.name}-push@${var.project_id}.iam.gserviceaccount.com"

  # How long a request waits for another one to release the fencing Lease
  # before it gives up (LEASE_WAIT in handler/src/core/rules/control.rs).
  lease_wait_seconds = 30

  # How long the service follows one Compute Engine detach operation before
  # it counts as failed (DETACH_WAIT in handler/src/shell/cloud/gce.rs); one
  # node's disks are detached one after the other.
  detach_operation_wait_seconds = 60

  # With active fencing, how long a request waits for a VM it stopped to be
  # TERMINATED (the stop's operation followed within it).
  power_off_wait_seconds = local.active_fencing ? var.power_off_wait_seconds : 0

  # The worst case of one node in one request, wait by wait: a Node still
  # Ready although its VM is off, the Lease, with active fencing the wait for
  # a stopped VM, the second Compute Engine confirmation, each of detach_disks_per_node detach operations followed
  # to its end, the wait for the disks to be free, a requested recovery's
  # settle delay, plus 30 s for the calls around them. The service bounds
  # its own work by the request's remaining time: a node with more disks, or
  # a second node, is finished by a later delivery. The request timeout is
  # also the push subscription's acknowledgement deadline, which Pub/Sub caps
  # at 600 s (Cloud Run would allow 3600 s): a plan whose settings add up to
  # more fails (a precondition of the services).
  request_timeout_seconds     = var.not_ready_wait_seconds + local.lease_wait_seconds + local.power_off_wait_seconds + var.confirm_again_after_seconds + var.detach_disks_per_node * local.detach_operation_wait_seconds + var.volume_detach_timeout_seconds + var.recovery_settle_seconds + 30
  max_request_timeout_seconds = 600

  # The Compute Engine and GKE permissions the code needs, and nothing else.
  # The list must equal gcp_permissions of infra/manifest.json;
  # tests/infra checks it. The ones that change a VM are granted apart, on
  # the cluster's node VMs alone (google_project_iam_member.node_vms): the
  # detach, and with active fencing the stop (power_off_gcp_permissions of
  # the manifest); the reads, project-wide.
  gcp_permissions = [
    "compute.disks.get",
    "compute.instances.detachDisk",
    "compute.instances.get",
    "compute.zoneOperations.get",
    "container.clusters.get",
  ]
  power_off_permissions = ["compute.instances.stop"]
  node_vm_permissions   = concat(["compute.instances.detachDisk"], local.active_fencing ? local.power_off_permissions : [])
  read_permissions      = sort(setsubtract(local.gcp_permissions, local.node_vm_permissions))

  # The audit log methods the service acts on. API calls write two entries,
  # the first when the call is accepted and the last (operation.last) once
  # the VM is down or up again: only the last counts. System events (no
  # version prefix) are written once, with no operation.
  down_methods = [
    "v1.compute.instances.stop",
    "v1.compute.instances.delete",
    "beta.compute.instances.stop",
    "beta.compute.instances.delete",
  ]
  up_methods = [
    "v1.compute.instances.start",
    "v1.compute.instances.resume",
  ]
  system_event_methods = [
    "compute.instances.guestTerminate",
    "compute.instances.preempted",
    "compute.instances.hostError",
    "compute.instances.terminateOnHostMaintenance",
  ]

  # GKE names node VMs gke-<cluster>-<pool>-<hash>-<suffix>, shortening long
  # cluster names: past 16 characters only the first 16 are relied on.
  instance_name_prefix = var.instance_name_prefix != null ? var.instance_name_prefix : (
    length(var.cluster_name) <= 16 ? "gke-${var.cluster_name}-" : "gke-${substr(var.cluster_name, 0, 16)}"
  )

  # Logging's query language binds OR tighter than AND: every group is in
  # parentheses, so the filter means the same either way. The last entry of an
  # API call, or any system event.
  api_calls_filter     = "((${join(" OR ", [for m in concat(local.down_methods, local.up_methods) : "protoPayload.methodName=\"${m}\""])}) AND operation.last=\"true\")"
  system_events_filter = "(${join(" OR ", [for m in local.system_event_methods : "protoPayload.methodName=\"${m}\""])})"
  sink_filter = join(" AND ", concat(
    ["resource.type=\"gce_instance\""],
    local.instance_name_prefix != "" ? ["protoPayload.resourceName:\"/instances/${local.instance_name_prefix}\""] : [],
    ["(${local.api_calls_filter} OR ${local.system_events_filter})"],
  ))

  # IAM Conditions see a VM by its resource name,
  # projects/P/zones/Z/instances/NAME; Compute Engine supports conditions on
  # resource names (not on labels). Null: no condition, every VM of the
  # project (instance_name_prefix "").
  node_vm_condition = local.instance_name_prefix != "" ? "resource.type == \"compute.googleapis.com/Instance\" && resource.name.extract(\"/instances/{name}\").startsWith(\"${local.instance_name_prefix}\")" : null

  webhook_token_secret  = var.webhook_token_secret_id != null ? var.webhook_token_secret_id : google_secret_manager_secret.webhook_token[0].id
  webhook_token_version = var.webhook_token_secret_id != null ? "latest" : google_secret_manager_secret_version.webhook_token[0].version

  # A Cloud Run service's deterministic URL, known before the service exists:
  # https://SERVICE-PROJECT_NUMBER.REGION.run.app (given to names short
  # enough, as these are). An Eventarc trigger's tokens name the URL of its
  # destination, which it sets to the service's, with the route's path.
  events_service_url = "https://${var.name}-${data.google_project.this.number}.${var.region}.run.app"

  # The push subscription's and the sweep's audience. The service's own URL
  # needs no custom audience: Cloud Run's invoker check accepts it.
  push_audience = var.push_audience != null ? var.push_audience : local.events_service_url

  # Every audience the module's own requests carry: the push subscription's
  # and the sweep's, and with Eventarc its trigger's.
  push_audiences = distinct(concat(
    [local.push_audience],
    var.eventarc ? [local.events_service_url, "${local.events_service_url}/eventarc"] : [],
  ))

  # The topic the notifications go to: the one given, the one created, or
  # none. The created topic's name is spelt out, so that the plan shows it.
  notification_topic = var.create_notification_topic ? "projects/${google_pubsub_topic.notifications[0].project}/topics/${google_pubsub_topic.notifications[0].name}" : var.notification_topic

  environment = merge(
    module.settings.environment,
    # The code refuses the power-off settings without ACTIVE_FENCING=stuck or
    # on: all four, or none. GKE's control plane has no Nodes: no
    # POWER_OFF_CONTROL_PLANE here.
    local.active_fencing ? {
      ACTIVE_FENCING          = local.active_fencing_scope
      POWER_OFF_AFTER_SECONDS = tostring(var.power_off_after_seconds)
      POWER_OFF_WAIT_SECONDS  = tostring(var.power_off_wait_seconds)
      PARTITION_PERCENT       = tostring(var.partition_percent)
    } : {},
    local.notification_topic != null ? { NOTIFY_TOPIC = local.notification_topic } : {},
    {
      GKE_CLUSTER          = local.cluster_id
      CLUSTER_ENDPOINT     = local.cluster_endpoint
      CLUSTER_CA_DATA      = var.cluster_ca_data
      PUSH_AUDIENCE        = join(",", local.push_audiences)
      PUSH_SERVICE_ACCOUNT = local.push_service_account_email
      # The services' request timeout: every wait of a request ends before
      # Cloud Run stops waiting for its answer.
      REQUEST_TIMEOUT_SECONDS = tostring(local.request_timeout_seconds)
    },
  )

  # The two services: one image, one account, one environment but
  # SERVE_ROUTES, so both fence alike. "events" takes the push subscription,
  # the sweep and Eventarc, and only the push account may invoke it. "webhook"
  # answers Alertmanager, who cannot present a Google identity, so anyone may
  # invoke it: its callers, with the token or refused, use up its own
  # instances, never those of the event routes. SERVE_ROUTES keeps each to
  # its own routes: the other service's answer 404 there.
  services = {
    events = {
      name                             = var.name
      description                      = "Fences dead Kubernetes nodes of ${var.cluster_name} (out-of-service taint, disk detach) only when Compute Engine confirms the VM is off, and ends the fencing once the node is back: the audit log entries, the sweep and Eventarc."
      routes                           = "events"
      max_instances                    = var.max_instances
      max_instance_request_concurrency = var.max_instance_request_concurrency
    }
    webhook = {
      name                             = "${var.name}-webhook"
      description                      = "node-fencer for Alertmanager's webhook of ${var.cluster_name}: same image and settings as ${var.name}, with instances of its own so that its public callers never hold up ${var.name}."
      routes                           = "alertmanager"
      max_instances                    = var.webhook_max_instances
      max_instance_request_concurrency = var.webhook_max_instance_request_concurrency
    }
  }

  alertmanager_url = "${google_cloud_run_v2_service.this["webhook"].uri}/alertmanager"
}

################################################################################
# Service account and its custom role
################################################################################

resource "google_service_account" "this" {
  project      = var.project_id
  account_id   = var.name
  display_name = "node-fencer (${var.name})"
  description  = "Identity of the Cloud Run service ${var.name}: Compute Engine through the custom role, the cluster as the Kubernetes user of this email."

  lifecycle {
    postcondition {
      condition     = self.email == local.service_account_email
      error_message = "The service account's email is not the one the service and the RBAC binding were given."
    }
  }
}

resource "google_project_iam_custom_role" "this" {
  project     = var.project_id
  role_id     = replace(var.name, "-", "_")
  title       = "node-fencer (${var.name})"
  description = "The Compute Engine and GKE reads node-fencer makes: a VM and its disks, the zone operation of a detach, the cluster."
  permissions = local.read_permissions
}

resource "google_project_iam_member" "this" {
  project = var.project_id
  role    = google_project_iam_custom_role.this.name
  member  = google_service_account.this.member
}

# The one write, on the cluster's node VMs only: a condition on the VM's
# name, which GKE starts with gke-<cluster>- (instance_name_prefix). A role of
# its own, so that the condition does not also hold back the reads.
resource "google_project_iam_custom_role" "node_vms" {
  project     = var.project_id
  role_id     = "${replace(var.name, "-", "_")}_node_vms"
  title       = "node-fencer node VMs (${var.name})"
  description = local.active_fencing ? "What node-fencer changes, granted on the cluster's node VMs only: detach a disk from a VM that is off, stop a hung node's VM (active fencing)." : "What node-fencer changes, granted on the cluster's node VMs only: detach a disk from a VM that is off."
  permissions = local.node_vm_permissions
}

resource "google_project_iam_member" "node_vms" {
  project = var.project_id
  role    = google_project_iam_custom_role.node_vms.name
  member  = google_service_account.this.member

  dynamic "condition" {
    for_each = local.node_vm_condition != null ? [local.node_vm_condition] : []

    content {
      title       = "${var.name}: node VMs of ${var.cluster_name}"
      description = "VMs whose name starts with ${local.instance_name_prefix}."
      expression  = condition.value
    }
  }
}

################################################################################
# Alertmanager webhook token (Secret Manager)
################################################################################

resource "random_password" "webhook_token" {
  count = var.webhook_token_secret_id == null ? 1 : 0

  # Letters and digits only: the token goes into an HTTP header and a file.
  length  = 48
  special = false
}

# Rotate with `terraform apply -replace=module.<name>.random_password.webhook_token[0]`:
# a new version, which the service reads from its next revision on, and roll
# the Alertmanager secret with it.
resource "google_secret_manager_secret" "webhook_token" {
  count = var.webhook_token_secret_id == null ? 1 : 0

  project   = var.project_id
  secret_id = "${var.name}-webhook-token"
  labels    = var.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "webhook_token" {
  count = var.webhook_token_secret_id == null ? 1 : 0

  secret      = google_secret_manager_secret.webhook_token[0].id
  secret_data = random_password.webhook_token[0].result
}

# The service account reads this one secret, nothing else of Secret Manager.
resource "google_secret_manager_secret_iam_member" "webhook_token" {
  project   = var.project_id
  secret_id = local.webhook_token_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.this.member
}

################################################################################
# Cloud Run service
################################################################################

resource "google_cloud_run_v2_service" "this" {
  for_each = local.services

  project     = var.project_id
  name        = each.value.name
  location    = var.region
  description = each.value.description
  labels      = var.labels

  # Both from everywhere: Pub/Sub push and Cloud Scheduler reach the events
  # service from outside any VPC (internal-only ingress would refuse them),
  # and Alertmanager calls the webhook service from wherever it runs. What
  # keeps the events service to the push account is its invoker binding;
  # the service itself authenticates every route as well (OIDC tokens of
  # the push service account on /pubsub, /eventarc and /sweep, the bearer
  # token on /alertmanager).
  ingress             = "INGRESS_TRAFFIC_ALL"
  deletion_protection = var.deletion_protection

  # Cloud Run's invoker check refuses a token whose audience is neither the
  # service's run.app URL nor one of these: a push_audience of one's own.
  custom_audiences = each.key == "events" && var.push_audience != null ? [var.push_audience] : null

  template {
    service_account                  = local.service_account_email
    timeout                          = "${local.request_timeout_seconds}s"
    max_instance_request_concurrency = each.value.max_instance_request_concurrency

    scaling {
      min_instance_count = 0
      max_instance_count = each.value.max_instances
    }

    containers {
      image = var.image
      args  = ["serve"]

      resources {
        limits = {
          cpu    = var.cpu
          memory = var.memory
        }
        # CPU only while a request is handled: everything is done before the answer.
        cpu_idle = true
      }

      dynamic "env" {
        for_each = merge(local.environment, { SERVE_ROUTES = each.value.routes })

        content {
          name  = env.key
          value = env.value
        }
      }

      env {
        name = "WEBHOOK_TOKEN"

        value_source {
          secret_key_ref {
            secret  = local.webhook_token_secret
            version = local.webhook_token_version
          }
        }
      }
    }

    dynamic "vpc_access" {
      for_each = var.vpc_network != null ? [true] : []

      content {
        egress = "PRIVATE_RANGES_ONLY"

        network_interfaces {
          network    = var.vpc_network
          subnetwork = var.vpc_subnetwork
        }
      }
    }
  }

  lifecycle {
    precondition {
      condition     = local.request_timeout_seconds <= local.max_request_timeout_seconds
      error_message = "The waits of one request add up to ${local.request_timeout_seconds} s (not_ready_wait_seconds ${var.not_ready_wait_seconds} + the Lease ${local.lease_wait_seconds} + power_off_wait_seconds with active_fencing ${local.power_off_wait_seconds} + confirm_again_after_seconds ${var.confirm_again_after_seconds} + detach_disks_per_node ${var.detach_disks_per_node} x ${local.detach_operation_wait_seconds} + volume_detach_timeout_seconds ${var.volume_detach_timeout_seconds} + recovery_settle_seconds ${var.recovery_settle_seconds} + 30), more than the ${local.max_request_timeout_seconds} s Pub/Sub allows for an acknowledgement, which the request timeout is: lower some of them."
    }
    precondition {
      condition     = (var.vpc_network == null) == (var.vpc_subnetwork == null)
      error_message = "vpc_network and vpc_subnetwork go together."
    }
  }

  # Cloud Run checks at deployment that the service account exists and may
  # read the secret (both bindings name the account); the roles must be in
  # place before the first request.
  depends_on = [google_secret_manager_secret_iam_member.webhook_token, google_project_iam_member.this, google_project_iam_member.node_vms]
}

# The service was a single resource before the webhook service joined it.
moved {
  from = google_cloud_run_v2_service.this
  to   = google_cloud_run_v2_service.this["events"]
}

# Public, the webhook service alone: Alertmanager cannot present a Google
# identity token, and Cloud Run's IAM check would refuse it before the
# service's own. The service refuses every request on /alertmanager without
# the bearer token (and on the event routes without an OIDC token of the push
# service account). (checkov's check of public Cloud Run services,
# CKV_GCP_102, knows only the v1 IAM resources; should it learn this one, its
# skip belongs here with that reason.)
resource "google_cloud_run_v2_service_iam_member" "public" {
  project  = var.project_id
  location = google_cloud_run_v2_service.this["webhook"].location
  name     = google_cloud_run_v2_service.this["webhook"].name
  role     = "roles/run.invoker"
  member   = "allUsers"
}

# The events service: only the push service account may invoke it, the
# identity of the push subscription, the sweep and Eventarc. Cloud Run refuses
# every other caller before the service sees the request.
resource "google_cloud_run_v2_service_iam_member" "push" {
  project  = var.project_id
  location = google_cloud_run_v2_service.this["events"].location
  name     = google_cloud_run_v2_service.this["events"].name
  role     = "roles/run.invoker"
  member   = google_service_account.push.member
}

################################################################################
# The identity of the push requests: Pub/Sub (and Eventarc) sign OIDC tokens
# as this account, which the service requires (PUSH_SERVICE_ACCOUNT).
################################################################################

resource "google_service_account" "push" {
  project      = var.project_id
  account_id   = "${var.name}-push"
  display_name = "node-fencer push (${var.name})"
  description  = "Identity of the Pub/Sub push and Eventarc requests to ${var.name}; it holds no role of its own."

  lifecycle {
    postcondition {
      condition     = self.email == local.push_service_account_email
      error_message = "The push service account's email is not the PUSH_SERVICE_ACCOUNT the service was given."
    }
  }
}

resource "google_service_account_iam_member" "push_token_creator" {
  service_account_id = google_service_account.push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

################################################################################
# Notifications: one message per fencing, refusal, power-off and recovery
################################################################################

resource "google_pubsub_topic" "notifications" {
  #checkov:skip=CKV_GCP_83:The messages name nodes, machines and decisions, no secrets; Google-managed encryption applies, a customer key would need a key policy of the deployer's own.
  count = var.create_notification_topic ? 1 : 0

  project = var.project_id
  name    = "${var.name}-notifications"
  labels  = var.labels

  lifecycle {
    precondition {
      condition     = var.notification_topic == null
      error_message = "create_notification_topic and notification_topic exclude each other: create a topic, or name one."
    }
  }
}

# Keeps every message a week for whoever reads them (gcloud pubsub
# subscriptions pull); a chat or e-mail integration adds its own push
# subscription (docs/notifications.md).
resource "google_pubsub_subscription" "notifications" {
  count = var.create_notification_topic ? 1 : 0

  project                    = var.project_id
  name                       = "${var.name}-notifications"
  topic                      = google_pubsub_topic.notifications[0].id
  labels                     = var.labels
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60

  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_topic_iam_member" "notifications" {
  count = local.notification_topic != null ? 1 : 0

  topic  = local.notification_topic
  role   = "roles/pubsub.publisher"
  member = google_service_account.this.member
}

################################################################################
# Audit logs -> Logging sink -> Pub/Sub -> push subscription -> /pubsub
################################################################################

resource "google_pubsub_topic" "audit" {
  #checkov:skip=CKV_GCP_83:The messages are Compute Engine audit log entries the project's own audit logs already hold; Google-managed encryption applies, a customer key would need a key policy of the deployer's own.
  project = var.project_id
  name    = "${var.name}-gce-audit"
  labels  = var.labels
}

resource "google_logging_project_sink" "this" {
  project                = var.project_id
  name                   = "${var.name}-gce-audit"
  description            = "Compute Engine audit log entries of the node VMs of ${var.cluster_name} that stop, delete, start or resume them, and the system events a VM goes down by, for ${var.name}."
  destination            = "pubsub.googleapis.com/${google_pubsub_topic.audit.id}"
  filter                 = local.sink_filter
  unique_writer_identity = true
}

resource "google_pubsub_topic_iam_member" "sink" {
  project = var.project_id
  topic   = google_pubsub_topic.audit.name
  role    = "roles/pubsub.publisher"
  member  = google_logging_project_sink.this.writer_identity
}

resource "google_pubsub_subscription" "push" {
  project = var.project_id
  name    = "${var.name}-push"
  topic   = google_pubsub_topic.audit.id
  labels  = var.labels

  # Pub/Sub waits this long for the answer before it delivers again: the
  # whole request, every wait included.
  ack_deadline_seconds = local.request_timeout_seconds

  push_config {
    push_endpoint = "${google_cloud_run_v2_service.this["events"].uri}/pubsub"

    oidc_token {
      service_account_email = local.push_service_account_email
      audience              = local.push_audience
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter.id
    max_delivery_attempts = var.max_delivery_attempts
  }

  # Never deleted for inactivity: a quiet cluster has no stopped VMs for months.
  expiration_policy {
    ttl = ""
  }

  depends_on = [google_service_account_iam_member.push_token_creator]
}

################################################################################
# The sweep: Cloud Scheduler -> /sweep, with the push account's OIDC token
################################################################################

# Fences NotReady nodes no entry named (missed, dead-lettered, or consumed
# while the kill switch was on) whose VM is off, and ends the fencing of
# nodes that are back.
resource "google_cloud_scheduler_job" "sweep" {
  count = var.sweep_schedule != null ? 1 : 0

  project          = var.project_id
  region           = var.region
  name             = "${var.name}-sweep"
  description      = "Periodic sweep of ${var.name}: fence NotReady nodes no event named whose VM is off, end the fencing of nodes that are back."
  schedule         = var.sweep_schedule
  time_zone        = "Etc/UTC"
  attempt_deadline = "${local.request_timeout_seconds}s"

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.this["events"].uri}/sweep"

    oidc_token {
      audience              = local.push_audience
      service_account_email = local.push_service_account_email
    }
  }

  retry_config {
    retry_count = 1
  }
}

################################################################################
# Dead letters: entries the service failed on max_delivery_attempts times
################################################################################

resource "google_pubsub_topic" "dead_letter" {
  #checkov:skip=CKV_GCP_83:The messages are Compute Engine audit log entries the project's own audit logs already hold; Google-managed encryption applies, a customer key would need a key policy of the deployer's own.
  project = var.project_id
  name    = "${var.name}-dead-letter"
  labels  = var.labels
}

# Holds the dead letters for reading (a topic without a subscription drops them).
resource "google_pubsub_subscription" "dead_letter" {
  project                    = var.project_id
  name                       = "${var.name}-dead-letter"
  topic                      = google_pubsub_topic.dead_letter.id
  labels                     = var.labels
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60

  expiration_policy {
    ttl = ""
  }
}

# Pub/Sub moves a message to the dead-letter topic as its service agent, which
# must be allowed to publish there and to acknowledge it on the subscription.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  project      = var.project_id
  subscription = google_pubsub_subscription.push.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

################################################################################
# Eventarc (optional): v1.compute.instances.stop to /eventarc
################################################################################

# Eventarc reads the audit logs itself and needs the trigger's account to
# receive events.
resource "google_project_iam_member" "push_event_receiver" {
  count = var.eventarc ? 1 : 0

  project = var.project_id
  role    = "roles/eventarc.eventReceiver"
  member  = google_service_account.push.member
}

# An audit-log trigger matches one method; the sink above carries them all.
# Its location is the cluster's region: a regional trigger receives the
# entries of the resources in that region.
# A trigger cannot be given an OIDC audience: its tokens name the URL of its
# destination (local.events_service_url, with or without the path), which
# PUSH_AUDIENCE lists.
resource "google_eventarc_trigger" "stop" {
  count = var.eventarc ? 1 : 0

  project         = var.project_id
  name            = "${var.name}-instance-stop"
  location        = local.cluster_region
  service_account = local.push_service_account_email
  labels          = var.labels

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.audit.log.v1.written"
  }

  matching_criteria {
    attribute = "serviceName"
    value     = "compute.googleapis.com"
  }

  matching_criteria {
    attribute = "methodName"
    value     = "v1.compute.instances.stop"
  }

  destination {
    cloud_run_service {
      service = google_cloud_run_v2_service.this["events"].name
      region  = google_cloud_run_v2_service.this["events"].location
      path    = "/eventarc"
    }
  }

  depends_on = [google_project_iam_member.push_event_receiver]
}

################################################################################
# Alerts
################################################################################

resource "google_monitoring_alert_policy" "dead_letter" {
  project               = var.project_id
  display_name          = "${var.name}: audit log entries in the dead-letter topic"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = "${google_pubsub_subscription.dead_letter.name} holds messages"

    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND resource.labels.subscription_id = \"${google_pubsub_subscription.dead_letter.name}\" AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Audit log entries for ${var.name} failed ${var.max_delivery_attempts} times and wait in the subscription ${google_pubsub_subscription.dead_letter.name}: a node may not have been fenced or recovered. Read them (`gcloud pubsub subscriptions pull ${google_pubsub_subscription.dead_letter.name} --limit 10`) and the service's logs, then acknowledge them."
  }
}

resource "google_monitoring_alert_policy" "errors" {
  project               = var.project_id
  display_name          = "${var.name}: 5xx answers"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = "${var.name} answered 5xx"

    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND resource.labels.service_name = one_of(${join(", ", [for svc in google_cloud_run_v2_service.this : "\"${svc.name}\""])}) AND metric.type = \"run.googleapis.com/request_count\" AND metric.labels.response_code_class = \"5xx\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "${var.name} answered a request with a server error: a node could not be fenced or recovered yet (Pub/Sub delivers the entry again). Read the service's logs. A refused request (401) is an answer, not an error: a flood of them does not set this off."
  }
}

# A Node whose machine node-fencer could not fence if it died now (the witness
# round that ends each sweep: a permission the service account lost, a VM the
# project does not have), in the sweeps of 15 minutes running.
resource "google_monitoring_alert_policy" "witness" {
  project               = var.project_id
  display_name          = "${var.name}: a Node it could not fence now"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = "${var.name}'s witness fails for a Node"

    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.this["WitnessFailures"].name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "900s"

      aggregations {
        alignment_period     = "900s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "${var.name} could not fence some Node if it died now: the witness round of its sweeps fails for it. The WitnessFailing Events on those Nodes, and the sweep's report (witness.failing), say why and what mends it; node-fencer preflight checks the permissions."
  }
}

################################################################################
# Log-based metrics and the dashboard
################################################################################

locals {
  # The metrics of infra/manifest.json, as the services write them to Cloud
  # Logging (one entry per unit counted, one per latency with its value in
  # `value`): each dimension is a label of the log-based metric, `Function`
  # the service's name. The infra tests hold this table to the manifest.
  log_metrics = {
    Suspects        = ["Trigger"]
    Decisions       = ["Outcome", "Reason"]
    PowerOffs       = ["PowerOutcome", "Reason"]
    Recoveries      = ["RecoveryOutcome", "Reason"]
    Errors          = ["Dependency"]
    VolumesDetached = []
    WitnessFailures = []
    ConfirmLatency  = []
    TaintLatency    = []
    DetachLatency   = []
    VerifyLatency   = []
  }
  latencies = ["ConfirmLatency", "TaintLatency", "DetachLatency", "VerifyLatency"]

  service_names = join(" OR ", [for svc in local.services : "\"${svc.name}\""])
}

resource "google_logging_metric" "this" {
  for_each = local.log_metrics

  project = var.project_id
  name    = "${var.name}/${each.key}"
  filter  = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=(${local.service_names}) AND jsonPayload.metric=\"${each.key}\""

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = contains(local.latencies, each.key) ? "DISTRIBUTION" : "INT64"
    unit         = contains(local.latencies, each.key) ? "ms" : "1"
    display_name = "node-fencer ${each.key}"

    dynamic "labels" {
      for_each = concat(["Function"], each.value)

      content {
        key        = labels.value
        value_type = "STRING"
      }
    }
  }

  label_extractors = { for label in concat(["Function"], each.value) : label => "EXTRACT(jsonPayload.${label})" }
  value_extractor  = contains(local.latencies, each.key) ? "EXTRACT(jsonPayload.value)" : null

  dynamic "bucket_options" {
    for_each = contains(local.latencies, each.key) ? [true] : []

    content {
      # 1 ms to about 2 hours, each bucket 1.5 times the last.
      exponential_buckets {
        num_finite_buckets = 40
        growth_factor      = 1.5
        scale              = 1
      }
    }
  }
}

locals {
  # The dashboard's charts: a title, the metric, the label each line is, and
  # a filter on another label. Counts are summed per minute; latencies shown
  # at their 50th and 99th percentiles.
  count_charts = [
    { title = "Decisions by outcome", metric = "Decisions", by = "Outcome", where = "" },
    { title = "Skips and refusals by reason", metric = "Decisions", by = "Reason", where = " AND metric.label.Outcome=\"skipped\"" },
    { title = "Errors by dependency", metric = "Errors", by = "Dependency", where = "" },
    { title = "Power-offs by outcome", metric = "PowerOffs", by = "PowerOutcome", where = "" },
    { title = "Power-off refusals by reason", metric = "PowerOffs", by = "Reason", where = " AND metric.label.PowerOutcome=\"refused\"" },
    { title = "Recoveries by outcome", metric = "Recoveries", by = "RecoveryOutcome", where = "" },
    { title = "Suspects by trigger", metric = "Suspects", by = "Trigger", where = "" },
    { title = "Volumes detached", metric = "VolumesDetached", by = "Function", where = "" },
    { title = "Nodes it could not fence now (witness)", metric = "WitnessFailures", by = "Function", where = "" },
  ]
  latency_charts = [
    { title = "Time to taint and to detach (ms)", metrics = ["TaintLatency", "DetachLatency"] },
    { title = "Cloud look and detach wait (ms)", metrics = ["ConfirmLatency", "VerifyLatency"] },
  ]

  count_widgets = [for chart in local.count_charts : {
    title = chart.title
    xyChart = {
      dataSets = [{
        plotType = "STACKED_BAR"
        timeSeriesQuery = {
          timeSeriesFilter = {
            filter = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.this[chart.metric].name}\" AND resource.type=\"cloud_run_revision\"${chart.where}"
            aggregation = {
              alignmentPeriod    = "60s"
              perSeriesAligner   = "ALIGN_SUM"
              crossSeriesReducer = "REDUCE_SUM"
              groupByFields      = ["metric.label.${chart.by}"]
            }
          }
        }
      }]
    }
  }]
  latency_widgets = [for chart in local.latency_charts : {
    title = chart.title
    xyChart = {
      dataSets = flatten([for metric in chart.metrics : [for p in ["50", "99"] : {
        plotType       = "LINE"
        legendTemplate = "${metric} p${p}"
        timeSeriesQuery = {
          timeSeriesFilter = {
            filter = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.this[metric].name}\" AND resource.type=\"cloud_run_revision\""
            aggregation = {
              alignmentPeriod    = "300s"
              perSeriesAligner   = "ALIGN_DELTA"
              crossSeriesReducer = "REDUCE_PERCENTILE_${p}"
              groupByFields      = []
            }
          }
        }
      }]])
    }
  }]
  widgets = concat(local.count_widgets, local.latency_widgets)
}

# Two charts a row, each 6 of the 12 columns wide and 4 rows high.
resource "google_monitoring_dashboard" "this" {
  project = var.project_id
  dashboard_json = jsonencode({
    displayName = var.name
    mosaicLayout = {
      columns = 12
      tiles = [for i, widget in local.widgets : {
        xPos   = (i % 2) * 6
        yPos   = floor(i / 2) * 4
        width  = 6
        height = 4
        widget = widget
      }]
    }
  })
}

locals {
  alertmanager_receiver = templatefile("${path.module}/../node-fencer/templates/alertmanager-receiver.yaml.tftpl", {
    name             = var.name
    url              = local.alertmanager_url
    credentials_file = var.alertmanager_credentials_file
  })
}
