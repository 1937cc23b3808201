package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
	"github.com/corral-sandbox/corral/internal/l7/reqpath"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
)

// handler decides and forwards the requests of one connection.
type handler struct {
	in     *Inspector
	t      *egress.Tunnel
	scheme string
	up     *upstream
	proxy  *httputil.ReverseProxy
	// active counts requests in flight, upgraded ones included.
	active tracker
}

// secretsFor is the masked secrets' Set a request was decided with, which
// its rewrite and scrubbing use whatever reload happens meanwhile; outside
// a request, the Set in force.
func (h *handler) secretsFor(ctx context.Context) *secrets.Set {
	if ex, ok := ctx.Value(exchangeKey{}).(*exchange); ok {
		return ex.secrets
	}
	return h.in.Policy.Current().Secrets
}

// exchange is what one request carries from the decision to the rewrite
// and the event.
type exchange struct {
	path    reqpath.Path
	secrets *secrets.Set
	masked  int
	// status is the upstream's final status (101 for an upgrade).
	status int
}

type exchangeKey struct{}

// Decisions as events name them.
const (
	decisionAllow = "allow"
	decisionDeny  = "deny"
	decisionAudit = "audit"
)

func (h *handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if !h.active.enter() {
		// The connection is being torn down; never let silence read as
		// an empty 200.
		http.Error(w, "connection closing", http.StatusServiceUnavailable)
		return
	}
	defer h.active.leave()
	start := time.Now()
	rw := &countingWriter{ResponseWriter: w}
	body := &countingBody{ReadCloser: req.Body}
	req.Body = body

	var (
		hr egress.HTTPRequest
		d  egress.HTTPDecision
		ex = &exchange{}
	)
	// One snapshot per request: it is decided, and has its secrets swapped
	// and scrubbed, under one policy version whatever reloads meanwhile.
	snap := h.in.Policy.Current()
	ex.secrets = snap.Secrets
	hr, ex.path, d = h.decide(req, snap.Decider)
	outcome := decisionAllow
	switch {
	case !d.Allow && !d.Audit:
		outcome = decisionDeny
		h.deny(rw, req, hr, d, ex.secrets)
	default:
		if !d.Allow {
			outcome = decisionAudit
		}
		h.proxy.ServeHTTP(rw, req.WithContext(context.WithValue(req.Context(), exchangeKey{}, ex)))
	}
	if ex.status == 0 {
		ex.status = rw.status()
	}
	h.report(req, hr, d, outcome, ex.status, rw, body.n.Load(), ex, time.Since(start))
}

// decide checks the request against the connection's host, normalises
// its path and query, and asks the engine. A request whose path or query
// cannot be read unambiguously is refused whatever the enforcement mode:
// there is no path it could be forwarded with that means what was
// decided.
func (h *handler) decide(req *http.Request, decider egress.HTTPDecider) (egress.HTTPRequest, reqpath.Path, egress.HTTPDecision) {
	r := h.t.Request
	raw := req.URL.EscapedPath()
	hr := egress.HTTPRequest{Method: strings.ToUpper(req.Method), Path: raw}
	// After a 101 the connection is relayed as bytes; only WebSocket is a
	// protocol whose use the rule on the upgrade request stands for (an
	// h2c or custom upgrade would carry requests no rule ever sees).
	if up := req.Header.Get("Upgrade"); up != "" && !strings.EqualFold(up, "websocket") {
		return hr, reqpath.Path{}, egress.HTTPDecision{Reason: egress.ReasonL7Upgrade,
			Detail: fmt.Sprintf("upgrade to %q is not relayed; only WebSocket upgrades are", up)}
	}
	if r.Host != "" {
		if host := hostOnly(req.Host); host != "" && !sniff.SameHost(host, r.Host) {
			return hr, reqpath.Path{}, egress.HTTPDecision{Reason: egress.ReasonHostMismatch,
				Detail: fmt.Sprintf("the request names host %s on a connection to %s", host, r.Host)}
		}
	}
	p, err := reqpath.Normalize(raw, h.t.Decision.AllowEncodedSlash)
	if err != nil {
		d := egress.HTTPDecision{Reason: egress.ReasonL7BadPath, Detail: err.Error(), Policy: h.t.Decision.Policy}
		if errors.Is(err, reqpath.ErrEncodedSlash) {
			d.Rule = h.t.Decision.PathRule
		}
		return hr, p, d
	}
	hr.Path = p.Match
	if hr.Query, err = reqpath.Query(req.URL.RawQuery); err != nil {
		return hr, p, egress.HTTPDecision{Reason: egress.ReasonL7BadQuery, Detail: err.Error()}
	}
	if decider == nil {
		return hr, p, egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: "the sandbox has no egress policy"}
	}
	// The request must be allowed under every reading an upstream may act
	// on, not only as sent: servers that drop ";params" route it as the
	// shorter path, and servers that honour a method override perform that
	// method. The reading that does worst decides: an enforced denial, or
	// else an audited one.
	d := decider.DecideHTTP(req.Context(), r, hr)
	decided := hr
	also := func(alt egress.HTTPRequest, why string) {
		if !d.Allow && !d.Audit {
			return
		}
		if ad := decider.DecideHTTP(req.Context(), r, alt); !ad.Allow && (!ad.Audit || d.Allow) {
			if why != "" {
				ad.Detail = why + ": " + ad.Detail
			}
			d, decided = ad, alt
		}
	}
	short := hr
	short.Path = p.Unparameterised
	if short.Path != hr.Path {
		also(short, "")
	}
	for _, o := range methodOverrides(req, hr) {
		why := fmt.Sprintf("%s names method %s, which servers that honour it perform instead of %s", o.from, o.method, hr.Method)
		alt := hr
		alt.Method = o.method
		also(alt, why)
		if short.Path != hr.Path {
			alt.Path = short.Path
			also(alt, why)
		}
	}
	return decided, p, d
}

// overrideHeaders are the headers through which servers let a request
// stand for another method (Express's method-override, Rails, Symfony,
// Google's APIs), in canonical form so that finding none is three map
// lookups. The _method query parameter is the other such way; a _method
// in a form body is not read, which would mean buffering bodies.
var overrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// methodOverride is a method a request names besides its own, and where.
type methodOverride struct{ method, from string }

// methodOverrides returns the methods other than hr.Method that req names
// in an override, upper case, each once (from where it is first named).
// Servers differ on which value they take (the first header, the first
// comma-separated token, the last parameter), so every one counts.
func methodOverrides(req *http.Request, hr egress.HTTPRequest) []methodOverride {
	var out []methodOverride
	add := func(from string, values []string) {
		for _, v := range values {
			for tok := range strings.SplitSeq(v, ",") {
				if m := strings.ToUpper(strings.TrimSpace(tok)); m != "" && m != hr.Method {
					out = append(out, methodOverride{m, from})
				}
			}
		}
	}
	for _, k := range overrideHeaders {
		add(k, req.Header[k])
	}
	add("the _method parameter", hr.Query["_method"])
	// Sorting first makes the dedup linear: a request head of 64 KiB could
	// name thousands of methods.
	slices.SortStableFunc(out, func(a, b methodOverride) int { return strings.Compare(a.method, b.method) })
	return slices.CompactFunc(out, func(a, b methodOverride) bool { return a.method == b.method })
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return strings.Trim(h, "[]")
	}
	return strings.Trim(hostport, "[]")
}

// rewrite sends the request to the host the gate allowed, with the path
// that was decided, and swaps masked secrets when it leaves over TLS.
func (h *handler) rewrite(pr *httputil.ProxyRequest) {
	ex := pr.In.Context().Value(exchangeKey{}).(*exchange)
	r := h.t.Request
	pr.Out.URL = &url.URL{Scheme: h.scheme, Host: r.Target(), Opaque: ex.path.Forward, RawQuery: pr.In.URL.RawQuery}
	if pr.Out.Host == "" {
		pr.Out.Host = r.Host
	}
	if h.scheme == "https" && r.Host != "" {
		ex.masked = ex.secrets.Swap(r.Host, pr.Out.Header)
	}
	if ex.secrets.Scoped(r.Host) {
		// Compressed responses and WebSocket frames would hide an echoed
		// real value from the scrubbing of responses. A server may
		// compress anyway; scrubResponse decodes what it can.
		pr.Out.Header.Del("Accept-Encoding")
		pr.Out.Header.Del("Sec-WebSocket-Extensions")
	}
}

// response scrubs real secret values from what a scoped host sends back,
// and records the upstream's status.
func (h *handler) response(resp *http.Response) error {
	if ex, ok := resp.Request.Context().Value(exchangeKey{}).(*exchange); ok {
		ex.status = resp.StatusCode
	}
	if !h.secretsFor(resp.Request.Context()).Scoped(h.t.Request.Host) {
		return nil
	}
	if err := h.scrubResponse(resp); err != nil {
		if ex, ok := resp.Request.Context().Value(exchangeKey{}).(*exchange); ok {
			ex.status = http.StatusBadGateway
		}
		return err
	}
	return nil
}

// denyBody is the 403 an agent reads to understand a refused request.
// Field names are part of corral's interface.
type denyBody struct {
	Error     string `json:"error"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail,omitempty"`
	Policy    string `json:"policy"`
	Rule      string `json:"rule"`
	Method    string `json:"method"`
	Host      string `json:"host"`
	Path      string `json:"path"`
	Binary    string `json:"binary"`
	NextSteps string `json:"next_steps"`
	// DraftChunk is the pending policy chunk that would allow this.
	DraftChunk string `json:"draft_chunk,omitempty"`
}

func (h *handler) deny(w http.ResponseWriter, req *http.Request, hr egress.HTTPRequest, d egress.HTTPDecision, set *secrets.Set) {
	r := h.t.Request
	host := r.Host
	if host == "" {
		host = r.IP.String()
	}
	b := denyBody{
		Error: "request denied by corral policy", Reason: d.Reason, Detail: set.Redact(d.Detail),
		Policy: d.Policy, Rule: d.Rule, Method: req.Method, Host: host, Path: set.Redact(hr.Path),
		Binary: r.Identity.Binary,
	}
	switch d.Reason {
	case egress.ReasonHostMismatch:
		b.NextSteps = "send each request on a connection opened to the host it names"
	case egress.ReasonL7Upgrade:
		b.NextSteps = "only WebSocket upgrades are relayed; send the requests without Upgrade"
	case egress.ReasonL7BadPath, egress.ReasonL7BadQuery:
		b.NextSteps = "send the path without dot segments, encoded slashes or double encoding, and the query as name=value pairs joined by &"
		if d.Rule != "" {
			b.NextSteps = fmt.Sprintf("the path holds an encoded slash (%%2F), which could move it past %s of policy %q; "+
				"if this upstream reads %%2F as part of a name (npm scopes, GitLab project ids), ask the operator to set allow_encoded_slash: true on that endpoint",
				d.Rule, d.Policy)
		}
	case egress.ReasonL7DenyRule:
		b.NextSteps = "this request matches a deny rule of the policy; it cannot be allowed by adding rules"
	default:
		b.NextSteps = fmt.Sprintf("ask the operator to add a rule allowing %s %s on %s to policy %q; denied requests are logged and can be approved with corral policy set",
			hr.Method, hr.Path, r.Target(), d.Policy)
		// Only a chunk already proposed answers an L7 refusal: the
		// advisor proposes for denied connections and audited requests.
		if h.in.Advice != nil {
			if chunk, next := h.in.Advice.For(r); chunk != "" {
				b.DraftChunk, b.NextSteps = chunk, strings.Join(next, "; ")
			}
		}
	}
	js, _ := json.Marshal(b)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Corral-Policy", "deny; reason="+d.Reason)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusForbidden)
	w.Write(js)
}

// upstreamError answers a request the rules allowed but the upstream did
// not take: 502, distinct from a policy refusal because the remedy is.
func (h *handler) upstreamError(w http.ResponseWriter, req *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	if u := (unscrubbable{}); errors.As(err, &u) {
		h.in.log().Warn("response from a host a masked secret is scoped to withheld: it could not be scrubbed", "target", h.t.Request.Target(), "err", err)
		js, _ := json.Marshal(map[string]string{
			"error":      "corral withheld the upstream's response: it could not be checked for masked secrets",
			"reason":     reasonUnscrubbable,
			"detail":     h.secretsFor(req.Context()).Redact(err.Error()),
			"next_steps": "this host receives a masked secret, so corral passes on only responses it can scrub of the real value: bodies uncompressed or in gzip or deflate, WebSockets without extensions; this is not a policy refusal",
		})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		w.Write(js)
		return
	}
	h.in.log().Debug("inspected request failed upstream", "target", h.t.Request.Target(), "err", err)
	js, _ := json.Marshal(map[string]string{
		"error":      "corral allowed the request but the upstream did not answer it",
		"reason":     egress.ReasonUpstream,
		"detail":     h.secretsFor(req.Context()).Redact(err.Error()),
		"next_steps": "check that " + h.t.Request.Target() + " is reachable from the host and presents a certificate the host trusts; this is not a policy refusal",
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	w.Write(js)
}

// report writes the one event of a request. Paths and queries go through
// Redact: a real secret must not reach a log even if a client echoes one.
func (h *handler) report(req *http.Request, hr egress.HTTPRequest, d egress.HTTPDecision, outcome string, status int, w *countingWriter, in int64, ex *exchange, took time.Duration) {
	if h.in.Audit == nil {
		return
	}
	set := ex.secrets
	r := h.t.Request
	host := r.Host
	if host == "" {
		host = r.IP.String()
	}
	out := w.n.Load()
	ev := audit.HTTPRequestEvent{
		Via: r.Via, Host: host, Port: r.Port, Scheme: h.scheme, Proto: req.Proto,
		Method: req.Method, Path: set.Redact(hr.Path), Query: set.Redact(req.URL.RawQuery),
		Decision: outcome, Policy: d.Policy, Rule: d.Rule,
		Status: status, Bytes: in + out, BytesIn: in, BytesOut: out, DurationMS: took.Milliseconds(),
		Binary: r.Identity.Binary, PID: r.Identity.PID, Masked: ex.masked,
		WouldDeny: outcome == decisionAudit,
	}
	if outcome != decisionAllow {
		ev.Reason, ev.Detail = d.Reason, set.Redact(d.Detail)
	}
	h.in.Audit.Log(ev)
	if outcome == decisionDeny {
		h.in.log().Warn("http request denied", "target", r.Target(), "method", req.Method, "path", set.Redact(hr.Path), "reason", d.Reason)
	}
}

// countingWriter records the final status and the body bytes written. It
// unwraps to the server's writer so flushing and hijacking still work.
type countingWriter struct {
	http.ResponseWriter
	code atomic.Int32
	n    atomic.Int64
}

func (w *countingWriter) WriteHeader(code int) {
	if code >= 200 {
		w.code.CompareAndSwap(0, int32(code))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.code.CompareAndSwap(0, http.StatusOK)
	n, err := w.ResponseWriter.Write(b)
	w.n.Add(int64(n))
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *countingWriter) status() int { return int(w.code.Load()) }

// countingBody counts the request body bytes read.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// tracker counts a connection's requests in flight and, once closed,
// refuses new ones, so that Inspect can wait for the last handler
// (an upgraded connection outlives the server) without racing a request
// that starts as the connection goes away.
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{}
}

func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// close refuses new requests and waits for those in flight.
func (t *tracker) close() {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	t.idle = idle
	t.mu.Unlock()
	<-idle
}
