# `tofu test` of the module, plans only: each variable's validation refuses a
# value just out of its range, the preconditions refuse contradictory
# settings, and each switch creates what it should. The provider block and the
# overridden data source let it plan without Google credentials or calls; run
# it from infra/modules/node-fencer-gcp after `tofu init` (make infra-test
# does).

provider "google" {
  project = "my-project"
  region  = "europe-west1"
}

override_data {
  target = data.google_project.this
  values = {
    number = "987654321098"
  }
}

variables {
  project_id       = "my-project"
  region           = "europe-west1"
  image            = "europe-docker.pkg.dev/my-project/node-fencer/node-fencer:1.0.0"
  cluster_name     = "prod"
  cluster_location = "europe-west1"
  cluster_endpoint = "203.0.113.10"
  cluster_ca_data  = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
}

# --- switches ---------------------------------------------------------------------

run "defaults" {
  command = plan

  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].timeout == "450s" && google_cloud_run_v2_service.this["webhook"].template[0].timeout == "450s" && google_pubsub_subscription.push.ack_deadline_seconds == 450
    error_message = "one node's worst case with the defaults, 60 + 30 + 0 + 4 x 60 + 60 + 30 + 30 = 450 s, is both services' request timeout and the acknowledgement deadline"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "GKE_CLUSTER"]) == "projects/my-project/locations/europe-west1/clusters/prod"
    error_message = "GKE_CLUSTER names the cluster"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "CLUSTER_ENDPOINT"]) == "https://203.0.113.10"
    error_message = "CLUSTER_ENDPOINT is the endpoint's https URL"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["webhook"].ingress == "INGRESS_TRAFFIC_ALL" && google_cloud_run_v2_service_iam_member.public.name == "node-fencer-webhook" && google_cloud_run_v2_service_iam_member.public.member == "allUsers"
    error_message = "Alertmanager reaches the webhook service: ingress from everywhere, invoker allUsers"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].scaling[0].min_instance_count == 0 && google_cloud_run_v2_service.this["events"].template[0].scaling[0].max_instance_count == 3
    error_message = "no idle instance, three at most"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].containers[0].resources[0].cpu_idle == true && google_cloud_run_v2_service.this["events"].template[0].containers[0].args == tolist(["serve"])
    error_message = "CPU only during requests; the binary runs as an HTTP server"
  }
  assert {
    condition     = google_cloud_run_v2_service_iam_member.push.name == "node-fencer" && google_cloud_run_v2_service_iam_member.push.role == "roles/run.invoker"
    error_message = "the events service: only the push account (push subscription, sweep, Eventarc) may invoke it"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["webhook"].template[0].scaling[0].max_instance_count == 1 && google_cloud_run_v2_service.this["webhook"].template[0].max_instance_request_concurrency == 10 && google_cloud_run_v2_service.this["events"].template[0].max_instance_request_concurrency == 10
    error_message = "the webhook service scales on its own: one instance by default"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["webhook"].template[0].containers[0].image == google_cloud_run_v2_service.this["events"].template[0].containers[0].image && google_cloud_run_v2_service.this["webhook"].template[0].containers[0].args == tolist(["serve"])
    error_message = "one image, run as serve, for both"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "SERVE_ROUTES"]) == "events" && one([for e in google_cloud_run_v2_service.this["webhook"].template[0].containers[0].env : e.value if e.name == "SERVE_ROUTES"]) == "alertmanager"
    error_message = "each service answers its own routes"
  }
  assert {
    condition     = google_cloud_scheduler_job.sweep[0].http_target[0].oidc_token[0].service_account_email == "node-fencer-push@my-project.iam.gserviceaccount.com" && google_pubsub_subscription.push.push_config[0].oidc_token[0].service_account_email == "node-fencer-push@my-project.iam.gserviceaccount.com"
    error_message = "the push subscription and the sweep call as the push account"
  }
  assert {
    condition     = google_project_iam_custom_role.node_vms.permissions == toset(["compute.instances.detachDisk"]) && !contains(tolist(google_project_iam_custom_role.this.permissions), "compute.instances.detachDisk")
    error_message = "the detach is granted apart from the reads"
  }
  assert {
    condition     = google_project_iam_member.node_vms.condition[0].expression == "resource.type == \"compute.googleapis.com/Instance\" && resource.name.extract(\"/instances/{name}\").startsWith(\"gke-prod-\")" && length(google_project_iam_member.this.condition) == 0
    error_message = "the detach on the cluster's node VMs only, by name; the reads project-wide"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "PUSH_AUDIENCE"]) == "https://node-fencer-987654321098.europe-west1.run.app"
    error_message = "without Eventarc, PUSH_AUDIENCE is the push subscription's and the sweep's audience alone"
  }
  assert {
    condition     = google_pubsub_subscription.push.push_config[0].oidc_token[0].audience == "https://node-fencer-987654321098.europe-west1.run.app" && google_cloud_scheduler_job.sweep[0].http_target[0].oidc_token[0].audience == "https://node-fencer-987654321098.europe-west1.run.app"
    error_message = "the push subscription and the sweep ask for tokens for the events service's own URL, which Cloud Run's invoker check accepts"
  }
  assert {
    condition     = alltrue([for svc in google_cloud_run_v2_service.this : svc.custom_audiences == null])
    error_message = "the service's own URL needs no custom audience"
  }
  assert {
    condition     = length(google_eventarc_trigger.stop) == 0 && length(google_project_iam_member.push_event_receiver) == 0
    error_message = "no Eventarc trigger unless asked for"
  }
  assert {
    condition     = length(google_secret_manager_secret.webhook_token) == 1 && length(random_password.webhook_token) == 1
    error_message = "a token is generated and kept in Secret Manager"
  }
  assert {
    condition     = google_project_iam_custom_role.this.role_id == "node_fencer"
    error_message = "the custom role is named after the service, '-' as '_'"
  }
  assert {
    condition     = strcontains(google_logging_project_sink.this.filter, "protoPayload.resourceName:\"/instances/gke-prod-\"") && google_logging_project_sink.this.unique_writer_identity
    error_message = "the sink takes the cluster's node VMs only, with a writer identity of its own"
  }
  assert {
    condition     = google_service_account_iam_member.push_token_creator.member == "serviceAccount:service-987654321098@gcp-sa-pubsub.iam.gserviceaccount.com"
    error_message = "Pub/Sub's service agent signs the push tokens"
  }
  assert {
    condition     = google_pubsub_subscription.push.dead_letter_policy[0].max_delivery_attempts == 10 && google_pubsub_subscription.push.retry_policy[0].minimum_backoff == "10s" && google_pubsub_subscription.push.retry_policy[0].maximum_backoff == "600s"
    error_message = "retries with backoff, ten deliveries, then the dead-letter topic"
  }
}


# Active fencing: the stop joins the detach in the node VMs' role (under its
# condition on their names), the four settings reach both services, and the
# wait for a stopped VM joins the request timeout: 450 + 120 = 570 s.
run "notifications_to_a_created_topic" {
  command = plan

  variables {
    create_notification_topic = true
  }

  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "NOTIFY_TOPIC"]) == "projects/my-project/topics/node-fencer-notifications"
    error_message = "NOTIFY_TOPIC names the created topic"
  }
  assert {
    condition     = google_pubsub_topic_iam_member.notifications[0].role == "roles/pubsub.publisher" && google_pubsub_topic_iam_member.notifications[0].topic == "projects/my-project/topics/node-fencer-notifications"
    error_message = "the service account publishes to that topic alone"
  }
  assert {
    condition     = google_pubsub_subscription.notifications[0].message_retention_duration == "604800s"
    error_message = "the pull subscription keeps the messages a week"
  }
}

run "notifications_to_a_given_topic" {
  command = plan

  variables {
    notification_topic = "projects/platform/topics/k8s-fencing"
  }

  assert {
    condition     = length(google_pubsub_topic.notifications) == 0 && google_pubsub_topic_iam_member.notifications[0].topic == "projects/platform/topics/k8s-fencing"
    error_message = "a given topic is published to, none created"
  }
}

run "a_created_and_a_given_topic_are_refused" {
  command = plan

  variables {
    create_notification_topic = true
    notification_topic        = "projects/platform/topics/k8s-fencing"
  }

  expect_failures = [google_pubsub_topic.notifications]
}

run "a_subscription_is_no_topic" {
  command = plan

  variables {
    notification_topic = "projects/platform/subscriptions/k8s-fencing"
  }

  expect_failures = [var.notification_topic]
}

run "active_fencing" {
  command = plan

  variables {
    active_fencing = true
  }

  assert {
    condition     = google_project_iam_custom_role.node_vms.permissions == toset(["compute.instances.detachDisk", "compute.instances.stop"]) && !contains(tolist(google_project_iam_custom_role.this.permissions), "compute.instances.stop")
    error_message = "the stop is granted in the node VMs' role only"
  }
  assert {
    condition     = length(google_project_iam_member.node_vms.condition) == 1
    error_message = "the node VMs' role, stop included, holds only on VMs named like the cluster's nodes"
  }
  assert {
    condition     = alltrue([for k in ["events", "webhook"] : one([for e in google_cloud_run_v2_service.this[k].template[0].containers[0].env : e.value if e.name == "ACTIVE_FENCING"]) == "on" && one([for e in google_cloud_run_v2_service.this[k].template[0].containers[0].env : e.value if e.name == "POWER_OFF_WAIT_SECONDS"]) == "120"])
    error_message = "both services get the active fencing settings"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].timeout == "570s" && google_pubsub_subscription.push.ack_deadline_seconds == 570
    error_message = "the wait for a stopped VM is part of the request timeout"
  }
}
run "active_fencing_stuck" {
  command = plan

  variables {
    active_fencing = "stuck"
  }

  assert {
    condition     = alltrue([for k in ["events", "webhook"] : one([for e in google_cloud_run_v2_service.this[k].template[0].containers[0].env : e.value if e.name == "ACTIVE_FENCING"]) == "stuck"])
    error_message = "stuck: both services get ACTIVE_FENCING=stuck"
  }
  assert {
    condition     = contains(tolist(google_project_iam_custom_role.node_vms.permissions), "compute.instances.stop")
    error_message = "stuck powers off as on does: the stop is granted"
  }
}

run "active_fencing_takes_off_stuck_or_on_only" {
  command = plan

  variables {
    active_fencing = "yes"
  }

  expect_failures = [var.active_fencing]
}

run "eventarc_an_own_secret_a_zonal_cluster_vpc_egress_and_the_longest_waits" {
  command = plan

  variables {
    eventarc                      = true
    webhook_token_secret_id       = "projects/my-project/secrets/alertmanager-token"
    cluster_location              = "europe-west1-b"
    not_ready_wait_seconds        = 120
    confirm_again_after_seconds   = 120
    volume_detach_timeout_seconds = 120
    recovery_settle_seconds       = 60
    detach_disks_per_node         = 2
    vpc_network                   = "projects/my-project/global/networks/prod"
    vpc_subnetwork                = "projects/my-project/regions/europe-west1/subnetworks/prod"
  }

  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].timeout == "600s" && google_pubsub_subscription.push.ack_deadline_seconds == 600
    error_message = "120 + 30 + 120 + 2 x 60 + 120 + 60 + 30 fill Pub/Sub's 600 s"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].vpc_access[0].egress == "PRIVATE_RANGES_ONLY" && google_cloud_run_v2_service.this["events"].template[0].vpc_access[0].network_interfaces[0].subnetwork == "projects/my-project/regions/europe-west1/subnetworks/prod"
    error_message = "private ranges through the VPC"
  }

  assert {
    condition     = length(google_eventarc_trigger.stop) == 1 && google_eventarc_trigger.stop[0].location == "europe-west1" && google_eventarc_trigger.stop[0].destination[0].cloud_run_service[0].path == "/eventarc"
    error_message = "one trigger in the zonal cluster's region, to /eventarc"
  }
  assert {
    condition     = length(google_project_iam_member.push_event_receiver) == 1 && google_project_iam_member.push_event_receiver[0].role == "roles/eventarc.eventReceiver"
    error_message = "the trigger's account receives events"
  }
  assert {
    condition     = length(google_secret_manager_secret.webhook_token) == 0 && length(random_password.webhook_token) == 0 && google_secret_manager_secret_iam_member.webhook_token.secret_id == "projects/my-project/secrets/alertmanager-token"
    error_message = "the given secret: nothing generated, read access to that one"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value_source[0].secret_key_ref[0].version if e.name == "WEBHOOK_TOKEN"]) == "latest"
    error_message = "a given secret is read at its latest version"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "GKE_CLUSTER"]) == "projects/my-project/locations/europe-west1-b/clusters/prod"
    error_message = "GKE_CLUSTER names the zonal cluster by its zone"
  }
}

run "a_long_cluster_name_keeps_its_first_16_characters" {
  command = plan

  variables {
    cluster_name = "payments-production-eu"
  }

  assert {
    condition     = strcontains(google_logging_project_sink.this.filter, "protoPayload.resourceName:\"/instances/gke-payments-product\" AND")
    error_message = "gke- and the first 16 characters of a long cluster name"
  }
}

run "an_empty_prefix_takes_every_vm" {
  command = plan

  variables {
    instance_name_prefix = ""
  }

  assert {
    condition     = !strcontains(google_logging_project_sink.this.filter, "protoPayload.resourceName")
    error_message = "no name restriction"
  }
}

run "eventarc_adds_the_audiences_its_tokens_name" {
  command = plan

  variables {
    eventarc = true
  }

  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "PUSH_AUDIENCE"]) == "https://node-fencer-987654321098.europe-west1.run.app,https://node-fencer-987654321098.europe-west1.run.app/eventarc"
    error_message = "PUSH_AUDIENCE lists the push subscription's audience and the URLs Eventarc's tokens name"
  }
  assert {
    condition     = google_pubsub_subscription.push.push_config[0].oidc_token[0].audience == "https://node-fencer-987654321098.europe-west1.run.app" && output.push_audiences[0] == "https://node-fencer-987654321098.europe-west1.run.app"
    error_message = "the push subscription's own audience is among them"
  }
}

run "an_audience_of_ones_own_is_a_custom_audience_of_the_events_service" {
  command = plan

  variables {
    push_audience = "https://node-fencer.example.com/push"
    eventarc      = true
  }

  assert {
    condition     = google_pubsub_subscription.push.push_config[0].oidc_token[0].audience == "https://node-fencer.example.com/push" && google_cloud_scheduler_job.sweep[0].http_target[0].oidc_token[0].audience == "https://node-fencer.example.com/push"
    error_message = "the push subscription and the sweep ask for tokens for push_audience"
  }
  assert {
    condition     = google_cloud_run_v2_service.this["events"].custom_audiences == tolist(["https://node-fencer.example.com/push"]) && google_cloud_run_v2_service.this["webhook"].custom_audiences == null
    error_message = "Cloud Run's invoker check of the events service accepts push_audience; the webhook service takes no token"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this["events"].template[0].containers[0].env : e.value if e.name == "PUSH_AUDIENCE"]) == "https://node-fencer.example.com/push,https://node-fencer-987654321098.europe-west1.run.app,https://node-fencer-987654321098.europe-west1.run.app/eventarc"
    error_message = "the service accepts push_audience first, then the URLs Eventarc's tokens name"
  }
}

run "an_empty_prefix_grants_the_detach_on_every_vm" {
  command = plan

  variables {
    instance_name_prefix = ""
  }

  assert {
    condition     = length(google_project_iam_member.node_vms.condition) == 0
    error_message = "no condition: every VM of the project"
  }
}

run "a_long_cluster_name_scopes_the_detach_to_its_first_16_characters" {
  command = plan

  variables {
    cluster_name = "payments-production-eu"
  }

  assert {
    condition     = strcontains(google_project_iam_member.node_vms.condition[0].expression, ".startsWith(\"gke-payments-product\")")
    error_message = "the same prefix as the sink's"
  }
}

run "eight_disks_fit_with_short_waits" {
  command = plan

  variables {
    detach_disks_per_node       = 8
    not_ready_wait_seconds      = 0
    confirm_again_after_seconds = 0
    recovery_settle_seconds     = 0
  }

  assert {
    condition     = google_cloud_run_v2_service.this["events"].template[0].timeout == "600s"
    error_message = "0 + 30 + 0 + 8 x 60 + 60 + 0 + 30 = 600 s"
  }
}

# --- preconditions ------------------------------------------------------------------

run "waits_beyond_pubsubs_600_seconds_are_refused" {
  command = plan

  variables {
    not_ready_wait_seconds        = 120
    confirm_again_after_seconds   = 120
    volume_detach_timeout_seconds = 120
    recovery_settle_seconds       = 60
  }

  expect_failures = [google_cloud_run_v2_service.this]
}

run "a_network_without_a_subnetwork" {
  command = plan

  variables {
    vpc_network = "projects/my-project/global/networks/prod"
  }

  expect_failures = [google_cloud_run_v2_service.this]
}

# --- validations: values just out of range, every validated variable in one
# run (two for the other bound of some); a run fails if any of its
# validations lets its value through

run "out_of_range_values_are_refused" {
  command = plan

  variables {
    name                                     = "fence"
    project_id                               = "My_Project"
    image                                    = " "
    max_instances                            = 0
    max_instance_request_concurrency         = 0
    cluster_name                             = "Prod"
    cluster_location                         = "europe"
    cluster_endpoint                         = "http://203.0.113.10"
    cluster_ca_data                          = "not base64!"
    confirm_again_after_seconds              = 121
    volume_detach_timeout_seconds            = 121
    not_ready_wait_seconds                   = 121
    recovery_settle_seconds                  = 61
    push_audience                            = "node-fencer"
    instance_name_prefix                     = "GKE-"
    max_delivery_attempts                    = 4
    webhook_token_secret_id                  = "alertmanager-token"
    detach_disks_per_node                    = 9
    webhook_max_instances                    = 0
    webhook_max_instance_request_concurrency = 0
    power_off_after_seconds                  = 59
    power_off_wait_seconds                   = 301
    partition_percent                        = 0
  }

  expect_failures = [
    var.name,
    var.project_id,
    var.image,
    var.max_instances,
    var.max_instance_request_concurrency,
    var.cluster_name,
    var.cluster_location,
    var.cluster_endpoint,
    var.cluster_ca_data,
    var.confirm_again_after_seconds,
    var.volume_detach_timeout_seconds,
    var.not_ready_wait_seconds,
    var.recovery_settle_seconds,
    var.push_audience,
    var.instance_name_prefix,
    var.max_delivery_attempts,
    var.webhook_token_secret_id,
    var.detach_disks_per_node,
    var.webhook_max_instances,
    var.webhook_max_instance_request_concurrency,
    var.power_off_after_seconds,
    var.power_off_wait_seconds,
    var.partition_percent,
  ]
}

run "the_other_bounds_are_refused" {
  command = plan

  variables {
    name                          = "Node-Fencer"
    volume_detach_timeout_seconds = 0
    max_delivery_attempts         = 101
    detach_disks_per_node         = 0
    push_audience                 = "https://node-fencer.example.com/"
    power_off_after_seconds       = 3601
    power_off_wait_seconds        = 9
    partition_percent             = 101
  }

  expect_failures = [
    var.name,
    var.volume_detach_timeout_seconds,
    var.max_delivery_attempts,
    var.detach_disks_per_node,
    var.push_audience,
    var.power_off_after_seconds,
    var.power_off_wait_seconds,
    var.partition_percent,
  ]
}
