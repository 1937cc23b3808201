package gate_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

// inspecting allows everything and asks for HTTP inspection.
type inspecting struct{ egresstest.Decider }

func (inspecting) Decide(context.Context, egress.Request) egress.Decision {
	return egress.Decision{Allow: true, Policy: "p", Inspect: true}
}

// A gate without an inspector must refuse a connection whose endpoint asks
// for inspection: relaying it as bytes would drop the policy's HTTP rules
// without a word.
func TestGateRefusesInspectionItCannotDo(t *testing.T) {
	dialer := &egresstest.Dialer{Addr: "127.0.0.1:9"}
	g := &gate.Gate{Decider: inspecting{}, Dialer: dialer}
	client, _ := net.Pipe()
	defer client.Close()
	_, err := g.Connect(context.Background(), client, egress.Request{Host: "api.example.com", Port: 443})
	de, ok := egress.AsDeny(err)
	if !ok || de.Decision.Reason != egress.ReasonEngine {
		t.Fatalf("Connect: %v, want a decision_error refusal", err)
	}
	if len(dialer.Requests()) != 0 {
		t.Errorf("the gate dialled upstream for a connection it refused")
	}
}

// identifier fails every identification with err.
type identifier struct{ err error }

func (i identifier) Identify(net.Conn) (egress.Identity, error) { return egress.Identity{}, i.err }

// A process running a file that changed since its first use is refused
// with binary_integrity, whatever the policy says, and nothing is dialled.
func TestGateRefusesChangedBinary(t *testing.T) {
	dialer := &egresstest.Dialer{Addr: "127.0.0.1:9"}
	changed := &egress.IntegrityError{Path: "/usr/bin/curl",
		Want: "0123456789abcdef0123456789abcdef", Got: "fedcba9876543210fedcba9876543210"}
	g := &gate.Gate{
		Decider:    egresstest.Decider{"api.example.com": true},
		Dialer:     dialer,
		Identifier: identifier{fmt.Errorf("procident: client 10.0.0.2:4000: %w", changed)},
	}
	client, _ := net.Pipe()
	defer client.Close()
	_, err := g.Connect(context.Background(), client, egress.Request{Host: "api.example.com", Port: 443})
	de, ok := egress.AsDeny(err)
	if !ok || de.Decision.Reason != egress.ReasonIntegrity {
		t.Fatalf("Connect: %v, want a binary_integrity refusal", err)
	}
	want := "/usr/bin/curl changed since first use in this sandbox (sha256 0123456789abcdef, now fedcba9876543210)"
	if de.Decision.Detail != want {
		t.Errorf("detail %q, want %q", de.Decision.Detail, want)
	}
	if len(dialer.Requests()) != 0 {
		t.Errorf("the gate dialled upstream for a connection it refused")
	}
}

// switchable allows a.test until deny is set.
type switchable struct {
	egresstest.Decider
	deny atomic.Bool
}

func (s *switchable) Decide(_ context.Context, r egress.Request) egress.Decision {
	if s.deny.Load() {
		return egress.Decision{Reason: egress.ReasonNoPolicy, Detail: "gone"}
	}
	return egress.Decision{Allow: true, Policy: "p"}
}

// A reload that lands between a tunnel's decision and its carrying finds
// nothing open to revoke; the tunnel must still be decided again before
// any byte moves.
func TestReloadBeforeCarryIsNotMissed(t *testing.T) {
	dec := &switchable{}
	up := egresstest.Upstream(t, egresstest.EchoAtEOF)
	g := &gate.Gate{Decider: dec, Dialer: &egresstest.Dialer{Addr: up}}
	client, proxySide := net.Pipe()
	defer client.Close()
	tun, err := g.Connect(context.Background(), proxySide, egress.Request{Host: "a.test", Port: 7000})
	if err != nil {
		t.Fatal(err)
	}
	dec.deny.Store(true)
	if n := g.Revoke(context.Background()); n != 0 {
		t.Fatalf("revoked %d tunnels before any was carried", n)
	}
	done := make(chan struct{})
	go func() {
		g.Carry(context.Background(), proxySide, tun, nil, time.Minute)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a tunnel the reloaded policy denies is being carried")
	}
	if _, err := client.Write([]byte("x")); err == nil {
		t.Error("the client end of a revoked tunnel is still open")
	}
}

// handsBack is an inspector that exempts every connection, as one does for
// TLS to a passthrough endpoint.
type handsBack struct{}

func (handsBack) Inspect(_ context.Context, client net.Conn, _ *egress.Tunnel, _ func(string, string, error) error) net.Conn {
	return client
}

// A connection the inspector hands back is relayed by the gate, idle
// timeout included, like any other tunnel.
func TestPassthroughKeepsIdleTimeout(t *testing.T) {
	up := egresstest.Upstream(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	g := &gate.Gate{Decider: inspecting{}, Dialer: &egresstest.Dialer{Addr: up}, Inspector: handsBack{}}
	client, proxySide := net.Pipe()
	defer client.Close()
	tun, err := g.Connect(context.Background(), proxySide, egress.Request{IP: netip.MustParseAddr("203.0.113.7"), Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		g.Carry(context.Background(), proxySide, tun, nil, 200*time.Millisecond)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an idle passthrough tunnel outlived its idle timeout")
	}
}
