// Package gate is the egress machinery every listener shares: the Gate
// that turns a connection attempt into a decision, an upstream connection
// and exactly one audit event, and carries the tunnel afterwards; the accept
// loop with its admission limits; and the replay of bytes read ahead. The
// types it speaks (requests, decisions, reasons) are package egress's.
package gate

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/relay"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
)

// Gate is the single path from a connection attempt to an upstream
// connection: identify the caller, decide, check what the client's first
// bytes claim, dial through the guarded dialer, and record one event. A
// listener that calls Gate.Connect cannot forget a step.
type Gate struct {
	Decider    egress.Decider
	Dialer     egress.Dialer
	Identifier egress.Identifier
	// Inspector serves connections whose decision asks for per-request
	// inspection. Without one such connections are refused: relaying them
	// as bytes would silently drop the policy's HTTP rules.
	Inspector egress.Inspector
	Audit     *audit.Logger
	Log       *slog.Logger
	// Admission bounds the connections the gate's listeners hold at once;
	// nil bounds nothing.
	Admission *Admission

	// open are the tunnels being carried, which Revoke re-decides.
	openMu sync.Mutex
	open   map[*openTunnel]struct{}
	// reloads counts Revoke calls (one per reload).
	reloads atomic.Uint64
}

// openTunnel is a carried tunnel and how to end it.
type openTunnel struct {
	r     egress.Request
	close func()
}

// Connect authorises r for the client connection and returns the upstream
// connection. A refusal is a *DenyError; the event is already recorded.
func (g *Gate) Connect(ctx context.Context, client net.Conn, r egress.Request) (*egress.Tunnel, error) {
	start := time.Now()
	// Read before deciding: a reload that lands during the decision
	// makes the tunnel be decided again before it carries anything.
	gen := g.reloads.Load()
	d := g.decide(ctx, client, &r)
	if d.Allow && d.Inspect && g.Inspector == nil {
		d = egress.Decision{Policy: d.Policy, Reason: egress.ReasonEngine, Detail: "the endpoint asks for HTTP inspection, which is not available here"}
	}
	latency := time.Since(start)
	if !d.Allow {
		g.report(r, d, latency)
		return nil, &egress.DenyError{Request: r, Decision: d}
	}
	up, err := g.Dialer.Dial(ctx, r, d.AllowedIPs)
	if err != nil {
		policy := d.Policy
		if de, ok := egress.AsDeny(err); ok {
			d = de.Decision
		} else {
			d = egress.Decision{Reason: egress.UpstreamReason(err, egress.ReasonUpstream), Detail: err.Error()}
		}
		// The policy that allowed it, for the event and the reply.
		d.Policy = cmp.Or(d.Policy, policy)
		g.report(r, d, latency)
		return nil, &egress.DenyError{Request: r, Decision: d}
	}
	g.report(r, d, latency)
	return &egress.Tunnel{Up: up, Request: r, Decision: d, Generation: gen}, nil
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
func (g *Gate) Carry(ctx context.Context, client net.Conn, t *egress.Tunnel, ahead []byte, idle time.Duration) {
	ot, untrack := g.track(t, client)
	defer untrack()
	// A reload between the decision and here found nothing to revoke:
	// Revoke counts the reload before it looks at the open tunnels, and
	// this tunnel is open from now on, so one of the two decides it again.
	if g.reloads.Load() != t.Generation && g.revoke(ctx, ot) {
		return
	}
	recheck := g.Recheck(ctx, client, t.Request)
	check := func(kind, name string, err error) error {
		derr := recheck(kind, name, err)
		if l, ok := client.(interface{ SetLinger(int) error }); ok && derr != nil {
			l.SetLinger(0) // the relay closes client after this error
		}
		return derr
	}
	if t.Decision.Inspect {
		raw := g.Inspector.Inspect(ctx, Replay(client, ahead), t, check)
		if raw == nil {
			return
		}
		// What the inspector read of it is in raw already.
		client, ahead = raw, nil
	}
	if _, _, err := relay.Relay(Guarded(client, ahead, t.Request, check), t.Up, idle); err != nil && g.Log != nil {
		g.Log.Debug("tunnel ended", "via", t.Request.Via, "target", t.Request.Target(), "err", err)
	}
}

// track records t as open until untrack is called.
func (g *Gate) track(t *egress.Tunnel, client net.Conn) (ot *openTunnel, untrack func()) {
	ot = &openTunnel{r: t.Request, close: func() {
		client.Close()
		t.Up.Close()
	}}
	g.openMu.Lock()
	if g.open == nil {
		g.open = map[*openTunnel]struct{}{}
	}
	g.open[ot] = struct{}{}
	g.openMu.Unlock()
	return ot, func() {
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
	g.reloads.Add(1)
	g.openMu.Lock()
	open := make([]*openTunnel, 0, len(g.open))
	for ot := range g.open {
		open = append(open, ot)
	}
	g.openMu.Unlock()
	closed := 0
	for _, ot := range open {
		if g.revoke(ctx, ot) {
			closed++
		}
	}
	return closed
}

// revoke decides ot again and closes it if the policy in force denies it.
func (g *Gate) revoke(ctx context.Context, ot *openTunnel) bool {
	if g.Decider == nil {
		return false
	}
	d := g.Decider.Decide(ctx, ot.r)
	if d.Allow {
		return false
	}
	ot.close()
	if g.Audit != nil {
		g.Audit.Log(connectEvent(audit.OutcomeRevoked, ot.r, d, 0))
	}
	if g.Log != nil {
		g.Log.Warn("open connection closed: the reloaded policy denies it", "target", ot.r.Target(), "binary", ot.r.Identity.Binary, "reason", d.Reason)
	}
	return true
}

// Guarded returns client replaying ahead and, when the connection was
// allowed for a named host, with its opening (TLS SNI, HTTP Host) and each
// later plain HTTP request held back until check approves the name it
// announces. A literal-address connection names no host a claim could
// contradict.
func Guarded(client net.Conn, ahead []byte, r egress.Request, check func(kind, name string, err error) error) net.Conn {
	if r.Host == "" {
		return Replay(client, ahead)
	}
	return sniff.Guard(client, append([]byte(nil), ahead...), sniff.DefaultMax, sniff.DefaultTimeout, check)
}

func (g *Gate) decide(ctx context.Context, client net.Conn, r *egress.Request) egress.Decision {
	if g.Identifier != nil {
		id, err := g.Identifier.Identify(client)
		if err != nil {
			return identityRefusal(err)
		}
		r.Identity = id
	}
	if r.Host != "" && r.Sniffed != "" && !strings.EqualFold(strings.TrimSuffix(r.Sniffed, "."), r.Host) {
		reason := egress.ReasonHostMismatch
		if r.SniffedKind == "tls_sni" {
			reason = egress.ReasonSNIMismatch
		}
		return egress.Decision{Reason: reason, Detail: r.SniffedKind + " " + r.Sniffed + " does not match " + r.Host}
	}
	if g.Decider == nil {
		return egress.Decision{Reason: egress.ReasonEngine, Detail: "no decision engine"}
	}
	return g.Decider.Decide(ctx, *r)
}

// identityRefusal is the decision on a connection whose client could not
// be identified. The identifier reports what it found; what that means for
// the connection is decided here.
func identityRefusal(err error) egress.Decision {
	var ie *egress.IntegrityError
	switch {
	case errors.As(err, &ie):
		// The file's own account, without the identifier's context: it
		// names the path and both hashes, which is what a reader acts on.
		return egress.Decision{Reason: egress.ReasonIntegrity, Detail: ie.Error()}
	case errors.Is(err, egress.ErrProcessExited) || errors.Is(err, syscall.ESRCH):
		// An ESRCH from a pidfd means the process it names has exited.
		return egress.Decision{Reason: egress.ReasonIdentityExited, Detail: err.Error()}
	}
	return egress.Decision{Reason: egress.ReasonIdentity, Detail: err.Error()}
}

// Recheck returns a check for sniff.Guard on a tunnel the gate already
// allowed by name before the client spoke (CONNECT, SOCKS5, a slow
// transparent client): a TLS or HTTP opening that names another host is
// refused, because the dial went to the named host's address and a shared
// front end would route by the inner name. The gate is asked again with
// the claim, so the refusal is decided and recorded like any other (the
// mismatch is rejected before dialling).
func (g *Gate) Recheck(ctx context.Context, client net.Conn, r egress.Request) func(kind, name string, err error) error {
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
func (g *Gate) report(r egress.Request, d egress.Decision, latency time.Duration) {
	outcome, msg := audit.OutcomeDenied, "network connection denied"
	switch {
	case d.Allow:
		outcome = audit.OutcomeAllowed
	case egress.UpstreamFailure(d.Reason):
		outcome, msg = audit.OutcomeFailed, "network connection allowed but its destination could not be reached"
	}
	if g.Audit != nil {
		g.Audit.Log(connectEvent(outcome, r, d, latency))
	}
	if g.Log != nil && !d.Allow {
		g.Log.Warn(msg, "target", r.Target(), "binary", r.Identity.Binary, "reason", d.Reason, "detail", d.Detail)
	}
}

// connectEvent is the audit record of one connection's outcome.
func connectEvent(outcome string, r egress.Request, d egress.Decision, latency time.Duration) audit.NetConnectEvent {
	ev := audit.NetConnectEvent{
		Outcome: outcome, Via: r.Via, Source: r.Source.String(), Host: r.Host, Port: r.Port,
		Binary: r.Identity.Binary, PID: r.Identity.PID, Ancestors: r.Identity.Ancestors,
		CmdlinePaths: r.Identity.CmdlinePaths, Untrusted: r.Identity.Untrusted,
		Policy: d.Policy, DecisionUS: latency.Microseconds(),
	}
	if r.Host == "" {
		ev.IP = r.IP.String()
	}
	if !d.Allow {
		ev.Reason, ev.Detail = d.Reason, d.Detail
	}
	return ev
}
