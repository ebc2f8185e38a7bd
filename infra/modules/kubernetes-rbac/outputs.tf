output "cluster_role_name" {
  description = "Name of the ClusterRole applied from the manifest."
  value       = kubernetes_cluster_role_v1.this.metadata[0].name
}

output "control_namespaces" {
  description = "Namespaces the manifest's control Roles were applied in (not kube-node-lease, where the kubelets' Leases are read): the function's CONTROL_NAMESPACE must be one of them."
  value       = distinct([for role in kubernetes_role_v1.this : role.metadata[0].namespace if !contains(local.fixed_namespaces, role.metadata[0].namespace)])
}

output "kubernetes_groups" {
  description = "Groups the manifest's ClusterRoleBinding binds: map the function's identity to one of them."
  value       = [for s in local.cluster_role_binding.subjects : s.name if s.kind == "Group"]
}

output "service_account_token" {
  description = "Long-lived token of the ServiceAccount (create_service_account), else null."
  value       = local.token
  sensitive   = true
}

output "cluster_ca_data" {
  description = "Base64 PEM of the cluster CA from the token Secret (create_service_account), else null. Marked sensitive only because it comes from a Secret."
  value       = local.ca_cert != null ? base64encode(local.ca_cert) : null
  sensitive   = true
}

output "kubeconfig" {
  description = "Kubeconfig that authenticates as the ServiceAccount at api_server_url, to store in SSM or Secrets Manager for the function; null unless create_service_account and api_server_url are set."
  value       = local.kubeconfig
  sensitive   = true
}

output "users" {
  description = "Users bound to the ClusterRole and the Roles besides the group (var.users)."
  value       = var.users
}
