package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print corral's version, the commit it was built from and the Go toolchain",
		Long: `Print corral's version, the commit it was built from and the Go toolchain.

The version is the one given at link time (-ldflags "-X
github.com/corral-sandbox/corral/internal/cli.Version=v1.2.3"), else the
module version Go recorded. The commit comes from the build information that
"go build" and "go install" record in a git checkout; "go run" records none.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, _ := debug.ReadBuildInfo()
			return writeVersion(cmd.OutOrStdout(), info)
		},
	}
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
