# The fencing policy node-fencer reads from its environment, validated once
# for both platforms: node-fencer (Lambda) and node-fencer-gcp (Cloud Run)
# declare these variables for their users and pass them through here, and
# each sets the returned environment on its functions or services, beside
# the settings only its platform has.
#
# The waits are the exception: each platform bounds them so that one
# invocation fits its time limit (Lambda's 900 s, Pub/Sub's 600 s), so the
# calling module validates them and this one only renders them.

locals {
  environment = merge(
    {
      DRY_RUN                       = tostring(var.dry_run)
      FAST_NOT_READY                = tostring(var.fast_not_ready)
      OUT_OF_SERVICE_NO_SCHEDULE    = tostring(var.out_of_service_no_schedule)
      MAX_OUT_OF_SERVICE            = tostring(var.max_out_of_service)
      FENCING_MODE                  = var.fencing_mode
      CONFIRM_AGAIN_AFTER_SECONDS   = tostring(var.confirm_again_after_seconds)
      VOLUME_DETACH_TIMEOUT_SECONDS = tostring(var.volume_detach_timeout_seconds)
      RECOVERY_SETTLE_SECONDS       = tostring(var.recovery_settle_seconds)
      RECOVERY                      = var.recovery
      NOT_READY_WAIT_SECONDS        = tostring(var.not_ready_wait_seconds)
      CONTROL_NAMESPACE             = var.control_namespace
      LOG_FORMAT                    = var.log_format
      RUST_LOG                      = var.log_level
    },
    # Unset means no percentage cap: passed only when set.
    var.max_out_of_service_percent != null ? { MAX_OUT_OF_SERVICE_PERCENT = tostring(var.max_out_of_service_percent) } : {},
    # Unset means every Node: passed only when set.
    var.node_selector != null ? { NODE_SELECTOR = var.node_selector } : {},
  )
}
