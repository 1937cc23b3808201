package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
)

// maxSecretBytes bounds a credential read from stdin or a file: anything
// larger is a mistake (a whole file piped in), not a token.
const maxSecretBytes = 64 << 10

func newGatewaySecretCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret set|list|delete",
		Short: "Keep named credentials at the gateway for policies' from_gateway secrets",
		Long: `Credentials kept at the gateway are sealed there (AES-256-GCM) and never read
back: a policy secret with from_gateway: NAME receives the value over its
supervisor's authenticated stream, and the workload sees only a surrogate.` + "\n" + cli.GatewayHelp,
	}
	cmd.AddCommand(newGatewaySecretSetCmd(), newGatewaySecretListCmd(), newGatewaySecretDeleteCmd())
	return cmd
}

func newGatewaySecretSetCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var fromFile string
	cmd := &cobra.Command{
		Use:   "set NAME [--from-file FILE]",
		Short: "Store a credential at the gateway (value from standard input or a file)",
		Long: `Store NAME's value at the gateway, replacing any earlier one; supervisors
whose policy names it get the new value at once. The value is read from
--from-file, else from standard input, never from a flag, so it stays out
of the shell's history and the process list; one trailing newline is
dropped.` + "\n" + cli.GatewayHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := cmd.InOrStdin()
			from := "standard input"
			if fromFile != "" {
				f, err := os.Open(fromFile)
				if err != nil {
					return cli.Exit(2, fmt.Errorf("--from-file: %w", err))
				}
				defer f.Close()
				in, from = f, fromFile
			}
			value, err := io.ReadAll(io.LimitReader(in, maxSecretBytes+1))
			if err != nil {
				return cli.Exit(2, fmt.Errorf("read the value from %s: %w", from, err))
			}
			value = bytes.TrimSuffix(bytes.TrimSuffix(value, []byte("\n")), []byte("\r"))
			switch {
			case len(value) > maxSecretBytes:
				return cli.Exit(2, fmt.Errorf("the value in %s is over %d KiB; a credential is not that long", from, maxSecretBytes>>10))
			case len(value) == 0:
				return cli.Exit(2, fmt.Errorf("no value in %s: pipe it in, or pass --from-file FILE", from))
			}
			if _, err := unary(cmd, &gf, "", func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.SetSecretResponse], error) {
				return c.Secrets.Set(ctx, connect.NewRequest(&gatewayv1.SetSecretRequest{Name: args[0], Value: value}))
			}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stored %s (%d bytes)\n", args[0], len(value))
			return nil
		},
	}
	cmd.Flags().StringVar(&fromFile, "from-file", "", "file holding the value (default: standard input)")
	gf.Add(cmd)
	return cmd
}

func newGatewaySecretListCmd() *cobra.Command {
	var gf cli.GatewayFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the names of the credentials kept at the gateway (never their values)",
		Long:  "List the names of the credentials kept at the gateway; values are never read back." + "\n" + cli.GatewayHelp,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unary(cmd, &gf, "", func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.ListSecretsResponse], error) {
				return c.Secrets.List(ctx, connect.NewRequest(&gatewayv1.ListSecretsRequest{}))
			})
			if err != nil {
				return err
			}
			for _, n := range resp.Msg.GetNames() {
				fmt.Fprintln(cmd.OutOrStdout(), n)
			}
			return nil
		},
	}
	gf.Add(cmd)
	return cmd
}

func newGatewaySecretDeleteCmd() *cobra.Command {
	var gf cli.GatewayFlags
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Remove a credential from the gateway",
		Long:  "Remove NAME from the gateway. Running supervisors keep the value they hold; new ones whose policy names it cannot start." + "\n" + cli.GatewayHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := unary(cmd, &gf, "", func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.DeleteSecretResponse], error) {
				return c.Secrets.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSecretRequest{Name: args[0]}))
			}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", args[0])
			return nil
		},
	}
	gf.Add(cmd)
	return cmd
}

func newGatewayRoutesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "routes set FILE|get",
		Short: "Keep the model routes every supervisor serves at inference.local",
		Long: `Model routes kept at the gateway (the format of --inference-routes and of a
policy's inference section) replace the policy's inference section on every
supervisor of the gateway, and are pushed to them when they change.` + "\n" + cli.GatewayHelp,
	}
	var gf cli.GatewayFlags
	set := &cobra.Command{
		Use:   "set FILE",
		Short: "Replace the gateway's model routes with FILE's",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return cli.Exit(2, err)
			}
			resp, err := unary(cmd, &gf, "", func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.Routes], error) {
				return c.Routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: string(data)}))
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "model routes version %d\n", resp.Msg.GetVersion())
			return nil
		},
	}
	gf.Add(set)
	var gg cli.GatewayFlags
	get := &cobra.Command{
		Use:   "get",
		Short: "Print the gateway's model routes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unary(cmd, &gg, "", func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.Routes], error) {
				resp, err := c.Routes.Get(ctx, connect.NewRequest(&gatewayv1.GetRoutesRequest{}))
				if connect.CodeOf(err) == connect.CodeNotFound {
					err = cli.Exit(1, errors.New("the gateway keeps no model routes: corral gateway routes set FILE"))
				}
				return resp, err
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# version %d by %s\n%s", resp.Msg.GetVersion(), resp.Msg.GetAuthor(), resp.Msg.GetYaml())
			return nil
		},
	}
	gg.Add(get)
	cmd.AddCommand(set, get)
	return cmd
}
