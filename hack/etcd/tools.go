//go:build tools

// Package tools keeps etcd's main package in go.mod/go.sum so `go mod tidy` does not drop it.
package tools

import _ "go.etcd.io/etcd/server/v3"
