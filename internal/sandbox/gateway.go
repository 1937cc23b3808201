package sandbox

import (
	"context"
	"log/slog"

	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

// GatewayOptions are corral run's --gateway flags and what a join tells
// the gateway about the sandbox.
type GatewayOptions struct {
	URL, CAFile, TokenFile string
	// StateDir is the run's state directory: the link keeps the sandbox's
	// credential and last-known-good policy under it.
	StateDir string
	Name     string
	Labels   map[string]string
	Argv     []string
	Workdir  string
	// Policy is the run's --policy, sent with a join as the policy to
	// start with when the gateway has none.
	Policy []byte
	Log    *slog.Logger
	// HostKeys lets the gateway's policies and routes read keys from this
	// host's files and corral's environment (--gateway-host-keys).
	HostKeys bool
}

// GatewayLink is a supervisor's link to the gateway that manages its
// sandbox (package gatewayrun, in corral's full program).
type GatewayLink interface {
	// CheckSecrets fails when p takes secrets from_gateway that this start
	// cannot have.
	CheckSecrets(p *policy.Policy) error
	// SecretLookup hands over the secrets' values from the gateway.
	SecretLookup() func(name string) (string, bool)
	// HasRoutes and Routes give the gateway's model routes at start.
	HasRoutes() bool
	Routes() *inference.Config
	// Logger returns log with its warnings and errors sent to the gateway
	// too.
	Logger(log *slog.Logger) *slog.Logger
	// Serve takes the gateway's updates until ctx ends.
	Serve(ctx context.Context, t GatewayTargets)
	// Finish reports the sandbox's end.
	Finish(code int, err error)
}

// GatewayTargets are what the gateway's updates change in the running
// sandbox.
type GatewayTargets struct {
	// Policy takes the policy versions; it keeps the running policy when
	// one is refused.
	Policy *reload.Reloader
	// Secrets take new values of the secrets from_gateway; nil for none.
	Secrets *secrets.Set
	// Routes puts model routes in force; nil when they are not the
	// gateway's to change (--inference-routes, or no proxy).
	Routes func(inference.Config) error
	// RoutesFixed says why Routes is nil, for the warning a routes update
	// then gets; "" when it is not.
	RoutesFixed string
}
