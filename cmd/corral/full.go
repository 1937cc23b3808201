//go:build corral_full

package main

// The full program (internal/fullbin): corral with the engine for users'
// --policy-rules and the CLI's side of a gateway.
import (
	_ "github.com/corral-sandbox/corral/internal/cli/fleet"
	_ "github.com/corral-sandbox/corral/internal/egress/decide/rego"
)
