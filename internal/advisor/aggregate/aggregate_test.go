package aggregate

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func denied(host string, port uint16, bin string) egress.Request {
	return egress.Request{Host: host, Port: port, Identity: egress.Identity{Binary: bin}, Via: egress.ViaTransparent}
}

var noPolicy = egress.Decision{Reason: egress.ReasonNoPolicy}

func TestDedup(t *testing.T) {
	c := &clock{time.Unix(1000, 0)}
	a := New(Config{Now: c.now})
	defer a.Close()
	argv := []string{"curl", "-H", "Authorization: Bearer abcdefgh12345678", "https://api.example.com"}
	a.RecordConnect(denied("api.example.com", 443, "/usr/bin/curl"), noPolicy, func() []string { return argv }, 0)
	c.t = c.t.Add(time.Second)
	a.RecordConnect(denied("api.example.com", 443, "/usr/bin/curl"), noPolicy, func() []string {
		t.Error("command line read for a known key")
		return nil
	}, 4)
	a.RecordConnect(denied("api.example.com", 443, "/usr/bin/python3"), noPolicy, nil, 0)
	a.RecordConnect(denied("api.example.com", 80, "/usr/bin/curl"), noPolicy, nil, 0)
	if n, _ := a.Stats(); n != 3 {
		t.Fatalf("keys = %d, want 3 (host, port, binary)", n)
	}
	e, ok := a.Get(Key{"api.example.com", 443, "/usr/bin/curl"})
	if !ok {
		t.Fatal("entry missing")
	}
	if e.Count != 6 || e.Suppressed != 4 {
		t.Errorf("count %d suppressed %d, want 6 and 4", e.Count, e.Suppressed)
	}
	if !e.FirstSeen.Equal(time.Unix(1000, 0)) || !e.LastSeen.Equal(time.Unix(1001, 0)) {
		t.Errorf("first %v last %v", e.FirstSeen, e.LastSeen)
	}
	if strings.Contains(e.Cmdline, "abcdefgh") || !strings.Contains(e.Cmdline, "[REDACTED]") {
		t.Errorf("cmdline %q: want the first one, sanitised", e.Cmdline)
	}
	if e.Reason != egress.ReasonNoPolicy {
		t.Errorf("reason %q", e.Reason)
	}
}

func TestLiteralIPKey(t *testing.T) {
	a := New(Config{Probe: func(context.Context, string) ([]netip.Addr, error) {
		t.Error("a literal IP was probed")
		return nil, nil
	}})
	defer a.Close()
	a.RecordConnect(egress.Request{IP: netip.MustParseAddr("::ffff:10.1.2.3"), Port: 5432, Identity: egress.Identity{Binary: "/usr/bin/psql"}}, noPolicy, nil, 0)
	e, ok := a.Get(Key{"10.1.2.3", 5432, "/usr/bin/psql"})
	if !ok {
		t.Fatalf("no entry keyed by the unmapped IP: %+v", a.Snapshot())
	}
	if len(e.Probe.Addrs) != 1 || e.Probe.Addrs[0] != netip.MustParseAddr("10.1.2.3") {
		t.Errorf("probe %+v, want the literal address itself", e.Probe)
	}
}

func TestCapAndOverflow(t *testing.T) {
	a := New(Config{MaxKeys: 10})
	defer a.Close()
	for i := range 25 {
		a.RecordConnect(denied(fmt.Sprintf("h%d.example.com", i), 443, "/usr/bin/curl"), noPolicy, nil, 0)
	}
	// Known keys keep counting when full.
	a.RecordConnect(denied("h0.example.com", 443, "/usr/bin/curl"), noPolicy, nil, 0)
	a.RecordDNS("new.example.com", 1, 0)
	keys, overflow := a.Stats()
	if keys != 10 || overflow != 16 {
		t.Errorf("keys %d overflow %d, want 10 and 16", keys, overflow)
	}
	if e, _ := a.Get(Key{"h0.example.com", 443, "/usr/bin/curl"}); e.Count != 2 {
		t.Errorf("existing key count %d, want 2", e.Count)
	}
}

func TestDNSThenConnectIsOneKey(t *testing.T) {
	c := &clock{time.Unix(1000, 0)}
	a := New(Config{Now: c.now, MaxKeys: 1})
	defer a.Close()
	a.RecordDNS("API.Example.com.", 3, 2)
	c.t = c.t.Add(time.Second)
	// Full with the DNS key: the connection still gets its key, because
	// it takes the DNS key's place.
	a.RecordConnect(denied("api.example.com", 443, "/usr/bin/curl"), noPolicy, nil, 0)
	a.RecordDNS("api.example.com", 1, 0)
	snap := a.Snapshot()
	if len(snap) != 1 {
		t.Fatalf("entries %+v, want one", snap)
	}
	e := snap[0]
	if e.Key != (Key{"api.example.com", 443, "/usr/bin/curl"}) {
		t.Errorf("key %v", e.Key)
	}
	if e.Count != 5 || e.DNSCount != 4 || e.Suppressed != 2 {
		t.Errorf("count %d dns %d suppressed %d, want 5, 4, 2", e.Count, e.DNSCount, e.Suppressed)
	}
	if !e.FirstSeen.Equal(time.Unix(1000, 0)) {
		t.Errorf("first seen %v: want the DNS denial's", e.FirstSeen)
	}
	if len(e.Absorbed) != 1 || e.Absorbed[0] != (Key{Host: "api.example.com"}) {
		t.Errorf("absorbed %v", e.Absorbed)
	}
	if _, overflow := a.Stats(); overflow != 0 {
		t.Errorf("overflow %d", overflow)
	}
}

func TestL7SampleCap(t *testing.T) {
	a := New(Config{})
	defer a.Close()
	r := denied("api.example.com", 443, "/usr/bin/curl")
	audit := egress.HTTPDecision{Audit: true}
	for i := range 70 {
		a.RecordHTTP(r, egress.HTTPRequest{Method: "GET", Path: fmt.Sprintf("/items/%d", i)}, egress.HTTPDecision{Allow: true})
	}
	for range 3 {
		a.RecordHTTP(r, egress.HTTPRequest{Method: "GET", Path: "/items/0"}, egress.HTTPDecision{Allow: true})
	}
	a.RecordHTTP(r, egress.HTTPRequest{Method: "POST", Path: "/items/0"}, audit)
	e, _ := a.Get(keyOf(r))
	if len(e.Samples) != DefaultMaxSamples || e.SamplesDropped != 21 || e.Requests != 74 {
		t.Errorf("samples %d dropped %d requests %d, want 50, 21, 74", len(e.Samples), e.SamplesDropped, e.Requests)
	}
	if e.Samples[0].Count != 4 {
		t.Errorf("repeated sample count %d, want 4", e.Samples[0].Count)
	}
	if e.Proto != "http" {
		t.Errorf("proto %q", e.Proto)
	}
	long := "/" + strings.Repeat("a", 2000)
	b := New(Config{})
	defer b.Close()
	b.RecordHTTP(r, egress.HTTPRequest{Method: "GET", Path: long}, audit)
	b.RecordHTTP(r, egress.HTTPRequest{Method: "GET", Path: "/u/token/ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"}, audit)
	e, _ = b.Get(keyOf(r))
	if len(e.Samples[0].Path) != maxPath || e.Samples[0].Decision != SampleAudit {
		t.Errorf("long path stored as %d bytes, decision %q", len(e.Samples[0].Path), e.Samples[0].Decision)
	}
	if strings.Contains(e.Samples[1].Path, "ghp_") {
		t.Errorf("token in path kept: %q", e.Samples[1].Path)
	}
}

func keyOf(r egress.Request) Key { return Key{r.Host, r.Port, r.Identity.Binary} }

func TestProbeOncePerHostAsync(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	a := New(Config{Probe: func(ctx context.Context, host string) ([]netip.Addr, error) {
		calls.Add(1)
		<-release
		return []netip.Addr{netip.MustParseAddr("10.0.0.7")}, nil
	}})
	defer a.Close()
	ch, cancel := a.Subscribe()
	defer cancel()
	// Recording must not wait for the probe.
	done := make(chan struct{})
	go func() {
		a.RecordConnect(denied("db.corp.example", 5432, "/usr/bin/psql"), noPolicy, nil, 0)
		a.RecordConnect(denied("db.corp.example", 5432, "/usr/bin/pg_dump"), noPolicy, nil, 0)
		a.RecordConnect(denied("db.corp.example", 5432, "/usr/bin/psql"), noPolicy, nil, 0)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("recording blocked on the probe")
	}
	<-ch
	_, gen := a.Changes(0)
	close(release)
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("no notification after the probe")
		}
		changed, _ := a.Changes(gen)
		if len(changed) == 2 && changed[0].Probe.Done {
			break
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("probe called %d times, want once for the host", n)
	}
	for _, e := range a.Snapshot() {
		if len(e.Probe.Addrs) != 1 || e.Probe.Addrs[0].String() != "10.0.0.7" {
			t.Errorf("%v probe %+v", e.Key, e.Probe)
		}
	}
}

func TestProbeBudget(t *testing.T) {
	var calls atomic.Int32
	a := New(Config{MaxProbes: 5, MaxProbesPerDomain: 2, Probe: func(context.Context, string) ([]netip.Addr, error) {
		calls.Add(1)
		return nil, nil
	}})
	for i := range 4 {
		a.RecordConnect(denied(fmt.Sprintf("x%d.leak.example", i), 443, ""), noPolicy, nil, 0)
	}
	for i := range 6 {
		a.RecordConnect(denied(fmt.Sprintf("h.d%d.example", i), 443, ""), noPolicy, nil, 0)
	}
	for deadline := time.Now().Add(5 * time.Second); calls.Load() < 5 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	a.Close()
	if n := calls.Load(); n != 5 {
		t.Errorf("probes %d, want 5 (2 for leak.example, then the total budget)", n)
	}
	e, _ := a.Get(Key{"x3.leak.example", 443, ""})
	if !strings.Contains(e.Probe.Skipped, "leak.example") {
		t.Errorf("skipped %q", e.Probe.Skipped)
	}
}

func TestConcurrentRecord(t *testing.T) {
	a := New(Config{})
	defer a.Close()
	ch, cancel := a.Subscribe()
	defer cancel()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				a.RecordConnect(denied(fmt.Sprintf("h%d.example.com", i%20), 443, fmt.Sprint(g%2)), noPolicy, nil, 0)
				a.RecordDNS(fmt.Sprintf("d%d.example.com", i%5), 1, 0)
				a.RecordHTTP(denied("h1.example.com", 443, "0"), egress.HTTPRequest{Method: "GET", Path: "/"}, egress.HTTPDecision{Audit: true})
			}
		}()
	}
	wg.Wait()
	select {
	case <-ch:
	default:
		t.Error("no notification")
	}
	var total uint64
	for _, e := range a.Snapshot() {
		total += e.Count
	}
	if total != 8*500*2 {
		t.Errorf("total %d, want %d", total, 8*500*2)
	}
}

// BenchmarkRecord is the aggregator's cost per denied connection, with a
// watcher subscribed: "repeat" is a known key (the common case), "flood"
// a new host every time (sanitising and probing until the key cap, then
// the overflow counter).
func BenchmarkRecord(b *testing.B) {
	argv := []string{"curl", "-H", "Authorization: Bearer abcdefgh12345678", "https://host.example.com/x"}
	cmdline := func() []string { return argv }
	for _, tc := range []struct {
		name  string
		hosts int
	}{{"repeat", 256}, {"flood", 1 << 16}} {
		b.Run(tc.name, func(b *testing.B) {
			a := New(Config{Probe: func(context.Context, string) ([]netip.Addr, error) { return nil, nil }})
			defer a.Close()
			_, cancel := a.Subscribe()
			defer cancel()
			reqs := make([]egress.Request, tc.hosts)
			for i := range reqs {
				reqs[i] = denied(fmt.Sprintf("host%d.example.com", i), 443, "/usr/bin/curl")
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				a.RecordConnect(reqs[i%len(reqs)], noPolicy, cmdline, 0)
			}
		})
	}
}
