################################################################################
# Service
################################################################################

variable "name" {
  description = "Name of the Cloud Run service and of its service account; the prefix of the push service account (<name>-push), topics, subscriptions, sink, secret, trigger and alert policies. The custom role is <name> with '-' as '_'."
  type        = string
  default     = "node-fencer"

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,23}[a-z0-9]$", var.name))
    error_message = "name must be 6-25 lowercase letters, digits and '-', starting with a letter and not ending with '-' (service account ids are 6-30 characters, and <name>-push is one)."
  }
}

variable "project_id" {
  description = "Project of the cluster's node VMs and of everything the module creates: the custom role is granted on it, the Logging sink reads its audit logs."
  type        = string

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a project id: 6-30 lowercase letters, digits and '-', starting with a letter."
  }
}

variable "region" {
  description = "Region of the Cloud Run service (and of the Eventarc trigger's destination)."
  type        = string
}

variable "image" {
  description = "Container image of node-fencer, e.g. europe-docker.pkg.dev/PROJECT/REPO/node-fencer:TAG (Artifact Registry; Cloud Run pulls it with the service agent). The service runs it with the argument `serve`, an HTTP server on $PORT."
  type        = string

  validation {
    condition     = length(trimspace(var.image)) > 0
    error_message = "image must name a container image."
  }
}

variable "cpu" {
  description = "CPU limit of an instance, as Cloud Run writes it (\"1\", \"2\"). CPU is allocated only while a request is handled: every step is done before the answer."
  type        = string
  default     = "1"
}

variable "memory" {
  description = "Memory limit of an instance (\"256Mi\", \"512Mi\")."
  type        = string
  default     = "256Mi"
}

variable "max_instances" {
  description = "Most instances Cloud Run may start for the event routes' service. Few are needed: the Lease in control_namespace serialises fencing across instances and requests, and an instance serves max_instance_request_concurrency requests at once."
  type        = number
  default     = 3

  validation {
    condition     = var.max_instances >= 1 && var.max_instances <= 100 && floor(var.max_instances) == var.max_instances
    error_message = "max_instances must be a whole number from 1 to 100."
  }
}

variable "max_instance_request_concurrency" {
  description = "Requests one instance of the event routes' service serves at once."
  type        = number
  default     = 10

  validation {
    condition     = var.max_instance_request_concurrency >= 1 && var.max_instance_request_concurrency <= 1000 && floor(var.max_instance_request_concurrency) == var.max_instance_request_concurrency
    error_message = "max_instance_request_concurrency must be a whole number from 1 to 1000."
  }
}

variable "webhook_max_instances" {
  description = "Most instances Cloud Run may start for <name>-webhook, the public service of Alertmanager's webhook. Its callers, with the token or refused, use up these alone, never the event routes' (max_instances); past them Cloud Run answers 429 and Alertmanager sends the alert again."
  type        = number
  default     = 1

  validation {
    condition     = var.webhook_max_instances >= 1 && var.webhook_max_instances <= 100 && floor(var.webhook_max_instances) == var.webhook_max_instances
    error_message = "webhook_max_instances must be a whole number from 1 to 100."
  }
}

variable "webhook_max_instance_request_concurrency" {
  description = "Requests one instance of <name>-webhook serves at once."
  type        = number
  default     = 10

  validation {
    condition     = var.webhook_max_instance_request_concurrency >= 1 && var.webhook_max_instance_request_concurrency <= 1000 && floor(var.webhook_max_instance_request_concurrency) == var.webhook_max_instance_request_concurrency
    error_message = "webhook_max_instance_request_concurrency must be a whole number from 1 to 1000."
  }
}

variable "vpc_network" {
  description = "Direct VPC egress, for a cluster whose API endpoint is private: the VPC network the service sends private-range traffic into (with vpc_subnetwork). Null sends everything to the internet directly."
  type        = string
  default     = null
}

variable "vpc_subnetwork" {
  description = "Direct VPC egress: the subnetwork of vpc_network the service's instances take their addresses from."
  type        = string
  default     = null
}

variable "deletion_protection" {
  description = "Refuse to destroy the Cloud Run service (the provider's deletion_protection). Off by default: the service keeps no state, `terraform destroy` should remove it."
  type        = bool
  default     = false
}

variable "labels" {
  description = "Labels for every resource that takes them."
  type        = map(string)
  default     = {}
}

################################################################################
# Cluster access: GKE_CLUSTER, CLUSTER_ENDPOINT, CLUSTER_CA_DATA
################################################################################

variable "cluster_name" {
  description = "Name of the GKE cluster; with project_id and cluster_location it makes GKE_CLUSTER (projects/P/locations/L/clusters/C)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$", var.cluster_name))
    error_message = "cluster_name must be a GKE cluster name: up to 40 lowercase letters, digits and '-', starting with a letter."
  }
}

variable "cluster_location" {
  description = "Location of the cluster: its region (regional cluster) or zone (zonal cluster)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+(-[a-z])?$", var.cluster_location))
    error_message = "cluster_location must be a region (europe-west1) or a zone (europe-west1-b)."
  }
}

variable "cluster_endpoint" {
  description = "API server of the cluster (CLUSTER_ENDPOINT): its endpoint as GKE returns it (an address, which gets https://) or an https:// URL."
  type        = string

  validation {
    condition     = length(var.cluster_endpoint) > 0 && !startswith(var.cluster_endpoint, "http://")
    error_message = "cluster_endpoint must be the endpoint's address or an https:// URL."
  }
}

variable "cluster_ca_data" {
  description = "CLUSTER_CA_DATA: base64 PEM of the cluster CA, as GKE returns it in master_auth[0].cluster_ca_certificate."
  type        = string

  validation {
    condition     = can(base64decode(var.cluster_ca_data))
    error_message = "cluster_ca_data must be base64 (master_auth[0].cluster_ca_certificate)."
  }
}

################################################################################
# Behaviour (environment of the service)
################################################################################

# Passed unchanged to the settings module both platforms share
# (infra/modules/settings), which validates them and renders the environment;
# only the waits are validated here, bounded to fit this platform's time limit.

variable "dry_run" {
  description = "DRY_RUN: when true the service decides and reports, but never taints a node or detaches a disk."
  type        = bool
  default     = false
}

variable "fast_not_ready" {
  description = "FAST_NOT_READY: when true (the default), a Node still Ready whose machine the cloud confirms off is marked Ready=Unknown if the cloud recorded when the machine stopped, the kubelet's Lease in kube-node-lease was last written at least 5 s before that, and the kubelet has missed a renewal it was due to make (on the apiserver's clock or node-fencer's own); when false, or without that proof, the node controller's grace period is waited out."
  type        = bool
  default     = true
}

variable "out_of_service_no_schedule" {
  description = "OUT_OF_SERVICE_NO_SCHEDULE: when true a fenced node also carries node.kubernetes.io/out-of-service=nodeshutdown:NoSchedule, the pair Rook/Ceph documents, and such a fencing ends only with proof of a power cycle."
  type        = bool
  default     = false
}

variable "max_out_of_service" {
  description = "MAX_OUT_OF_SERVICE: how many nodes of the cluster may carry the out-of-service taint at once; past it the service refuses to fence more."
  type        = number
  default     = 3
}

variable "max_out_of_service_percent" {
  description = "MAX_OUT_OF_SERVICE_PERCENT: also cap the nodes carrying the out-of-service taint at this share of all the cluster's nodes (at least one node); the stricter of the two caps applies. Null sets no percentage cap."
  type        = number
  default     = null
}

variable "node_selector" {
  description = "NODE_SELECTOR: a Kubernetes label selector, as kubectl -l takes it (\"pool=stateful\", \"tier in (db,queue),!spot\"), naming the Nodes node-fencer may fence or power off at all. Null (the default): every Node. A Node labelled node-fencer.io/exclude=true is left alone whatever the selector says; neither holds back the recovery of a fencing made earlier. The function refuses to start on a value that is not a selector."
  type        = string
  default     = null
}

variable "fencing_mode" {
  description = "FENCING_MODE: taint (the out-of-service taint, Kubernetes 1.26 and later), legacy (force-delete the node's pods and VolumeAttachments, for older clusters), or auto (pick by the API server's version)."
  type        = string
  default     = "auto"
}

variable "control_namespace" {
  description = "CONTROL_NAMESPACE: namespace of the service's Lease and kill-switch ConfigMap, both named node-fencer. The Role and RoleBinding of infra/kubernetes/rbac.yaml live in kube-system: for another namespace, apply them there (the kubernetes-rbac module's control_namespace)."
  type        = string
  default     = "kube-system"
}

# The request timeout is the sum of the waits one request may make (see
# local.request_timeout_seconds in main.tf), and it is also the push
# subscription's acknowledgement deadline, which Pub/Sub caps at 600 s: the
# bounds below keep each wait within reason, and a plan whose waits add up
# to more than 600 s fails.

variable "detach_disks_per_node" {
  description = "How many Persistent Disks of one node the request timeout allows for: the service detaches a node's disks one after the other and follows each detach operation for up to 60 s. A node with more disks is finished by a later delivery (the service bounds its work by the request's remaining time). Counts toward Pub/Sub's 600 s with the waits."
  type        = number
  default     = 4

  validation {
    condition     = var.detach_disks_per_node >= 1 && var.detach_disks_per_node <= 8 && floor(var.detach_disks_per_node) == var.detach_disks_per_node
    error_message = "detach_disks_per_node must be a whole number from 1 to 8 (nine detach operations with the Lease and the calls around them would pass Pub/Sub's 600 s)."
  }
}

variable "confirm_again_after_seconds" {
  description = "CONFIRM_AGAIN_AFTER_SECONDS: ask Compute Engine a second time, after this delay, that the VM is still off before acting; 0 acts on the first answer. The code accepts up to 300; at most 120 here keeps the request within Pub/Sub's 600 s acknowledgement deadline."
  type        = number
  default     = 0

  validation {
    condition     = var.confirm_again_after_seconds >= 0 && var.confirm_again_after_seconds <= 120 && floor(var.confirm_again_after_seconds) == var.confirm_again_after_seconds
    error_message = "confirm_again_after_seconds must be a whole number from 0 to 120."
  }
}

variable "volume_detach_timeout_seconds" {
  description = "VOLUME_DETACH_TIMEOUT_SECONDS: how long the service waits for detached disks to be free. The code accepts up to 600; at most 120 here keeps the request within Pub/Sub's 600 s acknowledgement deadline."
  type        = number
  default     = 60

  validation {
    condition     = var.volume_detach_timeout_seconds >= 1 && var.volume_detach_timeout_seconds <= 120 && floor(var.volume_detach_timeout_seconds) == var.volume_detach_timeout_seconds
    error_message = "volume_detach_timeout_seconds must be a whole number from 1 to 120 (0 would report every fence failed)."
  }
}

variable "not_ready_wait_seconds" {
  description = "NOT_READY_WAIT_SECONDS: when Compute Engine reports the VM off while its Node is still Ready, wait this long within the request for the Node to turn NotReady, then fence at once; 0 fails the request for Pub/Sub's redelivery. The code accepts up to 300; at most 120 here keeps the request within Pub/Sub's 600 s acknowledgement deadline."
  type        = number
  default     = 60

  validation {
    condition     = var.not_ready_wait_seconds >= 0 && var.not_ready_wait_seconds <= 120 && floor(var.not_ready_wait_seconds) == var.not_ready_wait_seconds
    error_message = "not_ready_wait_seconds must be a whole number from 0 to 120."
  }
}

variable "recovery_settle_seconds" {
  description = "RECOVERY_SETTLE_SECONDS: how long a fenced node must be Ready again before the service removes its taint; a requested recovery waits it out within the request. The code accepts up to 300; at most 60 here keeps the request within Pub/Sub's 600 s acknowledgement deadline."
  type        = number
  default     = 30

  validation {
    condition     = var.recovery_settle_seconds >= 0 && var.recovery_settle_seconds <= 60 && floor(var.recovery_settle_seconds) == var.recovery_settle_seconds
    error_message = "recovery_settle_seconds must be a whole number from 0 to 60."
  }
}

variable "recovery" {
  description = "RECOVERY: auto ends a fencing once the VM runs, the node is Ready and settled and no attachment of ours remains; manual also waits for an operator to confirm the node healthy (node-fencer recover --confirm NODE)."
  type        = string
  default     = "auto"
}

# Active fencing (opt-in): power off a dead node whose VM still runs.

variable "active_fencing" {
  description = "ACTIVE_FENCING: \"stuck\" or \"on\": a node NotReady (its kubelet silent) for power_off_after_seconds whose VM Compute Engine still reports RUNNING (found by the sweep, a firing KubeNodeNotReady alert, or `fence --power-off`) is powered off (instances.stop with noGracefulShutdown), waited for until TERMINATED, then fenced as a stopped one. Grants compute.instances.stop in the node VMs' role, under the same condition on their names as the detach. With \"stuck\" only a node on which a pod holds a volume only one node may attach (ReadWriteOnce: stuck, which Kubernetes never frees for a StatefulSet), the rest left to Kubernetes; with \"on\" any such node. \"off\" (the default) sets none of ACTIVE_FENCING, POWER_OFF_AFTER_SECONDS, POWER_OFF_WAIT_SECONDS and PARTITION_PERCENT, and grants no stop. true and false, as this variable once was, are taken for \"on\" and \"off\"."
  type        = string
  default     = "off"

  validation {
    condition     = contains(["off", "stuck", "on", "true", "false"], var.active_fencing)
    error_message = "active_fencing must be off, stuck or on."
  }
}

variable "power_off_after_seconds" {
  description = "POWER_OFF_AFTER_SECONDS, with active_fencing: how long a node must have been NotReady before its VM may be powered off."
  type        = number
  default     = 120

  validation {
    condition     = var.power_off_after_seconds >= 60 && var.power_off_after_seconds <= 3600 && floor(var.power_off_after_seconds) == var.power_off_after_seconds
    error_message = "power_off_after_seconds must be a whole number from 60 to 3600."
  }
}

variable "power_off_wait_seconds" {
  description = "POWER_OFF_WAIT_SECONDS, with active_fencing: how long, within the request, the service follows a stop and waits for the VM to be TERMINATED; one not off by then is left untainted for a redelivery or the next sweep. A hung guest may hold Compute Engine's ACPI soft-off window (120 s on a standard VM) before the VM is off: 150 or more lets such a stop end within the request. Added to the request timeout (which Pub/Sub caps at 600 s)."
  type        = number
  default     = 120

  validation {
    condition     = var.power_off_wait_seconds >= 10 && var.power_off_wait_seconds <= 300 && floor(var.power_off_wait_seconds) == var.power_off_wait_seconds
    error_message = "power_off_wait_seconds must be a whole number from 10 to 300."
  }
}

variable "partition_percent" {
  description = "PARTITION_PERCENT, with active_fencing: refuse every power-off while more than this share of the nodes are NotReady and not fenced, or while every node of the candidate's zone is (a network partition or a zone outage looks like that from the control plane)."
  type        = number
  default     = 30

  validation {
    condition     = var.partition_percent >= 1 && var.partition_percent <= 100 && floor(var.partition_percent) == var.partition_percent
    error_message = "partition_percent must be a whole number from 1 to 100."
  }
}

variable "log_format" {
  description = "LOG_FORMAT of the service's log lines: json (one JSON object a line, which Cloud Logging reads as a structured entry) or text."
  type        = string
  default     = "json"
}

variable "log_level" {
  description = "RUST_LOG filter of the service, e.g. \"info\" or \"info,node_fencer=debug\"."
  type        = string
  default     = "info"
}

################################################################################
# Triggers: Logging sink -> Pub/Sub push, Eventarc (optional)
################################################################################

variable "push_audience" {
  description = "The audience of the OIDC tokens the push subscription and the sweep present, the first of PUSH_AUDIENCE, which the service checks on /pubsub and /sweep: an https URL, as the service accepts them. Null: the events service's own URL, https://<name>-<project number>.<region>.run.app, which Cloud Run's invoker check accepts as it is. Any other is added to the events service's custom audiences, as Cloud Run refuses a token for an audience it does not know before the service sees the request."
  type        = string
  default     = null

  # The service's own check (audience_url of handler/src/core/inbound/oidc.rs), a
  # little stricter: a lowercase host, no port, no trailing '/' (the service
  # would drop it, and then no longer match the tokens' audience), path
  # segments of plain characters that do not start with '.'.
  validation {
    condition     = var.push_audience == null ? true : can(regex("^https://[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?(/[A-Za-z0-9_~-][-A-Za-z0-9_.~]*)*$", var.push_audience))
    error_message = "push_audience must be null or an https URL with a lowercase host, no port, query, fragment or trailing '/', and a path (if any) of letters, digits and '-', '_', '.', '~' (e.g. https://node-fencer.example.com/push)."
  }
}

variable "instance_name_prefix" {
  description = "The cluster's node VMs: only audit log entries of VMs whose name starts with this reach the service, and the service account may detach disks only from such VMs (an IAM condition on the VM's name). Null: the GKE node prefix gke-<cluster_name>- (for a name longer than 16 characters, gke- and its first 16 characters, as GKE shortens long cluster names in its VM names). \"\" lets every VM of the project through and grants the detach on every VM (the service ignores VMs that are no node of its cluster, at the cost of a request each); set it for Autopilot nodes (gk3-) or nodes named otherwise."
  type        = string
  default     = null

  validation {
    condition     = var.instance_name_prefix == null ? true : can(regex("^([a-z][-a-z0-9]{0,61})?$", var.instance_name_prefix))
    error_message = "instance_name_prefix must be null, \"\" or the start of a VM name: lowercase letters, digits and '-', starting with a letter."
  }
}

variable "max_delivery_attempts" {
  description = "Deliveries of one audit log entry to the service before the push subscription moves it to the dead-letter topic."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100 && floor(var.max_delivery_attempts) == var.max_delivery_attempts
    error_message = "max_delivery_attempts must be a whole number from 5 to 100 (Pub/Sub's range)."
  }
}

variable "eventarc" {
  description = "Also create an Eventarc trigger that sends the audit log entries of v1.compute.instances.stop to /eventarc. An audit-log trigger takes one method; the Logging sink and the push subscription already carry every method the service acts on, so this is a second path for the most common one, not a replacement."
  type        = bool
  default     = false
}

################################################################################
# Alertmanager webhook token
################################################################################

variable "webhook_token_secret_id" {
  description = "Secret Manager secret (projects/P/secrets/S) holding the bearer token Alertmanager presents on /alertmanager, when you keep your own; null creates <name>-webhook-token with a random token. The service account may read this one secret."
  type        = string
  default     = null

  validation {
    condition     = var.webhook_token_secret_id == null ? true : can(regex("^projects/[^/]+/secrets/[A-Za-z0-9_-]{1,255}$", var.webhook_token_secret_id))
    error_message = "webhook_token_secret_id must be null or projects/PROJECT/secrets/SECRET."
  }
}

variable "alertmanager_credentials_file" {
  description = "Path of the token file inside the Alertmanager container, used in the rendered receiver snippet (the Prometheus Operator mounts Secret <name> key <key> at /etc/alertmanager/secrets/<name>/<key>)."
  type        = string
  default     = "/etc/alertmanager/secrets/node-fencer-webhook/token"
}

################################################################################
# Alerts
################################################################################

variable "notification_topic" {
  description = "NOTIFY_TOPIC: an existing Pub/Sub topic (projects/P/topics/T) each fencing, refusal, power-off and recovery is published to, one JSON message each (docs/notifications.md); the service account is made a publisher on it alone. null: see create_notification_topic."
  type        = string
  default     = null

  validation {
    condition     = var.notification_topic == null ? true : can(regex("^projects/[a-z0-9.:-]+/topics/[A-Za-z][A-Za-z0-9._~+%-]{2,254}$", var.notification_topic))
    error_message = "notification_topic must be null or a Pub/Sub topic's full name, projects/PROJECT/topics/TOPIC."
  }
}

variable "create_notification_topic" {
  description = "Create the Pub/Sub topic <name>-notifications and a pull subscription <name>-notifications that keeps its messages for 7 days, and publish the notifications to it. Excludes notification_topic."
  type        = bool
  default     = false
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channels (projects/P/notificationChannels/ID) of the alert policies (entries in the dead-letter topic, 5xx answers); empty creates the policies without notifications."
  type        = list(string)
  default     = []
}

variable "sweep_schedule" {
  description = "Cloud Scheduler cron expression (UTC) of the sweep: it POSTs to /sweep with the push account's OIDC token, which fences NotReady nodes no event named whose VM Compute Engine reports off, and re-checks every node the service fenced, removing the taint once the VM runs and the node is Ready again. Null creates no schedule."
  type        = string
  default     = "*/10 * * * *"
}
