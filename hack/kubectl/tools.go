//go:build tools

// Package tools keeps kubectl, which the test bed builds (k8s_build.build_kubectl), in go.mod/go.sum.
// A module of its own, beside hack/k8s and hack/k8s-node: their binaries' cache stamps hash their
// go.mod/go.sum, so adding kubectl to either would rebuild the control plane or the node everywhere.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubectl"
)
