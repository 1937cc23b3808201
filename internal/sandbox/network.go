package sandbox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/dialer"
	"github.com/corral-sandbox/corral/internal/egress/dns"
	"github.com/corral-sandbox/corral/internal/egress/httpproxy"
	"github.com/corral-sandbox/corral/internal/egress/socks5"
	"github.com/corral-sandbox/corral/internal/egress/transparent"
	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/l7/inspect"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/procident"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// Egress configures proxy mode.
type Egress struct {
	// Engine decides every connection and is swapped on policy reloads.
	Engine interface {
		egress.Decider
		egress.HTTPDecider
		Reloadable
	}
	// UpstreamDNS is "HOST:PORT" of the resolver for allowed names; empty
	// means the host's resolver.
	UpstreamDNS string
	// CA signs the leaves the inspector presents when it terminates TLS.
	CA *ca.CA
	// SystemBundle is what the host trusts (ca.HostTrust), which the
	// sandbox's combined bundle starts with.
	SystemBundle []byte
	// UpstreamRoots returns the roots that verify upstream servers of
	// inspected connections, loading them on first use.
	UpstreamRoots func() *x509.CertPool
	// Secrets are swapped into inspected requests; nil for none. Their
	// scopes reload with the policy.
	Secrets *secrets.Live
}

// egressReload swaps the decision engine and the secrets' scopes together.
// The new scopes are worked out first, so a policy either takes effect
// whole or not at all. Then the open connections are decided again.
type egressReload struct {
	engine  Reloadable
	secrets *secrets.Live
	// gate carries the open connections, once the listeners are up.
	gate atomic.Pointer[egress.Gate]
}

func (r *egressReload) Swap(p *policy.Policy) error {
	scoped, err := r.secrets.Load().Rescope(p.Secrets)
	if err != nil {
		return err
	}
	if err := r.secrets.Reload(func() error { return r.engine.Swap(p) }, scoped); err != nil {
		return err
	}
	if g := r.gate.Load(); g != nil {
		g.Revoke(context.Background())
	}
	return nil
}

// writeCA puts the CA certificate and the combined bundle where the plan
// mounts them inside the sandbox.
func (s *supervisor) writeCA() error {
	dir := statedir.TLS(s.StateDir, s.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create CA directory: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone, and the umask
	// may have narrowed a new one; the workload's user must read it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("CA directory: %w", err)
	}
	bundle := s.Egress.CA.Bundle(s.Egress.SystemBundle)
	store, err := ca.TrustStore(bundle, plan.TrustStorePassword)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"ca.pem":         s.Egress.CA.CertPEM(),
		"ca-bundle.pem":  bundle,
		"truststore.p12": store,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("write sandbox CA: %w", err)
		}
	}
	return nil
}

// startEgress receives the listeners the init created inside the sandbox's
// network namespace and serves them until ctx ends. Every listener goes
// through one Gate, so identification, decision, SSRF checks and the audit
// event cannot differ between them.
func (s *supervisor) startEgress(ctx context.Context, sup *os.File) error {
	m, files, err := initproc.RecvFDs(sup)
	if err != nil {
		return fmt.Errorf("receive network listeners from sandbox init: %w", err)
	}
	if m.Type == initproc.MsgError {
		return &initproc.StepError{Step: m.Step, Code: m.Code, Err: errors.New(m.Error)}
	}
	if m.Type != initproc.MsgNetwork {
		for _, f := range files {
			f.Close()
		}
		return fmt.Errorf("sandbox init sent %q instead of its network listeners", m.Type)
	}
	l, err := capture.FromFiles(files)
	if err != nil {
		return fmt.Errorf("network listeners: %w", err)
	}
	if !l.IPv6 {
		s.Log.Info("IPv6 is not available inside the sandbox", "reason", l.NoIPv6Reason)
	}
	pool := dns.NewPool(netclass.SyntheticPrefix)
	dial := dialer.New(s.Egress.UpstreamDNS)
	gate := &egress.Gate{
		Decider:    s.Egress.Engine,
		Dialer:     dial,
		Identifier: &procident.Resolver{InitPID: s.cmd.Process.Pid, Execs: s.execs},
		Inspector: &inspect.Inspector{
			Decider: s.Egress.Engine, CA: s.Egress.CA, Secrets: s.Egress.Secrets, Dialer: dial,
			RootCAs: s.Egress.UpstreamRoots, Audit: s.Audit, Log: s.Log,
		},
		Audit: s.Audit,
		Log:   s.Log,
		// One admission for all listeners: the limit is the sandbox's, and
		// descriptors are the supervisor's, whichever listener spends them.
		Admission: egress.NewAdmission(int(s.Plan.Limits.Connections), s.Audit, s.Log),
	}
	if s.reload != nil {
		s.reload.gate.Store(gate)
	}
	resolver := &dns.Server{Decider: s.Egress.Engine, Audit: s.Audit, Log: s.Log, Pool: pool}
	idle := time.Duration(s.Plan.Limits.TunnelIdleMS) * time.Millisecond
	tp := &transparent.Server{Gate: gate, Names: pool, Log: s.Log, IdleTimeout: idle}
	hp := &httpproxy.Server{Gate: gate, Names: pool, Log: s.Log, IdleTimeout: idle}
	sp := &socks5.Server{Gate: gate, Names: pool, Log: s.Log, IdleTimeout: idle}

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
				s.Log.Error("egress listener stopped", "listener", what, "err", err)
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
				s.Log.Error("egress listener stopped", "listener", what, "err", err)
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
