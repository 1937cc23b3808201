package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

func newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: cli.FullShort("", "sandbox"),
		Long: `Manage the sandboxes of a corral gateway: create starts one (with the
gateway's local driver, or records it for a supervisor that joins from
another host), list and get show them, watch follows their phases
(provisioning, ready, exited, failed) and delete stops and forgets one.` + "\n" + cli.GatewayHelp,
	}
	cmd.AddCommand(newSandboxCreateCmd(), newSandboxListCmd(), newSandboxGetCmd(), newSandboxDeleteCmd(), newSandboxWatchCmd())
	return cmd
}

func newSandboxCreateCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var name, policyFile, workdir, drv string
	var labels, env []string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "create [--name N] [--label K=V]... [--policy FILE] [--workdir DIR] [--env K=V]... [--driver local|external] -- CMD...",
		Short: "Create a sandbox at the gateway and print its id",
		Long: `Create a sandbox at the gateway running CMD under the policy in FILE (the
built-in default without --policy) and print its id. With --driver local
(the gateway's default) the gateway starts the supervisor on its own host,
so --workdir is a directory there; with --driver external the gateway only
records the sandbox for a supervisor that joins from elsewhere. With --wait
it then waits until the sandbox is ready, exited or failed and prints that
phase; it exits 1 when the sandbox failed.` + "\n" + cli.GatewayHelp,
		RunE: func(cmd *cobra.Command, args []string) error {
			lm, err := parseKV("--label", labels)
			if err != nil {
				return cli.Exit(2, err)
			}
			if _, err := parseKV("--env", env); err != nil {
				return cli.Exit(2, err)
			}
			req := &gatewayv1.CreateSandboxRequest{Name: name, Labels: lm, Command: args, Env: env, Driver: drv}
			if workdir != "" {
				// A relative directory means nothing to a gateway that
				// runs elsewhere; made absolute it is at least this one.
				if req.Workdir, err = filepath.Abs(workdir); err != nil {
					return cli.Exit(2, fmt.Errorf("--workdir: %w", err))
				}
			}
			if policyFile != "" {
				data, _, err := cli.ReadPolicyFile(policyFile)
				if err != nil {
					return cli.Exit(2, err)
				}
				req.Policy = string(data)
			}
			c, err := dial(&gf)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			sb, err := c.Sandboxes.Create(ctx, connect.NewRequest(req))
			if err != nil {
				return gwErr(c, err, "")
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.Msg.Id)
			if !wait {
				return nil
			}
			return waitSettled(cmd, c, sb.Msg.Id, timeout)
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringVar(&name, "name", "", "a name for people (ids are what commands take)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "label K=V to select the sandbox by (repeatable)")
	cmd.Flags().StringVar(&policyFile, "policy", "", "policy file or git:REF:PATH (default: the built-in default)")
	cmd.Flags().StringVar(&workdir, "workdir", "", "working directory of the command, on the gateway's host for the local driver")
	cmd.Flags().StringArrayVar(&env, "env", nil, "environment variable K=V for the command (repeatable)")
	cmd.Flags().StringVar(&drv, "driver", "", "local (the gateway starts the supervisor) or external (one joins); default: the gateway's, local")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the sandbox is ready, exited or failed and print the phase")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long --wait waits")
	return cmd
}

// waitSettled waits for the sandbox to leave provisioning.
func waitSettled(cmd *cobra.Command, c *gatewayclient.Client, id string, timeout time.Duration) error {
	// A timer, not a deadline: see awaitPolicyStatus.
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	timer := time.AfterFunc(timeout, cancel)
	defer timer.Stop()
	stream, err := c.Sandboxes.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Id: id}))
	if err != nil {
		return gwErr(c, err, id)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg()
		sb := ev.Sandbox
		if ev.Deleted {
			return cli.Exit(1, fmt.Errorf("sandbox %s was deleted while starting", id))
		}
		switch sb.Phase {
		case gatewayv1.Phase_PHASE_READY, gatewayv1.Phase_PHASE_EXITED:
			fmt.Fprintln(cmd.OutOrStdout(), phaseText(sb))
			return nil
		case gatewayv1.Phase_PHASE_FAILED:
			fmt.Fprintln(cmd.OutOrStdout(), phaseText(sb))
			return cli.Exit(1, nil)
		}
	}
	if err := stream.Err(); err != nil && ctx.Err() == nil {
		return gwErr(c, err, id)
	}
	if err := cmd.Context().Err(); err != nil {
		return err
	}
	return cli.Exit(1, fmt.Errorf("sandbox %s is still provisioning after %s (see corral sandbox get %s)", id, timeout, id))
}

func newSandboxListCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var selector []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--selector K=V]... [--json]",
		Short: "List the gateway's sandboxes",
		Long: `List the gateway's sandboxes (those with every --selector label) with their
phase, exit status, newest policy version and what the supervisor said of
it (PENDING, LOADED or FAILED), age and labels.` + "\n" + cli.GatewayHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parseKV("--selector", selector)
			if err != nil {
				return cli.Exit(2, err)
			}
			return listSandboxes(cmd, &gf, sel, asJSON)
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringArrayVar(&selector, "selector", nil, "only sandboxes with label K=V (repeatable; all must match)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

// listSandboxes is corral sandbox list, and corral ps with a gateway.
func listSandboxes(cmd *cobra.Command, gf *cli.GatewayFlags, sel map[string]string, asJSON bool) error {
	c, err := dial(gf)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	defer cancel()
	resp, err := c.Sandboxes.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{Selector: sel}))
	if err != nil {
		return gwErr(c, err, "")
	}
	if asJSON {
		return writeProtoJSON(cmd.OutOrStdout(), resp.Msg)
	}
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tPHASE\tEXIT\tPOLICY\tAGE\tLABELS")
	now := time.Now()
	for _, sb := range resp.Msg.Sandboxes {
		exit := "-"
		if sb.ExitCode != nil {
			exit = fmt.Sprint(*sb.ExitCode)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.Id, nameText(sb), phaseName(sb.Phase), exit,
			policyText(sb), age(now, sb.CreatedAt.AsTime()), labelText(sb.Labels))
	}
	return w.Flush()
}

func newSandboxGetCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get ID [--json]",
		Short: "Show one sandbox of the gateway",
		Long:  "Show one sandbox: its phase, exit status and reason, command, working directory, driver, labels and policy." + "\n" + cli.GatewayHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			resp, err := unary(cmd, &gf, id, func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.Sandbox], error) {
				return c.Sandboxes.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: id}))
			})
			if err != nil {
				return err
			}
			sb := resp.Msg
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), sb)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "id:\t%s\n", sb.Id)
			fmt.Fprintf(w, "name:\t%s\n", nameText(sb))
			fmt.Fprintf(w, "phase:\t%s\n", phaseText(sb))
			fmt.Fprintf(w, "policy:\t%s\n", policyText(sb))
			fmt.Fprintf(w, "driver:\t%s\n", sb.Driver)
			fmt.Fprintf(w, "command:\t%s\n", cli.OrDash(termsafe.Line(strings.Join(sb.Command, " "))))
			fmt.Fprintf(w, "workdir:\t%s\n", cli.OrDash(termsafe.Line(sb.Workdir)))
			fmt.Fprintf(w, "labels:\t%s\n", labelText(sb.Labels))
			fmt.Fprintf(w, "created:\t%s\n", sb.CreatedAt.AsTime().Local().Format(time.RFC3339))
			fmt.Fprintf(w, "updated:\t%s\n", sb.UpdatedAt.AsTime().Local().Format(time.RFC3339))
			return w.Flush()
		},
	}
	gf.Add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxDeleteCmd() *cobra.Command {
	var gf cli.GatewayFlags
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Stop a sandbox and remove it from the gateway",
		Long:  "Stop the sandbox's supervisor (for the local driver) and remove the sandbox, its policies, logs and credential from the gateway." + "\n" + cli.GatewayHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if _, err := unary(cmd, &gf, id, func(ctx context.Context, c *gatewayclient.Client) (*connect.Response[gatewayv1.DeleteSandboxResponse], error) {
				return c.Sandboxes.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: id}))
			}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", id)
			return nil
		},
	}
	gf.Add(cmd)
	return cmd
}

func newSandboxWatchCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var selector []string
	cmd := &cobra.Command{
		Use:   "watch [ID] [--selector K=V]...",
		Short: "Print a line for each change of the gateway's sandboxes",
		Long: `Print the current state of the sandbox ID (or of every sandbox with the
--selector labels), then a line for each change of phase or policy status,
until interrupted (or until the one sandbox watched is deleted).` + "\n" + cli.GatewayHelp,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("--selector", selector)
			if err != nil {
				return cli.Exit(2, err)
			}
			req := &gatewayv1.WatchSandboxesRequest{Selector: sel}
			if len(args) == 1 {
				if len(sel) > 0 {
					return cli.Exit(2, errors.New("watch one sandbox ID or those matching --selector, not both"))
				}
				req.Id = args[0]
			}
			c, err := dial(&gf)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			stream, err := c.Sandboxes.Watch(ctx, connect.NewRequest(req))
			if err != nil {
				return gwErr(c, err, req.Id)
			}
			defer stream.Close()
			out := cmd.OutOrStdout()
			for stream.Receive() {
				ev := stream.Msg()
				sb := ev.Sandbox
				state := phaseText(sb) + "\tpolicy " + policyText(sb)
				if ev.Deleted {
					state = "deleted"
				}
				fmt.Fprintf(out, "%s\t%s\t%s\t%s\n", time.Now().Format(time.RFC3339), sb.Id, nameText(sb), state)
			}
			if err := stream.Err(); err != nil && ctx.Err() == nil {
				return gwErr(c, err, req.Id)
			}
			return nil
		},
	}
	gf.Add(cmd)
	cmd.Flags().StringArrayVar(&selector, "selector", nil, "only sandboxes with label K=V (repeatable; all must match)")
	return cmd
}

// parseKV reads repeated K=V flags into a map; a key given twice is an
// error rather than a silent choice.
func parseKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\x00") {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flag, kv)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%s %s given twice", flag, k)
		}
		m[k] = v
	}
	return m, nil
}

func phaseName(p gatewayv1.Phase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PHASE_"))
}

// nameText is the sandbox's name for a table cell. A supervisor that joins
// with a token names its sandbox, labels it and reports why it ended, so
// nameText, phaseText and labelText escape those for the terminal.
func nameText(sb *gatewayv1.Sandbox) string {
	return cli.OrDash(termsafe.Line(sb.Name))
}

// phaseText is the phase with what ended it.
func phaseText(sb *gatewayv1.Sandbox) string {
	s := phaseName(sb.Phase)
	if sb.ExitCode != nil {
		s += fmt.Sprintf(" (exit %d)", *sb.ExitCode)
	}
	if sb.Reason != "" {
		s += ": " + termsafe.Line(sb.Reason)
	}
	return s
}

func policyStatusName(s gatewayv1.PolicyStatus) string {
	return strings.TrimPrefix(s.String(), "POLICY_STATUS_")
}

func policyText(sb *gatewayv1.Sandbox) string {
	return fmt.Sprintf("v%d %s", sb.PolicyVersion, policyStatusName(sb.PolicyStatus))
}

func labelText(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return termsafe.Line(strings.Join(parts, ","))
}

// age is a duration in its largest whole unit, as kubectl prints it.
func age(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d.Seconds())))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func writeProtoJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
