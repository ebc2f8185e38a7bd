# `tofu test` of the module, plans only: the manifest's objects are applied as
# typed resources, the ServiceAccount and its bindings only when asked for, in
# the namespace asked for. Run it from infra/modules/kubernetes-rbac after
# `tofu init` (make infra-test does); planning reaches no cluster.

run "the_manifests_roles_and_bindings" {
  command = plan

  assert {
    condition     = kubernetes_cluster_role_v1.this.metadata[0].name == "node-fencer" && kubernetes_cluster_role_binding_v1.this.role_ref[0].name == "node-fencer"
    error_message = "the ClusterRole and its binding, named as in rbac.yaml"
  }
  assert {
    condition     = keys(kubernetes_role_v1.this) == ["kube-node-lease/node-fencer", "kube-system/node-fencer"] && kubernetes_role_v1.this["kube-system/node-fencer"].metadata[0].namespace == "kube-system" && kubernetes_role_v1.this["kube-node-lease/node-fencer"].metadata[0].namespace == "kube-node-lease"
    error_message = "each Role in the manifest's namespace"
  }
  assert {
    condition     = length(output.control_namespaces) == 1 && output.control_namespaces[0] == "kube-system"
    error_message = "the control namespace only: the kubelets' Leases are not the function's control objects"
  }
  assert {
    condition     = output.kubernetes_groups == ["node-fencer"]
    error_message = "the group the function's identity is mapped to"
  }
  assert {
    condition     = length(kubernetes_service_account_v1.this) == 0 && length(kubernetes_secret_v1.token) == 0 && length(kubernetes_role_binding_v1.service_account) == 0
    error_message = "no ServiceAccount unless asked for"
  }
  assert {
    condition     = length(kubernetes_cluster_role_binding_v1.users) == 0 && length(kubernetes_role_binding_v1.users) == 0
    error_message = "no user bindings unless users are given"
  }
}

run "another_control_namespace_moves_the_role_and_its_binding" {
  command = plan

  variables {
    control_namespace = "node-fencer"
  }

  assert {
    condition     = kubernetes_role_v1.this["kube-system/node-fencer"].metadata[0].namespace == "node-fencer" && kubernetes_role_binding_v1.this["kube-system/node-fencer"].metadata[0].namespace == "node-fencer"
    error_message = "the Role and RoleBinding in control_namespace"
  }
  assert {
    condition     = kubernetes_role_v1.this["kube-node-lease/node-fencer"].metadata[0].namespace == "kube-node-lease" && kubernetes_role_binding_v1.this["kube-node-lease/node-fencer"].metadata[0].namespace == "kube-node-lease"
    error_message = "the kubelets' Leases stay where Kubernetes keeps them"
  }
}

run "a_service_account_for_self_managed_clusters" {
  command = plan

  variables {
    create_service_account = true
    api_server_url         = "https://k8s-api.internal.example.com:6443"
  }

  assert {
    condition     = length(kubernetes_service_account_v1.this) == 1 && kubernetes_service_account_v1.this[0].automount_service_account_token == false
    error_message = "the ServiceAccount, its token never mounted"
  }
  assert {
    condition     = kubernetes_secret_v1.token[0].type == "kubernetes.io/service-account-token" && kubernetes_secret_v1.token[0].metadata[0].annotations["kubernetes.io/service-account.name"] == "node-fencer"
    error_message = "a long-lived token Secret for it"
  }
  assert {
    condition     = length(kubernetes_cluster_role_binding_v1.service_account) == 1 && keys(kubernetes_role_binding_v1.service_account) == ["kube-node-lease/node-fencer", "kube-system/node-fencer"]
    error_message = "bound to the ClusterRole and the Role"
  }
}

run "a_gke_service_account_bound_as_a_user" {
  command = plan

  variables {
    users = ["node-fencer@my-project.iam.gserviceaccount.com"]
  }

  assert {
    condition     = length(kubernetes_cluster_role_binding_v1.users) == 1 && kubernetes_cluster_role_binding_v1.users[0].role_ref[0].name == "node-fencer"
    error_message = "the users bound to the ClusterRole"
  }
  assert {
    condition     = [for s in kubernetes_cluster_role_binding_v1.users[0].subject : "${s.kind}/${s.name}"] == ["User/node-fencer@my-project.iam.gserviceaccount.com"]
    error_message = "each user a subject of kind User, named by its email"
  }
  assert {
    condition     = keys(kubernetes_role_binding_v1.users) == ["kube-node-lease/node-fencer", "kube-system/node-fencer"] && kubernetes_role_binding_v1.users["kube-system/node-fencer"].role_ref[0].kind == "Role"
    error_message = "and to every Role of the manifest"
  }
  assert {
    condition     = [for s in kubernetes_role_binding_v1.users["kube-system/node-fencer"].subject : "${s.kind}/${s.name}"] == ["User/node-fencer@my-project.iam.gserviceaccount.com"]
    error_message = "the Role binding names the same user"
  }
  assert {
    condition     = kubernetes_cluster_role_binding_v1.this.metadata[0].name == "node-fencer" && length(kubernetes_service_account_v1.this) == 0
    error_message = "the group binding stays as it is"
  }
}

run "users_with_an_empty_name" {
  command = plan

  variables {
    users = [""]
  }

  expect_failures = [var.users]
}

run "control_namespace_not_a_name" {
  command = plan

  variables {
    control_namespace = "Kube_System"
  }

  expect_failures = [var.control_namespace]
}

run "a_deployment_without_the_fast_path_or_the_legacy_mode_drops_their_grants" {
  command = plan

  variables {
    grant_node_status      = false
    grant_node_lease_reads = false
  }

  assert {
    condition     = !anytrue([for r in kubernetes_cluster_role_v1.this.rule : contains(r.resources, "nodes/status")]) && anytrue([for r in kubernetes_cluster_role_v1.this.rule : contains(r.resources, "nodes")])
    error_message = "no nodes/status patch; the Nodes' own rule stays"
  }
  assert {
    condition     = keys(kubernetes_role_v1.this) == ["kube-system/node-fencer"] && keys(kubernetes_role_binding_v1.this) == ["kube-system/node-fencer"]
    error_message = "no Role in kube-node-lease, nor its binding"
  }
}

run "every_grant_by_default" {
  command = plan

  assert {
    condition     = anytrue([for r in kubernetes_cluster_role_v1.this.rule : contains(r.resources, "nodes/status")])
    error_message = "nodes/status patch granted by default"
  }
}
