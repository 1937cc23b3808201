package auth

import (
	"context"

	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// Principal is who a request acts as.
type Principal struct {
	Kind store.TokenKind
	// Name is the user's name (token name or client certificate CN), or
	// the token's name for sandbox and join credentials.
	Name string
	// SandboxID binds a sandbox credential to its sandbox; every
	// supervisor call acts on this sandbox and no other.
	SandboxID string
	// TokenID identifies the token used (empty for a client certificate);
	// Join spends it.
	TokenID string
	// Secrets are, for a join credential, the gateway secrets its operator
	// granted: the only ones the joining sandbox's policy may take
	// from_gateway.
	Secrets []string
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the interceptor put in ctx. Handlers
// run only behind the interceptor, so ok is false only for a wiring bug.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
