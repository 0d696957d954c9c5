//go:build tools

// Package tools pins istioctl to the same istio.io/istio as ../istio (a test
// holds the two pins equal). A module of its own, so that its extra
// dependencies leave ../istio's go.sum, and so its cache entry, as they are.
package tools

import _ "istio.io/istio/istioctl/cmd/istioctl"
