package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// gatewayBinary is the gateway's own executable. It is separate so that
// gRPC, the SQL drivers and Prometheus never add to `corral run`.
const gatewayBinary = "corral-gateway"

func newGatewayCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gateway [serve|token|issue-client] [flags]",
		Short: "Run the control plane for many sandboxes (corral-gateway)",
		Long: `Run corral-gateway with these arguments: the gateway serving sandboxes,
policies, logs, secrets and model routes over gRPC/Connect on TLS, and its
admin commands (token create|list|delete, issue-client). See
corral gateway --help once corral-gateway is installed.

corral-gateway is looked up next to this corral binary, then in PATH.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := findGateway()
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			// exec, not a child: signals, exit status and the terminal go
			// to the gateway unchanged.
			if err := syscall.Exec(bin, append([]string{bin}, args...), os.Environ()); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("run %s: %w", bin, err)}
			}
			return nil
		},
	}
}

// findGateway looks next to this executable first, so a corral and a
// corral-gateway built together are used together.
func findGateway() (string, error) {
	dir := "DIR"
	if self, err := os.Executable(); err == nil {
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
