package main

import (
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/linkcheck"
)

// What only the gateway's server needs stays out of both programs, and OPA
// and the gateway client out of the corral that starts with every sandbox:
// every package a program links is initialised on each start.
var neither = []string{
	"modernc.org/sqlite",
	"github.com/jackc/pgx/v5",
	"google.golang.org/grpc",
	"html/template",
	"database/sql",
}

func TestLeanLinksNoOPAOrGatewayClient(t *testing.T) {
	linkcheck.NotLinked(t, ".", "", append([]string{
		"github.com/open-policy-agent/opa/v1/ast",
		"github.com/open-policy-agent/opa/v1/topdown",
		"github.com/corral-sandbox/corral/internal/egress/decide/rego",
		"google.golang.org/protobuf/proto",
		"connectrpc.com/connect",
		"github.com/corral-sandbox/corral/internal/gatewayclient",
		"github.com/corral-sandbox/corral/internal/gatewaylink",
		"github.com/corral-sandbox/corral/internal/cli/fleet",
	}, neither...))
}

// The full program (internal/fullbin) takes OPA in through its evaluator
// alone: the rego package around it adds packages to initialise.
func TestFullLinksNoRegoWrapper(t *testing.T) {
	linkcheck.NotLinked(t, ".", "corral_full", append([]string{
		"github.com/open-policy-agent/opa/v1/rego",
		"github.com/open-policy-agent/opa/v1/bundle",
		// The v0 compatibility layer over OPA v1: the same code, more packages.
		"github.com/open-policy-agent/opa/topdown",
	}, neither...))
}
