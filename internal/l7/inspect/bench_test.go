package inspect_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

// BenchmarkInspectedRequest is one small keep-alive request through the
// inspector (client TLS terminated, decided, forwarded over TLS), the
// in-process share of what bench/l7.sh measures end to end.
func BenchmarkInspectedRequest(b *testing.B) {
	up := newUpstream(b)
	h := newHarness(b, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
		ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: "/bench"}}}
	}))})
	c := h.clientFor(false, &tls.Config{RootCAs: h.sbPool, ServerName: h.host})
	get := func() {
		resp, err := c.Get(h.url("/bench"))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatal(resp.Status)
		}
	}
	get()
	b.ReportAllocs()
	for b.Loop() {
		get()
	}
}
