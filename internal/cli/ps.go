package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/statedir"
)

func newPsCmd() *cobra.Command {
	var gf GatewayFlags
	var stateDir string
	var local bool
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List running sandboxes",
		Long: `List the sandboxes running under the state directory, with their supervisor
pid, command, policy and start time.

With a gateway configured (see below) list the gateway's sandboxes instead,
as corral sandbox list does; --local lists this host's anyway.` + "\n" + GatewayHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !local {
				remote, err := gf.Configured()
				if err != nil {
					return err
				}
				if remote {
					if full == nil {
						return &exitError{code: 2, err: execFull("corral ps with a gateway", stateDir)}
					}
					return full.ListSandboxes(cmd, &gf)
				}
			}
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
	cmd.Flags().BoolVar(&local, "local", false, "list this host's sandboxes even when a gateway is configured")
	gf.Add(cmd)
	return cmd
}

func orStateDir(dir string) string {
	if dir == "" {
		return statedir.Default()
	}
	return dir
}

// absStateDir is dir, or the default, as an absolute path: what corral
// writes its programs and runs under.
func absStateDir(dir string) (string, error) {
	return filepath.Abs(orStateDir(dir))
}
