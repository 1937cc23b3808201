package main

import (
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/linkcheck"
)

// What only the gateway needs stays out of corral, which starts with every
// sandbox, and OPA comes in through its evaluator alone: the rego package
// around it adds packages whose initialisation every start pays for.
func TestRunLinksNoGatewayOrRegoWrapper(t *testing.T) {
	linkcheck.NotLinked(t, []string{
		"github.com/open-policy-agent/opa/v1/rego",
		"github.com/open-policy-agent/opa/v1/bundle",
		// The v0 compatibility layer over OPA v1: the same code, more packages.
		"github.com/open-policy-agent/opa/topdown",
		"modernc.org/sqlite",
		"github.com/jackc/pgx/v5",
		"google.golang.org/grpc",
		"html/template",
		"database/sql",
	})
}
