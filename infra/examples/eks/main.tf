# node-fencer for an EKS cluster: the function authenticates with its IAM role,
# which an EKS access entry maps to the Kubernetes group "node-fencer"; the
# kubernetes-rbac module binds that group to the ClusterRole and the Role of
# infra/kubernetes/rbac.yaml.

provider "aws" {
  region = var.region
}

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

# The deployer's own access to the cluster, to apply the RBAC manifest.
provider "kubernetes" {
  host                   = data.aws_eks_cluster.this.endpoint
  cluster_ca_certificate = base64decode(data.aws_eks_cluster.this.certificate_authority[0].data)

  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", var.cluster_name, "--region", var.region]
  }
}

module "node_fencer" {
  source = "../../modules/node-fencer"

  name         = var.name
  package_path = var.package_path
  architecture = var.architecture

  cluster_name     = var.cluster_name
  eks_access_entry = true

  # An EC2 event's instance outside the cluster's VPC is let go without a
  # Kubernetes request (EC2 events are per account and region).
  cluster_vpc_id = data.aws_eks_cluster.this.vpc_config[0].vpc_id

  dry_run                       = var.dry_run
  max_out_of_service            = var.max_out_of_service
  volume_detach_timeout_seconds = var.volume_detach_timeout_seconds

  # Active fencing (off by default): power off a node NotReady for
  # power_off_after_seconds whose instance still runs, then fence it. The role
  # may stop only instances tagged kubernetes.io/cluster/<cluster_name> = owned,
  # the module's default in EKS mode: EKS managed node groups, Karpenter and
  # self-managed EKS nodes tag their instances so. Nodes launched otherwise
  # need that tag, or power_off_instance_tag set to one they carry.
  active_fencing          = var.active_fencing
  power_off_after_seconds = var.power_off_after_seconds

  enable_alertmanager_url = var.enable_alertmanager_url
  alarm_sns_topic_arn     = var.alarm_sns_topic_arn

  # One message per fencing, refusal, power-off and recovery, to a topic the
  # module creates, each address subscribed by e-mail (SNS asks each to
  # confirm first). docs/notifications.md has the schema and the chat setup.
  create_notification_topic = length(var.notification_emails) > 0
  notification_emails       = var.notification_emails

  tags = var.tags
}

module "rbac" {
  source = "../../modules/kubernetes-rbac"
}
