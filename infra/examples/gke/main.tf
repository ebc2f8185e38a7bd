# node-fencer for a GKE cluster: a Cloud Run service whose service account the
# cluster knows as the Kubernetes user named by its email; the kubernetes-rbac
# module binds that user to the ClusterRole and the Role of
# infra/kubernetes/rbac.yaml.

provider "google" {
  project = var.project_id
  region  = var.region
}

data "google_container_cluster" "this" {
  project  = var.project_id
  name     = var.cluster_name
  location = var.cluster_location
}

# The deployer's own access to the cluster, to apply the RBAC manifest: the
# access token of the credentials Terraform runs with.
data "google_client_config" "this" {}

provider "kubernetes" {
  host                   = "https://${data.google_container_cluster.this.endpoint}"
  token                  = data.google_client_config.this.access_token
  cluster_ca_certificate = base64decode(data.google_container_cluster.this.master_auth[0].cluster_ca_certificate)
}

module "node_fencer" {
  source = "../../modules/node-fencer-gcp"

  name       = var.name
  project_id = var.project_id
  region     = var.region
  image      = var.image

  cluster_name     = data.google_container_cluster.this.name
  cluster_location = data.google_container_cluster.this.location
  cluster_endpoint = data.google_container_cluster.this.endpoint
  cluster_ca_data  = data.google_container_cluster.this.master_auth[0].cluster_ca_certificate

  dry_run                       = var.dry_run
  max_out_of_service            = var.max_out_of_service
  volume_detach_timeout_seconds = var.volume_detach_timeout_seconds

  eventarc              = var.eventarc
  notification_channels = var.notification_channels

  # One message per fencing, refusal, power-off and recovery, to a topic the
  # module creates, kept a week by a pull subscription; a chat integration
  # adds a push subscription (docs/notifications.md).
  create_notification_topic = var.notifications

  labels = var.labels
}

# GKE maps the service's Google service account to the Kubernetes user of its
# email: bound to the ClusterRole and the Role besides the group.
module "rbac" {
  source = "../../modules/kubernetes-rbac"

  users = [module.node_fencer.service_account_email]
}
