package inspect_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/relay"
	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/l7/inspect"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

const (
	apiHost   = "api.example.com"
	otherHost = "other.example.com"
	curl      = "/usr/bin/curl"
	// ioTimeout turns a hang into a failure; nothing here is slow.
	ioTimeout = 5 * time.Second
)

// seen is what the upstream received, as its own server parsed it.
type seen struct {
	Method, RequestURI, Path, Host, Proto string
	Header                                http.Header
}

// upstreamServer is the real destination behind the inspector. It records
// every request so tests can prove what was (and was not) forwarded.
type upstreamServer struct {
	srv     *httptest.Server
	pool    *x509.CertPool // nil for plain HTTP
	release chan struct{}
	once    sync.Once

	mu   sync.Mutex
	reqs []seen
}

// newUpstream starts a TLS upstream speaking h2 and HTTP/1.1 with leaves
// for apiHost and otherHost from its own CA, distinct from the sandbox's,
// so a test passes only if the inspector verifies against RootCAs.
func newUpstream(t testing.TB) *upstreamServer {
	t.Helper()
	upCA, err := ca.New("upstream", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var certs []tls.Certificate
	for _, h := range []string{apiHost, otherHost} {
		leaf, err := upCA.Leaf(h)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, *leaf)
	}
	u := &upstreamServer{pool: x509.NewCertPool(), release: make(chan struct{})}
	if !u.pool.AppendCertsFromPEM(upCA.CertPEM()) {
		t.Fatal("upstream CA PEM not accepted")
	}
	u.srv = httptest.NewUnstartedServer(u)
	// Tunnels whose requests were all denied close their unused upstream
	// connection before any handshake; that is not worth a log line.
	u.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	u.srv.EnableHTTP2 = true
	// Both protocols are offered: the inspector's transport asks for
	// HTTP/1.1 alone when it forwards a WebSocket upgrade.
	u.srv.TLS = &tls.Config{Certificates: certs, NextProtos: []string{"h2", "http/1.1"}}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	// Registered after Close so it runs first: a handler parked on
	// /stream by a failed test must not keep Close waiting.
	t.Cleanup(u.unblock)
	return u
}

func newPlainUpstream(t *testing.T) *upstreamServer {
	t.Helper()
	u := &upstreamServer{release: make(chan struct{})}
	u.srv = httptest.NewServer(u)
	t.Cleanup(u.srv.Close)
	t.Cleanup(u.unblock)
	return u
}

func (u *upstreamServer) unblock() { u.once.Do(func() { close(u.release) }) }

func (u *upstreamServer) addr() string { return u.srv.Listener.Addr().String() }

func (u *upstreamServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.reqs = append(u.reqs, seen{
		Method: r.Method, RequestURI: r.RequestURI, Path: r.URL.Path,
		Host: r.Host, Proto: r.Proto, Header: r.Header.Clone(),
	})
	u.mu.Unlock()
	switch r.URL.Path {
	case "/stream":
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "last\n")
	case "/ws":
		websocket.Server{
			// Origin checks are the application's business; the
			// inspector must relay whatever the upstream accepts.
			Handshake: func(*websocket.Config, *http.Request) error { return nil },
			Handler:   func(ws *websocket.Conn) { io.Copy(ws, ws) },
		}.ServeHTTP(w, r)
	case "/bye":
		// A complete response, then the connection ends without a word,
		// as servers do to kept connections they no longer want.
		w.Header().Set("Content-Length", "3")
		io.WriteString(w, "bye")
		rc := http.NewResponseController(w)
		rc.Flush()
		if c, _, err := rc.Hijack(); err == nil {
			c.Close()
		}
	case "/echo-auth":
		// A service quoting the credential it received back to the caller.
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	default:
		// Read the body first: an answer sent before it would leave how
		// much of it the proxy forwarded to chance.
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "ok %s %s", r.Method, r.URL.Path)
	}
}

func (u *upstreamServer) seen() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.reqs)
}

func (u *upstreamServer) uris() []string {
	var out []string
	for _, s := range u.seen() {
		out = append(out, s.Method+" "+s.RequestURI)
	}
	return out
}

// config describes one harness; zero fields take the common case.
type config struct {
	policy  *policy.Policy
	secrets *secrets.Set
	// host is the tunnel's destination as the gate allowed it.
	host string
	port uint16
	// plain makes the upstream speak HTTP without TLS.
	plain bool
	// tls is the connection decision's tls mode.
	tls string
}

// harness is a listener whose every connection is an allowed tunnel handed
// to the inspector, as the gate would after deciding the connection.
type harness struct {
	t      testing.TB
	up     *upstreamServer
	sbPool *x509.CertPool
	in     *inspect.Inspector
	dialer *egresstest.Dialer
	audit  *egresstest.AuditBuffer
	// log collects the inspector's debug log, which must never hold a
	// real secret either.
	log  *egresstest.AuditBuffer
	addr string
	host string

	accepted atomic.Int32
	live     atomic.Int32

	mu     sync.Mutex
	checks []string
}

func newHarness(t testing.TB, up *upstreamServer, c config) *harness {
	t.Helper()
	if c.host == "" {
		c.host = apiHost
	}
	if c.port == 0 {
		c.port = 443
		if c.plain {
			c.port = 80
		}
	}
	// The first snapshot takes the harness's secrets as they are; later
	// ones rescope them, as a sandbox's reloads do.
	policies, err := reload.New(mustCompile(t, c.policy), func(cp *policy.Compiled, prev *reload.Snapshot) (reload.Decider, *secrets.Set, error) {
		engine, err := decide.New(cp, nil)
		if err != nil || prev == nil {
			return engine, c.secrets, err
		}
		s, err := prev.Secrets.Rescope(cp.Secrets)
		return engine, s, err
	}, nil, nil)
	if err != nil {
		t.Fatalf("reload.New: %v", err)
	}
	sbCA, err := ca.New("sb", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, up: up, sbPool: x509.NewCertPool(),
		dialer: &egresstest.Dialer{Addr: up.addr()},
		audit:  &egresstest.AuditBuffer{}, log: &egresstest.AuditBuffer{},
		host: c.host,
	}
	h.sbPool.AppendCertsFromPEM(sbCA.CertPEM())
	h.in = &inspect.Inspector{
		Policy:  policies,
		CA:      sbCA,
		Dialer:  h.dialer,
		RootCAs: func() *x509.CertPool { return up.pool },
		Audit:   audit.New(h.audit),
		Log:     slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			up, err := net.Dial("tcp", up.addr())
			if err != nil {
				t.Errorf("dial upstream: %v", err)
				conn.Close()
				continue
			}
			tun := &egress.Tunnel{
				Up: up,
				Request: egress.Request{
					Host: c.host, Port: c.port, Via: egress.ViaTransparent,
					Identity: egress.Identity{Binary: curl},
				},
				Decision: egress.Decision{Allow: true, Inspect: true, Policy: "p", TLS: c.tls},
			}
			h.live.Add(1)
			wg.Go(func() {
				defer h.live.Add(-1)
				// The gate relays what the inspector hands back.
				if raw := h.in.Inspect(ctx, conn, tun, h.check); raw != nil {
					_, _, _ = relay.Relay(gate.Guarded(raw, nil, tun.Request, h.check), tun.Up, 0)
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(ioTimeout):
			t.Errorf("Inspect did not return after its context was cancelled")
		}
		if t.Failed() {
			t.Logf("inspector log:\n%s", h.log.String())
		}
	})
	return h
}

// check stands in for the gate's Recheck: only the tunnel's own host may
// be named by the client.
func (h *harness) check(kind, name string, err error) error {
	h.mu.Lock()
	h.checks = append(h.checks, kind+" "+name)
	h.mu.Unlock()
	if err != nil {
		return err
	}
	if !strings.EqualFold(name, h.host) {
		return fmt.Errorf("%s %s does not match %s", kind, name, h.host)
	}
	return nil
}

func (h *harness) checked() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.checks)
}

func (h *harness) url(path string) string {
	if h.up.pool == nil {
		return "http://" + h.host + path
	}
	return "https://" + h.host + path
}

// client returns a client that reaches the inspector whatever the URL
// says, trusting only the sandbox CA, as a workload in the sandbox would.
func (h *harness) client(h2 bool) *http.Client {
	return h.clientFor(h2, &tls.Config{RootCAs: h.sbPool, ServerName: h.host})
}

func (h *harness) clientFor(h2 bool, tc *tls.Config) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", h.addr)
		},
		TLSClientConfig:   tc,
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tc.NextProtos = []string{"http/1.1"}
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: ioTimeout}
}

// result is a response with its body read.
type result struct {
	*http.Response
	body string
}

func do(t *testing.T, c *http.Client, method, u string, header http.Header, body string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	return doReq(t, c, req)
}

func doReq(t *testing.T, c *http.Client, req *http.Request) result {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return result{resp, string(b)}
}

// raw sends one HTTP/1.1 request exactly as written, for the targets and
// headers Go's client would tidy up before sending.
func (h *harness) raw(t *testing.T, method, target, host string, extra ...string) result {
	t.Helper()
	conn := h.dialRaw(t)
	defer conn.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	closing := true
	for _, e := range extra {
		b.WriteString(e + "\r\n")
		closing = closing && !strings.HasPrefix(strings.ToLower(e), "connection:")
	}
	if closing {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatalf("write %s %s: %v", method, target, err)
	}
	// The request is attached so failures can name it.
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method, URL: &url.URL{Opaque: target}})
	if err != nil {
		t.Fatalf("%s %s: read response: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, target, err)
	}
	return result{resp, string(body)}
}

// dialRaw opens an HTTP/1.1 connection to the inspector, over TLS unless
// the harness is plain.
func (h *harness) dialRaw(t *testing.T) net.Conn {
	t.Helper()
	d := &net.Dialer{Timeout: ioTimeout}
	var conn net.Conn
	var err error
	if h.up.pool == nil {
		conn, err = d.Dial("tcp", h.addr)
	} else {
		conn, err = tls.DialWithDialer(d, "tcp", h.addr, &tls.Config{
			RootCAs: h.sbPool, ServerName: h.host, NextProtos: []string{"http/1.1"},
		})
	}
	if err != nil {
		t.Fatalf("dial inspector: %v", err)
	}
	conn.SetDeadline(time.Now().Add(ioTimeout))
	return conn
}

// settle waits until every tunnel the harness accepted has been served to
// the end. An event is written after its response, so only then is the
// audit trail complete.
func (h *harness) settle(t *testing.T, clients ...*http.Client) {
	t.Helper()
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	deadline := time.Now().Add(ioTimeout)
	for h.live.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d inspected connections still open after their clients closed", h.live.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// httpEvents returns the http.request events, after settle.
func (h *harness) httpEvents(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, ev := range h.audit.Events(t) {
		if ev[audit.FieldEvent] == audit.HTTPRequest {
			out = append(out, ev)
		}
	}
	return out
}

// eventFor finds the single event for method and path, failing if there
// is none or more than one.
func eventFor(t *testing.T, events []map[string]any, method, path string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, ev := range events {
		if ev["method"] == method && ev["path"] == path {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d http.request events for %s %s, want 1; events: %v", len(found), method, path, events)
	}
	return found[0]
}

// requireFields checks the fields of an http.request event that consumers
// key on.
func requireFields(t *testing.T, ev map[string]any) {
	t.Helper()
	for _, k := range []string{"decision", "rule", "status", "bytes_out", "duration_ms", "method", "path", "policy", "host"} {
		if _, ok := ev[k]; !ok {
			t.Errorf("event %v lacks %q", ev, k)
		}
	}
}

func num(ev map[string]any, k string) int {
	f, _ := ev[k].(float64)
	return int(f)
}

// denial checks a policy 403 and returns its decoded body.
func denial(t *testing.T, r result) map[string]any {
	t.Helper()
	if r.StatusCode != http.StatusForbidden {
		t.Fatalf("%s %s: status %d, want 403; body %q", r.Request.Method, r.Request.URL, r.StatusCode, r.body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("denial Content-Type %q, want application/json", ct)
	}
	if p := r.Header.Get("X-Corral-Policy"); !strings.HasPrefix(p, "deny") {
		t.Errorf("denial X-Corral-Policy %q, want deny...", p)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("denial body %q: %v", r.body, err)
	}
	for _, k := range []string{"error", "reason", "policy", "rule", "method", "path", "next_steps"} {
		if _, ok := body[k]; !ok {
			t.Errorf("denial body lacks %q: %s", k, r.body)
		}
	}
	return body
}

func wantOK(t *testing.T, r result, want string) {
	t.Helper()
	if r.StatusCode != http.StatusOK || r.body != want {
		t.Fatalf("%s %s: got %d %q, want 200 %q", r.Request.Method, r.Request.URL, r.StatusCode, r.body, want)
	}
}

// restPolicy is policy "p" with endpoints for any binary.
func restPolicy(eps ...policy.Endpoint) *policy.Policy {
	return &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{
		"p": {Endpoints: eps},
	}}
}

func rest(host string, port int, mod func(*policy.Endpoint)) policy.Endpoint {
	ep := policy.Endpoint{Host: host, Port: port, Protocol: policy.ProtocolREST, TLS: policy.TLSTerminate}
	mod(&ep)
	return ep
}

func readOnly(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }

// Requests pipelined on one HTTP/1.1 connection are each decided, in
// order: the simple ones are answered inline, and the POST behind them
// hands the rest of the connection, itself still unread, to net/http's
// server.
func TestReadOnlyDecidesEachPipelinedRequest(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	conn := h.dialRaw(t)
	defer conn.Close()
	reqs := []struct {
		method, path string
		status       int
	}{
		{"GET", "/repos/a", http.StatusOK},
		{"HEAD", "/repos/b", http.StatusOK},
		{"POST", "/repos/c", http.StatusForbidden},
		{"GET", "/repos/d", http.StatusOK},
		{"DELETE", "/repos/e", http.StatusForbidden},
		{"GET", "/repos/f", http.StatusOK},
	}
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", r.method, r.path, apiHost)
		if r.method == "POST" {
			b.WriteString("Content-Length: 2\r\n\r\n{}")
			continue
		}
		b.WriteString("\r\n")
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for _, r := range reqs {
		resp, err := http.ReadResponse(br, &http.Request{Method: r.method})
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != r.status {
			t.Errorf("%s %s: status %d, want %d", r.method, r.path, resp.StatusCode, r.status)
		}
	}
	if got, want := up.uris(), []string{"GET /repos/a", "HEAD /repos/b", "GET /repos/d", "GET /repos/f"}; !slices.Equal(got, want) {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}
}

func TestReadOnlyDecidesEachH2Stream(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	c := h.client(true)

	get := do(t, c, "GET", h.url("/repos/x"), nil, "")
	wantOK(t, get, "ok GET /repos/x")
	post := do(t, c, "POST", h.url("/repos/x"), http.Header{"Content-Type": {"application/json"}}, `{"name":"x"}`)
	body := denial(t, post)
	// A denial answers one stream; the connection carries on.
	again := do(t, c, "GET", h.url("/repos/y"), nil, "")
	wantOK(t, again, "ok GET /repos/y")

	for _, r := range []result{get, post, again} {
		if r.Proto != "HTTP/2.0" {
			t.Fatalf("%s %s went over %s, want HTTP/2.0", r.Request.Method, r.Request.URL.Path, r.Proto)
		}
	}
	if n := h.accepted.Load(); n != 1 {
		t.Fatalf("inspector accepted %d connections, want the 3 requests on 1", n)
	}
	if body["method"] != "POST" || body["path"] != "/repos/x" || body["policy"] != "p" ||
		body["reason"] != egress.ReasonL7NoRule || body["host"] != apiHost || body["binary"] != curl {
		t.Errorf("denial body %v does not describe the refused request", body)
	}
	if got, want := up.uris(), []string{"GET /repos/x", "GET /repos/y"}; !slices.Equal(got, want) {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}
	if p := up.seen()[0].Proto; p != "HTTP/2.0" {
		t.Errorf("forwarded over %s, want HTTP/2.0 to an h2 upstream", p)
	}
	// The gate's connection carries every stream; dialling again here
	// would be a second, unnecessary trip through the SSRF checks.
	if n := len(h.dialer.Requests()); n != 0 {
		t.Errorf("inspector dialled %d further upstream connections, want 0", n)
	}

	h.settle(t, c)
	events := h.httpEvents(t)
	if len(events) != 3 {
		t.Fatalf("%d http.request events for 3 requests: %v", len(events), events)
	}
	for _, ev := range events {
		requireFields(t, ev)
	}
	ev := eventFor(t, events, "POST", "/repos/x")
	if ev["decision"] != "deny" || num(ev, "status") != 403 || ev["rule"] != "" ||
		ev["reason"] != egress.ReasonL7NoRule || num(ev, "bytes_out") != len(post.body) || ev["policy"] != "p" {
		t.Errorf("POST event %v, want deny 403 with reason and the body's size", ev)
	}
	ev = eventFor(t, events, "GET", "/repos/x")
	if ev["decision"] != "allow" || num(ev, "status") != 200 || ev["rule"] != "access: read-only" ||
		num(ev, "bytes_out") != len(get.body) || ev["proto"] != "HTTP/2.0" {
		t.Errorf("GET event %v, want allow 200 by access: read-only", ev)
	}
	if _, ok := ev["reason"]; ok {
		t.Errorf("allowed request's event has a reason: %v", ev)
	}
}

func TestRulesAllowExactlyWhatTheySay(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
		ep.Rules = []policy.L7Rule{
			{Allow: policy.L7Match{Method: "GET", Path: "/repos/**"}},
			{Allow: policy.L7Match{Method: "POST", Path: "/graphql"}},
			{Allow: policy.L7Match{Method: "GET", Path: "/search", Query: map[string]any{"q": "repo:*"}}},
		}
		ep.DenyRules = []policy.L7Match{{Method: "*", Path: "/repos/*/secrets/**"}}
	}))})
	c := h.client(true)

	tests := []struct {
		method, target string
		allow          bool
		rule, reason   string
	}{
		{"GET", "/repos/a/b", true, "rules[0]", ""},
		{"POST", "/graphql", true, "rules[1]", ""},
		{"POST", "/repos/x", false, "", egress.ReasonL7NoRule},
		{"POST", "/graphql/x", false, "", egress.ReasonL7NoRule},
		{"GET", "/repos/a/secrets/x", false, "deny_rules[0]", egress.ReasonL7DenyRule},
		{"GET", "/search?q=repo:x", true, "rules[2]", ""},
		{"GET", "/search?q=user:x", false, "", egress.ReasonL7NoRule},
		{"GET", "/search?q=repo:x&q=user:y", false, "", egress.ReasonL7NoRule},
		{"GET", "/search", false, "", egress.ReasonL7NoRule},
	}
	var want []string
	for _, tt := range tests {
		r := do(t, c, tt.method, h.url(tt.target), nil, "")
		path, _, _ := strings.Cut(tt.target, "?")
		if tt.allow {
			wantOK(t, r, "ok "+tt.method+" "+path)
			want = append(want, tt.method+" "+tt.target)
			continue
		}
		body := denial(t, r)
		if body["rule"] != tt.rule || body["reason"] != tt.reason {
			t.Errorf("%s %s: denied by rule %q reason %q, want %q %q", tt.method, tt.target, body["rule"], body["reason"], tt.rule, tt.reason)
		}
	}
	if got := up.uris(); !slices.Equal(got, want) {
		t.Errorf("upstream saw %q, want exactly the allowed %q", got, want)
	}

	h.settle(t, c)
	events := h.httpEvents(t)
	if len(events) != len(tests) {
		t.Fatalf("%d http.request events for %d requests", len(events), len(tests))
	}
	for i, tt := range tests {
		ev := events[i]
		requireFields(t, ev)
		path, query, _ := strings.Cut(tt.target, "?")
		wantDecision := map[bool]string{true: "allow", false: "deny"}[tt.allow]
		if ev["method"] != tt.method || ev["path"] != path || ev["query"] != query || ev["decision"] != wantDecision || ev["rule"] != tt.rule {
			t.Errorf("event %d %v, want %s %s decided %s by %q", i, ev, tt.method, tt.target, wantDecision, tt.rule)
		}
	}
}

func TestAuditEnforcementForwardsAndRecords(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
		ep.Access = policy.AccessReadOnly
		ep.Enforcement = policy.EnforcementAudit
	}))})
	c := h.client(true)

	wantOK(t, do(t, c, "POST", h.url("/repos/x"), nil, "{}"), "ok POST /repos/x")
	if got := up.uris(); !slices.Equal(got, []string{"POST /repos/x"}) {
		t.Fatalf("upstream saw %q, want the would-be-denied POST", got)
	}
	h.settle(t, c)
	ev := eventFor(t, h.httpEvents(t), "POST", "/repos/x")
	requireFields(t, ev)
	if ev["decision"] != "audit" || ev["reason"] != egress.ReasonL7NoRule || ev["detail"] == "" || num(ev, "status") != 200 || num(ev, "bytes_in") != 2 {
		t.Errorf("event %v, want decision audit with reason and detail, status 200, bytes_in 2", ev)
	}
}

// TestPathTricksCannotReachDeniedPaths sends paths that mean /public/admin/x
// to an upstream that resolves them, against a policy that must refuse it.
func TestPathTricksCannotReachDeniedPaths(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
		ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: "/public/**"}}}
		ep.DenyRules = []policy.L7Match{{Method: "GET", Path: "/public/admin/**"}}
	}))})
	c := h.client(true)

	denied := []string{
		"/public/admin/x",
		"/public/x/../admin/x",
		"/public//admin/x",
		"/public/./admin/x",
		"/public/%2e%2e/public/admin/x",
		"/public/x/%2E%2E/admin/x",
		"/public/%61dmin/x",
		"/public/admin%2fx",
		"/public/admin%2Fx",
		"/public/admin%5cx",
		"/public/admin\\x",
		"/public/..;/public/admin/x",
		"/public/x/..;/admin/x",
		"/public/%252e%252e/admin",
		"/public/%2561dmin/x",
		"/public/x/../../public/admin/x",
	}
	for _, target := range denied {
		t.Run("h1"+target, func(t *testing.T) {
			denial(t, h.raw(t, "GET", target, apiHost))
		})
		t.Run("h2"+target, func(t *testing.T) {
			// Opaque keeps Go's client from re-encoding the target.
			req, _ := http.NewRequest("GET", h.url("/"), nil)
			req.URL.Opaque = target
			denial(t, doReq(t, c, req))
		})
	}
	for _, s := range up.seen() {
		if strings.Contains(strings.ToLower(s.RequestURI), "admin") || strings.Contains(s.Path, "admin") {
			t.Errorf("upstream received %s %s", s.Method, s.RequestURI)
		}
	}

	// A dot segment that stays inside the allowed tree is resolved, and
	// the upstream gets the path that was decided, not the one sent.
	wantOK(t, h.raw(t, "GET", "/public/a/../b", apiHost), "ok GET /public/b")
	req, _ := http.NewRequest("GET", h.url("/"), nil)
	req.URL.Opaque = "/public/a/%2e%2e/b"
	wantOK(t, doReq(t, c, req), "ok GET /public/b")
	var got []string
	for _, s := range up.seen() {
		got = append(got, s.RequestURI)
	}
	if want := []string{"/public/b", "/public/b"}; !slices.Equal(got, want) {
		t.Errorf("upstream saw request targets %q, want %q", got, want)
	}
}

func TestStreamsResponseAsItArrives(t *testing.T) {
	for _, h2 := range []bool{true, false} {
		t.Run(map[bool]string{true: "h2", false: "h1"}[h2], func(t *testing.T) {
			up := newUpstream(t)
			h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
			c := h.client(h2)
			resp, err := c.Get(h.url("/stream"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line := make(chan string, 1)
			go func() {
				s, _ := br.ReadString('\n')
				line <- s
			}()
			select {
			case s := <-line:
				if s != "first\n" {
					t.Fatalf("first line %q", s)
				}
			case <-time.After(ioTimeout):
				// Unblocking lets the read finish before the body closes.
				up.unblock()
				<-line
				t.Fatal("the first line did not arrive before the upstream finished the response: the inspector buffers")
			}
			up.unblock()
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "last\n" {
				t.Fatalf("rest of the stream %q, %v; want \"last\\n\"", rest, err)
			}
		})
	}
}

func TestMaskedSecretSwappedOnlyForItsHosts(t *testing.T) {
	real := "ghp_" + strings.Repeat("aB3", 12)
	set, err := loadSecrets(map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "REAL_GH_TOKEN", Hosts: []string{apiHost}, Headers: []string{"Authorization"}},
	}, func(k string) string {
		if k == "REAL_GH_TOKEN" {
			return real
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	env := set.Env()
	if len(env) != 1 || !strings.HasPrefix(env[0], "GH_TOKEN=") {
		t.Fatalf("Env() = %q", env)
	}
	surrogate := strings.TrimPrefix(env[0], "GH_TOKEN=")
	if surrogate == real || len(surrogate) != len(real) {
		t.Fatalf("surrogate %q is not a same-length stand-in", surrogate)
	}
	full := func(ep *policy.Endpoint) { ep.Access = policy.AccessFull }
	pol := restPolicy(rest(apiHost, 443, full), rest(otherHost, 443, full))
	up := newUpstream(t)

	api := newHarness(t, up, config{policy: pol, secrets: set})
	c := api.client(true)
	wantOK(t, do(t, c, "GET", api.url("/bearer"), http.Header{
		"Authorization": {"Bearer " + surrogate},
		// Not a header the secret names: left alone.
		"X-Api-Key": {surrogate},
	}, ""), "ok GET /bearer")
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + surrogate))
	wantOK(t, do(t, c, "GET", api.url("/basic"), http.Header{"Authorization": {"Basic " + basic}}, ""), "ok GET /basic")

	other := newHarness(t, up, config{policy: pol, secrets: set, host: otherHost})
	oc := other.client(true)
	wantOK(t, do(t, oc, "GET", other.url("/bearer"), http.Header{"Authorization": {"Bearer " + surrogate}}, ""), "ok GET /bearer")

	s := up.seen()
	if len(s) != 3 {
		t.Fatalf("upstream saw %d requests, want 3", len(s))
	}
	if got := s[0].Header.Get("Authorization"); got != "Bearer "+real {
		t.Errorf("bearer to %s arrived as %q, want the real token", apiHost, got)
	}
	if got := s[0].Header.Get("X-Api-Key"); got != surrogate {
		t.Errorf("unnamed header arrived as %q, want the surrogate unchanged", got)
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s[1].Header.Get("Authorization"), "Basic "))
	if err != nil || string(dec) != "x-access-token:"+real {
		t.Errorf("basic credential to %s arrived as %q (%v), want it carrying the real token", apiHost, dec, err)
	}
	if s[2].Host != otherHost {
		t.Fatalf("third request reached host %q, want %s", s[2].Host, otherHost)
	}
	if got := s[2].Header.Get("Authorization"); got != "Bearer "+surrogate {
		t.Errorf("bearer to %s, which the secret is not scoped to, arrived as %q, want the surrogate", otherHost, got)
	}

	api.settle(t, c)
	other.settle(t, oc)
	for _, tt := range []struct {
		h      *harness
		path   string
		masked int
	}{{api, "/bearer", 1}, {api, "/basic", 1}, {other, "/bearer", 0}} {
		ev := eventFor(t, tt.h.httpEvents(t), "GET", tt.path)
		if num(ev, "masked") != tt.masked {
			t.Errorf("%s %s: masked %v, want %d", tt.h.host, tt.path, ev["masked"], tt.masked)
		}
	}
	for _, h := range []*harness{api, other} {
		events, _ := json.Marshal(h.audit.Events(t))
		for _, leak := range []string{real, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + real))} {
			if strings.Contains(string(events), leak) {
				t.Errorf("audit trail of %s holds the real token", h.host)
			}
			if strings.Contains(h.log.String(), leak) {
				t.Errorf("inspector log of %s holds the real token", h.host)
			}
		}
	}
}

func TestSNIMismatchRefused(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	// Skipping verification gets past the leaf's name so the refusal seen
	// is the inspector's, not the client's.
	c := h.clientFor(true, &tls.Config{ServerName: "evil.example.com", InsecureSkipVerify: true})
	if resp, err := c.Get(h.url("/repos/x")); err == nil {
		resp.Body.Close()
		t.Fatalf("request with SNI evil.example.com on a tunnel to %s answered %s", apiHost, resp.Status)
	}
	if got := h.checked(); !slices.Contains(got, "tls_sni evil.example.com") {
		t.Errorf("check calls %q, want tls_sni evil.example.com", got)
	}
	h.settle(t, c)
	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
	if ev := h.httpEvents(t); len(ev) != 0 {
		t.Errorf("http.request events for a refused handshake: %v", ev)
	}
}

func TestHostHeaderMismatch(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(
		rest(apiHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessFull }),
		rest(otherHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessFull }),
	)})
	check := func(r result) {
		t.Helper()
		if body := denial(t, r); body["reason"] != egress.ReasonHostMismatch {
			t.Errorf("denial reason %v, want %s", body["reason"], egress.ReasonHostMismatch)
		}
	}
	check(h.raw(t, "GET", "/x", otherHost))
	check(h.raw(t, "GET", "/x", otherHost+":443"))
	// Absolute form names the host in the request line instead.
	check(h.raw(t, "GET", "https://"+otherHost+"/x", apiHost))

	c := h.client(true)
	req, _ := http.NewRequest("GET", h.url("/x"), nil)
	req.Host = otherHost // :authority, while SNI stays apiHost
	check(doReq(t, c, req))

	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream saw %q", up.uris())
	}
	// The same host with a port and in another case is the same host.
	wantOK(t, h.raw(t, "GET", "/x", "API.example.com:443"), "ok GET /x")

	// An opaque target ("a:b://host/x") has no path to decide: refused,
	// and never written on, where a server could read it as naming
	// another host.
	before := len(up.seen())
	for _, target := range []string{"a:https://" + otherHost + "/x", "https:" + otherHost + "/x"} {
		if body := denial(t, h.raw(t, "GET", target, apiHost)); body["reason"] != egress.ReasonL7BadPath {
			t.Errorf("%s: denial reason %v, want %s", target, body["reason"], egress.ReasonL7BadPath)
		}
	}
	if n := len(up.seen()) - before; n != 0 {
		t.Errorf("upstream saw %q", up.uris()[before:])
	}
}

func TestPlainHTTPInspected(t *testing.T) {
	real := "ghp_" + strings.Repeat("xY7", 12)
	set, err := loadSecrets(map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "T", Hosts: []string{apiHost}},
	}, func(string) string { return real })
	if err != nil {
		t.Fatal(err)
	}
	surrogate := strings.TrimPrefix(set.Env()[0], "GH_TOKEN=")
	up := newPlainUpstream(t)
	h := newHarness(t, up, config{plain: true, secrets: set, policy: restPolicy(rest(apiHost, 80, func(ep *policy.Endpoint) {
		ep.Access = policy.AccessReadOnly
		ep.TLS = ""
	}))})
	c := h.client(false)

	get := do(t, c, "GET", h.url("/x"), http.Header{"Authorization": {"Bearer " + surrogate}}, "")
	wantOK(t, get, "ok GET /x")
	denial(t, do(t, c, "DELETE", h.url("/x"), nil, ""))
	if got := up.uris(); !slices.Equal(got, []string{"GET /x"}) {
		t.Fatalf("upstream saw %q, want only the GET", got)
	}
	// A real value must never cross the network in clear.
	if got := up.seen()[0].Header.Get("Authorization"); got != "Bearer "+surrogate {
		t.Errorf("plain HTTP request carried Authorization %q, want the surrogate", got)
	}
	h.settle(t, c)
	events := h.httpEvents(t)
	if len(events) != 2 {
		t.Fatalf("%d events for 2 requests: %v", len(events), events)
	}
	for _, ev := range events {
		requireFields(t, ev)
		if ev["scheme"] != "http" || num(ev, "port") != 80 {
			t.Errorf("event %v, want scheme http port 80", ev)
		}
	}
	if ev := eventFor(t, events, "DELETE", "/x"); ev["decision"] != "deny" || num(ev, "status") != 403 {
		t.Errorf("DELETE event %v", ev)
	}
	if ev := eventFor(t, events, "GET", "/x"); num(ev, "masked") != 0 {
		t.Errorf("GET event %v, want masked 0", ev)
	}
}

// TestOneEventPerRequestOnKeepAlive covers HTTP/1.1 keep-alive, where
// requests share a connection one after another.
func TestOneEventPerRequestOnKeepAlive(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	c := h.client(false)
	var want []string
	for i := range 4 {
		method := []string{"GET", "PUT"}[i%2]
		path := "/n/" + strconv.Itoa(i)
		r := do(t, c, method, h.url(path), nil, "")
		if r.Proto != "HTTP/1.1" {
			t.Fatalf("went over %s, want HTTP/1.1", r.Proto)
		}
		want = append(want, method+" "+path)
	}
	if n := h.accepted.Load(); n != 1 {
		t.Errorf("inspector accepted %d connections, want 1 kept alive", n)
	}
	h.settle(t, c)
	events := h.httpEvents(t)
	var got []string
	for _, ev := range events {
		requireFields(t, ev)
		got = append(got, ev["method"].(string)+" "+ev["path"].(string))
	}
	if !slices.Equal(got, want) {
		t.Errorf("events for %q, want one each for %q", got, want)
	}
}

// TestUnterminatedTLSStillChecksSNI covers the endpoints that opt out of
// termination. The bytes are relayed, but the ClientHello must still name
// the host the gate allowed: CONNECT and SOCKS5 hand such tunnels over
// before the client has spoken, and a front end shared by many sites
// routes by SNI, so an unchecked name is domain fronting.
// tls: skip endpoints never reach the inspector (the decision does not ask
// for inspection); the gate's own guard checks them like any tunnel.
func TestUnterminatedTLSStillChecksSNI(t *testing.T) {
	for _, mode := range []string{policy.TLSPassthrough} {
		t.Run(mode, func(t *testing.T) {
			up := newUpstream(t)
			h := newHarness(t, up, config{tls: mode, policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
				ep.Access = policy.AccessReadOnly
				ep.TLS = mode
			}))})
			// The client talks to the upstream itself: nothing in
			// between terminates, so even a POST goes through.
			direct := h.clientFor(false, &tls.Config{RootCAs: up.pool, ServerName: apiHost})
			wantOK(t, do(t, direct, "POST", h.url("/x"), nil, ""), "ok POST /x")

			fronted := h.clientFor(false, &tls.Config{RootCAs: up.pool, ServerName: otherHost})
			if resp, err := fronted.Get("https://" + otherHost + "/fronted"); err == nil {
				resp.Body.Close()
				t.Errorf("ClientHello naming %s on a tunnel to %s reached the upstream: %s", otherHost, apiHost, resp.Status)
			}
			if got := h.checked(); !slices.Contains(got, "tls_sni "+otherHost) {
				t.Errorf("check calls %q, want tls_sni %s", got, otherHost)
			}
			if got := up.uris(); !slices.Equal(got, []string{"POST /x"}) {
				t.Errorf("upstream saw %q, want only the request on the matching tunnel", got)
			}
		})
	}
}

// TestReloadNeverMixesVersions: while the policy flips between two
// versions under many concurrent requests, every request is decided and
// has its secret swapped under one version. Version 1 allows /v1 and
// scopes the secret to this host; version 2 allows /v2 and scopes it
// elsewhere. A /v1 request that arrives with the surrogate, or a /v2
// request with the real value, was decided under one and rewritten under
// the other.
func TestReloadNeverMixesVersions(t *testing.T) {
	real := "ghp_" + strings.Repeat("xY7", 12)
	spec := func(host string) map[string]policy.Secret {
		return map[string]policy.Secret{"GH_TOKEN": {FromEnv: "REAL_GH_TOKEN", Hosts: []string{host}, Headers: []string{"Authorization"}}}
	}
	set, err := loadSecrets(spec(apiHost), func(k string) string {
		if k == "REAL_GH_TOKEN" {
			return real
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	surrogate := strings.TrimPrefix(set.Env()[0], "GH_TOKEN=")
	version := func(path, scopedTo string) *policy.Policy {
		p := restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
			ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: path}}}
		}), rest(otherHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }))
		p.Secrets = spec(scopedTo)
		return p
	}
	p1, p2 := version("/v1", apiHost), version("/v2", otherHost)

	up := newUpstream(t)
	h := newHarness(t, up, config{policy: p1, secrets: set})
	policies := h.in.Policy.(*reload.Reloader)
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := p1
			if i%2 == 1 {
				p = p2
			}
			if err := policies.Apply(p, "flip"); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var clients sync.WaitGroup
	for w := range 8 {
		clients.Go(func() {
			c := h.client(w%2 == 0)
			for i := range 300 {
				path := []string{"/v1", "/v2"}[(w+i)%2]
				req, _ := http.NewRequest("GET", h.url(path), nil)
				req.Header.Set("Authorization", "Bearer "+surrogate)
				if resp, err := c.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	clients.Wait()
	close(stop)
	flips.Wait()

	n := 0
	for _, s := range up.seen() {
		got := s.Header.Get("Authorization")
		switch s.Path {
		case "/v1":
			n++
			if got != "Bearer "+real {
				t.Errorf("a /v1 request, allowed only by version 1, reached the upstream without the secret version 1 swaps in")
			}
		case "/v2":
			n++
			if got != "Bearer "+surrogate {
				t.Errorf("a /v2 request, allowed only by version 2, reached the upstream with the real value, which version 2 keeps from this host")
			}
		}
	}
	if n == 0 {
		t.Fatal("no request got through while the policy flipped")
	}
}

// loadSecrets compiles each secret as validation does, then loads them.
func loadSecrets(specs map[string]policy.Secret, getenv func(string) string) (*secrets.Set, error) {
	var scopes []policy.SecretScope
	for _, name := range slices.Sorted(maps.Keys(specs)) {
		sc, err := policy.CompileSecret(name, specs[name])
		if err != nil {
			return nil, err
		}
		scopes = append(scopes, sc)
	}
	return secrets.Load(scopes, getenv)
}

func mustCompile(t testing.TB, p *policy.Policy) *policy.Compiled {
	t.Helper()
	c, err := p.Compile()
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return c
}
