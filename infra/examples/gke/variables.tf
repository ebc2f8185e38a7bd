variable "project_id" {
  description = "Project of the GKE cluster; the service and its triggers are created there."
  type        = string
}

variable "region" {
  description = "Region of the Cloud Run service, e.g. the cluster's."
  type        = string
}

variable "cluster_name" {
  description = "Name of the GKE cluster."
  type        = string
}

variable "cluster_location" {
  description = "Location of the GKE cluster: its region, or its zone for a zonal cluster."
  type        = string
}

variable "image" {
  description = "Container image of node-fencer in Artifact Registry, e.g. europe-docker.pkg.dev/PROJECT/REPO/node-fencer:TAG."
  type        = string
}

variable "name" {
  description = "Name of the Cloud Run service and prefix of what the module creates."
  type        = string
  default     = "node-fencer"
}

variable "dry_run" {
  description = "Decide and report only, change nothing: start with true, read the service's decisions in its logs, then switch to false."
  type        = bool
  default     = true
}

variable "max_out_of_service" {
  description = "How many nodes may carry the out-of-service taint at once."
  type        = number
  default     = 3
}

variable "volume_detach_timeout_seconds" {
  description = "How long the service waits for detached disks to be free; the request timeout follows from it."
  type        = number
  default     = 60
}

variable "eventarc" {
  description = "Also send v1.compute.instances.stop through an Eventarc trigger to /eventarc (the Logging sink carries every method already)."
  type        = bool
  default     = false
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channels for the dead-letter and 5xx alert policies."
  type        = list(string)
  default     = []
}

variable "labels" {
  description = "Labels for the Google Cloud resources."
  type        = map(string)
  default     = {}
}

variable "notifications" {
  description = "Publish each fencing, refusal, power-off and recovery to a Pub/Sub topic the module creates, <name>-notifications, with a pull subscription that keeps them a week."
  type        = bool
  default     = true
}
