# Applies infra/kubernetes/rbac.yaml, the single source of truth for what
# node-fencer may do in the cluster: the rules are read from the file, never
# restated here. Typed resources (not kubernetes_manifest) keep plans working
# before the cluster is reachable.

locals {
  manifest_path = coalesce(var.rbac_manifest_path, "${path.module}/../../kubernetes/rbac.yaml")

  # Split the multi-document YAML; comment-only documents decode to null.
  documents = [
    for doc in split("\n---", "\n${file(local.manifest_path)}") : yamldecode(doc)
    if try(yamldecode(doc), null) != null
  ]

  cluster_role         = one([for d in local.documents : d if d.kind == "ClusterRole"])
  cluster_role_binding = one([for d in local.documents : d if d.kind == "ClusterRoleBinding"])

  # The namespaced Roles (the control objects in CONTROL_NAMESPACE, the
  # kubelets' Leases in kube-node-lease) and their RoleBindings, keyed by the
  # manifest's namespace/name: for_each, so the manifest decides how many
  # there are. control_namespace moves those of the control namespace; the
  # kubelets' Leases stay where Kubernetes keeps them.
  fixed_namespaces = ["kube-node-lease"]
  # What a deployment's settings never use may be left out (preflight names
  # it): the kubelets' Leases, which only FAST_NOT_READY reads, and the
  # nodes/status writes, which only FAST_NOT_READY and the legacy mode make.
  dropped_namespaces = var.grant_node_lease_reads ? [] : ["kube-node-lease"]
  cluster_rules = [
    for r in local.cluster_role.rules : r
    if var.grant_node_status || !contains(try(r.resources, []), "nodes/status")
  ]
  roles = {
    for d in local.documents : "${d.metadata.namespace}/${d.metadata.name}" => merge(d, {
      namespace = contains(local.fixed_namespaces, d.metadata.namespace) ? d.metadata.namespace : coalesce(var.control_namespace, d.metadata.namespace)
    }) if d.kind == "Role" && !contains(local.dropped_namespaces, d.metadata.namespace)
  }
  role_bindings = {
    for d in local.documents : "${d.metadata.namespace}/${d.metadata.name}" => merge(d, {
      namespace = contains(local.fixed_namespaces, d.metadata.namespace) ? d.metadata.namespace : coalesce(var.control_namespace, d.metadata.namespace)
      role_key  = "${d.metadata.namespace}/${d.roleRef.name}"
    }) if d.kind == "RoleBinding" && !contains(local.dropped_namespaces, d.metadata.namespace)
  }

  labels = merge({ "app.kubernetes.io/name" = "node-fencer" }, var.labels)
}

resource "kubernetes_cluster_role_v1" "this" {
  metadata {
    name        = local.cluster_role.metadata.name
    labels      = try(local.cluster_role.metadata.labels, {})
    annotations = try(local.cluster_role.metadata.annotations, {})
  }

  dynamic "rule" {
    for_each = local.cluster_rules

    content {
      api_groups     = try(rule.value.apiGroups, null)
      resources      = try(rule.value.resources, null)
      resource_names = try(rule.value.resourceNames, null)
      verbs          = rule.value.verbs
    }
  }

  lifecycle {
    precondition {
      condition     = local.cluster_role_binding.roleRef.name == local.cluster_role.metadata.name
      error_message = "The ClusterRoleBinding in ${local.manifest_path} must refer to its ClusterRole."
    }
  }
}

resource "kubernetes_cluster_role_binding_v1" "this" {
  metadata {
    name        = local.cluster_role_binding.metadata.name
    labels      = try(local.cluster_role_binding.metadata.labels, {})
    annotations = try(local.cluster_role_binding.metadata.annotations, {})
  }

  role_ref {
    api_group = local.cluster_role_binding.roleRef.apiGroup
    kind      = local.cluster_role_binding.roleRef.kind
    name      = kubernetes_cluster_role_v1.this.metadata[0].name
  }

  dynamic "subject" {
    for_each = local.cluster_role_binding.subjects

    content {
      kind      = subject.value.kind
      name      = subject.value.name
      api_group = try(subject.value.apiGroup, null)
      namespace = try(subject.value.namespace, null)
    }
  }
}

resource "kubernetes_role_v1" "this" {
  for_each = local.roles

  metadata {
    name        = each.value.metadata.name
    namespace   = each.value.namespace
    labels      = try(each.value.metadata.labels, {})
    annotations = try(each.value.metadata.annotations, {})
  }

  dynamic "rule" {
    for_each = each.value.rules

    content {
      api_groups     = try(rule.value.apiGroups, null)
      resources      = try(rule.value.resources, null)
      resource_names = try(rule.value.resourceNames, null)
      verbs          = rule.value.verbs
    }
  }
}

resource "kubernetes_role_binding_v1" "this" {
  for_each = local.role_bindings

  metadata {
    name        = each.value.metadata.name
    namespace   = each.value.namespace
    labels      = try(each.value.metadata.labels, {})
    annotations = try(each.value.metadata.annotations, {})
  }

  role_ref {
    api_group = each.value.roleRef.apiGroup
    kind      = each.value.roleRef.kind
    name      = kubernetes_role_v1.this[each.value.role_key].metadata[0].name
  }

  dynamic "subject" {
    for_each = each.value.subjects

    content {
      kind      = subject.value.kind
      name      = subject.value.name
      api_group = try(subject.value.apiGroup, null)
      namespace = try(subject.value.namespace, null)
    }
  }

  lifecycle {
    precondition {
      condition     = each.value.roleRef.kind == "Role" && contains(keys(local.roles), each.value.role_key)
      error_message = "The RoleBinding ${each.key} in ${local.manifest_path} must refer to a Role of the manifest in its own namespace."
    }
  }
}

################################################################################
# Users: identities the cluster knows by name rather than by group, such as a
# Google service account on GKE (the user is its email), bound to the
# ClusterRole and to every Role of the manifest.
################################################################################

resource "kubernetes_cluster_role_binding_v1" "users" {
  count = length(var.users) > 0 ? 1 : 0

  metadata {
    name   = "${kubernetes_cluster_role_v1.this.metadata[0].name}-users"
    labels = local.labels
  }

  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "ClusterRole"
    name      = kubernetes_cluster_role_v1.this.metadata[0].name
  }

  dynamic "subject" {
    for_each = var.users

    content {
      kind      = "User"
      name      = subject.value
      api_group = "rbac.authorization.k8s.io"
    }
  }
}

resource "kubernetes_role_binding_v1" "users" {
  for_each = { for key, role in local.roles : key => role if length(var.users) > 0 }

  metadata {
    name      = "${kubernetes_role_v1.this[each.key].metadata[0].name}-users"
    namespace = kubernetes_role_v1.this[each.key].metadata[0].namespace
    labels    = local.labels
  }

  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.this[each.key].metadata[0].name
  }

  dynamic "subject" {
    for_each = var.users

    content {
      kind      = "User"
      name      = subject.value
      api_group = "rbac.authorization.k8s.io"
    }
  }
}

################################################################################
# Self-managed clusters: a ServiceAccount with a long-lived token
#
# The function reads a kubeconfig from SSM or Secrets Manager; this identity is
# what that kubeconfig authenticates as, bound to the ClusterRole and to every
# Role of the manifest. The token Secret does not expire: rotate it by deleting
# the Secret (Kubernetes issues a new token) or with `terraform apply -replace`,
# then update the stored kubeconfig.
################################################################################

resource "kubernetes_service_account_v1" "this" {
  count = var.create_service_account ? 1 : 0

  metadata {
    name      = var.service_account_name
    namespace = var.service_account_namespace
    labels    = local.labels
  }

  # Only used from outside the cluster; no pod mounts its token.
  automount_service_account_token = false
}

resource "kubernetes_cluster_role_binding_v1" "service_account" {
  count = var.create_service_account ? 1 : 0

  metadata {
    name   = "${kubernetes_cluster_role_v1.this.metadata[0].name}-serviceaccount"
    labels = local.labels
  }

  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "ClusterRole"
    name      = kubernetes_cluster_role_v1.this.metadata[0].name
  }

  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.this[0].metadata[0].name
    namespace = kubernetes_service_account_v1.this[0].metadata[0].namespace
  }
}

resource "kubernetes_role_binding_v1" "service_account" {
  for_each = { for key, role in local.roles : key => role if var.create_service_account }

  metadata {
    name      = "${kubernetes_role_v1.this[each.key].metadata[0].name}-serviceaccount"
    namespace = kubernetes_role_v1.this[each.key].metadata[0].namespace
    labels    = local.labels
  }

  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.this[each.key].metadata[0].name
  }

  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.this[0].metadata[0].name
    namespace = kubernetes_service_account_v1.this[0].metadata[0].namespace
  }
}

resource "kubernetes_secret_v1" "token" {
  count = var.create_service_account ? 1 : 0

  metadata {
    name      = "${var.service_account_name}-token"
    namespace = var.service_account_namespace
    labels    = local.labels
    annotations = {
      "kubernetes.io/service-account.name" = kubernetes_service_account_v1.this[0].metadata[0].name
    }
  }

  type                           = "kubernetes.io/service-account-token"
  wait_for_service_account_token = true
}

locals {
  token   = one(kubernetes_secret_v1.token[*].data["token"])
  ca_cert = one(kubernetes_secret_v1.token[*].data["ca.crt"])

  kubeconfig = var.create_service_account && var.api_server_url != null ? yamlencode({
    apiVersion = "v1"
    kind       = "Config"
    clusters = [{
      name = "cluster"
      cluster = {
        server                     = var.api_server_url
        certificate-authority-data = base64encode(local.ca_cert)
      }
    }]
    users = [{
      name = var.service_account_name
      user = { token = local.token }
    }]
    contexts = [{
      name    = var.service_account_name
      context = { cluster = "cluster", user = var.service_account_name }
    }]
    current-context = var.service_account_name
  }) : null
}
