package inspect_test

import (
	"crypto/x509"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

// A scoped upstream that echoes the credential must not hand the real
// value back into the sandbox, in headers or body.
func TestEchoedSecretScrubbedFromResponse(t *testing.T) {
	const real = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
	set, err := loadSecrets(map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "REAL", Hosts: []string{apiHost}},
	}, func(string) string { return real })
	if err != nil {
		t.Fatal(err)
	}
	surrogate := strings.TrimPrefix(set.Env()[0], "GH_TOKEN=")
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessFull })), secrets: set})
	for _, h2 := range []bool{true, false} {
		r := do(t, h.client(h2), "GET", h.url("/echo-auth"), http.Header{
			"Authorization":   {"Bearer " + surrogate},
			"Accept-Encoding": {"gzip"},
		}, "")
		last := up.seen()[len(up.seen())-1]
		if got := last.Header.Get("Authorization"); got != "Bearer "+real {
			t.Fatalf("upstream got %q, want the real token", got)
		}
		// A compressed echo could not be scrubbed.
		if got := last.Header.Get("Accept-Encoding"); got != "" {
			t.Errorf("h2=%v: the scoped upstream was offered encoding %q", h2, got)
		}
		if strings.Contains(r.body, real) || strings.Contains(r.Header.Get("X-Echo"), real) {
			t.Errorf("h2=%v: the response carried the real token back: %q %q", h2, r.Header.Get("X-Echo"), r.body)
		}
		if r.body != "you sent Bearer "+surrogate {
			t.Errorf("h2=%v: body %q, want the echo with the surrogate", h2, r.body)
		}
	}
}

// An upgrade to anything but WebSocket would turn the connection into an
// uninspected relay (h2c smuggling); it is refused.
func TestNonWebSocketUpgradeRefused(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }))})
	for _, proto := range []string{"h2c", "tunnel"} {
		r := h.raw(t, "GET", "/", apiHost, "Connection: Upgrade", "Upgrade: "+proto)
		if r.StatusCode != http.StatusForbidden {
			t.Errorf("Upgrade: %s got %d, want 403", proto, r.StatusCode)
		}
		if d := denial(t, r); d != nil && d["reason"] != "l7_upgrade_not_allowed" {
			t.Errorf("Upgrade: %s: reason %v", proto, d["reason"])
		}
	}
	for _, s := range up.seen() {
		if s.Header.Get("Upgrade") != "" {
			t.Errorf("the upstream saw an upgrade request: %+v", s)
		}
	}
}

// Upstream certificates are always verified: with roots that do not
// include the upstream's CA, the request fails with a 502 and never
// reaches it, whatever the client trusts.
func TestUntrustedUpstreamRefused(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessFull }))})
	h.in.RootCAs = func() *x509.CertPool { return x509.NewCertPool() }
	r := do(t, h.client(false), "GET", h.url("/x"), nil, "")
	if r.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502 from an upstream corral cannot verify", r.StatusCode)
	}
	if got := up.uris(); len(got) != 0 {
		t.Errorf("the unverified upstream received %q", got)
	}
}
