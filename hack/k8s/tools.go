//go:build tools

// Package tools keeps the commands the test bed builds in go.mod/go.sum, so `go mod tidy`
// does not drop them and builds stay reproducible offline from the module cache.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
