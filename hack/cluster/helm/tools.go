//go:build tools

// Package tools pins an upstream program that the test harness builds.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
