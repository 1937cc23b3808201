package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/statedir"
)

func newPsCmd() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List running sandboxes",
		Long:  "List the sandboxes running under the state directory, with their supervisor pid, command, policy and start time.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			state := orStateDir(stateDir)
			entries, err := os.ReadDir(statedir.Runs(state))
			if err != nil && !os.IsNotExist(err) {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tPID\tSESSION\tNETWORK\tPOLICY\tSTARTED\tCOMMAND")
			for _, e := range entries {
				ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
				resp, err := control.Call(ctx, state, e.Name(), control.Request{Op: control.OpStatus})
				cancel()
				if err != nil || resp.Status == nil {
					continue // not running (yet, or any more)
				}
				st := resp.Status
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.12s v%d\t%s\t%s\n", st.ID, st.PID, st.Session, st.NetworkMode,
					st.PolicySHA256, st.PolicyVersion, st.Started.Format(time.RFC3339), strings.Join(st.Argv, " "))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory (default: /var/lib/corral as root, else $XDG_STATE_HOME/corral)")
	return cmd
}

func newPolicySetCmd() *cobra.Command {
	var stateDir, id string
	cmd := &cobra.Command{
		Use:   "set --sandbox ID FILE",
		Short: "Replace the network policy of a running sandbox",
		Long: `Validate FILE and swap it in as the running sandbox's policy. FILE may be
partial: each top-level section it names replaces the running one whole, and
the sections it leaves out stay as they run (with "extends: none" FILE is the
whole policy). Only network policies and the hosts and headers of secrets
may change: the filesystem, Landlock, process, limits, seccomp, state and
network mode are fixed when a sandbox starts, and a policy that changes them
is rejected. A rejected policy never replaces the working one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if id == "" {
				return &exitError{code: 2, err: fmt.Errorf("--sandbox ID is required (see corral ps)")}
			}
			data, err := os.ReadFile(args[0])
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("read policy: %w", err)}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			resp, err := control.Call(ctx, orStateDir(stateDir), id, control.Request{Op: control.OpSetPolicy, Policy: string(data), Source: args[0]})
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
	cmd.Flags().StringVar(&id, "sandbox", "", "id of the running sandbox (see corral ps)")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory of the sandbox")
	return cmd
}

func orStateDir(dir string) string {
	if dir == "" {
		return statedir.Default()
	}
	return dir
}
