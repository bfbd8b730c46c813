//go:build tools

// Package tools keeps kwok's main package in go.mod/go.sum so `go mod tidy` does not drop it.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
