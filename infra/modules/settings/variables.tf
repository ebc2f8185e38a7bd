# Required, every one: the calling modules hold the defaults their users see,
# and pass each of their variables through unchanged.

variable "dry_run" {
  description = "DRY_RUN: decide and report, change nothing."
  type        = bool
}

variable "fast_not_ready" {
  description = "FAST_NOT_READY: mark a Node Ready=Unknown when the cloud recorded its machine's stop, the kubelet's Lease was last written at least 5 s before it, and the kubelet has missed a renewal it was due to make, instead of waiting out the node controller's grace period."
  type        = bool
}

variable "out_of_service_no_schedule" {
  description = "OUT_OF_SERVICE_NO_SCHEDULE: also apply node.kubernetes.io/out-of-service=nodeshutdown:NoSchedule; such a fencing ends only with proof of a power cycle."
  type        = bool
}

variable "max_out_of_service" {
  description = "MAX_OUT_OF_SERVICE: how many nodes of the cluster may carry the out-of-service taint at once."
  type        = number

  validation {
    condition     = var.max_out_of_service >= 1 && var.max_out_of_service <= 1000 && floor(var.max_out_of_service) == var.max_out_of_service
    error_message = "max_out_of_service must be a whole number from 1 to 1000."
  }
}

variable "max_out_of_service_percent" {
  description = "MAX_OUT_OF_SERVICE_PERCENT: also cap the out-of-service nodes at this share of all nodes (at least one); null sets no percentage cap."
  type        = number

  validation {
    condition     = var.max_out_of_service_percent == null ? true : (var.max_out_of_service_percent >= 1 && var.max_out_of_service_percent <= 100 && floor(var.max_out_of_service_percent) == var.max_out_of_service_percent)
    error_message = "max_out_of_service_percent must be null or a whole number from 1 to 100."
  }
}

variable "node_selector" {
  description = "NODE_SELECTOR: a Kubernetes label selector naming the Nodes node-fencer may fence or power off; null: every Node."
  type        = string

  # The function parses it exactly at start and refuses what is not a
  # selector; here only what no selector can hold is refused.
  validation {
    condition     = var.node_selector == null ? true : can(regex("^[A-Za-z0-9][A-Za-z0-9_./!=(), -]*$|^![A-Za-z0-9][A-Za-z0-9_./!=(), -]*$", var.node_selector))
    error_message = "node_selector must be null or a label selector (letters, digits and _ . / ! = ( ) , - and spaces), such as \"pool=stateful\" or \"tier in (db,queue),!spot\"."
  }
}

variable "fencing_mode" {
  description = "FENCING_MODE: taint, legacy or auto."
  type        = string

  validation {
    condition     = contains(["auto", "taint", "legacy"], var.fencing_mode)
    error_message = "fencing_mode must be \"auto\", \"taint\" or \"legacy\"."
  }
}

variable "control_namespace" {
  description = "CONTROL_NAMESPACE: namespace of the Lease and the kill-switch ConfigMap, both named node-fencer."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.control_namespace))
    error_message = "control_namespace must be a namespace name: up to 63 lowercase letters, digits and '-', starting and ending with a letter or digit."
  }
}

variable "recovery" {
  description = "RECOVERY: auto, or manual (an operator also confirms the node healthy)."
  type        = string

  validation {
    condition     = contains(["auto", "manual"], var.recovery)
    error_message = "recovery must be \"auto\" or \"manual\"."
  }
}

variable "log_format" {
  description = "LOG_FORMAT: json or text."
  type        = string

  validation {
    condition     = contains(["json", "text"], var.log_format)
    error_message = "log_format must be \"json\" or \"text\"."
  }
}

variable "log_level" {
  description = "RUST_LOG filter, e.g. \"info\" or \"info,node_fencer=debug\"."
  type        = string
}

# The waits: validated by the calling module, which bounds them to fit its
# platform's time limit (see main.tf).

variable "confirm_again_after_seconds" {
  description = "CONFIRM_AGAIN_AFTER_SECONDS: ask the cloud a second time, after this delay, before acting."
  type        = number
}

variable "volume_detach_timeout_seconds" {
  description = "VOLUME_DETACH_TIMEOUT_SECONDS: how long to wait for detached volumes to be free."
  type        = number
}

variable "not_ready_wait_seconds" {
  description = "NOT_READY_WAIT_SECONDS: how long to wait, within one request, for a Ready Node whose machine is off to turn NotReady."
  type        = number
}

variable "recovery_settle_seconds" {
  description = "RECOVERY_SETTLE_SECONDS: how long a fenced node must be Ready again before its taint is removed."
  type        = number
}
