//go:build tools

// Package tools pins the upstream programs the image tests use: a registry
// server (distribution) to push to on loopback, and a client we did not write
// (crane) to read back what was pushed.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
	_ "github.com/google/go-containerregistry/cmd/crane"
)
