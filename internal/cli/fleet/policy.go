package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

// setGatewayPolicy stores the next version at the gateway and waits for
// the supervisor's word on it.
func setGatewayPolicy(cmd *cobra.Command, gf *cli.GatewayFlags, id string, data []byte, wait time.Duration) error {
	c, err := dial(gf)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	defer cancel()
	resp, err := c.Policies.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: string(data)}))
	if err != nil {
		return gwErr(c, err, id)
	}
	pv := resp.Msg
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "sandbox %s: policy version %d (sha256 %s)\n", id, pv.Version, pv.Sha256)
	if wait <= 0 {
		return nil
	}
	pv, err = awaitPolicyStatus(cmd.Context(), c, id, pv.Version, wait)
	if err != nil {
		return gwErr(c, err, id)
	}
	switch pv.Status {
	case gatewayv1.PolicyStatus_POLICY_STATUS_LOADED:
		fmt.Fprintf(out, "sandbox %s: policy version %d LOADED\n", id, pv.Version)
		return nil
	case gatewayv1.PolicyStatus_POLICY_STATUS_FAILED:
		return cli.Exit(1, fmt.Errorf("sandbox %s: policy version %d FAILED, the sandbox keeps its previous policy: %s", id, pv.Version, termsafe.Line(pv.Error)))
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "corral: sandbox %s has not reported policy version %d after %s; it applies it when its supervisor is connected (see corral policy status --sandbox %s)\n",
		id, pv.Version, wait, id)
	return nil
}

// awaitPolicyStatus waits, bounded by wait, until the supervisor reports
// version v LOADED or FAILED, and returns the version as it then is
// (still PENDING when the time ran out). It watches the sandbox, which
// changes when the status does, rather than polling.
func awaitPolicyStatus(ctx context.Context, c *gatewayclient.Client, id string, v int64, wait time.Duration) (*gatewayv1.PolicyVersion, error) {
	// A timer, not a deadline: a deadline travels to the gateway, which
	// may then end the stream with an error of its own first.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := time.AfterFunc(wait, cancel)
	defer timer.Stop()
	stream, err := c.Sandboxes.Watch(wctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Id: id}))
	if err != nil {
		return nil, err
	}
	for stream.Receive() {
		sb := stream.Msg().Sandbox
		if sb.PolicyVersion > v || (sb.PolicyVersion == v && sb.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_PENDING) {
			break
		}
	}
	if err := stream.Err(); err != nil && wctx.Err() == nil {
		stream.Close()
		return nil, err
	}
	stream.Close()
	gctx, gcancel := context.WithTimeout(ctx, callTimeout)
	defer gcancel()
	resp, err := c.Policies.Get(gctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id, Version: v}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func newPolicyGetCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var id string
	var version int64
	cmd := &cobra.Command{
		Use:   "get --sandbox ID [--version N]",
		Short: cli.FullShort("policy", "get"),
		Long: `Print the newest policy version of the sandbox (or version N) as YAML: the
whole effective policy, ready for corral policy set. A supervisor that
joined wrote its first version, so characters a terminal would act on or
that hide text (controls, bidi overrides) are printed as escapes (\u202e).` + "\n" + cli.GatewayHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needSandbox(id); err != nil {
				return err
			}
			resp, err := unary(cmd, &gf, id, func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.PolicyVersion], error) {
				resp, err := c.Policies.Get(ctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id, Version: version}))
				if version != 0 && connect.CodeOf(err) == connect.CodeNotFound {
					err = cli.Exit(1, fmt.Errorf("sandbox %s has no policy version %d at the gateway (see corral policy history --sandbox %s)", id, version, id))
				}
				return resp, err
			})
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), termsafe.Text(resp.Msg.Yaml))
			return err
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the sandbox (see corral sandbox list)")
	cmd.Flags().Int64Var(&version, "version", 0, "the version to print (default: the newest)")
	return cmd
}

func newPolicyHistoryCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var id string
	cmd := &cobra.Command{
		Use:   "history --sandbox ID",
		Short: cli.FullShort("policy", "history"),
		Long: `List every policy version of the sandbox: when it was set, by whom, its
SHA-256 and what the supervisor reported (PENDING, LOADED, FAILED and why).` + "\n" + cli.GatewayHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needSandbox(id); err != nil {
				return err
			}
			resp, err := unary(cmd, &gf, id, func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.PolicyHistoryResponse], error) {
				return c.Policies.History(ctx, connect.NewRequest(&gatewayv1.PolicyHistoryRequest{SandboxId: id}))
			})
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "VERSION\tCREATED\tAUTHOR\tSHA256\tSTATUS\tERROR")
			for _, pv := range resp.Msg.Versions {
				fmt.Fprintf(w, "%d\t%s\t%s\t%.12s\t%s\t%s\n", pv.Version, pv.CreatedAt.AsTime().Local().Format(time.RFC3339),
					cli.OrDash(termsafe.Line(pv.Author)), pv.Sha256, policyStatusName(pv.Status), cli.OrDash(termsafe.Line(oneLine(pv.Error))))
			}
			return w.Flush()
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the sandbox (see corral sandbox list)")
	return cmd
}

func newPolicyStatusCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var id string
	cmd := &cobra.Command{
		Use:   "status --sandbox ID",
		Short: cli.FullShort("policy", "status"),
		Long: `Print the sandbox's newest policy version and what its supervisor reported
for it: PENDING (not yet applied, e.g. while the supervisor is away),
LOADED, or FAILED with the error (the sandbox then keeps enforcing the
version it had).` + "\n" + cli.GatewayHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needSandbox(id); err != nil {
				return err
			}
			resp, err := unary(cmd, &gf, id, func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.PolicyVersion], error) {
				return c.Policies.Get(ctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id}))
			})
			if err != nil {
				return err
			}
			pv := resp.Msg
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "sandbox %s: policy version %d (sha256 %s, set by %s at %s) %s\n", id, pv.Version, pv.Sha256,
				cli.OrDash(termsafe.Line(pv.Author)), pv.CreatedAt.AsTime().Local().Format(time.RFC3339), policyStatusName(pv.Status))
			if pv.Error != "" {
				fmt.Fprintf(out, "error: %s\n", termsafe.Line(pv.Error))
			}
			return nil
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the sandbox (see corral sandbox list)")
	return cmd
}

// needSandbox checks --sandbox for the policy commands that exist only at
// a gateway.
func needSandbox(id string) error {
	if id == "" {
		return cli.Exit(2, errors.New("--sandbox ID is required (see corral sandbox list)"))
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
