output "service_name" {
  description = "Name of the Cloud Run service of the event routes (the push subscription, the sweep, Eventarc)."
  value       = google_cloud_run_v2_service.this["events"].name
}

output "service_url" {
  description = "URL of the Cloud Run service of the event routes."
  value       = google_cloud_run_v2_service.this["events"].uri
}

output "webhook_service_name" {
  description = "Name of the Cloud Run service of Alertmanager's webhook, <name>-webhook."
  value       = google_cloud_run_v2_service.this["webhook"].name
}

output "webhook_service_url" {
  description = "URL of the Cloud Run service of Alertmanager's webhook."
  value       = google_cloud_run_v2_service.this["webhook"].uri
}

output "alertmanager_url" {
  description = "Webhook URL for Alertmanager: the service's /alertmanager route."
  value       = local.alertmanager_url
}

output "request_timeout_seconds" {
  description = "Request timeout of both services and acknowledgement deadline of the push subscription, in seconds, derived from not_ready_wait_seconds, the Lease wait, confirm_again_after_seconds, detach_disks_per_node detach operations, volume_detach_timeout_seconds and recovery_settle_seconds."
  value       = local.request_timeout_seconds
}

output "service_account_email" {
  description = "Email of the service's service account: the Kubernetes user to bind to the ClusterRole and the Role (the kubernetes-rbac module's users)."
  value       = local.service_account_email
}

output "push_service_account_email" {
  description = "Email of the service account whose OIDC token the push subscription and Eventarc present (PUSH_SERVICE_ACCOUNT)."
  value       = local.push_service_account_email
}

output "push_audience" {
  description = "Audience of the OIDC tokens of the push subscription and the sweep: push_audience, or the events service's URL."
  value       = local.push_audience
}

output "push_audiences" {
  description = "Every audience the module's requests carry: push_audience, and with eventarc the events service's URL with and without /eventarc (PUSH_AUDIENCE, comma-separated)."
  value       = local.push_audiences
}

output "custom_role_id" {
  description = "The project's custom role of the service account's reads (projects/P/roles/R)."
  value       = google_project_iam_custom_role.this.name
}

output "node_vms_role_id" {
  description = "The project's custom role of the service account's detach (projects/P/roles/R), granted on the cluster's node VMs only."
  value       = google_project_iam_custom_role.node_vms.name
}

output "node_vms_condition" {
  description = "The IAM condition of that grant: the VM's name starts with instance_name_prefix; null when instance_name_prefix is \"\" (every VM of the project)."
  value       = local.node_vm_condition
}

output "gke_cluster" {
  description = "The cluster as the service names it (GKE_CLUSTER)."
  value       = local.cluster_id
}

output "webhook_token_secret_id" {
  description = "Secret Manager secret holding the Alertmanager bearer token (projects/P/secrets/S)."
  value       = local.webhook_token_secret
}

output "webhook_token" {
  description = "Bearer token Alertmanager must present on /alertmanager, when the module generated it; null with webhook_token_secret_id."
  value       = one(random_password.webhook_token[*].result)
  sensitive   = true
}

output "audit_topic" {
  description = "Pub/Sub topic the Logging sink writes the audit log entries to."
  value       = google_pubsub_topic.audit.name
}

output "push_subscription" {
  description = "Push subscription that delivers the entries to /pubsub."
  value       = google_pubsub_subscription.push.name
}

output "dead_letter_topic" {
  description = "Pub/Sub topic of the entries the service failed on max_delivery_attempts times."
  value       = google_pubsub_topic.dead_letter.name
}

output "dead_letter_subscription" {
  description = "Subscription that holds the dead letters for reading."
  value       = google_pubsub_subscription.dead_letter.name
}

output "sink_filter" {
  description = "Filter of the Logging sink: the audit log entries that reach the service."
  value       = local.sink_filter
}

output "eventarc_trigger" {
  description = "Name of the Eventarc trigger (eventarc), else null."
  value       = one(google_eventarc_trigger.stop[*].name)
}

output "alertmanager_receiver" {
  description = "Alertmanager route and receiver for the service, rendered as YAML to merge into alertmanager.yml."
  value       = local.alertmanager_receiver
}

output "control_namespace" {
  description = "Namespace of the service's Lease and kill-switch ConfigMap (CONTROL_NAMESPACE); the Role of infra/kubernetes/rbac.yaml must be applied there."
  value       = var.control_namespace
}

output "notification_topic" {
  description = "The Pub/Sub topic the notifications are published to (created or given), or null when none is configured."
  value       = local.notification_topic
}

output "notification_subscription" {
  description = "The pull subscription that keeps the created topic's notifications for 7 days (create_notification_topic), else null."
  value       = one(google_pubsub_subscription.notifications[*].name)
}
