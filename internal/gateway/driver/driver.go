// Package driver starts and stops the supervisors of a gateway's sandboxes.
// The gateway sees only this interface, so a driver for another place to
// run supervisors (Kubernetes pods) fits without changes above it.
package driver

import (
	"context"

	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// Link is what a supervisor needs to reach the gateway as its sandbox.
type Link struct {
	// URL is the gateway's address, e.g. https://127.0.0.1:7443.
	URL string
	// CAFile is the PEM file of the gateway's CA.
	CAFile string
	// Token is the sandbox's own credential.
	Token string
}

// Status is what a driver knows of a supervisor it started.
type Status struct {
	Running bool
	// ExitCode is set once the supervisor has exited and its code is known.
	ExitCode *int
	Reason   string
}

// Driver runs supervisors. Create returns the driver's reference for the
// sandbox (kept in store.Sandbox.DriverRef) so that Inspect and Delete work
// after a gateway restart.
type Driver interface {
	Create(ctx context.Context, sb store.Sandbox, link Link) (ref string, err error)
	Inspect(ctx context.Context, sb store.Sandbox) (Status, error)
	// Delete stops the supervisor (and with it the sandbox) and removes
	// what the driver made for it. Deleting a stopped sandbox is not an
	// error.
	Delete(ctx context.Context, sb store.Sandbox) error
}

// Checker is a driver that refuses, before anything is recorded, a sandbox
// it will not run as asked (a working directory outside what it may use).
type Checker interface {
	Check(sb store.Sandbox) error
}
