variable "region" {
  description = "AWS region of the cluster's instances."
  type        = string
}

variable "admin_kubeconfig_path" {
  description = "Path to a kubeconfig with cluster-admin rights, used by Terraform to apply the RBAC manifest (not given to the function)."
  type        = string
  default     = "~/.kube/config"
}

variable "admin_kubeconfig_context" {
  description = "Context of admin_kubeconfig_path to use; null uses its current context."
  type        = string
  default     = null
}

variable "api_server_url" {
  description = "API server URL as the function reaches it (e.g. https://k8s-api.internal.example.com:6443), written into the kubeconfig built from the ServiceAccount token."
  type        = string
  default     = null
}

variable "function_kubeconfig" {
  description = "Kubeconfig for the function, stored in an SSM SecureString; null builds one from the node-fencer ServiceAccount's token and api_server_url. Its identity needs the rights of infra/kubernetes/rbac.yaml."
  type        = string
  default     = null
  sensitive   = true
}

variable "kms_key_arn" {
  description = "Customer managed KMS key for the kubeconfig parameter and the webhook token, or null for the AWS managed keys."
  type        = string
  default     = null
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

variable "vpc_subnet_ids" {
  description = "Subnets for the function when the API endpoint is only reachable inside the VPC; empty runs it outside any VPC."
  type        = list(string)
  default     = []
}

variable "vpc_security_group_ids" {
  description = "Security groups of the function, with vpc_subnet_ids."
  type        = list(string)
  default     = []
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

variable "detach_volume_require_tag" {
  description = "Allow detaching only volumes tagged ebs.csi.aws.com/cluster = true (created by the EBS CSI driver)."
  type        = bool
  default     = true
}

variable "active_fencing" {
  description = "off, stuck or on: power off (forced stop) a node NotReady for power_off_after_seconds whose instance EC2 still reports running, then fence it (stuck: only a node on which a pod holds a ReadWriteOnce volume); needs power_off_instance_tag."
  type        = string
  default     = "off"
}

variable "power_off_after_seconds" {
  description = "With active_fencing: how long a node must have been NotReady before its instance may be powered off."
  type        = number
  default     = 120
}

variable "power_off_instance_tag" {
  description = "With active_fencing: the tag {key, value} every node instance of the cluster carries (e.g. kubernetes.io/cluster/<name> = owned, which kOps puts on its instances and the AWS cloud provider looks for); the function may stop only instances carrying it."
  type = object({
    key   = string
    value = string
  })
  default = null
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
