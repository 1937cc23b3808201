package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/gatewaylink"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

// GatewayOptions are corral run's --gateway flags and what a join tells
// the gateway about the sandbox.
type GatewayOptions struct {
	URL, CAFile, TokenFile string
	// StateDir is the run's state directory: the link keeps the sandbox's
	// credential and last-known-good policy under it.
	StateDir string
	Name     string
	Labels   map[string]string
	Argv     []string
	Workdir  string
	// Policy is the run's --policy, sent with a join as the policy to
	// start with when the gateway has none.
	Policy []byte
	Log    *slog.Logger
}

// Gateway is a supervisor's link to the gateway that manages its sandbox.
type Gateway struct {
	link *gatewaylink.Link
	aud  *audit.Logger
}

// ConnectGateway connects to the gateway before the sandbox is built and
// returns the policy the sandbox starts with: the gateway's, or the one
// cached by an earlier run when the gateway is unreachable; nil when the
// gateway has none, and the run's own applies. From now on every audit
// event of aud's sink goes to the gateway too.
func ConnectGateway(ctx context.Context, o GatewayOptions, aud *audit.Logger) (*Gateway, *policy.Policy, error) {
	link, start, err := gatewaylink.Start(ctx, gatewaylink.Config{
		URL: o.URL, CAFile: o.CAFile, TokenFile: o.TokenFile, StateDir: o.StateDir, Log: o.Log,
		Join: gatewaylink.Join{Name: o.Name, Labels: o.Labels, Command: o.Argv, Workdir: o.Workdir, Policy: o.Policy},
	})
	if err != nil {
		return nil, nil, err
	}
	g := &Gateway{link: link, aud: aud}
	aud.Observe(link.Observe)
	if start.Version == 0 {
		return g, nil, nil
	}
	source := gatewaySource(start.Version)
	if start.Cached {
		source += " (cached: gateway unreachable)"
	}
	p, err := gatewayPolicy(start.YAML, source)
	if err != nil {
		err = fmt.Errorf("policy version %d from the gateway: %w", start.Version, err)
		g.Finish(ExitSetupFailed, err)
		return nil, nil, err
	}
	o.Log.Info("policy from the gateway", "version", start.Version, "sandbox", link.SandboxID(), "cached", start.Cached)
	return g, p, nil
}

func gatewaySource(version int64) string { return fmt.Sprintf("gateway:v%d", version) }

// gatewayPolicy parses one version the gateway holds. Each is a whole
// policy (sections it leaves out are the built-in default's, as for a
// file), so the sandbox runs exactly what the gateway shows as that
// version, whatever ran before it.
func gatewayPolicy(yaml []byte, source string) (*policy.Policy, error) {
	if len(bytes.TrimSpace(yaml)) == 0 {
		return policy.Default(), nil
	}
	return policy.Parse(yaml, source)
}

// Logger returns log with its warnings and errors sent to the gateway too.
func (g *Gateway) Logger(log *slog.Logger) *slog.Logger {
	return slog.New(g.link.Handler(log.Handler()))
}

// Serve applies the versions the gateway pushes through r, which keeps
// the running policy when one is refused, until ctx ends or Finish.
func (g *Gateway) Serve(ctx context.Context, r *reload.Reloader) {
	go g.link.Serve(ctx, func(version int64, yaml []byte) error {
		source := gatewaySource(version)
		p, err := gatewayPolicy(yaml, source)
		if err != nil {
			// The reloader audits what it refuses; a version that does
			// not even parse never reaches it.
			g.aud.Log(audit.PolicyReloadFailedEvent{Source: source, Version: r.Current().Version + 1, Error: err.Error()})
			return err
		}
		return r.Apply(p, source)
	})
}

// Finish reports how the run ended (corral's exit code, and why it
// failed) and flushes the logs, waiting a bounded time.
func (g *Gateway) Finish(code int, err error) { g.link.Finish(code, err) }
