variable "rbac_manifest_path" {
  description = "Path to the RBAC manifest to apply; null uses infra/kubernetes/rbac.yaml of this repository, the file the end-to-end tests run under."
  type        = string
  default     = null
}

variable "create_service_account" {
  description = "Self-managed clusters: also create the ServiceAccount service_account_name in service_account_namespace, bind it to the ClusterRole and issue it a long-lived token Secret, to build the function's kubeconfig from. Not needed on EKS, where the function's IAM role is mapped to the group by an access entry."
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
  description = "Extra labels for the ServiceAccount, its Secret and binding (the ClusterRole and its binding keep the labels of the manifest)."
  type        = map(string)
  default     = {}
}
