//go:build tools

// Package tools pins runc, the OCI runtime under containerd's shim.
package tools

import _ "github.com/opencontainers/runc"
