// Command corral-init is the sandbox's init as a program of its own. corral
// carries it inside its binary (internal/sandbox/initbin), so each sandbox
// starts a program that links only what the init needs instead of all of
// corral; it is not meant to be installed or run by hand. It is the init of
// sandboxes whose network the supervisor makes (as root); cmd/corral-netinit
// is the one that makes the network itself.
package main

import (
	"os"
	"runtime"

	_ "github.com/corral-sandbox/corral/internal/linux/prefault"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
)

// init keeps the sandbox's init on the process's main thread, the one its
// pid names (see initproc.InitMain).
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(initproc.InitMain(nil))
}
