package reload

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
)

// hostDecider allows the hosts of its policy's endpoints, so a test can
// tell which version decided.
type hostDecider struct{ c *policy.Compiled }

func (h hostDecider) Decide(_ context.Context, r egress.Request) egress.Decision {
	for _, g := range h.c.Grants {
		for _, t := range g.Targets {
			if t.Host.Match(r.Host) {
				return egress.Decision{Allow: true, Policy: g.Name}
			}
		}
	}
	return egress.Decision{Reason: egress.ReasonNoPolicy}
}

func (h hostDecider) DecideHTTP(ctx context.Context, r egress.Request, _ egress.HTTPRequest) egress.HTTPDecision {
	d := h.Decide(ctx, r)
	return egress.HTTPDecision{Allow: d.Allow, Policy: d.Policy, Reason: d.Reason}
}

func (h hostDecider) NameAllowed(host string) bool {
	return h.Decide(context.Background(), egress.Request{Host: host}).Allow
}

type fakeBuild struct {
	mu    sync.Mutex
	built []*policy.Compiled
	fail  error
}

func (f *fakeBuild) build(c *policy.Compiled, _ *Snapshot) (Decider, *secrets.Set, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, nil, f.fail
	}
	f.built = append(f.built, c)
	return hostDecider{c}, nil, nil
}

func newReloader(t *testing.T) (*Reloader, *fakeBuild, *bytes.Buffer) {
	t.Helper()
	start, err := policy.Parse([]byte("version: 1\nnetwork_policies:\n  a:\n    endpoints: [{host: a.test, port: 443}]\n"), "start.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := start.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var trail bytes.Buffer
	fb := &fakeBuild{}
	r, err := New(c, fb.build, audit.New(&trail), nil)
	if err != nil {
		t.Fatal(err)
	}
	return r, fb, &trail
}

// TestReloadLastKnownGood: a reload that fails validation, changes a
// static section or fails to build leaves the running snapshot and its
// version; one that succeeds, partial or not, is the next version, and
// readers see it whole.
func TestReloadLastKnownGood(t *testing.T) {
	r, fb, trail := newReloader(t)
	before := r.Current()
	if before.Version != 1 || len(fb.built) != 1 {
		t.Fatalf("start: version %d, %d builds", before.Version, len(fb.built))
	}

	if err := r.Set([]byte("version: 1\nnetwork: {mode: proxi}\n"), "typo.yaml"); err == nil {
		t.Fatal("an invalid policy was accepted")
	}
	if err := r.Set([]byte("version: 1\nlimits: {pids: 7}\n"), "limits.yaml"); err == nil || !strings.Contains(err.Error(), "limits") {
		t.Fatalf("a reload changing limits: %v, want a refusal naming limits", err)
	}
	if err := r.Set([]byte("version: 1\nnetwork_policies:\n  b:\n    endpoints: [{host: 198.18.1.1, port: 443}]\n"), "synthetic.yaml"); err == nil {
		t.Fatal("a policy naming an address the dialer always refuses was accepted")
	}
	fb.fail = errors.New("compile failed")
	if err := r.Set([]byte("version: 1\nnetwork_policies:\n  b:\n    endpoints: [{host: b.test, port: 443}]\n"), "b.yaml"); err == nil {
		t.Fatal("a policy the engine refused was accepted")
	}
	if r.Current() != before || len(fb.built) != 1 {
		t.Fatalf("failed reloads changed the running policy (version %d, %d builds)", r.Current().Version, len(fb.built))
	}
	if !r.Decide(context.Background(), egress.Request{Host: "a.test", Port: 443}).Allow {
		t.Fatal("after failed reloads the first policy no longer decides")
	}

	fb.fail = nil
	swaps := 0
	r.OnSwap(func(context.Context) { swaps++ })
	// Partial: only network_policies; the rest stays as it runs.
	if err := r.Set([]byte("version: 1\nnetwork_policies:\n  b:\n    endpoints: [{host: b.test, port: 443}]\n"), "b.yaml"); err != nil {
		t.Fatal(err)
	}
	now := r.Current()
	if now.Version != 2 || len(fb.built) != 2 || now.Policy != fb.built[1] || swaps != 1 {
		t.Fatalf("after a good reload: version %d, %d builds, %d swap hooks", now.Version, len(fb.built), swaps)
	}
	if _, ok := now.Policy.Policy.NetworkPolicies["b"]; !ok {
		t.Errorf("the reloaded policy lacks the new network policy")
	}
	if r.Decide(context.Background(), egress.Request{Host: "a.test", Port: 443}).Allow || !r.NameAllowed("b.test") {
		t.Error("the reloader's decisions are not the new snapshot's")
	}
	if got := strings.Count(trail.String(), `"event":"policy.reload_failed"`); got != 4 {
		t.Errorf("%d policy.reload_failed events, want 4:\n%s", got, trail)
	}
	if !strings.Contains(trail.String(), `"event":"policy.reloaded"`) || !strings.Contains(trail.String(), `"version":2`) {
		t.Errorf("no policy.reloaded event for version 2:\n%s", trail)
	}
}

// TestSnapshotsAreWhole: readers racing reloads always see a snapshot
// whose decider was built for its own policy.
func TestSnapshotsAreWhole(t *testing.T) {
	r, _, _ := newReloader(t)
	yamls := [][]byte{
		[]byte("version: 1\nnetwork_policies:\n  b:\n    endpoints: [{host: b.test, port: 443}]\n"),
		[]byte("version: 1\nnetwork_policies:\n  c:\n    endpoints: [{host: c.test, port: 443}]\n"),
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; i < 200; i++ {
			if err := r.Set(yamls[i%2], "flip.yaml"); err != nil {
				t.Error(err)
			}
		}
		close(stop)
	})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				s := r.Current()
				if s.Decider.(hostDecider).c != s.Policy {
					t.Error("a snapshot's decider belongs to another version")
					return
				}
			}
		})
	}
	wg.Wait()
	if v := r.Current().Version; v != 201 {
		t.Errorf("version %d after 200 reloads, want 201", v)
	}
}
