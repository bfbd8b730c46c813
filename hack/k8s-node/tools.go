//go:build tools

// Package tools keeps the node commands the test bed builds (hack/handoff_testbed/node.py) in
// go.mod/go.sum. A module of its own, beside hack/k8s: the control-plane binaries' cache stamp hashes
// hack/k8s's go.mod/go.sum, so adding the kubelet there would rebuild the control plane everywhere.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
