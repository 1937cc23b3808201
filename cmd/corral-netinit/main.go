// Command corral-netinit is the sandbox's init for sandboxes whose network
// the init makes itself (rootless): cmd/corral-init with the network
// set-up (internal/sandbox/initproc/netsetup) linked in. corral carries it
// as it carries corral-init; it is not meant to be installed or run by
// hand.
package main

import (
	"os"
	"runtime"

	_ "github.com/corral-sandbox/corral/internal/linux/prefault"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc/netsetup"
)

// init keeps the sandbox's init on the process's main thread, the one its
// pid names (see initproc.InitMain).
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(initproc.InitMain(netsetup.Network))
}
