package main

import (
	"os/exec"
	"strings"
	"testing"
)

// Every package the init links is initialised and paged in on each
// sandbox's start. These are the ones that once came in through the plan
// builder and cost the init about 5 ms of its start (bench/startup.sh).
var tooHeavy = []string{
	"github.com/corral-sandbox/corral/internal/policy",
	"github.com/open-policy-agent/opa/v1/topdown",
	"gopkg.in/yaml.v3",
	"net/http",
	"crypto/tls",
	"crypto/x509",
}

func TestInitLinksNoHeavyPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, p := range tooHeavy {
		if deps[p] {
			t.Errorf("corral-init links %s; `go list -deps ./cmd/corral-init` shows the import, and `go mod why -m` the path", p)
		}
	}
}
