// Package assemble builds one sandbox's egress, and is the only place that
// does: from the policy and what corral run's flags add, the decision
// engine, the sandbox's CA and the trust handed to the workload, and the
// secrets; then, on the listeners the sandbox's init opened, the guarded
// dialer, the identifier, the gate, the inspector, the proxies and the DNS
// server. corral run calls New while the sandbox is being made, and the
// supervisor waits for it before the sandbox's init gets its config, so a
// policy that does not compile stops the run before the workload exists;
// Start comes once the listeners exist.
package assemble

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/egress/dialer"
	"github.com/corral-sandbox/corral/internal/egress/dns"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/httpproxy"
	"github.com/corral-sandbox/corral/internal/egress/localsvc"
	"github.com/corral-sandbox/corral/internal/egress/socks5"
	"github.com/corral-sandbox/corral/internal/egress/transparent"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/l7/inspect"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/procident"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

// Config is what an egress is built from.
type Config struct {
	// ID names the sandbox; its CA carries it.
	ID string
	// Hostname is the sandbox's own name: its resolver answers it as the
	// sandbox's /etc/hosts does, so looking it up is never a denied name.
	Hostname string
	Policy   *policy.Compiled
	// Rules replace the built-in decision rules (--policy-rules); nil
	// keeps them.
	Rules []byte
	// UpstreamDNS is "HOST:PORT" of the resolver for allowed names; empty
	// means the host's resolver.
	UpstreamDNS string
	// UpstreamRoots returns the roots that verify upstream servers of
	// inspected connections, loading them on first use.
	UpstreamRoots func() *x509.CertPool
	// Secrets are swapped into inspected requests; nil for none.
	Secrets *secrets.Set
	// Inference, from --inference-routes or the gateway, replaces the
	// policy's model routes for the whole run (reloads do not change
	// them); nil keeps the policy's.
	Inference *inference.Config
	// RouteKeys refuses model routes whose key files the sandbox could
	// read (planner.RouteKeysHidden on the run's plan); routes a reload
	// or the gateway brings in are checked with it before they are put
	// in force. nil checks none.
	RouteKeys func(origin string, routes []inference.Route) error
	// Limits are the plan's: Connections and TunnelIdleMS bound the
	// tunnels.
	Limits plan.Limits
	Audit  *audit.Logger
	Log    *slog.Logger
}

// Egress is one sandbox's egress: built by New, served by Start, and
// reloaded through its Policy.
type Egress struct {
	cfg    Config
	ca     *ca.CA
	system []byte // what the host trusts (ca.HostTrust)
	policy *reload.Reloader
	// dial connects upstream for every listener and the model routes.
	dial *dialer.Dialer
	// router answers inference.local.
	router *inference.Router
	// routesMu guards routesSet, which is true once SetRoutes has put
	// routes from outside the policy in force: reloads leave them alone.
	routesMu  sync.Mutex
	routesSet bool
	// services are the names the supervisor answers itself (AddService).
	services map[string]http.Handler
	// advice names pending policy chunks in refusals (SetAdvice).
	advice egress.Advice
	// gate carries the open connections once Start has run; a reload
	// re-decides them.
	gate atomic.Pointer[gate.Gate]
}

// AddService has the supervisor answer name inside the sandbox with h, on
// ports 80 (HTTP) and 443 (HTTPS with a leaf of the sandbox CA), through
// every listener; the name resolves whatever the policy says, and its
// connections are audited but not decided. Call it before Start.
func (e *Egress) AddService(name string, h http.Handler) {
	if e.services == nil {
		e.services = map[string]http.Handler{}
	}
	e.services[strings.ToLower(name)] = h
}

// New prepares the policy's decisions and creates the sandbox's CA.
// Nothing runs yet.
func New(c Config) (*Egress, error) {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	authority, err := ca.New(c.ID, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("create the sandbox CA: %w", err)
	}
	system, warnings, err := ca.HostTrust(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("read the system CA bundle: %w", err)
	}
	for _, w := range warnings {
		c.Log.Warn(w)
	}
	e := &Egress{cfg: c, ca: authority, system: system, dial: dialer.New(c.UpstreamDNS)}
	if err := e.newRouter(); err != nil {
		return nil, err
	}
	if e.policy, err = reload.New(c.Policy, e.build, c.Audit, c.Log); err != nil {
		return nil, fmt.Errorf("compile network policy: %w", err)
	}
	e.policy.OnSwap(e.revoke)
	return e, nil
}

// Policy is the sandbox's policy in force; its Set reloads this egress.
func (e *Egress) Policy() *reload.Reloader { return e.policy }

// build makes a policy version's decisions and secrets: the secrets loaded
// at start, and from then on the same values under the new scopes, worked
// out before anything is put in force, so a policy takes effect whole or
// not at all.
func (e *Egress) build(c *policy.Compiled, prev *reload.Snapshot) (reload.Decider, *secrets.Set, error) {
	engine, err := decide.New(c, e.cfg.Rules)
	if err != nil {
		return nil, nil, err
	}
	if prev == nil {
		return engine, e.cfg.Secrets, nil
	}
	scoped, err := prev.Secrets.Rescope(c.Secrets)
	if err != nil {
		return nil, nil, err
	}
	// Last, as the one step that takes effect at once: nothing after it
	// can fail.
	if err := e.swapRoutes(c); err != nil {
		return nil, nil, err
	}
	return engine, scoped, nil
}

// revoke decides the open connections again under the policy just put in
// force.
func (e *Egress) revoke(ctx context.Context) {
	if g := e.gate.Load(); g != nil {
		g.Revoke(ctx)
	}
}

// TrustFiles returns, by file name, what the plan mounts where the
// workload's TLS clients look, each file as parts to write in order: the
// sandbox CA's certificate and the host's bundle with it added.
func (e *Egress) TrustFiles() map[string][][]byte {
	return map[string][][]byte{
		"ca.pem":        {e.ca.CertPEM()},
		"ca-bundle.pem": e.ca.Bundle(e.system),
	}
}

// BrowserPolicy is a Chromium/Chrome managed policy that trusts the sandbox
// CA (CACertificates, base64 DER): those browsers read no CA bundle.
// Base64 needs no JSON escaping, so the document is formatted directly.
func (e *Egress) BrowserPolicy() []byte {
	return fmt.Appendf(nil, "{\"CACertificates\": [%q]}\n", base64.StdEncoding.EncodeToString(e.ca.Certificate().Raw))
}

// JavaTrustStoreFile names the JKS form of the bundle among the trust
// files.
const JavaTrustStoreFile = "truststore.jks"

// JavaTrustStore writes the bundle to w as a JKS trust store (Java reads
// no PEM), starting from the store of the host's roots kept in keepDir
// (ca.TrustStore). Even so it takes a millisecond, so callers run it beside
// the rest of the sandbox's set-up.
func (e *Egress) JavaTrustStore(w io.Writer, keepDir string) error {
	err := ca.TrustStore(w, plan.TrustStorePassword, keepDir, e.system, e.ca.CertPEM())
	if errors.Is(err, ca.ErrNotKept) {
		e.cfg.Log.Warn("Java trust store: the next sandbox will decode the host's CA bundle again", "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("sandbox trust store: %w", err)
	}
	return nil
}

// Sandbox is what the running sandbox gives its egress.
type Sandbox struct {
	// Listeners are the sockets the init opened inside the sandbox's
	// network namespace; Start takes ownership of their files.
	Listeners *capture.Listeners
	// InitPID and Execs identify the process behind each connection
	// (Execs may be nil where forks and execs cannot be followed).
	InitPID int
	Execs   *procident.ExecWatch
	// Connects, when set, says who connected each socket.
	Connects *procident.ConnectLog
}

// Start serves every listener until ctx ends. Every listener goes through
// one Gate, so identification, decision, SSRF checks and the audit event
// cannot differ between them.
func (e *Egress) Start(ctx context.Context, sb Sandbox) error {
	c, l := e.cfg, sb.Listeners
	pool := dns.NewPool(netclass.SyntheticPrefix)
	dial := e.dial
	// Learn mode is fixed at start (a reload cannot change it).
	learn := c.Policy.Policy.Network.Learn
	g := &gate.Gate{
		Advice:     e.advice,
		Learn:      learn,
		Decider:    e.policy,
		Dialer:     dial,
		Identifier: &procident.Resolver{InitPID: sb.InitPID, Execs: sb.Execs, Connects: sb.Connects},
		Inspector: &inspect.Inspector{
			Policy: e.policy, CA: e.ca, Dialer: dial,
			RootCAs: c.UpstreamRoots, Audit: c.Audit, Log: c.Log, Advice: e.advice,
		},
		Audit: c.Audit,
		Log:   c.Log,
		// One admission for all listeners: the limit is the sandbox's, and
		// descriptors are the supervisor's, whichever listener spends them.
		Admission: gate.NewAdmission(int(c.Limits.Connections), c.Audit, c.Log),
	}
	for name, h := range e.services {
		if g.Services == nil {
			g.Services = map[string]egress.LocalService{}
		}
		g.Services[name] = &localsvc.Service{Name: name, Handler: h, CA: e.ca, Log: c.Log}
	}
	e.gate.Store(g)
	resolver := &dns.Server{Decider: localNames{e.policy, g.Services}, Audit: c.Audit, Log: c.Log, Pool: pool, Learn: learn,
		Self: c.Hostname}
	idle := time.Duration(c.Limits.TunnelIdleMS) * time.Millisecond
	tp := &transparent.Server{Gate: g, Names: pool, Log: c.Log, IdleTimeout: idle}
	hp := &httpproxy.Server{Gate: g, Names: pool, Log: c.Log, IdleTimeout: idle, Advice: e.advice}
	sp := &socks5.Server{Gate: g, Names: pool, Log: c.Log, IdleTimeout: idle, HTTP: hp.ServeConn}

	serve := func(what string, f *os.File, run func(net.Listener) error) error {
		if f == nil {
			return nil
		}
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s listener: %w", what, err)
		}
		go func() {
			if err := run(ln); err != nil && ctx.Err() == nil {
				c.Log.Error("egress listener stopped", "listener", what, "err", err)
			}
		}()
		return nil
	}
	servePacket := func(what string, f *os.File) error {
		if f == nil {
			return nil
		}
		pc, err := net.FilePacketConn(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s listener: %w", what, err)
		}
		go func() {
			if err := resolver.ServeUDP(ctx, pc); err != nil && ctx.Err() == nil {
				c.Log.Error("egress listener stopped", "listener", what, "err", err)
			}
		}()
		return nil
	}
	dnsTCP := func(ln net.Listener) error { return resolver.ServeTCP(ctx, ln) }
	steps := []error{
		servePacket("dns/udp", l.DNSUDP),
		servePacket("dns/udp6", l.DNSUDP6),
		serve("dns/tcp", l.DNSTCP, dnsTCP),
		serve("dns/tcp6", l.DNSTCP6, dnsTCP),
		serve("transparent", l.Transparent4, func(ln net.Listener) error { return tp.Serve(ctx, ln) }),
		serve("transparent6", l.Transparent6, func(ln net.Listener) error { return tp.Serve(ctx, ln) }),
		serve("http proxy", l.HTTPProxy, func(ln net.Listener) error { return hp.Serve(ctx, ln) }),
		serve("socks5", l.SOCKS, func(ln net.Listener) error { return sp.Serve(ctx, ln) }),
	}
	for _, err := range steps {
		if err != nil {
			return err
		}
	}
	return nil
}

// localNames answers the services' names in DNS as well as the names the
// policy allows.
type localNames struct {
	*reload.Reloader
	services map[string]egress.LocalService
}

func (l localNames) NameAllowed(host string) bool {
	_, ok := l.services[strings.ToLower(strings.TrimSuffix(host, "."))]
	return ok || l.Reloader.NameAllowed(host)
}
