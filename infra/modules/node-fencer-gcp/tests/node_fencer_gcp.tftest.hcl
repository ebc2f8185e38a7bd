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
    condition     = google_cloud_run_v2_service.this.template[0].timeout == "270s" && google_pubsub_subscription.push.ack_deadline_seconds == 270
    error_message = "the default waits sum to 270 s, the request timeout and the acknowledgement deadline"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this.template[0].containers[0].env : e.value if e.name == "GKE_CLUSTER"]) == "projects/my-project/locations/europe-west1/clusters/prod"
    error_message = "GKE_CLUSTER names the cluster"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this.template[0].containers[0].env : e.value if e.name == "CLUSTER_ENDPOINT"]) == "https://203.0.113.10"
    error_message = "CLUSTER_ENDPOINT is the endpoint's https URL"
  }
  assert {
    condition     = google_cloud_run_v2_service.this.ingress == "INGRESS_TRAFFIC_ALL" && google_cloud_run_v2_service_iam_member.public.member == "allUsers"
    error_message = "Alertmanager reaches the service: ingress from everywhere, invoker allUsers"
  }
  assert {
    condition     = google_cloud_run_v2_service.this.template[0].scaling[0].min_instance_count == 0 && google_cloud_run_v2_service.this.template[0].scaling[0].max_instance_count == 3
    error_message = "no idle instance, three at most"
  }
  assert {
    condition     = google_cloud_run_v2_service.this.template[0].containers[0].resources[0].cpu_idle == true && google_cloud_run_v2_service.this.template[0].containers[0].args == tolist(["serve"])
    error_message = "CPU only during requests; the binary runs as an HTTP server"
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
    vpc_network                   = "projects/my-project/global/networks/prod"
    vpc_subnetwork                = "projects/my-project/regions/europe-west1/subnetworks/prod"
  }

  assert {
    condition     = google_cloud_run_v2_service.this.template[0].timeout == "600s" && google_pubsub_subscription.push.ack_deadline_seconds == 600
    error_message = "the longest waits sum to Pub/Sub's 600 s"
  }
  assert {
    condition     = google_cloud_run_v2_service.this.template[0].vpc_access[0].egress == "PRIVATE_RANGES_ONLY" && google_cloud_run_v2_service.this.template[0].vpc_access[0].network_interfaces[0].subnetwork == "projects/my-project/regions/europe-west1/subnetworks/prod"
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
    condition     = one([for e in google_cloud_run_v2_service.this.template[0].containers[0].env : e.value_source[0].secret_key_ref[0].version if e.name == "WEBHOOK_TOKEN"]) == "latest"
    error_message = "a given secret is read at its latest version"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.this.template[0].containers[0].env : e.value if e.name == "GKE_CLUSTER"]) == "projects/my-project/locations/europe-west1-b/clusters/prod"
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

# --- preconditions ------------------------------------------------------------------

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
    name                             = "fence"
    project_id                       = "My_Project"
    image                            = " "
    max_instances                    = 0
    max_instance_request_concurrency = 0
    cluster_name                     = "Prod"
    cluster_location                 = "europe"
    cluster_endpoint                 = "http://203.0.113.10"
    cluster_ca_data                  = "not base64!"
    confirm_again_after_seconds      = 121
    volume_detach_timeout_seconds    = 121
    not_ready_wait_seconds           = 121
    recovery_settle_seconds          = 61
    push_audience                    = ""
    instance_name_prefix             = "GKE-"
    max_delivery_attempts            = 4
    webhook_token_secret_id          = "alertmanager-token"
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
  ]
}

run "the_other_bounds_are_refused" {
  command = plan

  variables {
    name                          = "Node-Fencer"
    volume_detach_timeout_seconds = 0
    max_delivery_attempts         = 101
  }

  expect_failures = [
    var.name,
    var.volume_detach_timeout_seconds,
    var.max_delivery_attempts,
  ]
}
