output "function_name" {
  description = "Name of the main Lambda function (EventBridge events, the recovery schedule)."
  value       = module.node_fencer.function_name
}

output "webhook_function_name" {
  description = "Name of the webhook function, the only one behind the Function URL."
  value       = module.node_fencer.webhook_function_name
}

output "function_url" {
  description = "Function URL of the webhook function, for Alertmanager's webhook."
  value       = module.node_fencer.function_url
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

output "dlq_url" {
  description = "Dead-letter queue of events the function could not process."
  value       = module.node_fencer.dlq_url
}

output "notification_topic_arn" {
  description = "The SNS topic of the notifications (subscribe a chat integration to it), or null."
  value       = module.node_fencer.notification_topic_arn
}
