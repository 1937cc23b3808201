package httpproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

var synth = netip.MustParseAddr("198.18.0.1")

type harness struct {
	addr   string
	dialer *egresstest.Dialer
	audit  *egresstest.AuditBuffer
}

func start(t *testing.T, upstream string) *harness {
	t.Helper()
	h := &harness{dialer: &egresstest.Dialer{Addr: upstream}, audit: &egresstest.AuditBuffer{}}
	s := &Server{
		Gate: &gate.Gate{
			Decider: egresstest.Decider{"allowed.test": true, "example.com": true, "2001:db8::1": true},
			Dialer:  h.dialer,
			Audit:   audit.New(h.audit),
		},
		Names: egresstest.Names{synth: "allowed.test"},
	}
	h.addr = egresstest.Serve(t, s.Serve)
	return h
}

func (h *harness) dial(t *testing.T) *net.TCPConn { return egresstest.Dial(t, h.addr) }

func TestConnectRelaysWithHalfClose(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	// The first payload byte travels with the request, as eager clients
	// send it.
	io.WriteString(c, "CONNECT allowed.test:5432 HTTP/1.1\r\nHost: allowed.test:5432\r\n\r\n\x00ahead")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	io.WriteString(c, " after")
	c.CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "echo:\x00ahead after" {
		t.Fatalf("got %q %v", got, err)
	}
	reqs := h.dialer.Requests()
	if len(reqs) != 1 || reqs[0].Host != "allowed.test" || reqs[0].Port != 5432 || reqs[0].Via != egress.ViaHTTPConnect {
		t.Fatalf("dialled %+v", reqs)
	}
}

func TestConnectTargets(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	for target, want := range map[string]egress.Request{
		"198.18.0.1:443":    {Host: "allowed.test", Port: 443},
		"[2001:db8::1]:443": {IP: netip.MustParseAddr("2001:db8::1"), Port: 443},
		"Allowed.Test.:443": {Host: "allowed.test", Port: 443},
	} {
		c := h.dial(t)
		io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", target, resp, err)
		}
		reqs := h.dialer.Requests()
		got := reqs[len(reqs)-1]
		if got.Host != want.Host || got.IP != want.IP || got.Port != want.Port {
			t.Errorf("%s: dialled %+v", target, got)
		}
	}
}

type denyJSON struct {
	Error, Reason, Host, Binary, Policy string
	Port                                int
	NextSteps                           string `json:"next_steps"`
}

func readDeny(t *testing.T, c net.Conn, method string, status int) denyJSON {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" || !strings.HasPrefix(resp.Header.Get("X-Corral-Policy"), "deny") {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	var body denyJSON
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body
}

func TestConnectDenied(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	io.WriteString(c, "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
	body := readDeny(t, c, http.MethodConnect, http.StatusForbidden)
	if body.Error != "connection denied by corral policy" || body.Reason != egress.ReasonNoPolicy ||
		body.Host != "evil.test" || body.Port != 443 || !strings.Contains(body.NextSteps, "corral policy set") {
		t.Fatalf("body %+v", body)
	}
	if len(h.dialer.Requests()) != 0 {
		t.Fatal("dialled a denied target")
	}
	evs := h.audit.Events(t)
	if len(evs) != 1 || evs[0][audit.FieldEvent] != audit.NetConnectDenied || evs[0]["via"] != egress.ViaHTTPConnect {
		t.Fatalf("events %v", evs)
	}
}

func TestConnectUpstreamUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	h := start(t, closed)
	c := h.dial(t)
	io.WriteString(c, "CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
	if body := readDeny(t, c, http.MethodConnect, http.StatusBadGateway); body.Reason != egress.ReasonUpstream {
		t.Fatalf("body %+v", body)
	}
}

// TestUpstreamTimeoutIs504: a slow destination is a 504, which clients
// that show only the status line tell apart from a dead one's 502.
func TestUpstreamTimeoutIs504(t *testing.T) {
	h := start(t, "")
	h.dialer.Err = fmt.Errorf("dial allowed.test: %w", context.DeadlineExceeded)
	c := h.dial(t)
	io.WriteString(c, "GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if body := readDeny(t, c, http.MethodGet, http.StatusGatewayTimeout); body.Reason != egress.ReasonUpstreamTimeout {
		t.Fatalf("body %+v", body)
	}
	evs := h.audit.Events(t)
	if len(evs) != 1 || evs[0][audit.FieldEvent] != audit.NetConnectFailed || evs[0]["reason"] != egress.ReasonUpstreamTimeout {
		t.Fatalf("events %v", evs)
	}
}

func TestConnectFrontedSNI(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	io.WriteString(c, "CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	err := tls.Client(c, &tls.Config{ServerName: "evil.test"}).Handshake()
	if err == nil {
		t.Fatal("fronted handshake completed")
	}
	evs := h.audit.Events(t)
	if len(evs) != 2 || evs[1][audit.FieldEvent] != audit.NetConnectDenied || evs[1]["reason"] != egress.ReasonSNIMismatch {
		t.Fatalf("events %v", evs)
	}
}

func TestConnectMatchingSNI(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello over tls")
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	defer srv.Close()
	h := start(t, srv.Listener.Addr().String())
	client := srv.Client()
	tr := client.Transport.(*http.Transport)
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: h.addr})
	// httptest's certificate names example.com, so the SNI is always
	// example.com: it passes only when CONNECT names the same host.
	tr.TLSClientConfig.ServerName = "example.com"
	resp, err := client.Get("https://example.com/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello over tls" {
		t.Fatalf("body %q", b)
	}
	tr.CloseIdleConnections()
	if resp, err := client.Get("https://allowed.test/"); err == nil {
		resp.Body.Close()
		t.Fatal("SNI example.com passed through CONNECT allowed.test")
	}
	evs := h.audit.Events(t)
	if last := evs[len(evs)-1]; last[audit.FieldEvent] != audit.NetConnectDenied || last["reason"] != egress.ReasonSNIMismatch {
		t.Fatalf("events %v", evs)
	}
}

func TestForward(t *testing.T) {
	type seen struct {
		URI, Host, Method, Body string
		Header                  http.Header
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.RequestURI, r.Host, r.Method, string(b), r.Header}
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Up", "1")
		io.WriteString(w, "forwarded")
	}))
	defer srv.Close()
	h := start(t, srv.Listener.Addr().String())

	c := h.dial(t)
	io.WriteString(c, "GET http://allowed.test/path?q=1 HTTP/1.1\r\nHost: evil.test\r\n"+
		"Proxy-Connection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\nProxy-Authorization: Basic eA==\r\nX-Keep: yes\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "forwarded" || resp.Header.Get("X-Up") != "1" ||
		resp.Header.Get("Keep-Alive") != "" || !resp.Close {
		t.Fatalf("response %d %q %v close=%v", resp.StatusCode, body, resp.Header, resp.Close)
	}
	s := <-got
	if s.URI != "/path?q=1" || s.Host != "allowed.test" {
		t.Fatalf("upstream saw %q for host %q", s.URI, s.Host)
	}
	for _, h := range []string{"Proxy-Connection", "X-Secret", "Proxy-Authorization", "User-Agent"} {
		if _, ok := s.Header[h]; ok {
			t.Errorf("upstream got %s", h)
		}
	}
	if s.Header.Get("X-Keep") != "yes" {
		t.Errorf("end-to-end header dropped: %v", s.Header)
	}
	if reqs := h.dialer.Requests(); len(reqs) != 1 || reqs[0].Port != 80 || reqs[0].Via != egress.ViaHTTPForward {
		t.Fatalf("dialled %+v", reqs)
	}

	// A real client, a chunked upload, and a synthetic address in the URI.
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: h.addr})}}
	resp, err = client.Post("http://198.18.0.1:8080/up", "text/plain", io.MultiReader(strings.NewReader("chunk"), strings.NewReader("ed")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s = <-got
	if s.Method != "POST" || s.Body != "chunked" || s.Host != "allowed.test:8080" || s.URI != "/up" {
		t.Fatalf("upstream saw %+v", s)
	}
}

func TestForwardExpectContinue(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer srv.Close()
	h := start(t, srv.Listener.Addr().String())
	c := h.dial(t)
	io.WriteString(c, "PUT http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("interim %q %v", line, err)
	}
	if line, _ := br.ReadString('\n'); line != "\r\n" {
		t.Fatalf("interim response carries headers: %q", line)
	}
	io.WriteString(c, "data")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "data" {
		t.Fatalf("body %q", b)
	}
}

func TestForwardDenied(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	io.WriteString(c, "GET http://evil.test:8080/ HTTP/1.1\r\nHost: evil.test:8080\r\n\r\n")
	if body := readDeny(t, c, http.MethodGet, http.StatusForbidden); body.Reason != egress.ReasonNoPolicy || body.Host != "evil.test" || body.Port != 8080 {
		t.Fatalf("body %+v", body)
	}
}

func TestBadRequests(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	for _, req := range []string{
		"GET /relative HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET https://allowed.test/ HTTP/1.1\r\n\r\n",
		"CONNECT allowed.test HTTP/1.1\r\n\r\n",
		"CONNECT allowed.test:0 HTTP/1.1\r\n\r\n",
		"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n",
		"CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\n\r\n",
		"GET http://user:pw@allowed.test/ HTTP/1.1\r\n\r\n",
		// Opaque targets name no host: written on, "x://allowed.test"
		// would name one the gate never saw.
		"GET http:allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http:x://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"\x16\x03\x01garbage\r\n\r\n",
	} {
		c := h.dial(t)
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %v %v", req, resp, err)
		}
	}
	c := h.dial(t)
	io.WriteString(c, "GET http://allowed.test/ HTTP/1.1\r\nX: "+strings.Repeat("a", MaxHeaderBytes)+"\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized head: %v %v", resp, err)
	}
	if n := len(h.dialer.Requests()); n != 0 {
		t.Fatalf("dialled %d times for bad requests", n)
	}
}

func TestHeaderDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the header timeout")
	}
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	c.SetDeadline(time.Now().Add(HeaderTimeout + 5*time.Second))
	io.WriteString(c, "CONNECT allowed.test:443 HTTP/1.1\r\n")
	start := time.Now()
	_, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		t.Logf("read: %v", err)
	}
	if d := time.Since(start); d < HeaderTimeout-time.Second || d > HeaderTimeout+4*time.Second {
		t.Fatalf("slow client dropped after %v", d)
	}
}

// Plain HTTP through a CONNECT tunnel is checked request by request: a
// keep-alive request naming another host served at the same address is
// domain fronting, refused like the first one would be.
func TestConnectKeepAliveFronting(t *testing.T) {
	rec := &egresstest.HostRecorder{}
	h := start(t, egresstest.Upstream(t, rec.Serve))
	c := h.dial(t)
	io.WriteString(c, "CONNECT allowed.test:80 HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	io.WriteString(c, "GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	io.WriteString(c, "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("the fronted request got an answer: %v", resp.Status)
	}
	evs := h.audit.Events(t)
	if last := evs[len(evs)-1]; last[audit.FieldEvent] != audit.NetConnectDenied || last["reason"] != egress.ReasonHostMismatch {
		t.Fatalf("events %v", evs)
	}
	if hosts := rec.Hosts(); len(hosts) != 1 || hosts[0] != "allowed.test" {
		t.Fatalf("upstream saw %v, want only the first request", hosts)
	}
}
