// Package cli wires corral's commands. Each file is one command group; the
// commands parse flags and call into the packages that do the work.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/quietlog"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=v1.2.3".
var Version = "dev"

// exitError carries a specific exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Execute runs the CLI with args and returns the process exit code.
func Execute(ctx context.Context, args []string) int {
	return execute(ctx, args, os.Stdin, os.Stdout, os.Stderr)
}

func execute(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) int {
	root := &cobra.Command{
		Use:   "corral",
		Short: "Run AI coding agents and everything they spawn inside a policy-governed Linux sandbox",
		Long: `corral runs a command in a sandbox whose filesystem, syscalls, processes,
resources and network are governed by one declarative YAML policy.

Without --policy, the built-in default policy is used: the working directory
read-write, system directories read-only, a private /tmp and home, every
network connection captured and denied, the default seccomp profile and
resource limits a laptop survives.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newPsCmd(), newPolicyCmd(), newVersionCmd(), draftCmd)
	root.AddCommand(fullCommands("")...)
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	// An error may quote what a sandbox or a gateway sent back (a
	// supervisor's refusal, a reload error naming the workload's paths),
	// so it is printed through termsafe; its own line breaks stay.
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(errOut, "corral: %s\n", termsafe.Text(ee.err.Error()))
		}
		return ee.code
	}
	fmt.Fprintf(errOut, "corral: %s\n", termsafe.Text(err.Error()))
	return 2
}

// newLogger builds the human-facing logger on stderr.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(quietlog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))), nil
}
