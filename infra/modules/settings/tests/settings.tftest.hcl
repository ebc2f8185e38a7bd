# `tofu test` of the settings both node-fencer modules pass through, plans
# only: the environment they render, and each validation refusing a value
# just out of its range. Run it from infra/modules/settings after `tofu init`
# (make infra-test does).

variables {
  dry_run                       = false
  fast_not_ready                = true
  out_of_service_no_schedule    = false
  max_out_of_service            = 3
  max_out_of_service_percent    = null
  node_selector                 = null
  fencing_mode                  = "auto"
  control_namespace             = "kube-system"
  confirm_again_after_seconds   = 0
  volume_detach_timeout_seconds = 60
  not_ready_wait_seconds        = 60
  recovery_settle_seconds       = 30
  recovery                      = "auto"
  log_format                    = "json"
  log_level                     = "info"
}

run "the_environment_of_the_defaults" {
  command = plan

  assert {
    condition = output.environment == {
      DRY_RUN                       = "false"
      FAST_NOT_READY                = "true"
      OUT_OF_SERVICE_NO_SCHEDULE    = "false"
      MAX_OUT_OF_SERVICE            = "3"
      FENCING_MODE                  = "auto"
      CONFIRM_AGAIN_AFTER_SECONDS   = "0"
      VOLUME_DETACH_TIMEOUT_SECONDS = "60"
      RECOVERY_SETTLE_SECONDS       = "30"
      RECOVERY                      = "auto"
      NOT_READY_WAIT_SECONDS        = "60"
      CONTROL_NAMESPACE             = "kube-system"
      LOG_FORMAT                    = "json"
      RUST_LOG                      = "info"
    }
    error_message = "every setting as the string the binary reads; no percentage cap unless set"
  }
}

run "a_percentage_cap_is_passed_when_set" {
  command = plan

  variables {
    max_out_of_service_percent = 20
  }

  assert {
    condition     = output.environment["MAX_OUT_OF_SERVICE_PERCENT"] == "20"
    error_message = "MAX_OUT_OF_SERVICE_PERCENT when set"
  }
}

run "a_node_selector_is_passed_when_set" {
  command = plan

  variables {
    node_selector = "pool in (db,queue),!spot"
  }

  assert {
    condition     = output.environment["NODE_SELECTOR"] == "pool in (db,queue),!spot"
    error_message = "NODE_SELECTOR when set"
  }
}

# --- validations: values just out of range, every validated variable in one
# run, the other bounds in a second; a run fails if any of its validations
# lets its value through

run "out_of_range_values_are_refused" {
  command = plan

  variables {
    max_out_of_service         = 1001
    max_out_of_service_percent = 101
    fencing_mode               = "force"
    control_namespace          = "Kube_System"
    recovery                   = "never"
    log_format                 = "logfmt"
    node_selector              = "pool=stateful;rm -rf"
  }

  expect_failures = [
    var.max_out_of_service,
    var.max_out_of_service_percent,
    var.fencing_mode,
    var.control_namespace,
    var.recovery,
    var.log_format,
    var.node_selector,
  ]
}

run "the_other_bounds_are_refused" {
  command = plan

  variables {
    max_out_of_service         = 0
    max_out_of_service_percent = 0
    control_namespace          = "kube-system-"
  }

  expect_failures = [
    var.max_out_of_service,
    var.max_out_of_service_percent,
    var.control_namespace,
  ]
}
