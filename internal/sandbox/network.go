package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/dialer"
	"github.com/corral-sandbox/corral/internal/egress/dns"
	"github.com/corral-sandbox/corral/internal/egress/httpproxy"
	"github.com/corral-sandbox/corral/internal/egress/socks5"
	"github.com/corral-sandbox/corral/internal/egress/transparent"
	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/procident"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
)

// SyntheticPrefix is where the sandbox's DNS server takes the addresses it
// answers for allowed names; a connection to one names its host exactly.
var SyntheticPrefix = netip.MustParsePrefix("198.18.0.0/16")

// Egress configures proxy mode.
type Egress struct {
	// Engine decides every connection and is swapped on policy reloads.
	Engine interface {
		egress.Decider
		Reloadable
	}
	// UpstreamDNS is "HOST:PORT" of the resolver for allowed names; empty
	// means the host's resolver.
	UpstreamDNS string
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
	pool := dns.NewPool(SyntheticPrefix)
	gate := &egress.Gate{
		Decider:    s.Egress.Engine,
		Dialer:     dialer.New(s.Egress.UpstreamDNS),
		Identifier: &procident.Resolver{InitPID: s.cmd.Process.Pid},
		Audit:      s.Audit,
		Log:        s.Log,
	}
	resolver := &dns.Server{Decider: s.Egress.Engine, Audit: s.Audit, Log: s.Log, Pool: pool}
	tp := &transparent.Server{Gate: gate, Names: pool, Log: s.Log}
	hp := &httpproxy.Server{Gate: gate, Names: pool, Log: s.Log}
	sp := &socks5.Server{Gate: gate, Names: pool, Log: s.Log}

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
