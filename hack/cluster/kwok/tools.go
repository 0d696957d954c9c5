//go:build tools

// Package tools pins an upstream program that the test harness builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
