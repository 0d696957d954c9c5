//go:build tools

// Package tools pins Istio's Linux istio-cni programs (install-cni, the
// istio-cni plugin) at the istio.io/istio of ../istio; hack/images puts them
// in the install-cni image the real node runs. A module of its own, so that
// ../istio's go.sum, and with it the cached pilot-discovery, stays as it is.
package tools

import (
	_ "istio.io/istio/cni/cmd/install-cni"
	_ "istio.io/istio/cni/cmd/istio-cni"
)
