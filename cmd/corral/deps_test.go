package main

import (
	"os/exec"
	"strings"
	"testing"
)

// Every package corral links is initialised on each `corral run`, before
// the sandbox starts. What only the gateway needs stays out, and OPA comes
// in through its evaluator alone: the rego package around it added about
// 6 ms of package initialisation to each start on a 2-core VM.
var notForRun = []string{
	"github.com/open-policy-agent/opa/v1/rego",
	"github.com/open-policy-agent/opa/v1/bundle",
	"modernc.org/sqlite",
	"github.com/jackc/pgx/v5",
	"google.golang.org/grpc",
	"html/template",
	"database/sql",
}

func TestRunLinksNoGatewayOrRegoWrapper(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, p := range notForRun {
		if deps[p] {
			t.Errorf("corral links %s; `go list -deps ./cmd/corral` shows it, and `go mod why` the path", p)
		}
	}
}
