output "environment" {
  description = "The settings as the environment variables node-fencer reads (DRY_RUN, MAX_OUT_OF_SERVICE, ...), values as strings; MAX_OUT_OF_SERVICE_PERCENT only when set."
  value       = local.environment
}
