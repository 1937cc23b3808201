// Command corral runs a program inside a sandbox governed by a policy.
package main

import (
	"context"
	"os"
	"runtime"

	"github.com/corral-sandbox/corral/internal/cli"
	_ "github.com/corral-sandbox/corral/internal/linux/prefault"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc/netsetup"
)

// init keeps the sandbox's init on the process's main thread, the one its
// pid names: the init confines that thread, forks the workload from it and
// forwards signals from it (see initproc.InitMain).
func init() {
	if len(os.Args) > 1 && os.Args[1] == initproc.InitArg {
		runtime.LockOSThread()
	}
}

func main() {
	// The sandbox's init is a re-exec of this binary and must start before
	// the CLI does anything.
	if len(os.Args) > 1 && os.Args[1] == initproc.InitArg {
		os.Exit(initproc.InitMain(netsetup.Network))
	}
	// Signals are not turned into cancellation here: `corral run` forwards
	// them to the workload, which decides how to end.
	os.Exit(cli.Execute(context.Background(), os.Args[1:]))
}
