variable "region" {
  description = "AWS region of the cluster."
  type        = string
}

variable "cluster_name" {
  description = "Name of the EKS cluster; its authentication mode must be API or API_AND_CONFIG_MAP for the access entry."
  type        = string
}

variable "name" {
  description = "Name of the function and prefix of what the module creates."
  type        = string
  default     = "node-fencer"
}

variable "package_path" {
  description = "Path to the zip built by `cargo lambda build --release --package node-fencer --output-format zip`, relative to this directory or absolute."
  type        = string
  default     = "../../../target/lambda/node-fencer/bootstrap.zip"
}

variable "architecture" {
  description = "Instruction set the zip was built for: x86_64 or arm64."
  type        = string
  default     = "x86_64"
}

variable "dry_run" {
  description = "Decide and report only, change nothing: start with true, read the function's decisions in its logs, then switch to false."
  type        = bool
  default     = true
}

variable "max_out_of_service" {
  description = "How many nodes may carry the out-of-service taint at once."
  type        = number
  default     = 3
}

variable "volume_detach_timeout_seconds" {
  description = "How long the function waits for detached volumes to become available; the function timeout follows from it."
  type        = number
  default     = 60
}

variable "active_fencing" {
  description = "off, stuck or on: power off (forced stop) a node NotReady for power_off_after_seconds whose instance EC2 still reports running, then fence it (stuck: only a node on which a pod holds a ReadWriteOnce volume); only instances tagged kubernetes.io/cluster/<cluster_name> = owned can be stopped."
  type        = string
  default     = "off"
}

variable "power_off_after_seconds" {
  description = "With active_fencing: how long a node must have been NotReady before its instance may be powered off."
  type        = number
  default     = 120
}

variable "enable_alertmanager_url" {
  description = "Create the webhook function, its Function URL and the bearer token for Alertmanager's webhook."
  type        = bool
  default     = true
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic for the dead-letter-queue and error alarms, or null."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for the AWS resources."
  type        = map(string)
  default     = {}
}

variable "notification_emails" {
  description = "E-mail addresses told of each fencing, refusal, power-off and recovery (an SNS topic is created for them); empty: no notifications."
  type        = list(string)
  default     = []
}
