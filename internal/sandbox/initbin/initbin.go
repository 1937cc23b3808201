// Package initbin carries the sandbox's init (cmd/corral-init) inside the
// corral binary: exec'ing corral itself as the init would pay for loading
// and initialising every package corral links (the CLI, the proxy), page by
// page, and the init alone is a fraction of that.
package initbin

//go:generate go run ../../carried/build corral-init- ./cmd/corral-init

import "github.com/corral-sandbox/corral/internal/carried"

var program = carried.Program{FS: embedded, Prefix: "corral-init-"}

// Path returns the init program for this corral under stateDir, writing it
// there on first use, or "" when this corral carries none (built without
// go generate, or with the corral_selfinit tag); the caller then
// re-executes itself as the init.
func Path(stateDir string) (string, error) { return program.Path(stateDir) }
