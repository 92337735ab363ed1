// CoreDNS for the local cluster's real nodes: upstream's coremain with only the plugins the
// Corefile that controlplane/kube_services.py writes uses, set as CoreDNS documents for custom
// builds (dnsserver.Directives, in plugin.cfg's order). The full plugin set would pull in every
// cloud SDK CoreDNS supports and take several times as long to compile on two cores.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order requests pass the plugins in: plugin.cfg's order, restricted to those imported.
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes", "forward"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
