//go:build tools

// Package tools pins CoreDNS, the real node's cluster DNS.
package tools

import _ "github.com/coredns/coredns"
