package main

import (
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/linkcheck"
)

// The init starts with every sandbox. These once came in through the plan
// builder, which made its binary half again as large; the syscall tables
// (a millisecond of the init's start) through assembling its own seccomp
// filter.
func TestInitLinksNoHeavyPackages(t *testing.T) {
	linkcheck.NotLinked(t, "", []string{
		"github.com/corral-sandbox/corral/internal/policy",
		"github.com/open-policy-agent/opa/v1/topdown",
		"gopkg.in/yaml.v3",
		"net/http",
		"crypto/tls",
		"crypto/x509",
		"github.com/elastic/go-seccomp-bpf/arch",
	})
}
