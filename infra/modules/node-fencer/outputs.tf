output "function_name" {
  description = "Name of the main Lambda function (EventBridge events, the recovery schedule, direct invocations)."
  value       = aws_lambda_function.this["main"].function_name
}

output "function_arn" {
  description = "ARN of the main Lambda function."
  value       = aws_lambda_function.this["main"].arn
}

output "function_timeout" {
  description = "Timeout of both functions in seconds, derived from not_ready_wait_seconds, the Lease wait, confirm_again_after_seconds, volume_detach_timeout_seconds, recovery_settle_seconds and, with active_fencing, power_off_wait_seconds."
  value       = aws_lambda_function.this["main"].timeout
}

output "webhook_function_name" {
  description = "Name of the webhook function behind the Function URL, or null when enable_alertmanager_url is false."
  value       = var.enable_alertmanager_url ? aws_lambda_function.this["webhook"].function_name : null
}

output "webhook_function_arn" {
  description = "ARN of the webhook function behind the Function URL, or null when enable_alertmanager_url is false."
  value       = var.enable_alertmanager_url ? aws_lambda_function.this["webhook"].arn : null
}

output "webhook_log_group_name" {
  description = "CloudWatch log group of the webhook function, or null when enable_alertmanager_url is false."
  value       = var.enable_alertmanager_url ? aws_cloudwatch_log_group.this["webhook"].name : null
}

output "role_arn" {
  description = "ARN of the IAM role of both functions (the principal of the EKS access entry)."
  value       = aws_iam_role.this.arn
}

output "role_name" {
  description = "Name of the IAM role of both functions."
  value       = aws_iam_role.this.name
}

output "log_group_name" {
  description = "CloudWatch log group of the main function."
  value       = aws_cloudwatch_log_group.this["main"].name
}

output "event_rule_arn" {
  description = "ARN of the EventBridge rule for EC2 instance state changes."
  value       = aws_cloudwatch_event_rule.this.arn
}

output "recovery_rule_arn" {
  description = "ARN of the EventBridge schedule of the recovery check, or null when recovery_schedule is null."
  value       = one(aws_cloudwatch_event_rule.recovery[*].arn)
}

output "control_namespace" {
  description = "Namespace of the function's Lease and kill-switch ConfigMap (CONTROL_NAMESPACE); the Role of infra/kubernetes/rbac.yaml must be applied there."
  value       = var.control_namespace
}

output "dlq_url" {
  description = "URL of the dead-letter queue that receives events the function could not process."
  value       = aws_sqs_queue.dlq.url
}

output "dlq_arn" {
  description = "ARN of the dead-letter queue."
  value       = aws_sqs_queue.dlq.arn
}

output "function_url" {
  description = "Function URL of the webhook function, for Alertmanager's webhook, or null when enable_alertmanager_url is false."
  value       = one(aws_lambda_function_url.this[*].function_url)
}

output "webhook_token" {
  description = "Bearer token Alertmanager must present to the function URL, or null when enable_alertmanager_url is false."
  value       = one(random_password.webhook_token[*].result)
  sensitive   = true
}

output "webhook_token_secret_arn" {
  description = "ARN of the Secrets Manager secret holding the webhook token (webhook_token_store = secretsmanager), else null."
  value       = one(aws_secretsmanager_secret.webhook_token[*].arn)
}

output "webhook_token_ssm_parameter_name" {
  description = "Name of the SSM SecureString holding the webhook token (webhook_token_store = ssm), else null."
  value       = one(aws_ssm_parameter.webhook_token[*].name)
}

output "alertmanager_receiver" {
  description = "Alertmanager route and receiver for the function URL, rendered as YAML to merge into alertmanager.yml; null when enable_alertmanager_url is false."
  value       = local.alertmanager_receiver
}

output "eks_access_entry_arn" {
  description = "ARN of the EKS access entry mapping the role to the Kubernetes group node-fencer, or null."
  value       = one(aws_eks_access_entry.this[*].access_entry_arn)
}

output "kubernetes_group" {
  description = "Kubernetes group the function's identity belongs to; infra/kubernetes/rbac.yaml binds it."
  value       = "node-fencer"
}

output "power_off_instance_tag" {
  description = "With active_fencing, the tag {key, value} an instance must carry for the role to stop it (power_off_instance_tag, or in EKS mode kubernetes.io/cluster/<cluster_name> = owned); null when active fencing is off."
  value       = local.active_fencing ? local.power_off_instance_tag : null
}

output "notification_topic_arn" {
  description = "The SNS topic the notifications are published to (created or given), or null when none is configured."
  value       = local.notify ? local.notification_topic_arn : null
}
