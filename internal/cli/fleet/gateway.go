package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/fullbin"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
	"github.com/corral-sandbox/corral/internal/gatewayconf"
)

// gatewayBinary is the gateway's own executable. It is separate so that
// gRPC, the SQL drivers and Prometheus never add to `corral run`.
const gatewayBinary = "corral-gateway"

// callTimeout bounds one request/response call to the gateway.
const callTimeout = 30 * time.Second

func newGatewayCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gateway [login|logout|secret|routes|serve|token|issue-client|list-clients|revoke-client] [flags]",
		Short: cli.FullShort("", "gateway"),
		Long: `corral gateway login and logout save and remove the gateway this corral
talks to (for corral sandbox, logs, policy and ps --gateway); corral gateway
secret and routes keep credentials and model routes at it.

Anything else runs corral-gateway with these arguments: the gateway serving
sandboxes, policies, logs, secrets and model routes over gRPC/Connect on
TLS, and its admin commands (token create|list|delete, issue-client,
list-clients, revoke-client). See
corral gateway serve --help once corral-gateway is installed.

corral-gateway is looked up next to this corral binary, then in PATH.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
				return cmd.Help()
			}
			self, _ := fullbin.Executable() // "": look in PATH only
			bin, err := findGateway(self)
			if err != nil {
				return cli.Exit(2, err)
			}
			// exec, not a child: signals, exit status and the terminal go
			// to the gateway unchanged.
			if err := syscall.Exec(bin, append([]string{bin}, args...), os.Environ()); err != nil {
				return cli.Exit(2, fmt.Errorf("run %s: %w", bin, err))
			}
			return nil
		},
	}
	cmd.AddCommand(newGatewayLoginCmd(), newGatewayLogoutCmd(), newGatewaySecretCmd(), newGatewayRoutesCmd())
	return cmd
}

// findGateway looks next to self, the corral the user ran, first, so a
// corral and a corral-gateway built together are used together; then in
// PATH.
func findGateway(self string) (string, error) {
	dir := "DIR"
	if self != "" {
		dir = filepath.Dir(self)
		next := filepath.Join(dir, gatewayBinary)
		if fi, err := os.Stat(next); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return next, nil
		}
	}
	if p, err := exec.LookPath(gatewayBinary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found next to corral (in %s) or in PATH; build it with: go build -o %s/%s ./cmd/corral-gateway",
		gatewayBinary, dir, dir, gatewayBinary)
}

func newGatewayLoginCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var tokenFile string
	cmd := &cobra.Command{
		Use:   "login --gateway URL --gateway-ca FILE [--token-file FILE]",
		Short: "Check a gateway token and save it for later commands",
		Long: `Check that the gateway at --gateway (else $CORRAL_GATEWAY) answers with a
certificate the CA in --gateway-ca (else $CORRAL_GATEWAY_CA) verifies and
accepts the token, then save the URL, the CA's absolute path and the token
to $XDG_CONFIG_HOME/corral/gateway.json (default ~/.config/corral/gateway.json),
readable by you only. Later corral sandbox, logs, policy and ps commands
use it when neither a flag nor the environment names a gateway.

The token (corral gateway token create --name NAME on the gateway's host)
is read from --token-file, else from standard input; never from a flag, so
it stays out of the shell's history and the process list.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw := gf.Opts.URL
			if raw == "" {
				raw = os.Getenv(gatewayconf.EnvURL)
			}
			if raw == "" {
				return cli.Exit(2, errors.New("--gateway URL is required (e.g. https://gateway.example:7443)"))
			}
			u, err := gatewayconf.NormalizeURL(raw)
			if err != nil {
				return cli.Exit(2, err)
			}
			ca := gf.Opts.CAFile
			if ca == "" {
				ca = os.Getenv(gatewayconf.EnvCA)
			}
			t := gatewayconf.Target{URL: u, CAFile: ca}
			if tokenFile != "" {
				t.Token, err = gatewayconf.ReadToken(tokenFile)
				t.TokenFrom = tokenFile
			} else {
				t.Token, err = readTokenStdin(cmd.InOrStdin(), cmd.ErrOrStderr())
				t.TokenFrom = "standard input"
			}
			if err != nil {
				return cli.Exit(2, err)
			}
			c, err := gatewayclient.New(t)
			if err != nil {
				return cli.Exit(2, err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			resp, err := c.Sandboxes.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
			if err != nil {
				return gwErr(c, err, "")
			}
			path, err := gatewayconf.WriteLogin(gatewayconf.Login{URL: u, CAFile: ca, Token: t.Token})
			if err != nil {
				return cli.Exit(1, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "logged in to %s (%d sandboxes); saved to %s\n", u, len(resp.Msg.Sandboxes), path)
			return nil
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the token (default: read it from standard input)")
	return cmd
}

// readTokenStdin reads one line; on a terminal it asks for it and does
// not echo it.
func readTokenStdin(in io.Reader, prompt io.Writer) (string, error) {
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(prompt, "gateway token: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", fmt.Errorf("read the token: %w", err)
		}
		return nonEmptyToken(string(b))
	}
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the token from standard input: %w", err)
	}
	return nonEmptyToken(line)
}

func nonEmptyToken(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", errors.New("no token on standard input: pipe it in, or pass --token-file FILE")
	}
	return s, nil
}

func newGatewayLogoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logout",
		Short: "Remove the gateway login saved by corral gateway login",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, existed, err := gatewayconf.RemoveLogin()
			if err != nil {
				return cli.Exit(1, err)
			}
			if !existed {
				fmt.Fprintf(cmd.OutOrStdout(), "not logged in (no %s)\n", path)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", path)
			return nil
		},
	}
}

// dial resolves the gateway and builds its clients.
func dial(g *cli.GatewayFlags) (*gatewayclient.Client, error) {
	t, err := gatewayconf.Resolve(g.Opts)
	if err != nil {
		return nil, cli.Exit(2, err)
	}
	c, err := gatewayclient.New(t)
	if err != nil {
		return nil, cli.Exit(2, err)
	}
	return c, nil
}

// gwErr explains a failed gateway call; the gateway refusing the input
// itself exits 2, like corral policy check, anything else 1.
// unary makes one call to the gateway, bounded by callTimeout, and turns a
// refusal into the message and exit code a user acts on (sandboxID names
// the sandbox it may be about). An error from cli.Exit passes unchanged.
func unary[T any](cmd *cobra.Command, gf *cli.GatewayFlags, sandboxID string, call func(context.Context, *gatewayclient.Client) (T, error)) (T, error) {
	var zero T
	c, err := dial(gf)
	if err != nil {
		return zero, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	defer cancel()
	out, err := call(ctx, c)
	if _, exit := cli.ExitCode(err); err != nil && !exit {
		err = gwErr(c, err, sandboxID)
	}
	return out, err
}

func gwErr(c *gatewayclient.Client, err error, sandboxID string) error {
	code := 1
	if gatewayclient.Invalid(err) {
		code = 2
	}
	return cli.Exit(code, c.Explain(err, sandboxID))
}
