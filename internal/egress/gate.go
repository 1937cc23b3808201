package egress

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress/relay"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
)

// Gate is the single path from a connection attempt to an upstream
// connection: identify the caller, decide, check what the client's first
// bytes claim, dial through the guarded dialer, and record one event. A
// listener that calls Gate.Connect cannot forget a step.
type Gate struct {
	Decider    Decider
	Dialer     Dialer
	Identifier Identifier
	// Inspector serves connections whose decision asks for per-request
	// inspection. Without one such connections are refused: relaying them
	// as bytes would silently drop the policy's HTTP rules.
	Inspector Inspector
	Audit     *audit.Logger
	Log       *slog.Logger
	// Admission bounds the connections the gate's listeners hold at once;
	// nil bounds nothing.
	Admission *Admission

	// open are the tunnels being carried, which Revoke re-decides.
	openMu sync.Mutex
	open   map[*openTunnel]struct{}
}

// openTunnel is a carried tunnel and how to end it.
type openTunnel struct {
	r     Request
	close func()
}

// Tunnel is an allowed connection.
type Tunnel struct {
	Up net.Conn
	// Request is the caller's request with the client's identity filled in.
	Request  Request
	Decision Decision
}

// Inspector takes over an allowed connection whose decision sets Inspect
// and returns when it ends, having closed both ends. check is the gate's
// Recheck for traffic it relays without terminating (TLS passthrough).
type Inspector interface {
	Inspect(ctx context.Context, client net.Conn, t *Tunnel, check func(kind, name string, err error) error)
}

// Connect authorises r for the client connection and returns the upstream
// connection. A refusal is a *DenyError; the event is already recorded.
func (g *Gate) Connect(ctx context.Context, client net.Conn, r Request) (*Tunnel, error) {
	start := time.Now()
	d := g.decide(ctx, client, &r)
	if d.Allow && d.Inspect && g.Inspector == nil {
		d = Decision{Policy: d.Policy, Reason: ReasonEngine, Detail: "the endpoint asks for HTTP inspection, which is not available here"}
	}
	latency := time.Since(start)
	if !d.Allow {
		g.report(r, d, latency)
		return nil, &DenyError{Request: r, Decision: d}
	}
	up, err := g.Dialer.Dial(ctx, r, d.AllowedIPs)
	if err != nil {
		policy := d.Policy
		if de, ok := AsDeny(err); ok {
			d = de.Decision
		} else {
			d = Decision{Reason: UpstreamReason(err, ReasonUpstream), Detail: err.Error()}
		}
		// The policy that allowed it, for the event and the reply.
		d.Policy = cmp.Or(d.Policy, policy)
		g.report(r, d, latency)
		return nil, &DenyError{Request: r, Decision: d}
	}
	g.report(r, d, latency)
	return &Tunnel{Up: up, Request: r, Decision: d}, nil
}

// Carry moves an allowed tunnel's traffic until it ends and closes both
// ends; every listener hands its tunnels here, so none can relay without
// the checks. ahead holds bytes the listener already read from client (a
// peeked opening, a request head). A tunnel whose decision asks for
// inspection goes to the inspector. Any other is relayed as bytes, with
// the client's opening, and every later request of a plain HTTP
// connection, checked against the host it was allowed for (Guarded). A
// refusal resets the client: an RST is the only reason a raw TCP client
// can be shown.
func (g *Gate) Carry(ctx context.Context, client net.Conn, t *Tunnel, ahead []byte, idle time.Duration) {
	defer g.track(t, client)()
	recheck := g.Recheck(ctx, client, t.Request)
	check := func(kind, name string, err error) error {
		derr := recheck(kind, name, err)
		if l, ok := client.(interface{ SetLinger(int) error }); ok && derr != nil {
			l.SetLinger(0) // the relay closes client after this error
		}
		return derr
	}
	if t.Decision.Inspect {
		g.Inspector.Inspect(ctx, Replay(client, ahead), t, check)
		return
	}
	if _, _, err := relay.Relay(Guarded(client, ahead, t.Request, check), t.Up, idle); err != nil && g.Log != nil {
		g.Log.Debug("tunnel ended", "via", t.Request.Via, "target", t.Request.Target(), "err", err)
	}
}

// track records t as open until the returned func is called.
func (g *Gate) track(t *Tunnel, client net.Conn) (untrack func()) {
	ot := &openTunnel{r: t.Request, close: func() {
		client.Close()
		t.Up.Close()
	}}
	g.openMu.Lock()
	if g.open == nil {
		g.open = map[*openTunnel]struct{}{}
	}
	g.open[ot] = struct{}{}
	g.openMu.Unlock()
	return func() {
		g.openMu.Lock()
		delete(g.open, ot)
		g.openMu.Unlock()
	}
}

// Revoke decides every open tunnel again, as if it were opened now, and
// closes those the policy in force denies, each with a net.connect.revoked
// event. A reload calls it after the new policy is in force: relayed bytes
// (uninspected TLS, a WebSocket after its 101, any other TCP stream) carry
// no requests that could be re-decided one by one. It returns how many it
// closed.
func (g *Gate) Revoke(ctx context.Context) int {
	g.openMu.Lock()
	open := make([]*openTunnel, 0, len(g.open))
	for ot := range g.open {
		open = append(open, ot)
	}
	g.openMu.Unlock()
	closed := 0
	for _, ot := range open {
		if g.Decider == nil {
			break
		}
		d := g.Decider.Decide(ctx, ot.r)
		if d.Allow {
			continue
		}
		ot.close()
		closed++
		if g.Audit != nil {
			kv := []any{"via", ot.r.Via, "source", ot.r.Source.String(), "host", ot.r.Host, "port", ot.r.Port,
				"binary", ot.r.Identity.Binary, "pid", ot.r.Identity.PID, "policy", d.Policy, "reason", d.Reason, "detail", d.Detail}
			if ot.r.Host == "" {
				kv = append(kv, "ip", ot.r.IP.String())
			}
			g.Audit.Emit(audit.NetConnectRevoked, kv...)
		}
		if g.Log != nil {
			g.Log.Warn("open connection closed: the reloaded policy denies it", "target", ot.r.Target(), "binary", ot.r.Identity.Binary, "reason", d.Reason)
		}
	}
	return closed
}

// Guarded returns client replaying ahead and, when the connection was
// allowed for a named host, with its opening (TLS SNI, HTTP Host) and each
// later plain HTTP request held back until check approves the name it
// announces. A literal-address connection names no host a claim could
// contradict.
func Guarded(client net.Conn, ahead []byte, r Request, check func(kind, name string, err error) error) net.Conn {
	if r.Host == "" {
		return Replay(client, ahead)
	}
	return sniff.Guard(client, append([]byte(nil), ahead...), sniff.DefaultMax, sniff.DefaultTimeout, check)
}

func (g *Gate) decide(ctx context.Context, client net.Conn, r *Request) Decision {
	if g.Identifier != nil {
		id, err := g.Identifier.Identify(client)
		if err != nil {
			if de, ok := AsDeny(err); ok {
				return de.Decision
			}
			return Decision{Reason: identityReason(err), Detail: err.Error()}
		}
		r.Identity = id
	}
	if r.Host != "" && r.Sniffed != "" && !strings.EqualFold(strings.TrimSuffix(r.Sniffed, "."), r.Host) {
		reason := ReasonHostMismatch
		if r.SniffedKind == "tls_sni" {
			reason = ReasonSNIMismatch
		}
		return Decision{Reason: reason, Detail: r.SniffedKind + " " + r.Sniffed + " does not match " + r.Host}
	}
	if g.Decider == nil {
		return Decision{Reason: ReasonEngine, Detail: "no decision engine"}
	}
	return g.Decider.Decide(ctx, *r)
}

// Recheck returns a check for sniff.Guard on a tunnel the gate already
// allowed by name before the client spoke (CONNECT, SOCKS5, a slow
// transparent client): a TLS or HTTP opening that names another host is
// refused, because the dial went to the named host's address and a shared
// front end would route by the inner name. The gate is asked again with
// the claim, so the refusal is decided and recorded like any other (the
// mismatch is rejected before dialling).
func (g *Gate) Recheck(ctx context.Context, client net.Conn, r Request) func(kind, name string, err error) error {
	return func(kind, name string, err error) error {
		claim := sniff.Claim(kind, name, err)
		if claim == "" || sniff.SameHost(claim, r.Host) {
			return nil
		}
		r.Sniffed, r.SniffedKind = claim, kind
		t, derr := g.Connect(ctx, client, r)
		if derr == nil {
			t.Up.Close()
			derr = errors.New(r.Via + ": " + kind + " " + claim + " does not match " + r.Host)
		}
		return derr
	}
}

// report writes the one structured event of a connection.
func (g *Gate) report(r Request, d Decision, latency time.Duration) {
	event, msg := audit.NetConnectDenied, "network connection denied"
	switch {
	case d.Allow:
		event = audit.NetConnectAllowed
	case UpstreamFailure(d.Reason):
		event, msg = audit.NetConnectFailed, "network connection allowed but its destination could not be reached"
	}
	kv := []any{
		"via", r.Via, "source", r.Source.String(), "host", r.Host, "port", r.Port,
		"binary", r.Identity.Binary, "pid", r.Identity.PID, "ancestors", r.Identity.Ancestors,
		"cmdline_paths", r.Identity.CmdlinePaths, "policy", d.Policy, "decision_us", latency.Microseconds(),
	}
	if r.Host == "" {
		kv = append(kv, "ip", r.IP.String())
	}
	if r.Identity.Untrusted != "" {
		kv = append(kv, "untrusted", r.Identity.Untrusted)
	}
	if !d.Allow {
		kv = append(kv, "reason", d.Reason, "detail", d.Detail)
	}
	if g.Audit != nil {
		g.Audit.Emit(event, kv...)
	}
	if g.Log != nil && !d.Allow {
		g.Log.Warn(msg, "target", r.Target(), "binary", r.Identity.Binary, "reason", d.Reason, "detail", d.Detail)
	}
}
