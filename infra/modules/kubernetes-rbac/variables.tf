variable "rbac_manifest_path" {
  description = "Path to the RBAC manifest to apply; null uses infra/kubernetes/rbac.yaml of this repository, the file the end-to-end tests run under."
  type        = string
  default     = null
}

variable "control_namespace" {
  description = "Namespace to apply the manifest's Role and RoleBinding in (the function's Lease and kill-switch ConfigMap); must equal the function's CONTROL_NAMESPACE (the node-fencer module's control_namespace). Null keeps the manifest's namespace, kube-system."
  type        = string
  default     = null

  validation {
    condition     = var.control_namespace == null || can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.control_namespace))
    error_message = "control_namespace must be a namespace name: up to 63 lowercase letters, digits and '-', starting and ending with a letter or digit."
  }
}

variable "create_service_account" {
  description = "Self-managed clusters: also create the ServiceAccount service_account_name in service_account_namespace, bind it to the ClusterRole and the Role and issue it a long-lived token Secret, to build the function's kubeconfig from. Not needed on EKS, where the function's IAM role is mapped to the group by an access entry."
  type        = bool
  default     = false
}

variable "service_account_namespace" {
  description = "Namespace of the ServiceAccount and its token Secret."
  type        = string
  default     = "kube-system"
}

variable "service_account_name" {
  description = "Name of the ServiceAccount; its token Secret is named <name>-token."
  type        = string
  default     = "node-fencer"
}

variable "api_server_url" {
  description = "With create_service_account: API server URL as the function reaches it, written into the kubeconfig output. Null leaves the kubeconfig output null."
  type        = string
  default     = null
}

variable "labels" {
  description = "Extra labels for the ServiceAccount, its Secret and binding (the manifest's roles and bindings keep the manifest's labels)."
  type        = map(string)
  default     = {}
}

variable "users" {
  description = "Kubernetes users to bind to the ClusterRole and to every Role of the manifest besides its group. On GKE a Google service account authenticates as the user named by its email (the node-fencer-gcp module's service_account_email); EKS and self-managed clusters need none."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for u in var.users : length(trimspace(u)) > 0])
    error_message = "users must not hold empty names."
  }
}

variable "grant_node_status" {
  description = "Grant patch on nodes/status. Only FAST_NOT_READY (on by default; marking a Node whose kubelet is proven silent Ready=Unknown) and the legacy mode (releasing volumesInUse; FENCING_MODE=legacy, or auto before Kubernetes 1.26) write it: a deployment with both off may set false. `node-fencer preflight` names the grants a configuration does not need."
  type        = bool
  default     = true
}

variable "grant_node_lease_reads" {
  description = "Grant reading the kubelets' Leases in kube-node-lease (the manifest's Role there and its binding). Only FAST_NOT_READY (on by default) reads them: a deployment with FAST_NOT_READY=false may set false."
  type        = bool
  default     = true
}
