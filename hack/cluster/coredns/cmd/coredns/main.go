// Command coredns is CoreDNS with only the plugins the real node's Corefile
// names (hack/devcluster/ambient_devcluster/realnode.py). CoreDNS's own main
// links every in-tree plugin, cloud SDKs included, which made it the slowest
// of the node's cold builds; the server and each plugin are CoreDNS's own,
// at the pinned version.
package main

import (
	"slices"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
)

// linked names the directives of the plugins imported above ("prometheus" is
// the metrics plugin's directive). A Corefile naming any other directive is
// refused at start with CoreDNS's own "unknown directive" error.
var linked = []string{"bind", "cache", "errors", "health", "kubernetes", "prometheus", "ready"}

func init() {
	// Upstream's order of execution, kept: only the directives not linked leave it.
	dnsserver.Directives = slices.DeleteFunc(dnsserver.Directives, func(d string) bool {
		return !slices.Contains(linked, d)
	})
}

func main() {
	coremain.Run()
}
