// Command corral runs a program inside a sandbox governed by a policy.
package main

import (
	"context"
	"os"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
)

func main() {
	// The sandbox's own stages are re-execs of this binary and must start
	// before the CLI does anything.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case initproc.InitArg:
			os.Exit(initproc.InitMain())
		case initproc.ExecArg:
			os.Exit(initproc.ExecMain())
		}
	}
	// Signals are not turned into cancellation here: `corral run` forwards
	// them to the workload, which decides how to end.
	os.Exit(cli.Execute(context.Background(), os.Args[1:]))
}
