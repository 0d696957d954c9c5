//go:build tools

// Package tools pins Istio's control plane: the test harness builds
// pilot-discovery from it and copies its Helm charts out of the module cache.
package tools

import _ "istio.io/istio/pilot/cmd/pilot-discovery"
