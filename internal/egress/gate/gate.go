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
	"io"
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
	// Advice, when set, names the pending policy chunk in denial events.
	Advice egress.Advice
	// Learn lets through connections refused only for want of a policy
	// (network.learn), recorded with decision "learn"; the dialer still
	// refuses internal addresses.
	Learn bool
	// Services are the names the supervisor answers itself, by
	// lower-case name, on ports 80 and 443; no policy decides them.
	Services map[string]egress.LocalService

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
	// local tunnels reach a service of the supervisor's, which no policy
	// decides and so no reload revokes.
	local bool
}

// Connect authorises r for the client connection and returns the upstream
// connection. A refusal is a *DenyError; the event is already recorded.
func (g *Gate) Connect(ctx context.Context, client net.Conn, r egress.Request) (*egress.Tunnel, error) {
	start := time.Now()
	// Read before deciding: a reload that lands during the decision
	// makes the tunnel be decided again before it carries anything.
	gen := g.reloads.Load()
	if svc, ok := g.Services[strings.ToLower(strings.TrimSuffix(r.Host, "."))]; ok && r.Host != "" {
		return g.connectLocal(client, r, svc, gen, start)
	}
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

// connectLocal admits a connection to one of the supervisor's services:
// the caller is identified, for the audit event and the service, and its
// opening checked against the name as for any host; no policy decides.
func (g *Gate) connectLocal(client net.Conn, r egress.Request, svc egress.LocalService, gen uint64, start time.Time) (*egress.Tunnel, error) {
	d := g.admit(client, &r)
	if d.Reason == "" && r.Port != 80 && r.Port != 443 {
		d = egress.Decision{Reason: egress.ReasonNoPolicy, Detail: r.Host + " answers on ports 80 and 443 only"}
	}
	if d.Reason == "" {
		d = egress.Decision{Allow: true, Policy: r.Host}
	}
	g.report(r, d, time.Since(start))
	if !d.Allow {
		return nil, &egress.DenyError{Request: r, Decision: d}
	}
	return &egress.Tunnel{Request: r, Decision: d, Generation: gen, Local: svc}, nil
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
	if t.Local != nil {
		t.Local.ServeConn(ctx, Replay(client, ahead), t.Request)
		return
	}
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
	// A tunnel with nothing left to check is handed to the relay bare,
	// opening sent first, so the kernel can move its bytes (splice)
	// instead of the relay copying them through user space.
	in := client
	bare, err := settled(t, ahead, check)
	if err == nil && !bare && len(ahead) == 0 && !t.Decision.Inspect {
		// Nothing was read ahead (a CONNECT client waits for the 200):
		// an opening the client sends before the server speaks may
		// settle the tunnel just the same.
		bare, err = settledOpening(t, client, idle, check)
	}
	if err == nil && bare {
		err = sendAhead(t.Up, ahead, idle)
	}
	if err != nil {
		client.Close()
		t.Up.Close()
		g.ended(t.Request, err)
		return
	}
	if !bare {
		in = Guarded(client, ahead, t.Request, check)
	}
	_, _, err = relay.Relay(in, t.Up, idle)
	g.ended(t.Request, err)
}

func (g *Gate) ended(r egress.Request, err error) {
	if err != nil && g.Log != nil {
		g.Log.Debug("tunnel ended", "via", r.Via, "target", r.Target(), "err", err)
	}
}

// settled reports whether Guarded would pass the client's bytes through
// untouched from here on: the tunnel is not inspected, and its destination
// is a literal address or ahead holds a complete opening that is not HTTP
// (whose later requests would be checked) and check approves it, as
// Guarded's first read would have. A refusal is check's error.
func settled(t *egress.Tunnel, ahead []byte, check func(kind, name string, err error) error) (bool, error) {
	switch {
	case t.Decision.Inspect:
		// What the inspector hands back is checked from its first byte.
		return false, nil
	case t.Request.Host == "":
		return true, nil
	}
	if len(ahead) == 0 {
		// The opening is still to come, or never will if the server
		// speaks first (see settledOpening).
		return false, nil
	}
	kind, name, complete, err := sniff.Classify(ahead)
	if (!complete && err == nil) || (err != nil && !errors.Is(err, sniff.ErrMalformed)) || kind == sniff.KindHTTP {
		return false, nil
	}
	if err := check(kind, name, err); err != nil {
		return false, err
	}
	return true, nil
}

// settledOpening waits for the first end of the tunnel to speak and, if
// the client's opening comes first and settles the tunnel, reads it and
// sends it upstream. Otherwise nothing has been read and the guard reads
// the opening as it always does.
func settledOpening(t *egress.Tunnel, client net.Conn, idle time.Duration, check func(kind, name string, err error) error) (bool, error) {
	c, cok := client.(*net.TCPConn)
	u, uok := t.Up.(*net.TCPConn)
	if !cok || !uok {
		return false, nil
	}
	classified := func(b []byte) bool {
		_, _, complete, err := sniff.Classify(b)
		return complete || err != nil
	}
	opening, err := relay.Opening(c, u, idle, sniff.DefaultTimeout, sniff.DefaultMax, classified)
	if err != nil || opening == nil {
		return false, err
	}
	bare, err := settled(t, opening, check)
	if err != nil || !bare {
		return false, err
	}
	// The client's first bytes are still queued; these are they.
	if _, err := io.ReadFull(c, opening); err != nil {
		return false, err
	}
	return true, sendAhead(u, opening, idle)
}

// sendAhead writes the bytes the listener read ahead to up, within the
// idle timeout the relay would have given them.
func sendAhead(up net.Conn, ahead []byte, idle time.Duration) error {
	if len(ahead) == 0 {
		return nil
	}
	if idle > 0 {
		up.SetWriteDeadline(time.Now().Add(idle))
		defer up.SetWriteDeadline(time.Time{})
	}
	_, err := up.Write(ahead)
	return err
}

// track records t as open until untrack is called.
func (g *Gate) track(t *egress.Tunnel, client net.Conn) (ot *openTunnel, untrack func()) {
	ot = &openTunnel{r: t.Request, local: t.Local != nil, close: func() {
		client.Close()
		if t.Up != nil {
			t.Up.Close()
		}
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
	if g.Decider == nil || ot.local {
		return false
	}
	d := g.learn(g.Decider.Decide(ctx, ot.r))
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
	if d := g.admit(client, r); d.Reason != "" {
		return d
	}
	if g.Decider == nil {
		return egress.Decision{Reason: egress.ReasonEngine, Detail: "no decision engine"}
	}
	return g.learn(g.Decider.Decide(ctx, *r))
}

// learn turns a refusal for want of a policy into an allowance in learn
// mode.
func (g *Gate) learn(d egress.Decision) egress.Decision {
	if !g.Learn || d.Allow || !egress.Learnable(d.Reason) {
		return d
	}
	return egress.Decision{Allow: true, Policy: audit.DecisionLearn, Reason: audit.DecisionLearn, Detail: "learn mode: no policy allows this"}
}

// admit identifies the caller into r and checks that the name its opening
// announces is the one it asked for; a refusal has a Reason.
func (g *Gate) admit(client net.Conn, r *egress.Request) egress.Decision {
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
	return egress.Decision{}
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
		ev := connectEvent(outcome, r, d, latency)
		if outcome == audit.OutcomeDenied && g.Advice != nil && egress.Learnable(d.Reason) {
			var next []string
			ev.DraftChunk, next = g.Advice.For(r)
			ev.NextSteps = strings.Join(next, "; ")
		}
		g.Audit.Log(ev)
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
	if d.Allow && d.Reason == audit.DecisionLearn {
		ev.Decision = audit.DecisionLearn
	}
	return ev
}
