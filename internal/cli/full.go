package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/fullbin"
	"github.com/corral-sandbox/corral/internal/gatewayconf"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/sandbox"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// Full is what corral's full program adds to the CLI (package
// internal/cli/fleet): every command and branch that calls a gateway. Its
// client code (protobuf, Connect) stays out of the corral every sandbox
// starts with, which runs the full program (internal/fullbin) for these.
type Full struct {
	// Commands are the commands under parent ("" for the root) that
	// exist only in the full program; each is named in fullOnly.
	Commands func(parent string) []*cobra.Command
	// ListSandboxes is corral ps with a gateway.
	ListSandboxes func(cmd *cobra.Command, gf *GatewayFlags) error
	// SetPolicy is corral policy set with a gateway.
	SetPolicy func(cmd *cobra.Command, gf *GatewayFlags, id string, data []byte, wait time.Duration) error
	// ConnectGateway is corral run --gateway's link to the gateway.
	ConnectGateway func(ctx context.Context, o sandbox.GatewayOptions, aud *audit.Logger) (sandbox.GatewayLink, *policy.Policy, error)
}

var full *Full

// Extend adds the full program's part; package fleet calls it from its
// init.
func Extend(f Full) { full = &f }

// fullOnly names the commands only the full program has, with the summary
// `corral help` shows for them in the lean one.
var fullOnly = []struct{ parent, name, short string }{
	{"", "gateway", "Run the control plane for many sandboxes (corral-gateway), or log in to one"},
	{"", "sandbox", "Create, list, inspect, watch and delete sandboxes through a gateway"},
	{"", "logs", "Print the logs and audit events the gateway keeps for sandboxes"},
	{"policy", "get", "Print a sandbox's policy as the gateway stores it"},
	{"policy", "history", "List the policy versions of a sandbox at the gateway"},
	{"policy", "status", "Show whether a sandbox loaded its newest policy"},
}

// FullShort is the summary of the full program's command name under
// parent, which its definition in package fleet uses too.
func FullShort(parent, name string) string {
	for _, c := range fullOnly {
		if c.parent == parent && c.name == name {
			return c.short
		}
	}
	panic("cli: no full-program command " + parent + " " + name)
}

// fullCommands are the full program's commands under parent, or, in the
// lean corral, stand-ins that run the full program with this command line.
func fullCommands(parent string) []*cobra.Command {
	if full != nil {
		return full.Commands(parent)
	}
	var out []*cobra.Command
	for _, c := range fullOnly {
		if c.parent != parent {
			continue
		}
		out = append(out, &cobra.Command{
			Use: c.name, Short: c.short, DisableFlagParsing: true,
			RunE: func(*cobra.Command, []string) error { return &exitError{code: 2, err: execFull("corral "+c.name, "")} },
		})
	}
	return out
}

// execFull replaces this process with the full program, run with the same
// command line, for what (which only the full program has); it installs
// the program under stateDir ("" for the default) on first use, and
// returns only on failure.
func execFull(what, stateDir string) error {
	if stateDir == "" {
		stateDir = statedir.Default()
	}
	return fmt.Errorf("%s: %w", what, fullbin.Exec(stateDir, os.Args))
}

// Exit returns an error that makes corral print err (if not nil) and exit
// with code.
func Exit(code int, err error) error { return &exitError{code: code, err: err} }

// ExitCode is the exit code err (or an error it wraps) asks for, and
// whether it asks for one.
func ExitCode(err error) (int, bool) {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, true
	}
	return 0, false
}

// ExecuteWith runs the CLI with args and the given standard streams and
// returns the exit code, for tests.
func ExecuteWith(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) int {
	return execute(ctx, args, in, out, errOut)
}

// GatewayHelp ends the help of every command that talks to a gateway.
const GatewayHelp = `
The gateway is --gateway URL, else $CORRAL_GATEWAY, else the one saved by
corral gateway login. The CA its certificate must verify with is
--gateway-ca FILE, else $CORRAL_GATEWAY_CA, else the login's (the gateway
keeps it as tls/ca.pem in its data directory). The token is
$CORRAL_GATEWAY_TOKEN (the secret itself) or the file named by
$CORRAL_GATEWAY_TOKEN_FILE, else the login's. The login's CA and token are
used only for the gateway they were saved with.`

// GatewayFlags are --gateway and --gateway-ca, on every command that
// talks to a gateway.
type GatewayFlags struct {
	Opts gatewayconf.Options
}

// Add defines the flags on cmd.
func (g *GatewayFlags) Add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&g.Opts.URL, "gateway", "", "gateway URL, https://HOST:PORT (default: $CORRAL_GATEWAY, else the login)")
	cmd.Flags().StringVar(&g.Opts.CAFile, "gateway-ca", "", "CA file the gateway's certificate must verify with (default: $CORRAL_GATEWAY_CA, else the login)")
}

// Configured reports whether the command should go to a gateway.
func (g *GatewayFlags) Configured() (bool, error) {
	ok, err := gatewayconf.Configured(g.Opts)
	if err != nil {
		return false, &exitError{code: 2, err: err}
	}
	return ok, nil
}
