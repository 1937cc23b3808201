package bench

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/testutil/fakemodel"
)

// inferencePair is a fake model backend and a Router in front of it, both
// on loopback, with one keep-alive client for each path so direct and
// routed calls are measured side by side in the same run.
type inferencePair struct {
	backend *fakemodel.Server
	router  *httptest.Server
	client  *http.Client
	br      *bufio.Reader // reused: a fresh 64 KiB buffer per call would dominate the small calls
}

func newInferencePair(b *testing.B, behavior fakemodel.Behavior) *inferencePair {
	b.Helper()
	be := fakemodel.New()
	be.Set(behavior)
	r, err := inference.NewRouter(inference.Config{Routes: []inference.Route{{
		Name: "bench", BaseURL: be.URL + "/v1", Model: "bench-model",
		Protocols: []string{inference.OpenAIChatCompletions, inference.OpenAIEmbeddings},
		APIKey:    inference.KeySource{FromEnv: "BENCH_KEY"},
	}}}, inference.Options{Getenv: func(string) string { return "sk-bench" }})
	if err != nil {
		b.Fatal(err)
	}
	rs := httptest.NewServer(r)
	b.Cleanup(func() { rs.Close(); be.Close() })
	return &inferencePair{backend: be, router: rs,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		br:     bufio.NewReaderSize(nil, 64<<10)}
}

// post sends one request and returns the time to the first line of the
// body, the number of SSE events, and the total time.
func (p *inferencePair) post(b *testing.B, base, path, body string) (ttfb time.Duration, events int, total time.Duration) {
	start := time.Now()
	resp, err := p.client.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s: %s", base, resp.Status)
	}
	br := p.br
	br.Reset(resp.Body)
	for {
		line, err := br.ReadSlice('\n')
		if ttfb == 0 && len(line) > 0 {
			ttfb = time.Since(start)
		}
		if len(line) > 5 && string(line[:5]) == "data:" {
			events++
		}
		if err == io.EOF {
			break
		}
		if err != nil && err != bufio.ErrBufferFull {
			b.Fatal(err)
		}
	}
	return ttfb, events, time.Since(start)
}

func p50(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

const streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// BenchmarkInferenceTTFB: time to the first streamed byte, direct and
// through the Router, alternating per iteration. Target: added ≤ 1 ms p50.
func BenchmarkInferenceTTFB(b *testing.B) {
	p := newInferencePair(b, fakemodel.Behavior{Tokens: 3})
	var direct, routed []time.Duration
	for i := 0; i < b.N+20; i++ {
		d, _, _ := p.post(b, p.backend.URL, "/v1/chat/completions", streamBody)
		r, _, _ := p.post(b, p.router.URL, "/v1/chat/completions", streamBody)
		if i >= 20 {
			direct, routed = append(direct, d), append(routed, r)
		}
	}
	dp, rp := p50(direct), p50(routed)
	b.ReportMetric(float64(dp.Microseconds()), "direct_p50_us")
	b.ReportMetric(float64(rp.Microseconds()), "routed_p50_us")
	b.ReportMetric(float64((rp - dp).Microseconds()), "added_p50_us")
}

// BenchmarkInferenceStream: streamed events per second of a long answer,
// through the Router divided by direct. Target ≥ 0.95.
func BenchmarkInferenceStream(b *testing.B) {
	const tokens = 5000
	p := newInferencePair(b, fakemodel.Behavior{Tokens: tokens})
	var dt, rt time.Duration
	var de, re int
	for i := 0; i < b.N+1; i++ {
		_, e1, t1 := p.post(b, p.backend.URL, "/v1/chat/completions", streamBody)
		_, e2, t2 := p.post(b, p.router.URL, "/v1/chat/completions", streamBody)
		if e1 != e2 || e1 < tokens {
			b.Fatalf("events direct %d routed %d", e1, e2)
		}
		if i > 0 {
			dt, rt, de, re = dt+t1, rt+t2, de+e1, re+e2
		}
	}
	dr, rr := float64(de)/dt.Seconds(), float64(re)/rt.Seconds()
	b.ReportMetric(dr, "direct_events/s")
	b.ReportMetric(rr, "routed_events/s")
	b.ReportMetric(rr/dr, "stream_ratio")
}

// BenchmarkInferenceSmall: small non-streamed requests per second, one at
// a time on a keep-alive connection, routed divided by direct. Target ≥ 0.5.
func BenchmarkInferenceSmall(b *testing.B) {
	p := newInferencePair(b, fakemodel.Behavior{})
	const body = `{"model":"m","input":"hello"}`
	const batch = 200
	var dt, rt time.Duration
	for i := 0; i < b.N+1; i++ {
		s := time.Now()
		for range batch {
			p.post(b, p.backend.URL, "/v1/embeddings", body)
		}
		d := time.Since(s)
		s = time.Now()
		for range batch {
			p.post(b, p.router.URL, "/v1/embeddings", body)
		}
		r := time.Since(s)
		if i > 0 {
			dt, rt = dt+d, rt+r
		}
	}
	n := float64(b.N * batch)
	b.ReportMetric(n/dt.Seconds(), "direct_req/s")
	b.ReportMetric(n/rt.Seconds(), "routed_req/s")
	b.ReportMetric(dt.Seconds()/rt.Seconds(), "rps_ratio")
}
