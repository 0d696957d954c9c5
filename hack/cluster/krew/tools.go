//go:build tools

// Package tools pins krew, kubectl's plugin manager: the tests validate the
// repository's krew manifest with its validate-krew-manifest and install the
// plugin with krew itself from the archive hack/gen_krew.py builds.
package tools

import (
	_ "sigs.k8s.io/krew/cmd/krew"
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
