//go:build tools

// Package tools pins crictl, the CRI client the real node's stop uses to
// remove its pod sandboxes the way the kubelet would (CNI DEL included).
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
