//go:build tools

// Package tools pins what build.sh builds so that `go mod tidy` keeps their
// dependencies in go.mod and go.sum: the three control plane commands, the
// external-attacher, openapi-gen, and the two config packages among
// openapi-gen's inputs that no command imports (see openapi-packages.txt).
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/cmd/csi-attacher"
	_ "k8s.io/kube-openapi/cmd/openapi-gen"
	_ "k8s.io/kube-proxy/config/v1alpha1"
	_ "k8s.io/kubelet/config/v1beta1"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
