//go:build tools

// Package tools pins an upstream program that the test harness builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
