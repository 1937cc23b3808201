package service

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

const base = "version: 1\nnetwork_policies:\n  git:\n    endpoints: [{host: github.com, port: 443}]\n    binaries: [{path: /usr/bin/git}]\n"

var alice = drafts.Actor{UID: 1000, User: "alice"}

// harness is a sandbox's policy, audit trail and advisor, without a
// sandbox.
type harness struct {
	svc *Service
	rl  *reload.Reloader
	aud *audit.Logger
	buf *lockedBuffer
}

// lockedBuffer is the audit trail, written by the advisor's goroutine
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newReloader holds the base policy, reporting to aud.
func newReloader(tb testing.TB, aud *audit.Logger) *reload.Reloader {
	tb.Helper()
	p, err := policy.Parse([]byte(base), "test")
	if err != nil {
		tb.Fatal(err)
	}
	c, err := p.Compile()
	if err != nil {
		tb.Fatal(err)
	}
	build := func(c *policy.Compiled, _ *reload.Snapshot) (reload.Decider, *secrets.Set, error) {
		e, err := decide.New(c, nil)
		return e, nil, err
	}
	rl, err := reload.New(c, build, aud, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return rl
}

func newHarness(t *testing.T, ttl time.Duration) *harness {
	t.Helper()
	var buf lockedBuffer
	aud := audit.New(&buf).For("sb", "default")
	rl := newReloader(t, aud)
	svc, err := New(Config{Dir: t.TempDir(), Reloader: rl, Audit: aud, TTL: ttl,
		Probe: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go svc.Run(ctx)
	t.Cleanup(func() { cancel(); svc.Close() })
	return &harness{svc: svc, rl: rl, aud: aud, buf: &buf}
}

var curl = egress.Request{Host: "api.example.com", Port: 443, Identity: egress.Identity{Binary: "/usr/bin/curl"}}

func (h *harness) deny(r egress.Request) {
	h.aud.Log(audit.NetConnectEvent{Outcome: audit.OutcomeDenied, Via: egress.ViaTransparent, Host: r.Host, Port: r.Port,
		Binary: r.Identity.Binary, Reason: h.rl.Decide(context.Background(), r).Reason})
}

// pending waits for the pending draft answering r.
func (h *harness) pending(t *testing.T, r egress.Request, within time.Duration) drafts.Draft {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if id, _ := h.svc.For(r); id != "" {
			d, err := h.svc.Store().Get(id)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no pending draft for %s within %s; audit:\n%s", r.Target(), within, h.buf.String())
	return drafts.Draft{}
}

// A denial becomes a pending draft within a second; approving it reloads
// the policy so the same connection is allowed; undoing it restores the
// refusal; every step is audited.
func TestDenialApproveUndo(t *testing.T) {
	h := newHarness(t, 0)
	ctx := context.Background()
	if h.rl.Decide(ctx, curl).Allow {
		t.Fatal("curl allowed before any approval")
	}
	h.deny(curl)
	d := h.pending(t, curl, time.Second)
	if d.Chunk.Stage != propose.StageInitial || d.Chunk.Author != propose.AuthorAdvisor {
		t.Fatalf("draft %+v", d)
	}
	if _, err := h.svc.Approve(ctx, d.ID, alice, "looks fine"); err != nil {
		t.Fatal(err)
	}
	if got := h.rl.Decide(ctx, curl); !got.Allow {
		t.Fatalf("after approval: %+v", got)
	}
	got, _ := h.svc.Store().Get(d.ID)
	if got.State != drafts.Approved || got.Loaded == nil || got.Loaded.Version != 2 {
		t.Fatalf("approved draft %+v", got)
	}
	if id, _ := h.svc.For(curl); id != "" {
		t.Errorf("advice still names %s after approval", id)
	}
	if _, err := h.svc.Undo(ctx, d.ID, alice, ""); err != nil {
		t.Fatal(err)
	}
	if got := h.rl.Decide(ctx, curl); got.Allow {
		t.Fatalf("after undo: %+v", got)
	}
	if _, ok := h.rl.Current().Policy.Policy.NetworkPolicies["git"]; !ok || h.rl.Current().Version != 3 {
		t.Errorf("undo changed more than the draft: version %d, %v", h.rl.Current().Version, h.rl.Current().Policy.Policy.NetworkPolicies)
	}
	for _, ev := range []string{audit.DraftProposed, audit.DraftApproved, audit.DraftUndone} {
		if !strings.Contains(h.buf.String(), `"event":"`+ev+`"`) {
			t.Errorf("no %s event in %s", ev, h.buf.String())
		}
	}
}

// Stage 1 (audit) approved, then five reads seen → a refined read-only
// chunk that replaces it; after its approval a write is refused.
func TestRefineAfterAudit(t *testing.T) {
	h := newHarness(t, 0)
	ctx := context.Background()
	h.deny(curl)
	first := h.pending(t, curl, time.Second)
	if _, err := h.svc.Approve(ctx, first.ID, alice, ""); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/v1/a", "/v1/b", "/v1/c", "/v1/d", "/v1/e"} {
		d := h.rl.DecideHTTP(ctx, curl, egress.HTTPRequest{Method: "GET", Path: p})
		outcome := "allow"
		if !d.Allow {
			outcome = "audit"
		}
		h.aud.Log(audit.HTTPRequestEvent{Via: egress.ViaTransparent, Host: curl.Host, Port: curl.Port, Method: "GET", Path: p,
			Decision: outcome, Policy: d.Policy, Binary: "/usr/bin/curl", WouldDeny: d.Audit && !d.Allow})
	}
	second := h.pending(t, curl, time.Second)
	if second.Chunk.Stage != propose.StageRefined || second.Replaces != first.ID {
		t.Fatalf("second draft %+v", second)
	}
	if _, err := h.svc.Approve(ctx, second.ID, alice, ""); err != nil {
		t.Fatal(err)
	}
	if d := h.rl.DecideHTTP(ctx, curl, egress.HTTPRequest{Method: "POST", Path: "/v1/a"}); d.Allow || d.Audit {
		t.Errorf("write after refinement: %+v", d)
	}
	if d := h.rl.DecideHTTP(ctx, curl, egress.HTTPRequest{Method: "GET", Path: "/v1/z"}); !d.Allow {
		t.Errorf("read after refinement: %+v", d)
	}
}

// Two rejections of a host stop new drafts for it until retry; the
// guidance is kept for the agent.
func TestRejectBackoffRetry(t *testing.T) {
	h := newHarness(t, 0)
	ctx := context.Background()
	as := func(bin string) egress.Request {
		r := curl
		r.Identity.Binary = bin
		return r
	}
	for _, bin := range []string{"/usr/bin/curl", "/usr/bin/wget"} {
		h.deny(as(bin))
		d := h.pending(t, as(bin), time.Second)
		got, err := h.svc.Reject(d.ID, alice, "not needed", "use the mirror at mirror.example.com")
		if err != nil || got.Guidance != "use the mirror at mirror.example.com" {
			t.Fatalf("reject: %+v, %v", got, err)
		}
	}
	h.deny(as("/usr/bin/curl"))
	h.deny(as("/usr/bin/python3"))
	time.Sleep(300 * time.Millisecond)
	if list, _ := h.svc.Store().List(); len(list) != 2 {
		t.Fatalf("after two rejections of the host: %d drafts, want 2", len(list))
	}
	out, err := h.svc.Retry(ctx, curl.Host, curl.Port, alice)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 {
		t.Fatalf("retry proposed %d drafts, want 3 (curl, wget, python3)", len(out))
	}
}

// Pending drafts expire and are audited.
func TestExpiry(t *testing.T) {
	h := newHarness(t, 200*time.Millisecond)
	h.deny(curl)
	d := h.pending(t, curl, time.Second)
	// The expiry loop runs at least every 100 ms.
	deadline := time.Now().Add(3 * time.Second)
	for {
		got, _ := h.svc.Store().Get(d.ID)
		id, _ := h.svc.For(curl)
		audited := strings.Contains(h.buf.String(), `"event":"draft.expired"`)
		if got.State == drafts.Expired && id == "" && audited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("draft %s, advice %q, audited %v", got.State, id, audited)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A refusal no chunk can ever answer is not told that one is coming.
func TestAdviceForNeverAllowedAddress(t *testing.T) {
	h := newHarness(t, 0)
	meta := egress.Request{IP: netip.MustParseAddr("169.254.169.254"), Port: 80, Identity: egress.Identity{Binary: "/usr/bin/curl"}}
	id, next := h.svc.For(meta)
	if id != "" || len(next) != 1 || !strings.Contains(next[0], "no policy can open 169.254.169.254") {
		t.Errorf("advice for the metadata address: %q %q", id, next)
	}
	if _, next := h.svc.For(egress.Request{Host: "a.test", Port: 443}); len(next) == 0 || !strings.Contains(next[0], "policy.local") {
		t.Errorf("advice for a name: %q", next)
	}
}
