package cli

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/fullbin"
)

func newVersionCmd() *cobra.Command {
	var (
		full     bool
		stateDir string
	)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print corral's version, the commit it was built from and the Go toolchain",
		Long: `Print corral's version, the commit it was built from and the Go toolchain.

The version is the one given at link time (-ldflags "-X
github.com/corral-sandbox/corral/internal/cli.Version=v1.2.3"), else the
module version Go recorded. The commit comes from the build information that
"go build" and "go install" record in a git checkout; "go run" records none.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stateDir != "" && !full {
				return &exitError{code: 2, err: errors.New("--state-dir goes with --full-program")}
			}
			if full {
				state, err := absStateDir(stateDir)
				if err != nil {
					return &exitError{code: 1, err: err}
				}
				path, err := fullbin.Path(state)
				if err != nil {
					return &exitError{code: 1, err: err}
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), path)
				return err
			}
			info, _ := debug.ReadBuildInfo()
			return writeVersion(cmd.OutOrStdout(), info)
		},
	}
	cmd.Flags().BoolVar(&full, "full-program", false, "print instead the path of corral's full program (corral with OPA and the gateway client, which this corral runs for --policy-rules and the gateway commands), writing it to the state directory first; the gateway's local driver starts sandboxes with it")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "with --full-program: the state directory to write it to (default: /var/lib/corral as root, else $XDG_STATE_HOME/corral)")
	return cmd
}

// writeVersion prints one line: version, revision (with "+dirty" when the
// tree had uncommitted changes) and its time, toolchain and platform.
func writeVersion(w io.Writer, info *debug.BuildInfo) error {
	version, revision, when, dirty := Version, "unknown revision", "", false
	if info != nil {
		if version == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.time":
				when = " " + s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if dirty {
		revision += "+dirty"
	}
	_, err := fmt.Fprintf(w, "corral %s (%s%s; %s, %s/%s)\n", version, revision, when, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}
