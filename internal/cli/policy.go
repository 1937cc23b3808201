package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
	"github.com/corral-sandbox/corral/internal/planner"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/policy/gitsrc"
)

func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Validate and explain sandbox policies; set, read and follow them through a gateway",
	}
	cmd.AddCommand(newPolicyCheckCmd(), newPolicyExplainCmd(), newPolicySetCmd(), newPolicyDefaultCmd(), newPolicyRulesCmd(),
		newPolicyGetCmd(), newPolicyHistoryCmd(), newPolicyStatusCmd())
	return cmd
}

func newPolicyCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE|git:REF:PATH",
		Short: "Validate a policy file",
		Long: `Validate a policy file (or, given git:REF:PATH, the file as committed on REF of
the current directory's repository). Exits 0 when it is valid (printing any
warnings), or prints every problem as "field.path: what is wrong — how to
fix" and exits 2.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := loadPolicy(args[0], ".")
			if err != nil {
				var ve *policy.ValidationError
				if errors.As(err, &ve) {
					for _, pr := range ve.Problems {
						fmt.Fprintln(cmd.ErrOrStderr(), pr.String())
					}
					return &exitError{code: 2, err: fmt.Errorf("%s: %d problem(s)", args[0], len(ve.Problems))}
				}
				return &exitError{code: 2, err: err}
			}
			for _, w := range p.Warnings() {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+w.String())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid (sha256 %s)\n", p.Source, p.SHA256())
			if len(p.Inherited) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s from the built-in default (left out of the file; extends: none to leave them empty)\n",
					p.Source, strings.Join(p.Inherited, ", "))
			}
			return nil
		},
	}
}

func newPolicyExplainCmd() *cobra.Command {
	var asJSON bool
	var workdir, stateDir string
	cmd := &cobra.Command{
		Use:   "explain [FILE]",
		Short: "Print what a policy compiles to on this host",
		Long: `Print the compiled plan for a policy (the built-in default without FILE) on
this host: the mounts in order, Landlock rules and ABI, the seccomp profile
with every rule, namespaces, uid/gid, limits and how each is enforced here,
and the network plan. Nothing is started.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := ""
			if len(args) == 1 {
				path = args[0]
			}
			wd, err := resolveWorkdir(workdir)
			if err != nil {
				return err
			}
			p, err := loadPolicy(path, wd)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			planPol, err := gitsrc.ForPlan(p, wd, path)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			pl, err := planner.Build(planPol, planner.Context{Workdir: wd, StateDir: orStateDir(stateDir), ID: "<id>", Session: "default", Path: inheritedPath()}, planner.LocalHost(orStateDir(stateDir)))
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(pl)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy: %s (sha256 %s)\n", orDefault(p.Source), p.SHA256())
			return pl.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")
	cmd.Flags().StringVar(&workdir, "workdir", "", "working directory to plan for (default: current directory)")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory to plan for")
	return cmd
}

func newPolicySetCmd() *cobra.Command {
	var gf gatewayFlags
	var stateDir, id string
	var local bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "set --sandbox ID FILE|git:REF:PATH",
		Short: "Replace the network policy of a running sandbox",
		Long: `Validate FILE and swap it in as the running sandbox's policy. FILE may be
partial: each top-level section it names replaces the running one whole, and
the sections it leaves out stay as they run (with "extends: none" FILE is the
whole policy). Only network policies and the hosts and headers of secrets
may change: the filesystem, Landlock, process, limits, seccomp, state and
network mode are fixed when a sandbox starts, and a policy that changes them
is rejected. A rejected policy never replaces the working one.

With a gateway configured (see below) the policy goes to the gateway, which
stores it as the sandbox's next version and pushes it to the supervisor;
set prints the version and waits up to --wait for the supervisor to report
it LOADED or FAILED, and exits 1 on FAILED with the supervisor's error.
Without a gateway, or with --local, it goes to the sandbox on this host
through its control socket.` + "\n" + gatewayHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if id == "" {
				return &exitError{code: 2, err: fmt.Errorf("--sandbox ID is required (see corral ps)")}
			}
			data, source, err := readPolicyFile(args[0])
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			if !local {
				remote, err := gf.configured()
				if err != nil {
					return err
				}
				if remote {
					return setGatewayPolicy(cmd, &gf, id, data, wait)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			resp, err := control.Call(ctx, orStateDir(stateDir), id, control.Request{Op: control.OpSetPolicy, Policy: string(data), Source: source})
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			if !resp.OK {
				return &exitError{code: 2, err: fmt.Errorf("sandbox %s kept its policy: %s", id, resp.Error)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sandbox %s: policy version %d (sha256 %s)\n", id, resp.Status.PolicyVersion, resp.Status.PolicySHA256)
			return nil
		},
	}
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the running sandbox (see corral ps, or corral sandbox list)")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory of the sandbox (without a gateway)")
	cmd.Flags().BoolVar(&local, "local", false, "set the policy of a sandbox on this host even when a gateway is configured")
	cmd.Flags().DurationVar(&wait, "wait", 5*time.Second, "with a gateway: how long to wait for LOADED or FAILED (0: do not wait)")
	gf.add(cmd)
	return cmd
}

// setGatewayPolicy stores the next version at the gateway and waits for
// the supervisor's word on it.
func setGatewayPolicy(cmd *cobra.Command, gf *gatewayFlags, id string, data []byte, wait time.Duration) error {
	c, err := gf.dial()
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
		return &exitError{code: 1, err: fmt.Errorf("sandbox %s: policy version %d FAILED, the sandbox keeps its previous policy: %s", id, pv.Version, pv.Error)}
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
	var gf gatewayFlags
	var id string
	var version int64
	cmd := &cobra.Command{
		Use:   "get --sandbox ID [--version N]",
		Short: "Print a sandbox's policy as the gateway stores it",
		Long: `Print the newest policy version of the sandbox (or version N) as YAML: the
whole effective policy, ready for corral policy set.` + "\n" + gatewayHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needSandbox(id); err != nil {
				return err
			}
			resp, err := unary(cmd, &gf, id, func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.PolicyVersion], error) {
				resp, err := c.Policies.Get(ctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id, Version: version}))
				if version != 0 && connect.CodeOf(err) == connect.CodeNotFound {
					err = &exitError{code: 1, err: fmt.Errorf("sandbox %s has no policy version %d at the gateway (see corral policy history --sandbox %s)", id, version, id)}
				}
				return resp, err
			})
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), resp.Msg.Yaml)
			return err
		},
	}
	gf.add(cmd)
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the sandbox (see corral sandbox list)")
	cmd.Flags().Int64Var(&version, "version", 0, "the version to print (default: the newest)")
	return cmd
}

func newPolicyHistoryCmd() *cobra.Command {
	var gf gatewayFlags
	var id string
	cmd := &cobra.Command{
		Use:   "history --sandbox ID",
		Short: "List the policy versions of a sandbox at the gateway",
		Long: `List every policy version of the sandbox: when it was set, by whom, its
SHA-256 and what the supervisor reported (PENDING, LOADED, FAILED and why).` + "\n" + gatewayHelp,
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
					orDash(pv.Author), pv.Sha256, policyStatusName(pv.Status), orDash(oneLine(pv.Error)))
			}
			return w.Flush()
		},
	}
	gf.add(cmd)
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the sandbox (see corral sandbox list)")
	return cmd
}

func newPolicyStatusCmd() *cobra.Command {
	var gf gatewayFlags
	var id string
	cmd := &cobra.Command{
		Use:   "status --sandbox ID",
		Short: "Show whether a sandbox loaded its newest policy",
		Long: `Print the sandbox's newest policy version and what its supervisor reported
for it: PENDING (not yet applied, e.g. while the supervisor is away),
LOADED, or FAILED with the error (the sandbox then keeps enforcing the
version it had).` + "\n" + gatewayHelp,
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
				orDash(pv.Author), pv.CreatedAt.AsTime().Local().Format(time.RFC3339), policyStatusName(pv.Status))
			if pv.Error != "" {
				fmt.Fprintf(out, "error: %s\n", pv.Error)
			}
			return nil
		},
	}
	gf.add(cmd)
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the sandbox (see corral sandbox list)")
	return cmd
}

// needSandbox checks --sandbox for the policy commands that exist only at
// a gateway.
func needSandbox(id string) error {
	if id == "" {
		return &exitError{code: 2, err: errors.New("--sandbox ID is required (see corral sandbox list)")}
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// readPolicyFile reads a policy file by path, or as committed in the
// current directory's repository for git:REF:PATH, and names its source.
func readPolicyFile(spec string) (data []byte, source string, err error) {
	if gitsrc.IsSpec(spec) {
		data, commit, _, err := gitsrc.Load(".", spec)
		if err != nil {
			return nil, "", fmt.Errorf("read policy %w", err)
		}
		s, _ := gitsrc.ParseSpec(spec) // Load parsed it already
		return data, s.Source(commit), nil
	}
	data, err = os.ReadFile(spec)
	if err != nil {
		return nil, "", fmt.Errorf("read policy: %w", err)
	}
	return data, spec, nil
}

func newPolicyDefaultCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "default",
		Short: "Print the built-in default policy, a starting point for your own",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := os.Stdout.Write(policy.DefaultYAML())
			return err
		},
	}
}

func newPolicyRulesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rules",
		Short: "Print corral's built-in network decision rules (Rego), a starting point for --policy-rules",
		Long: `Print the Rego rules corral evaluates for every connection (decision), every
DNS name (name_allowed) and every inspected HTTP request (request_decision).
A file given to corral run --policy-rules replaces them as a whole, so start
from these.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(decide.BakedRules())
			return err
		},
	}
}

func orDefault(source string) string {
	if source == "" {
		return "<default>"
	}
	return source
}
