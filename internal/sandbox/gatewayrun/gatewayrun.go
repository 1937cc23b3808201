// Package gatewayrun links a running sandbox to the gateway that manages
// it (corral run --gateway): the policy and secrets it starts with, the
// updates it takes while it runs and the audit trail it reports. Only
// corral's full program links it, with the gateway client's protobuf and
// Connect code (internal/fullbin).
package gatewayrun

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/gatewaylink"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
	"github.com/corral-sandbox/corral/internal/sandbox"
)

// Gateway is a supervisor's link to the gateway that manages its sandbox.
type Gateway struct {
	link *gatewaylink.Link
	aud  *audit.Logger
	log  *slog.Logger
	// cached is set when the sandbox starts from the policy an earlier
	// run cached, the gateway being unreachable.
	cached bool
	// values are the secrets' values from the gateway's first update,
	// until SecretLookup hands them over.
	values map[string][]byte
	// routes are the gateway's model routes at start; nil for none.
	routes *gatewaylink.Routes
	// hostKeys lets the gateway's documents take keys from_file and
	// from_env on this host.
	hostKeys bool
}

var _ sandbox.GatewayLink = (*Gateway)(nil)

// Connect connects to the gateway before the sandbox is built and
// returns the policy the sandbox starts with: the gateway's, or the one
// cached by an earlier run when the gateway is unreachable; nil when the
// gateway has none, and the run's own applies. From now on every audit
// event of aud's sink goes to the gateway too.
func Connect(ctx context.Context, o sandbox.GatewayOptions, aud *audit.Logger) (*Gateway, *policy.Policy, error) {
	link, start, err := gatewaylink.Start(ctx, gatewaylink.Config{
		URL: o.URL, CAFile: o.CAFile, TokenFile: o.TokenFile, StateDir: o.StateDir, Log: o.Log,
		Join: gatewaylink.Join{Name: o.Name, Labels: o.Labels, Command: o.Argv, Workdir: o.Workdir, Policy: o.Policy},
	})
	if err != nil {
		return nil, nil, err
	}
	g := &Gateway{link: link, aud: aud, log: o.Log, cached: start.Cached, values: start.Secrets, routes: start.Routes, hostKeys: o.HostKeys}
	aud.Observe(link.Observe)
	if start.Version == 0 {
		return g, nil, nil
	}
	source := gatewaySource(start.Version)
	if start.Cached {
		source += " (cached: gateway unreachable)"
	}
	p, err := g.policy(start.YAML, source)
	if err != nil {
		err = fmt.Errorf("policy version %d from the gateway: %w", start.Version, err)
		g.Finish(sandbox.ExitSetupFailed, err)
		return nil, nil, err
	}
	o.Log.Info("policy from the gateway", "version", start.Version, "sandbox", link.SandboxID(), "cached", start.Cached)
	return g, p, nil
}

func gatewaySource(version int64) string { return fmt.Sprintf("gateway:v%d", version) }

// policy parses one version the gateway holds. Each is a whole policy
// (sections it leaves out are the built-in default's, as for a file), so
// the sandbox runs exactly what the gateway shows as that version,
// whatever ran before it.
func (g *Gateway) policy(yaml []byte, source string) (*policy.Policy, error) {
	if len(bytes.TrimSpace(yaml)) == 0 {
		return policy.Default(), nil
	}
	p, err := policy.Parse(yaml, source)
	if err != nil {
		return nil, err
	}
	var reads []string
	for _, name := range slices.Sorted(maps.Keys(p.Secrets)) {
		reads = append(reads, hostReads("secrets."+name, p.Secrets[name].FromEnv, p.Secrets[name].FromFile)...)
	}
	if p.Inference != nil {
		reads = append(reads, routeReads("inference.routes", p.Inference.Routes)...)
	}
	if err := g.hostKeysAllowed(reads); err != nil {
		return nil, err
	}
	return p, nil
}

// hostReads names what a key source would read on this host.
func hostReads(field, fromEnv, fromFile string) []string {
	var out []string
	if fromEnv != "" {
		out = append(out, field+".from_env "+fromEnv)
	}
	if fromFile != "" {
		out = append(out, field+".from_file "+fromFile)
	}
	return out
}

func routeReads(field string, routes []inference.Route) []string {
	var out []string
	for i, r := range routes {
		out = append(out, hostReads(fmt.Sprintf("%s[%d].api_key", field, i), r.APIKey.FromEnv, r.APIKey.FromFile)...)
	}
	return out
}

// hostKeysAllowed refuses a gateway document that would read keys on this
// host unless the supervisor was started to allow it: through such a key,
// sent to a server of their choosing, gateway users would read any file of
// this host and corral's environment.
func (g *Gateway) hostKeysAllowed(reads []string) error {
	if len(reads) == 0 || g.hostKeys {
		return nil
	}
	return fmt.Errorf("it takes %s on this host, which a supervisor takes from the gateway only when started with --gateway-host-keys (gateway users could read this host's files and corral's environment that way); hold the value in the gateway and use from_gateway instead",
		strings.Join(reads, ", "))
}

// CheckSecrets fails when p takes secrets from_gateway that this start
// cannot have: the gateway was unreachable, and values are never cached.
func (g *Gateway) CheckSecrets(p *policy.Policy) error {
	if names := p.GatewaySecrets(); len(names) > 0 && g.cached {
		return fmt.Errorf("the policy takes %s from_gateway, and the gateway is unreachable: secret values are never cached on disk, so this sandbox can start only when the gateway is back",
			strings.Join(names, ", "))
	}
	return nil
}

// SecretLookup hands over the secrets' values from the gateway, for
// secrets.LoadFrom, and forgets them: from then on the Set holds them.
func (g *Gateway) SecretLookup() func(name string) (string, bool) {
	values := g.values
	g.values = nil
	return func(name string) (string, bool) {
		v, ok := values[name]
		return string(v), ok
	}
}

// HasRoutes reports whether the gateway had model routes at start.
func (g *Gateway) HasRoutes() bool { return g.routes != nil }

// Routes returns the gateway's model routes at start, nil when it has
// none. A document that does not parse is reported (warning and audit
// event) and ignored: the policy's routes apply.
func (g *Gateway) Routes() *inference.Config {
	if g.routes == nil {
		return nil
	}
	c, err := g.routeDoc(g.routes.YAML)
	if err != nil {
		g.routesFailed(g.routes.Version, 0, err)
		return nil
	}
	g.log.Info("model routes from the gateway", "version", g.routes.Version, "routes", len(c.Routes))
	return &c
}

// routesFailed reports routes that were not put in force. policyVersion
// is the policy version in force, 0 before the sandbox runs.
func (g *Gateway) routesFailed(version int64, policyVersion int, err error) {
	g.log.Warn("model routes from the gateway refused; the routes in force stay", "version", version, "err", err)
	g.aud.Log(audit.PolicyReloadFailedEvent{Source: fmt.Sprintf("gateway:routes v%d", version), Version: policyVersion + 1, Error: err.Error()})
}

// routeDoc reads the gateway's routes document as an --inference-routes
// file is read.
func (g *Gateway) routeDoc(data []byte) (inference.Config, error) {
	c, err := inference.ParseRoutes(data)
	if err != nil {
		return inference.Config{}, fmt.Errorf("inference routes: %w", err)
	}
	if err := g.hostKeysAllowed(routeReads("routes", c.Routes)); err != nil {
		return inference.Config{}, fmt.Errorf("inference routes: %w", err)
	}
	return c, nil
}

// Logger returns log with its warnings and errors sent to the gateway too.
func (g *Gateway) Logger(log *slog.Logger) *slog.Logger {
	return slog.New(g.link.Handler(log.Handler()))
}

// Serve applies what the gateway pushes to t, until ctx ends or Finish.
func (g *Gateway) Serve(ctx context.Context, t sandbox.GatewayTargets) {
	go g.link.Serve(ctx, g.handlers(t))
}

func (g *Gateway) handlers(t sandbox.GatewayTargets) gatewaylink.Handlers {
	r := t.Policy
	return gatewaylink.Handlers{
		Policy: func(version int64, yaml []byte) error {
			source := gatewaySource(version)
			p, err := g.policy(yaml, source)
			if err != nil {
				// The reloader audits what it refuses; a version that does
				// not even parse never reaches it.
				g.aud.Log(audit.PolicyReloadFailedEvent{Source: source, Version: r.Current().Version + 1, Error: err.Error()})
				return err
			}
			return r.Apply(p, source)
		},
		Secrets: func(values map[string][]byte) { g.updateSecrets(t.Secrets, values, r) },
		Routes: func(version int64, yaml []byte) error {
			if t.Routes == nil {
				g.log.Warn("model routes from the gateway not applied: "+t.RoutesFixed, "version", version)
				return nil
			}
			c, err := g.routeDoc(yaml)
			if err == nil {
				err = t.Routes(c)
			}
			if err != nil {
				g.routesFailed(version, r.Current().Version, err)
				return err
			}
			g.log.Info("model routes from the gateway in force", "version", version, "routes", len(c.Routes))
			return nil
		},
	}
}

// updateSecrets puts new values of the secrets from_gateway in force; a
// value the running sandbox cannot take is reported and the old ones stay.
// Names only: a value never reaches a log.
func (g *Gateway) updateSecrets(set *secrets.Set, values map[string][]byte, r *reload.Reloader) {
	changed, err := set.UpdateGateway(func(name string) (string, bool) {
		v, ok := values[name]
		return string(v), ok
	})
	if err != nil {
		g.log.Warn("secret values from the gateway refused; the values in force stay", "err", err)
		g.aud.Log(audit.PolicyReloadFailedEvent{Source: "gateway:secrets", Version: r.Current().Version + 1, Error: err.Error()})
		return
	}
	if len(changed) > 0 {
		g.log.Info("new secret values from the gateway in force", "secrets", changed)
	}
}

// Finish reports how the run ended (corral's exit code, and why it
// failed) and flushes the logs, waiting a bounded time.
func (g *Gateway) Finish(code int, err error) { g.link.Finish(code, err) }
