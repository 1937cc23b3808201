// Package initbin carries the sandbox's init inside the corral binary:
// exec'ing corral itself as the init would pay for loading and initialising
// every package corral links (the CLI, the proxy), page by page, and the
// init alone is a fraction of that. It carries two: cmd/corral-init, for
// sandboxes whose network the supervisor makes (as root), and
// cmd/corral-netinit, which also links the network set-up (nftables,
// netlink) for sandboxes whose init makes it (rootless); an init that never
// needs that code does not pay for loading it.
package initbin

//go:generate go run ../../carried/build corral-init- ./cmd/corral-init
//go:generate go run ../../carried/build corral-netinit- ./cmd/corral-netinit

import "github.com/corral-sandbox/corral/internal/carried"

var (
	program    = carried.Program{FS: embedded, Prefix: "corral-init-"}
	netProgram = carried.Program{FS: embedded, Prefix: "corral-netinit-"}
)

// Path returns the init program for this corral under stateDir, the one
// that makes the sandbox's network if network is set, writing it there on
// first use, or "" when this corral carries none (built without go
// generate, or with the corral_selfinit tag); the caller then re-executes
// itself as the init.
func Path(stateDir string, network bool) (string, error) {
	if network {
		return netProgram.Path(stateDir)
	}
	return program.Path(stateDir)
}
