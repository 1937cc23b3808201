package bench

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/service"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

// advisorEnv is a sandbox's egress decision path (gate, reloader, decision
// engine, audit file) with its policy advisor, without a sandbox: the
// figures are the advisor's own, not process start-up.
type advisorEnv struct {
	svc  *service.Service
	gate *gate.Gate
	aud  *audit.Logger
}

func newAdvisorEnv(b *testing.B, observe bool) *advisorEnv {
	b.Helper()
	p, err := policy.Parse([]byte("version: 1\nnetwork:\n  mode: proxy\n"), "bench")
	if err != nil {
		b.Fatal(err)
	}
	c, err := p.Compile()
	if err != nil {
		b.Fatal(err)
	}
	sink, err := audit.Open(filepath.Join(b.TempDir(), "audit.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sink.Close() })
	aud := sink.For("bench", "default")
	rl, err := reload.New(c, func(c *policy.Compiled, _ *reload.Snapshot) (reload.Decider, *secrets.Set, error) {
		e, err := decide.New(c, nil)
		return e, nil, err
	}, aud, nil)
	if err != nil {
		b.Fatal(err)
	}
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { up.Close() })
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	e := &advisorEnv{aud: aud, gate: &gate.Gate{Decider: rl, Dialer: &egresstest.Dialer{Addr: up.Addr().String()}, Audit: aud}}
	if !observe {
		return e
	}
	// The probe's answer does not matter here; resolving stays local.
	svc, err := service.New(service.Config{Dir: b.TempDir(), Reloader: rl, Audit: aud, NoProbe: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go svc.Run(ctx)
	b.Cleanup(func() { cancel(); svc.Close() })
	e.svc = svc
	e.gate.Advice = svc
	return e
}

func (e *advisorEnv) connect(host string) error {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	t, err := e.gate.Connect(context.Background(), server, egress.Request{Host: host, Port: 7000,
		Identity: egress.Identity{Binary: "/usr/bin/curl"}})
	if err == nil {
		t.Up.Close()
	}
	return err
}

func p50ms(d []time.Duration) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)/2]) / float64(time.Millisecond)
}

// BenchmarkAdvisorLatency measures, over ADVISOR_RUNS hosts (default 20),
// the time from a first denied connection to its pending draft being
// visible (target p50 ≤ 1 s) and from the start of an approval to the
// first allowed connection (target p50 ≤ 200 ms). Each host is a new key,
// denied, proposed, approved, then connected to.
func BenchmarkAdvisorLatency(b *testing.B) {
	e := newAdvisorEnv(b, true)
	runs := envInt(b, "ADVISOR_RUNS", 20)
	var toDraft, toAllowed []time.Duration
	n := 0
	for range b.N {
		for range runs {
			// The store holds at most 10 pending drafts; each is approved
			// before the next host.
			n++
			host := fmt.Sprintf("h%d.bench.example", n)
			start := time.Now()
			if err := e.connect(host); err == nil {
				b.Fatal("an unknown host was allowed")
			}
			var id string
			for id == "" {
				if time.Since(start) > 10*time.Second {
					b.Fatalf("no draft for %s", host)
				}
				id, _ = e.svc.For(egress.Request{Host: host, Port: 7000, Identity: egress.Identity{Binary: "/usr/bin/curl"}})
				if id == "" {
					time.Sleep(200 * time.Microsecond)
				}
			}
			toDraft = append(toDraft, time.Since(start))
			start = time.Now()
			if _, err := e.svc.Approve(context.Background(), id, drafts.Actor{UID: 0, User: "bench"}, ""); err != nil {
				b.Fatal(err)
			}
			if err := e.connect(host); err != nil {
				b.Fatalf("after approval: %v", err)
			}
			toAllowed = append(toAllowed, time.Since(start))
		}
	}
	b.ReportMetric(p50ms(toDraft), "denial_to_draft_p50_ms")
	b.ReportMetric(p50ms(toAllowed), "approval_to_allowed_p50_ms")
}

// BenchmarkAdvisorDeniedConnection is one denied connection through the
// gate with its audit event, with the advisor observing it (the denial
// flood case: one key, repeated) and without, side by side; the
// difference is what the advisor adds per denial (target ≤ 5 µs).
func BenchmarkAdvisorDeniedConnection(b *testing.B) {
	for _, observe := range []bool{false, true} {
		name := "without_advisor"
		if observe {
			name = "with_advisor"
		}
		b.Run(name, func(b *testing.B) {
			e := newAdvisorEnv(b, observe)
			b.ResetTimer()
			for range b.N {
				if err := e.connect("flood.bench.example"); err == nil {
					b.Fatal("allowed")
				}
			}
		})
	}
}

// BenchmarkAdvisorObserve is the advisor's own cost per denied
// connection event: the observer alone, one key repeated.
func BenchmarkAdvisorObserve(b *testing.B) {
	e := newAdvisorEnv(b, true)
	ev := audit.NetConnectEvent{Outcome: audit.OutcomeDenied, Via: egress.ViaTransparent, Host: "flood.bench.example", Port: 7000,
		Binary: "/usr/bin/curl", Reason: egress.ReasonNoPolicy}
	e.svc.Observe(ev)
	b.ResetTimer()
	for range b.N {
		e.svc.Observe(ev)
	}
}
