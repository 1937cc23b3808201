// Package fleet is the corral CLI's side of a gateway: corral gateway
// (login, secrets, routes; the rest runs corral-gateway), sandbox, logs,
// policy get|history|status, and the gateway branches of ps, policy set
// and run --gateway. Only corral's full program links it, and with it the
// gateway client's protobuf and Connect code; the lean corral runs the full
// program for these (internal/fullbin). Importing it adds it to the CLI.
package fleet

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/sandbox"
	"github.com/corral-sandbox/corral/internal/sandbox/gatewayrun"
)

func init() {
	cli.Extend(cli.Full{
		Commands: commands,
		ListSandboxes: func(cmd *cobra.Command, gf *cli.GatewayFlags) error {
			return listSandboxes(cmd, gf, nil, false)
		},
		SetPolicy: setGatewayPolicy,
		ConnectGateway: func(ctx context.Context, o sandbox.GatewayOptions, aud *audit.Logger) (sandbox.GatewayLink, *policy.Policy, error) {
			g, p, err := gatewayrun.Connect(ctx, o, aud)
			if err != nil {
				return nil, nil, err // not a typed nil in the interface
			}
			return g, p, nil
		},
	})
}

// commands are this package's commands under parent, one for each name
// cli lists for it.
func commands(parent string) []*cobra.Command {
	switch parent {
	case "":
		return []*cobra.Command{newGatewayCmd(), newSandboxCmd(), newLogsCmd()}
	case "policy":
		return []*cobra.Command{newPolicyGetCmd(), newPolicyHistoryCmd(), newPolicyStatusCmd()}
	}
	return nil
}
