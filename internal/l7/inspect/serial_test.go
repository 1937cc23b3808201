package inspect_test

import (
	"crypto/x509"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

// TestSerialKeepAlive: an HTTP/1.1 client's requests go over the one
// connection the gate dialled, in turn, each answered in order.
func TestSerialKeepAlive(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	c := h.client(false)
	for _, p := range []string{"/a", "/b", "/c"} {
		wantOK(t, do(t, c, "GET", h.url(p), nil, ""), "ok GET "+p)
	}
	if n := len(h.dialer.Requests()); n != 0 {
		t.Errorf("inspector dialled %d further upstream connections, want 0", n)
	}
	for _, s := range up.seen() {
		if s.Proto != "HTTP/1.1" {
			t.Errorf("%s forwarded over %s, want HTTP/1.1 for an HTTP/1.1 client", s.RequestURI, s.Proto)
		}
	}
}

// TestSerialRedialsClosedConnection: when the upstream ends a kept
// connection between requests, the next request goes out again on a new
// one (through the guarded dialer) instead of failing.
func TestSerialRedialsClosedConnection(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	c := h.client(false)
	wantOK(t, do(t, c, "GET", h.url("/bye"), nil, ""), "bye")
	wantOK(t, do(t, c, "GET", h.url("/after"), nil, ""), "ok GET /after")
	if n := len(h.dialer.Requests()); n != 1 {
		t.Errorf("inspector dialled %d further upstream connections, want 1", n)
	}
	if h.accepted.Load() != 1 {
		t.Errorf("the client opened %d connections, want 1", h.accepted.Load())
	}
}

// TestSerialLeavesBodiesToTransport: a request with a body on the same
// HTTP/1.1 connection still reaches the upstream whole.
func TestSerialLeavesBodiesToTransport(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessReadWrite }))})
	c := h.client(false)
	wantOK(t, do(t, c, "GET", h.url("/a"), nil, ""), "ok GET /a")
	wantOK(t, do(t, c, "POST", h.url("/b"), nil, `{"x":1}`), "ok POST /b")
	wantOK(t, do(t, c, "GET", h.url("/c"), nil, ""), "ok GET /c")
}

// TestSerialVerifiesUpstream: the HTTP/1.1 path verifies the upstream's
// certificate like the Transport: an upstream whose CA is not trusted
// gets no request, and the client a 502 naming the upstream.
func TestSerialVerifiesUpstream(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, readOnly))})
	h.in.RootCAs = func() *x509.CertPool { return x509.NewCertPool() }
	r := do(t, h.client(false), "GET", h.url("/a"), nil, "")
	if r.StatusCode != http.StatusBadGateway || !strings.Contains(r.body, egress.ReasonUpstream) {
		t.Errorf("got %d %q, want 502 %s", r.StatusCode, r.body, egress.ReasonUpstream)
	}
	if n := len(up.seen()); n != 0 {
		t.Errorf("the untrusted upstream received %d requests", n)
	}
}
