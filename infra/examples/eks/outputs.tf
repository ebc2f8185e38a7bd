output "function_name" {
  description = "Name of the Lambda function."
  value       = module.node_fencer.function_name
}

output "function_url" {
  description = "Function URL for Alertmanager's webhook."
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
