################################################################################
# Function
################################################################################

variable "name" {
  description = "Name of the Lambda function; also the name of the IAM role and the prefix of the webhook function (<name>-webhook), queue, rules, alarms and token secret it creates."
  type        = string
  default     = "node-fencer"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,48}$", var.name))
    error_message = "name must be 1-48 characters of letters, digits, '-' and '_' (derived names add up to 16 characters)."
  }
}

variable "package_path" {
  description = "Path to the deployment zip built by `cargo lambda build --release --package node-fencer --output-format zip` (target/lambda/node-fencer/bootstrap.zip); it holds one `bootstrap` executable."
  type        = string

  validation {
    condition     = endswith(var.package_path, ".zip")
    error_message = "package_path must name a .zip file."
  }
}

variable "architecture" {
  description = "Instruction set the zip was built for: x86_64, or arm64 (build with `cargo lambda build --release --package node-fencer --arm64 --output-format zip`)."
  type        = string
  default     = "x86_64"

  validation {
    condition     = contains(["x86_64", "arm64"], var.architecture)
    error_message = "architecture must be \"x86_64\" or \"arm64\"."
  }
}

variable "memory_size" {
  description = "Memory of the function in MiB (CPU scales with it)."
  type        = number
  default     = 256

  validation {
    condition     = var.memory_size >= 128 && var.memory_size <= 10240 && floor(var.memory_size) == var.memory_size
    error_message = "memory_size must be a whole number of MiB from 128 to 10240."
  }
}

variable "reserved_concurrent_executions" {
  description = "Reserved concurrency of the main function (EventBridge events, the recovery schedule, direct invocations; the Function URL has a function of its own, see webhook_reserved_concurrent_executions). The default 1 runs one decision at a time, so two nodes failing together cannot both see room under max_out_of_service and overshoot it (the Lease in control_namespace serialises fencing across invocations and across both functions as well, so a larger value stays within the cap). EventBridge events that find it busy wait in Lambda's async queue (up to async_maximum_event_age_seconds). -1 removes the reservation."
  type        = number
  default     = 1

  validation {
    condition     = var.reserved_concurrent_executions == -1 || (var.reserved_concurrent_executions >= 1 && floor(var.reserved_concurrent_executions) == var.reserved_concurrent_executions)
    error_message = "reserved_concurrent_executions must be -1 (unreserved) or a whole number >= 1 (0 would disable the function)."
  }
}

variable "webhook_reserved_concurrent_executions" {
  description = "Reserved concurrency of the webhook function <name>-webhook, the only one behind the Function URL (enable_alertmanager_url). Every request to the public URL, with the token or refused with 401, runs there and never takes the main function's concurrency, so no URL caller can delay EventBridge events or the recovery schedule. With the default 1, an Alertmanager request that finds it busy gets HTTP 429 and its alert is sent again at the next group_interval or repeat_interval. -1 removes the reservation (URL callers then draw on the account's unreserved concurrency); it and reserved_concurrent_executions cannot both be -1."
  type        = number
  default     = 1

  validation {
    condition     = var.webhook_reserved_concurrent_executions == -1 || (var.webhook_reserved_concurrent_executions >= 1 && floor(var.webhook_reserved_concurrent_executions) == var.webhook_reserved_concurrent_executions)
    error_message = "webhook_reserved_concurrent_executions must be -1 (unreserved) or a whole number >= 1 (0 would disable the function)."
  }
}

variable "code_signing_config_arn" {
  description = "ARN of a Lambda code signing configuration to enforce on the zip, or null for none."
  type        = string
  default     = null
}

variable "vpc_subnet_ids" {
  description = "Subnets to run the function in, for clusters whose API endpoint is private. Empty runs it outside any VPC (it then reaches the AWS APIs and a public cluster endpoint directly). The subnets need a route to the AWS APIs (NAT or VPC endpoints for EC2, EKS/Secrets Manager/SSM and STS)."
  type        = list(string)
  default     = []
}

variable "vpc_security_group_ids" {
  description = "Security groups of the function when vpc_subnet_ids is set; they must allow egress to the cluster endpoint and the AWS APIs on 443."
  type        = list(string)
  default     = []
}

variable "permissions_boundary_arn" {
  description = "ARN of an IAM permissions boundary for the function's role, or null for none."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource that takes them."
  type        = map(string)
  default     = {}
}

################################################################################
# Behaviour (environment of the function)
################################################################################

# Passed unchanged to the settings module both platforms share
# (infra/modules/settings), which validates them and renders the environment;
# only the waits are validated here, bounded to fit this platform's time limit.

variable "dry_run" {
  description = "DRY_RUN: when true the function decides and reports, but never taints a node or detaches a volume."
  type        = bool
  default     = false
}

variable "fence_hibernated" {
  description = "FENCE_HIBERNATED: when true an instance stopped by hibernation counts as off. By default it does not: started again, it resumes from RAM with whatever it meant to write."
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
  description = "MAX_OUT_OF_SERVICE: how many nodes of the cluster may carry the out-of-service taint at once; past it the function refuses to fence more."
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
  description = "CONTROL_NAMESPACE: namespace of the function's Lease and kill-switch ConfigMap, both named node-fencer. The Role and RoleBinding of infra/kubernetes/rbac.yaml live in kube-system: for another namespace, apply them there (the kubernetes-rbac module's control_namespace), or the function cannot take the Lease."
  type        = string
  default     = "kube-system"
}

# The function timeout is the sum of the waits one invocation may make (see
# local.function_timeout in main.tf). The code accepts up to 600 s of detach
# wait and 300 s for each delay, far more than fits in Lambda's 900 s, so the
# four bounds below, with that of power_off_wait_seconds (active fencing),
# split those 900 s between them.

variable "confirm_again_after_seconds" {
  description = "CONFIRM_AGAIN_AFTER_SECONDS: ask EC2 a second time, after this delay, that the instance is still off before acting; 0 acts on the first answer. The code accepts up to 300; at most 120 here keeps the function timeout within Lambda's 900 s."
  type        = number
  default     = 0

  validation {
    condition     = var.confirm_again_after_seconds >= 0 && var.confirm_again_after_seconds <= 120 && floor(var.confirm_again_after_seconds) == var.confirm_again_after_seconds
    error_message = "confirm_again_after_seconds must be a whole number from 0 to 120."
  }
}

variable "volume_detach_timeout_seconds" {
  description = "VOLUME_DETACH_TIMEOUT_SECONDS: how long the function waits for detached volumes to become available. The code accepts up to 600; at most 180 here keeps the function timeout within Lambda's 900 s, power_off_wait_seconds included."
  type        = number
  default     = 60

  validation {
    condition     = var.volume_detach_timeout_seconds >= 1 && var.volume_detach_timeout_seconds <= 180 && floor(var.volume_detach_timeout_seconds) == var.volume_detach_timeout_seconds
    error_message = "volume_detach_timeout_seconds must be a whole number from 1 to 180 (0 would report every fence failed)."
  }
}

variable "not_ready_wait_seconds" {
  description = "NOT_READY_WAIT_SECONDS: when EC2 confirms the instance off while its Node is still Ready (the stop event comes before the node controller's --node-monitor-grace-period, 50 s by default, is over), wait this long within the invocation for the Node to turn NotReady, then fence at once; 0 fails the invocation for Lambda's retries. The code accepts up to 300; at most 120 here keeps the function timeout within Lambda's 900 s."
  type        = number
  default     = 60

  validation {
    condition     = var.not_ready_wait_seconds >= 0 && var.not_ready_wait_seconds <= 120 && floor(var.not_ready_wait_seconds) == var.not_ready_wait_seconds
    error_message = "not_ready_wait_seconds must be a whole number from 0 to 120."
  }
}

variable "recovery_settle_seconds" {
  description = "RECOVERY_SETTLE_SECONDS: how long a fenced node must be Ready again before the function removes its taint; a requested recovery waits it out within the invocation. The code accepts up to 300; at most 120 here keeps the function timeout within Lambda's 900 s."
  type        = number
  default     = 30

  validation {
    condition     = var.recovery_settle_seconds >= 0 && var.recovery_settle_seconds <= 120 && floor(var.recovery_settle_seconds) == var.recovery_settle_seconds
    error_message = "recovery_settle_seconds must be a whole number from 0 to 120."
  }
}

variable "recovery" {
  description = "RECOVERY: auto ends a fencing once the instance runs, the node is Ready and settled and no attachment of ours remains; manual also waits for an operator to confirm the node healthy (node-fencer recover --confirm NODE, or the direct invocation {\"action\": \"recover\", \"node\": NODE, \"confirm\": true})."
  type        = string
  default     = "auto"
}

variable "log_format" {
  description = "LOG_FORMAT of the function's own log lines: json (one JSON object a line, for CloudWatch Logs Insights) or text. The Lambda platform log format follows it."
  type        = string
  default     = "json"
}

variable "log_level" {
  description = "RUST_LOG filter of the function, e.g. \"info\" or \"info,node_fencer=debug\"."
  type        = string
  default     = "info"
}

################################################################################
# Active fencing (opt-in): power off a dead node whose instance still runs
################################################################################

variable "active_fencing" {
  description = "ACTIVE_FENCING: \"stuck\" or \"on\": a node NotReady for power_off_after_seconds whose instance EC2 still reports running (found by the sweep, a firing KubeNodeNotReady alert, or `fence --power-off`) is powered off (ec2:StopInstances, forced, without OS shutdown), waited for until stopped, then fenced as a stopped one; its status checks are read with ec2:DescribeInstanceStatus. The role may stop only instances carrying power_off_instance_tag. With \"stuck\" only a node on which a pod holds a volume only one node may attach (ReadWriteOnce: stuck, which Kubernetes never frees for a StatefulSet), the rest left to Kubernetes; with \"on\" any such node. \"off\" (the default) sets none of ACTIVE_FENCING, POWER_OFF_AFTER_SECONDS, POWER_OFF_WAIT_SECONDS and PARTITION_PERCENT, and grants neither action. true and false, as this variable once was, are taken for \"on\" and \"off\"."
  type        = string
  default     = "off"

  validation {
    condition     = contains(["off", "stuck", "on", "true", "false"], var.active_fencing)
    error_message = "active_fencing must be off, stuck or on."
  }
}

variable "power_off_after_seconds" {
  description = "POWER_OFF_AFTER_SECONDS, with active_fencing: how long a node must have been NotReady before its instance may be powered off."
  type        = number
  default     = 120

  validation {
    condition     = var.power_off_after_seconds >= 60 && var.power_off_after_seconds <= 3600 && floor(var.power_off_after_seconds) == var.power_off_after_seconds
    error_message = "power_off_after_seconds must be a whole number from 60 to 3600."
  }
}

variable "power_off_wait_seconds" {
  description = "POWER_OFF_WAIT_SECONDS, with active_fencing: how long, within the invocation, the function waits for a powered-off instance to reach stopped; one not stopped by then fails the invocation for a retry, untainted. Added to the function timeout when active_fencing is on. The code accepts up to 600; at most 120 here keeps the function timeout within Lambda's 900 s."
  type        = number
  default     = 120

  validation {
    condition     = var.power_off_wait_seconds >= 10 && var.power_off_wait_seconds <= 120 && floor(var.power_off_wait_seconds) == var.power_off_wait_seconds
    error_message = "power_off_wait_seconds must be a whole number from 10 to 120."
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

variable "power_off_instance_tag" {
  description = "With active_fencing: the tag (key and value) an instance must carry for the role to stop it, as a condition on aws:ResourceTag/<key> of ec2:StopInstances, so that the function can stop only the cluster's own instances. Null in EKS mode means key kubernetes.io/cluster/<cluster_name> with value owned, which EKS managed node groups, Karpenter and self-managed EKS nodes carry; self-managed clusters (kubeconfig_*) must set it to a tag every node instance carries."
  type = object({
    key   = string
    value = string
  })
  default = null

  validation {
    condition     = var.power_off_instance_tag == null ? true : (length(var.power_off_instance_tag.key) >= 1 && length(var.power_off_instance_tag.key) <= 128 && length(var.power_off_instance_tag.value) <= 256)
    error_message = "power_off_instance_tag must be null or a tag: key of 1-128 characters, value of up to 256."
  }
}

variable "power_off_control_plane" {
  description = "POWER_OFF_CONTROL_PLANE, with active_fencing: allow the power-off of a Node with the control-plane role (self-managed clusters: kOps, kubeadm, Cluster API). False (the default) leaves POWER_OFF_CONTROL_PLANE unset, which the code takes as false, and adds to the role a Deny of ec2:StopInstances on every instance carrying one of control_plane_instance_tags, so that not even a mistaken decision can stop one; true sets POWER_OFF_CONTROL_PLANE=true and drops that Deny."
  type        = bool
  default     = false
}

variable "control_plane_instance_tags" {
  description = "With active_fencing and not power_off_control_plane: the tags that mark a control-plane instance, each {key, value} where value may hold IAM's * and ? wildcards (\"*\": any value); ec2:StopInstances is denied on an instance carrying any of them. The default covers kOps (k8s.io/role/control-plane = 1, and the earlier k8s.io/role/master = 1, which kOps still writes beside it) and Cluster API's AWS provider (sigs.k8s.io/cluster-api-provider-aws/role = control-plane). kubeadm tags nothing: add the tag your own provisioning puts on control-plane instances. EKS runs its control plane outside the account: nothing to add."
  type = list(object({
    key   = string
    value = string
  }))
  default = [
    { key = "k8s.io/role/control-plane", value = "*" },
    { key = "k8s.io/role/master", value = "*" },
    { key = "sigs.k8s.io/cluster-api-provider-aws/role", value = "control-plane" },
  ]

  validation {
    condition     = alltrue([for tag in var.control_plane_instance_tags : length(tag.key) >= 1 && length(tag.key) <= 128 && length(tag.value) >= 1 && length(tag.value) <= 256])
    error_message = "control_plane_instance_tags must be tags {key, value}: key of 1-128 characters, value of 1-256 (\"*\" for any value)."
  }
}

################################################################################
# Cluster access: exactly one of cluster_name, kubeconfig_ssm_parameter_name,
# kubeconfig_secret_arn
################################################################################

variable "cluster_vpc_id" {
  description = "CLUSTER_VPC_ID: the cluster's VPC. An EC2 event's instance in another VPC is let go without a Kubernetes request. Clusters without a cloud provider (Nodes with no AWS provider id) need it: such a Node is fenced only when an EC2 event's instance runs in this VPC and holds the Node's InternalIP; a private DNS name alone never names a machine. Unset, such Nodes are never fenced."
  type        = string
  default     = null

  validation {
    condition     = var.cluster_vpc_id == null || can(regex("^vpc-([0-9a-f]{8}|[0-9a-f]{17})$", var.cluster_vpc_id))
    error_message = "cluster_vpc_id must be a VPC id: vpc- and 8 or 17 lowercase hex digits."
  }
}

variable "cluster_tag" {
  description = "CLUSTER_TAG, with cluster_vpc_id: a tag KEY or KEY=VALUE the cluster's instances carry (for example kubernetes.io/cluster/NAME=owned), also required of an instance matched to a Node without a provider id. A key kubernetes.io/cluster/NAME also names the cluster: an instance tagged for other clusters only is let go without a Kubernetes request."
  type        = string
  default     = null

  validation {
    condition     = var.cluster_tag == null || can(regex("^[^=]{1,128}(=.{0,256})?$", var.cluster_tag))
    error_message = "cluster_tag must be KEY (1-128 characters) or KEY=VALUE (value up to 256)."
  }
}

variable "cluster_name" {
  description = "EKS mode: name of the EKS cluster in this account and region (CLUSTER_NAME). The function authenticates with its IAM role; see eks_access_entry. Also names the cluster: an EC2 event's instance tagged for other clusters only is let go without a Kubernetes request."
  type        = string
  default     = null
}

variable "cluster_endpoint" {
  description = "EKS mode, optional: API server URL (CLUSTER_ENDPOINT). Set together with cluster_ca_data to spare the eks:DescribeCluster call and permission."
  type        = string
  default     = null
}

variable "cluster_ca_data" {
  description = "EKS mode, optional: base64 PEM of the cluster CA (CLUSTER_CA_DATA), as in the cluster's certificateAuthority.data. Set together with cluster_endpoint."
  type        = string
  default     = null
}

variable "eks_access_entry" {
  description = "EKS mode: create an EKS access entry that maps the function's role to the Kubernetes group \"node-fencer\" (bound by infra/kubernetes/rbac.yaml). Needs the cluster's authentication mode API or API_AND_CONFIG_MAP; set false to map the role yourself (aws-auth ConfigMap)."
  type        = bool
  default     = true
}

variable "kubeconfig_ssm_parameter_name" {
  description = "Self-managed mode: name of an SSM SecureString parameter in this account and region holding the function's kubeconfig (KUBECONFIG_SSM_PARAMETER)."
  type        = string
  default     = null
}

variable "kubeconfig_secret_arn" {
  description = "Self-managed mode: full ARN (with its 6-character suffix) of a Secrets Manager secret holding the function's kubeconfig (KUBECONFIG_SECRET_ID)."
  type        = string
  default     = null

  validation {
    condition     = var.kubeconfig_secret_arn == null || can(regex("^arn:[^:]+:secretsmanager:[^:]+:[0-9]{12}:secret:.+-[A-Za-z0-9]{6}$", var.kubeconfig_secret_arn))
    error_message = "kubeconfig_secret_arn must be the complete secret ARN, ending in -XXXXXX."
  }
}

variable "kms_key_arn" {
  description = "Customer managed KMS key that encrypts the kubeconfig parameter/secret and the webhook token. When set, the module encrypts the token with it and grants the function kms:Decrypt on it, only through SSM and Secrets Manager. Null uses the AWS managed keys, which need no grant."
  type        = string
  default     = null
}

################################################################################
# EBS detach scope
################################################################################

variable "detach_volume_require_tag" {
  description = "Allow ec2:DetachVolume only on volumes carrying detach_volume_tag_key = detach_volume_tag_value. Set false for clusters whose PersistentVolumes include volumes not created by the EBS CSI driver (static or in-tree provisioned), which lack the tag."
  type        = bool
  default     = true
}

variable "detach_volume_tag_key" {
  description = "Tag key a volume must carry to be detachable (see detach_volume_require_tag). The EBS CSI driver sets ebs.csi.aws.com/cluster = true on every volume it creates, in every cluster of the account: for a condition of this cluster's own, see detach_volume_cluster_id."
  type        = string
  default     = "ebs.csi.aws.com/cluster"
}

variable "detach_volume_tag_value" {
  description = "Value of detach_volume_tag_key a volume must carry to be detachable."
  type        = string
  default     = "true"
}

variable "detach_volume_cluster_id" {
  description = "The cluster id the EBS CSI driver tags its volumes with, to allow ec2:DetachVolume only on this cluster's volumes: the driver's --k8s-tag-cluster-id=<id> (Helm controller.k8sTagClusterId) tags every volume it creates kubernetes.io/cluster/<id> = owned (and KubernetesCluster = <id>), as the in-tree plugin tagged its own. When set, the condition keys on kubernetes.io/cluster/<id> = owned instead of detach_volume_tag_key and detach_volume_tag_value. Null keeps those (by default the driver's ebs.csi.aws.com/cluster = true, which every cluster's volumes carry)."
  type        = string
  default     = null

  validation {
    condition     = var.detach_volume_cluster_id == null ? true : (length(var.detach_volume_cluster_id) >= 1 && length(var.detach_volume_cluster_id) <= 107)
    error_message = "detach_volume_cluster_id must be null or the driver's cluster id: 1-107 characters (kubernetes.io/cluster/ and it make a tag key of at most 128)."
  }
}

################################################################################
# EventBridge trigger and asynchronous delivery
################################################################################

variable "instance_ids" {
  description = "Limit the EventBridge rule to these EC2 instance ids; empty matches every instance of the account and region. The state-change event carries only the instance id and state, no tags, so the rule cannot filter on tags: the function itself ignores instances that are no node of its cluster (a cheap no-op)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for id in var.instance_ids : can(regex("^i-[0-9a-f]{8,17}$", id))])
    error_message = "instance_ids must be EC2 instance ids (i-...)."
  }
}

variable "recovery_schedule" {
  description = "EventBridge schedule expression of the sweep: it invokes the function with {\"action\":\"sweep\"}, which fences NotReady nodes no event named (missed, dead-lettered, or consumed while the kill switch was on) whose instance EC2 reports off, and re-checks every node the function fenced, removing the taint once the instance runs and the node is Ready again. Each sweep also counts the Nodes others put out of service, so that events until the next one read their Node by name instead of listing every Node. Null creates no schedule (nodes are then looked at only on EC2 events, alerts and direct requests, each listing every Node)."
  type        = string
  default     = "rate(10 minutes)"

  validation {
    condition     = var.recovery_schedule == null || can(regex("^(rate|cron)\\(.+\\)$", var.recovery_schedule))
    error_message = "recovery_schedule must be null or an EventBridge schedule expression: rate(...) or cron(...)."
  }
}

variable "event_maximum_age_seconds" {
  description = "EventBridge retry policy: how long EventBridge keeps trying to hand an event to the function before sending it to the dead-letter queue."
  type        = number
  default     = 3600

  validation {
    condition     = var.event_maximum_age_seconds >= 60 && var.event_maximum_age_seconds <= 86400
    error_message = "event_maximum_age_seconds must be from 60 to 86400."
  }
}

variable "event_maximum_retry_attempts" {
  description = "EventBridge retry policy: how many times EventBridge retries handing an event to the function."
  type        = number
  default     = 8

  validation {
    condition     = var.event_maximum_retry_attempts >= 0 && var.event_maximum_retry_attempts <= 185
    error_message = "event_maximum_retry_attempts must be from 0 to 185."
  }
}

variable "async_maximum_event_age_seconds" {
  description = "Lambda asynchronous invocation: how long an accepted event may wait (throttled by the reserved concurrency, or between retries) before it goes to the dead-letter queue. Safe to keep long: the function confirms the instance state with EC2 at decision time."
  type        = number
  default     = 3600

  validation {
    condition     = var.async_maximum_event_age_seconds >= 60 && var.async_maximum_event_age_seconds <= 21600
    error_message = "async_maximum_event_age_seconds must be from 60 to 21600."
  }
}

variable "async_maximum_retry_attempts" {
  description = "Lambda asynchronous invocation: retries after the function returned an error (every trigger is idempotent)."
  type        = number
  default     = 2

  validation {
    condition     = contains([0, 1, 2], var.async_maximum_retry_attempts)
    error_message = "async_maximum_retry_attempts must be 0, 1 or 2."
  }
}

################################################################################
# Logs and alarms
################################################################################

variable "log_retention_days" {
  description = "Retention of the functions' CloudWatch log groups /aws/lambda/<name> and /aws/lambda/<name>-webhook, in days."
  type        = number
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."
  }
}

variable "log_kms_key_arn" {
  description = "KMS key ARN to encrypt the log groups with, or null for CloudWatch Logs' own encryption. Its key policy must allow the logs.<region>.amazonaws.com service principal."
  type        = string
  default     = null
}

################################################################################
# Notifications
################################################################################

variable "notification_topic_arn" {
  description = "NOTIFY_TOPIC: an existing standard SNS topic each fencing, refusal, power-off and recovery is published to, one JSON message each (docs/notifications.md); the role gets sns:Publish on it alone. A topic encrypted with a customer-managed KMS key also needs kms:GenerateDataKey and kms:Decrypt on that key, granted by its key policy. null: see create_notification_topic."
  type        = string
  default     = null

  validation {
    condition     = var.notification_topic_arn == null ? true : can(regex("^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$", var.notification_topic_arn))
    error_message = "notification_topic_arn must be null or the ARN of a standard SNS topic (arn:aws:sns:REGION:ACCOUNT:NAME; a FIFO topic is not supported)."
  }
}

variable "create_notification_topic" {
  description = "Create the SNS topic <name>-notifications (encrypted with the AWS-managed key alias/aws/sns) and publish the notifications to it. Excludes notification_topic_arn."
  type        = bool
  default     = false
}

variable "notification_emails" {
  description = "E-mail addresses subscribed to the created topic (create_notification_topic); each receives a confirmation e-mail from SNS first. Chat integrations subscribe to the topic_arn output (docs/notifications.md)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for e in var.notification_emails : can(regex("^[^@ ]+@[^@ ]+\\.[^@ ]+$", e))])
    error_message = "notification_emails must hold e-mail addresses."
  }
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic ARN notified when an alarm fires and clears (dead-letter queue not empty, function errors); null creates the alarms without actions."
  type        = string
  default     = null
}

################################################################################
# Alertmanager webhook
################################################################################

variable "enable_alertmanager_url" {
  description = "Create the webhook function <name>-webhook with a Lambda Function URL for Alertmanager's webhook, and a bearer token for it. The URL is public (authorization NONE) because Alertmanager cannot sign SigV4 requests; the function rejects any request without the token. Its own function and reserved concurrency (webhook_reserved_concurrent_executions) keep URL callers from delaying the main function."
  type        = bool
  default     = true
}

variable "webhook_token_store" {
  description = "Where the generated webhook token is kept: secretsmanager (WEBHOOK_TOKEN_SECRET_ID) or ssm (SecureString, WEBHOOK_TOKEN_SSM_PARAMETER)."
  type        = string
  default     = "secretsmanager"

  validation {
    condition     = contains(["secretsmanager", "ssm"], var.webhook_token_store)
    error_message = "webhook_token_store must be \"secretsmanager\" or \"ssm\"."
  }
}

variable "secret_recovery_window_days" {
  description = "Recovery window of the token secret when it is deleted (0 deletes at once, so the same name can be created again right away)."
  type        = number
  default     = 7

  validation {
    condition     = var.secret_recovery_window_days == 0 || (var.secret_recovery_window_days >= 7 && var.secret_recovery_window_days <= 30)
    error_message = "secret_recovery_window_days must be 0 or from 7 to 30."
  }
}

variable "alertmanager_credentials_file" {
  description = "Path of the token file inside the Alertmanager container, used in the rendered receiver snippet (the Prometheus Operator mounts Secret <name> key <key> at /etc/alertmanager/secrets/<name>/<key>)."
  type        = string
  default     = "/etc/alertmanager/secrets/node-fencer-webhook/token"
}
