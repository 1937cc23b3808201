package main

import (
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/linkcheck"
)

// The init starts with every sandbox. These once came in through the plan
// builder, which made its binary half again as large; the syscall tables
// (a millisecond of the init's start) through assembling its own seccomp
// filter.
// Both inits: this one, and corral-netinit, which adds the network set-up.
func TestInitLinksNoHeavyPackages(t *testing.T) {
	for _, pkg := range []string{".", "../corral-netinit"} {
		linkcheck.NotLinked(t, pkg, "", []string{
			"github.com/corral-sandbox/corral/internal/policy",
			"github.com/open-policy-agent/opa/v1/topdown",
			"gopkg.in/yaml.v3",
			"net/http",
			"crypto/tls",
			"crypto/x509",
			"github.com/elastic/go-seccomp-bpf/arch",
		})
	}
}

// The network set-up is corral-netinit's: as root the supervisor makes the
// network, and this init loading nftables, netlink and the net package
// cost every start about a millisecond (bench/startup.sh, init alone).
func TestInitLinksNoNetworkSetUp(t *testing.T) {
	linkcheck.NotLinked(t, ".", "", []string{
		"github.com/corral-sandbox/corral/internal/sandbox/initproc/netsetup",
		"github.com/corral-sandbox/corral/internal/linux/capture",
		"github.com/google/nftables",
		"github.com/vishvananda/netlink",
		"net",
	})
}
