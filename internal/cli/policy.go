package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/planner"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/policy/gitsrc"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Validate and explain sandbox policies; set, read and follow them through a gateway",
	}
	cmd.AddCommand(newPolicyCheckCmd(), newPolicyExplainCmd(), newPolicySetCmd(), newPolicyDefaultCmd(), newPolicyRulesCmd())
	cmd.AddCommand(fullCommands("policy")...)
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
					// Problems quote the file, which may be one the
					// workload wrote (a policy inside its workdir).
					for _, pr := range ve.Problems {
						fmt.Fprintln(cmd.ErrOrStderr(), termsafe.Line(pr.String()))
					}
					return &exitError{code: 2, err: fmt.Errorf("%s: %d problem(s)", args[0], len(ve.Problems))}
				}
				return &exitError{code: 2, err: err}
			}
			for _, w := range p.Warnings() {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+termsafe.Line(w.String()))
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
			wd, _, err := resolveWorkdir(workdir)
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
	var gf GatewayFlags
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
through its control socket.` + "\n" + GatewayHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if id == "" {
				return &exitError{code: 2, err: fmt.Errorf("--sandbox ID is required (see corral ps)")}
			}
			data, source, err := ReadPolicyFile(args[0])
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			if !local {
				remote, err := gf.Configured()
				if err != nil {
					return err
				}
				if remote {
					if full == nil {
						return &exitError{code: 2, err: execFull("corral policy set with a gateway", stateDir)}
					}
					return full.SetPolicy(cmd, &gf, id, data, wait)
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
	gf.Add(cmd)
	return cmd
}

// ReadPolicyFile reads a policy file by path, or as committed in the
// current directory's repository for git:REF:PATH, and names its source.
func ReadPolicyFile(spec string) (data []byte, source string, err error) {
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
