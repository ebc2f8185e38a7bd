# node-fencer for a self-managed cluster on EC2 (kubeadm, k3s, kOps, ...): the
# function authenticates with a kubeconfig it reads from an SSM SecureString.
# By default that kubeconfig is built from the token of a ServiceAccount the
# kubernetes-rbac module creates and binds to the ClusterRole and the Role of
# infra/kubernetes/rbac.yaml; pass function_kubeconfig to use your own.

provider "aws" {
  region = var.region
}

# The deployer's own access to the cluster, to apply the RBAC manifest.
provider "kubernetes" {
  config_path    = var.admin_kubeconfig_path
  config_context = var.admin_kubeconfig_context
}

module "rbac" {
  source = "../../modules/kubernetes-rbac"

  create_service_account = true
  api_server_url         = var.api_server_url
}

resource "aws_ssm_parameter" "kubeconfig" {
  #checkov:skip=CKV_AWS_337:A customer key is opt-in through kms_key_arn; the default aws/ssm key needs no key policy of the deployer's own.
  name        = "/${var.name}/kubeconfig"
  description = "Kubeconfig the ${var.name} function uses to reach the cluster."
  type        = "SecureString"
  tier        = "Advanced" # kubeconfigs with embedded CA and token can pass the 4 KB of the Standard tier
  key_id      = var.kms_key_arn
  value       = var.function_kubeconfig != null ? var.function_kubeconfig : module.rbac.kubeconfig
  tags        = var.tags

  lifecycle {
    precondition {
      condition     = var.function_kubeconfig != null || var.api_server_url != null
      error_message = "Set api_server_url (to build the kubeconfig from the ServiceAccount) or function_kubeconfig."
    }
  }
}

module "node_fencer" {
  source = "../../modules/node-fencer"

  name         = var.name
  package_path = var.package_path
  architecture = var.architecture

  kubeconfig_ssm_parameter_name = aws_ssm_parameter.kubeconfig.name
  kms_key_arn                   = var.kms_key_arn

  # A private API endpoint needs the function inside the VPC.
  vpc_subnet_ids         = var.vpc_subnet_ids
  vpc_security_group_ids = var.vpc_security_group_ids

  dry_run                       = var.dry_run
  max_out_of_service            = var.max_out_of_service
  volume_detach_timeout_seconds = var.volume_detach_timeout_seconds

  # Volumes of clusters that run the EBS CSI driver carry its tag; set false if
  # some PersistentVolumes use volumes created otherwise.
  detach_volume_require_tag = var.detach_volume_require_tag

  # Active fencing (off by default): power off a node NotReady for
  # power_off_after_seconds whose instance still runs, then fence it. The role
  # may stop only instances carrying power_off_instance_tag, which must be a
  # tag every node instance of the cluster carries (this example creates no
  # instances: tag them, or their launch template's instance tags, with it).
  # The module refuses active fencing here without it.
  active_fencing          = var.active_fencing
  power_off_after_seconds = var.power_off_after_seconds
  power_off_instance_tag  = var.power_off_instance_tag

  enable_alertmanager_url = var.enable_alertmanager_url
  alarm_sns_topic_arn     = var.alarm_sns_topic_arn

  tags = var.tags
}
