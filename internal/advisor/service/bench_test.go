package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/policy"
)

// BenchmarkNewWithExpiredDrafts: the advisor's start, which every
// proxy-mode run pays, on a session holding 100 proposals that expired
// unanswered in the last hours (as many as the store keeps).
func BenchmarkNewWithExpiredDrafts(b *testing.B) {
	dir := b.TempDir()
	now := time.Now().Add(-3 * time.Hour)
	st, err := drafts.Open(dir, drafts.Options{TTL: time.Minute, MaxPending: 1000, Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		host := fmt.Sprintf("h%d.example.com", i)
		np := policy.NetworkPolicy{Endpoints: []policy.Endpoint{{Host: host, Port: 443, Protocol: "rest", Access: "read-only"}}}
		name := propose.Name(host, 443, "/usr/bin/curl")
		c := propose.Chunk{ID: propose.Fingerprint(name, np, 1, propose.AuthorAdvisor), Name: name, Policy: np, Stage: 1,
			Author: propose.AuthorAdvisor, Wants: []propose.Want{{Host: host, Port: 443, Binary: "/usr/bin/curl"}}}
		if _, err := st.Add(c, check.Result{Verdict: check.Broad}, drafts.System); err != nil {
			b.Fatal(err)
		}
		now = now.Add(time.Minute)
	}
	if _, err := st.Expire(); err != nil {
		b.Fatal(err)
	}
	rl := newReloader(b, audit.Discard())
	for b.Loop() {
		if _, err := New(Config{Dir: dir, Reloader: rl, NoProbe: true}); err != nil {
			b.Fatal(err)
		}
	}
}
