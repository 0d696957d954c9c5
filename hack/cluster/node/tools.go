//go:build tools

// Package tools pins the upstream node programs (the kubelet and kube-proxy)
// at the control plane's Kubernetes version; a module of its own so that
// ../kubernetes's go.sum, and so its cache hash, stays as it is.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
