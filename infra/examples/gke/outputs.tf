output "service_url" {
  description = "URL of the Cloud Run service."
  value       = module.node_fencer.service_url
}

output "alertmanager_url" {
  description = "Webhook URL for Alertmanager (the service's /alertmanager route)."
  value       = module.node_fencer.alertmanager_url
}

output "webhook_token" {
  description = "Bearer token for Alertmanager: terraform output -raw webhook_token."
  value       = module.node_fencer.webhook_token
  sensitive   = true
}

output "alertmanager_receiver" {
  description = "Alertmanager route and receiver to merge into alertmanager.yml."
  value       = module.node_fencer.alertmanager_receiver
}

output "service_account_email" {
  description = "The service's service account, the Kubernetes user bound to the ClusterRole and the Role."
  value       = module.node_fencer.service_account_email
}

output "dead_letter_subscription" {
  description = "Subscription holding the audit log entries the service failed on."
  value       = module.node_fencer.dead_letter_subscription
}

output "notification_subscription" {
  description = "The pull subscription of the notifications: gcloud pubsub subscriptions pull <it> --auto-ack."
  value       = module.node_fencer.notification_subscription
}
