package drafts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/policy"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var (
	alice = Actor{UID: 1000, User: "alice"}
	ok    = check.Result{Verdict: check.Broad}
)

func chunk(host string, port uint16, stage propose.Stage, access string) propose.Chunk {
	np := policy.NetworkPolicy{Endpoints: []policy.Endpoint{{Host: host, Port: int(port), Protocol: "rest", Access: access}}}
	name := propose.Name(host, port, "/usr/bin/curl")
	return propose.Chunk{
		ID: propose.Fingerprint(name, np, stage, propose.AuthorAdvisor), Name: name, Policy: np, Stage: stage, Author: propose.AuthorAdvisor,
		Wants: []propose.Want{{Host: host, Port: port, Binary: "/usr/bin/curl"}},
	}
}

func open(t *testing.T, dir string, c *clock) *FileStore {
	t.Helper()
	s, err := Open(dir, Options{Now: c.now, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestLifecycle(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	dir := t.TempDir()
	s := open(t, dir, c)
	d := must[Draft](t)(s.Add(chunk("a.example.com", 443, 1, "read-only"), ok, System))
	if d.State != Pending || d.ID == "" || !d.Expires.Equal(time.Unix(1000, 0).Add(DefaultTTL)) {
		t.Fatalf("added %+v", d)
	}
	if _, err := s.MarkLoaded(d.ID, 2, "abc"); !errors.Is(err, ErrState) {
		t.Errorf("MarkLoaded on pending: %v", err)
	}
	c.add(time.Minute)
	d = must[Draft](t)(s.Approve(d.ID, alice, "looks right"))
	if d.State != Approved || d.Done() {
		t.Errorf("approved, not loaded: %+v done=%v", d, d.Done())
	}
	d = must[Draft](t)(s.MarkLoaded(d.ID, 2, "abc"))
	if !d.Done() || d.Loaded.Version != 2 {
		t.Errorf("loaded: %+v", d)
	}
	if _, err := s.Reject(d.ID, alice, "no", ""); !errors.Is(err, ErrState) {
		t.Errorf("reject approved: %v", err)
	}
	d = must[Draft](t)(s.Undo(d.ID, alice, "too wide"))
	if d.State != Undone {
		t.Errorf("undo: %+v", d)
	}
	// Survives a restart: a new store on the same directory sees it all.
	s2 := open(t, dir, c)
	got := must[Draft](t)(s2.Get(d.ID))
	if got.State != Undone || len(got.History) != 4 {
		t.Fatalf("after reopen: %+v", got)
	}
	h := got.History
	if h[0].To != Pending || h[1].To != Approved || h[1].Actor != alice || h[1].Reason != "looks right" || h[3].To != Undone || !h[1].At.Equal(time.Unix(1060, 0)) {
		t.Errorf("history %+v", h)
	}
	if _, err := s2.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get unknown: %v", err)
	}
	if _, err := s.Add(chunk("b.example.com", 443, 1, "read-only"), check.Result{Verdict: check.Invalid, Reason: "x"}, System); err == nil {
		t.Error("an invalid chunk was stored")
	}
}

func TestSupersede(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := open(t, t.TempDir(), c)
	one := must[Draft](t)(s.Add(chunk("a.example.com", 443, 1, "read-only"), ok, System))
	two := must[Draft](t)(s.Add(chunk("a.example.com", 443, 2, "read-write"), ok, System))
	if got := must[Draft](t)(s.Get(one.ID)); got.State != Superseded || got.SupersededBy != two.ID || !got.Done() {
		t.Errorf("stage 1 after stage 2: %+v", got)
	}
	// An approved initial chunk is replaced only when its refinement is
	// approved.
	three := must[Draft](t)(s.Add(chunk("b.example.com", 443, 1, "read-only"), ok, System))
	must[Draft](t)(s.Approve(three.ID, alice, ""))
	four := must[Draft](t)(s.Add(chunk("b.example.com", 443, 2, "read-write"), ok, System))
	if four.Replaces != three.ID {
		t.Errorf("replaces %q, want %q", four.Replaces, three.ID)
	}
	if got := must[Draft](t)(s.Get(three.ID)); got.State != Approved {
		t.Errorf("approved draft changed before its replacement was approved: %s", got.State)
	}
	must[Draft](t)(s.Approve(four.ID, alice, ""))
	if got := must[Draft](t)(s.Get(three.ID)); got.State != Superseded {
		t.Errorf("replaced draft: %s", got.State)
	}
}

func TestDuplicates(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := open(t, t.TempDir(), c)
	ch := chunk("a.example.com", 443, 1, "read-only")
	d := must[Draft](t)(s.Add(ch, ok, System))
	if got, err := s.Add(ch, ok, System); !errors.Is(err, ErrDuplicate) || got.ID != d.ID {
		t.Errorf("same chunk again: %v %s", err, got.ID)
	}
	must[Draft](t)(s.Reject(d.ID, alice, "no", ""))
	if _, err := s.Add(ch, ok, System); !errors.Is(err, ErrRejected) {
		t.Errorf("rejected chunk again: %v", err)
	}
	c.add(time.Second)
	if err := s.Retry("a.example.com", 443, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ch, ok, System); err != nil {
		t.Errorf("after retry: %v", err)
	}
}

func TestExpiry(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s, err := Open(t.TempDir(), Options{Now: c.now, TTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d := must[Draft](t)(s.Add(chunk("a.example.com", 443, 1, "read-only"), ok, System))
	c.add(10*time.Minute - time.Second)
	if exp := must[[]Draft](t)(s.Expire()); len(exp) != 0 {
		t.Errorf("expired early: %+v", exp)
	}
	c.add(time.Second)
	exp := must[[]Draft](t)(s.Expire())
	if len(exp) != 1 || exp[0].ID != d.ID || exp[0].State != Expired {
		t.Fatalf("expired %+v", exp)
	}
	if _, err := s.Approve(d.ID, alice, ""); !errors.Is(err, ErrState) {
		t.Errorf("approve expired: %v", err)
	}
	// Expiry also happens on any other call, and frees the slot.
	d2 := must[Draft](t)(s.Add(chunk("b.example.com", 443, 1, "read-only"), ok, System))
	c.add(time.Hour)
	if got := must[Draft](t)(s.Get(d2.ID)); got.State != Expired || got.History[1].Actor != System {
		t.Errorf("lazy expiry: %+v", got)
	}
}

func TestPendingCap(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := open(t, t.TempDir(), c)
	for i := range DefaultMaxPending {
		must[Draft](t)(s.Add(chunk(fmt.Sprintf("h%d.example.com", i), 443, 1, "read-only"), ok, System))
	}
	if _, err := s.Add(chunk("more.example.com", 443, 1, "read-only"), ok, System); !errors.Is(err, ErrTooManyPending) {
		t.Fatalf("11th pending: %v", err)
	}
	// A refinement replaces its pending predecessor, so it fits.
	if _, err := s.Add(chunk("h0.example.com", 443, 2, "read-write"), ok, System); err != nil {
		t.Errorf("refinement at the cap: %v", err)
	}
	must[Draft](t)(s.Reject(must[[]Draft](t)(s.List())[0].ID, alice, "", ""))
	if _, err := s.Add(chunk("more.example.com", 443, 1, "read-only"), ok, System); err != nil {
		t.Errorf("after a rejection freed a slot: %v", err)
	}
}

func TestRejectionBackoff(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := open(t, t.TempDir(), c)
	d := must[Draft](t)(s.Add(chunk("a.example.com", 443, 1, "read-only"), ok, System))
	must[Draft](t)(s.Reject(d.ID, alice, "no", "use the mirror at pypi.internal"))
	d = must[Draft](t)(s.Add(chunk("a.example.com", 443, 1, "full"), ok, System))
	must[Draft](t)(s.Reject(d.ID, alice, "still no", ""))
	if _, err := s.Add(chunk("a.example.com", 443, 2, "read-write"), ok, System); !errors.Is(err, ErrBackoff) {
		t.Fatalf("third proposal after two rejections: %v", err)
	}
	// Other ports of the host are unaffected.
	if _, err := s.Add(chunk("a.example.com", 8443, 1, "read-only"), ok, System); err != nil {
		t.Errorf("other port: %v", err)
	}
	if err := s.Retry("a.example.com", 443, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(chunk("a.example.com", 443, 2, "read-write"), ok, System); err != nil {
		t.Errorf("after retry: %v", err)
	}
	h := must[[]Transition](t)(s.History())
	if last := h[len(h)-2]; last.Draft != "" || last.Actor != alice || last.Reason != "retry a.example.com:443" {
		t.Errorf("retry not in history: %+v", last)
	}
}

func TestWait(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	dir := t.TempDir()
	sup := open(t, dir, c) // the supervisor
	cli := open(t, dir, c) // the corral draft command
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	approved := must[Draft](t)(sup.Add(chunk("a.example.com", 443, 1, "read-only"), ok, Actor{UID: 1000, User: "agent"}))
	res := make(chan Draft, 1)
	go func() {
		d, err := sup.Wait(ctx, approved.ID)
		if err != nil {
			t.Error(err)
		}
		res <- d
	}()
	must[Draft](t)(sup.Approve(approved.ID, alice, ""))
	select {
	case d := <-res:
		t.Fatalf("Wait returned before the policy was loaded: %+v", d)
	case <-time.After(50 * time.Millisecond):
	}
	must[Draft](t)(sup.MarkLoaded(approved.ID, 3, "h"))
	if d := <-res; d.State != Approved || d.Loaded == nil {
		t.Errorf("wait: %+v", d)
	}

	// A rejection by another process reaches the waiter with its guidance.
	rejected := must[Draft](t)(sup.Add(chunk("b.example.com", 443, 1, "read-only"), ok, System))
	go func() {
		d, _ := sup.Wait(ctx, rejected.ID)
		res <- d
	}()
	must[Draft](t)(cli.Reject(rejected.ID, alice, "no", "use api.example.com instead"))
	if d := <-res; d.State != Rejected || d.Guidance != "use api.example.com instead" {
		t.Errorf("wait after reject: %+v", d)
	}

	short, stop := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer stop()
	pending := must[Draft](t)(sup.Add(chunk("c.example.com", 443, 1, "read-only"), ok, System))
	if _, err := sup.Wait(short, pending.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait timeout: %v", err)
	}
}

func TestConcurrentWriters(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Unix(1000, 0)}
	var stores []*FileStore
	for range 2 {
		s, err := Open(dir, Options{Now: c.now, MaxPending: 1000})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	var wg sync.WaitGroup
	// Two goroutines on each of two stores on one directory.
	for i, s := range []*FileStore{stores[0], stores[0], stores[1], stores[1]} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 15 {
				d, err := s.Add(chunk(fmt.Sprintf("w%d-%d.example.com", i, j), 443, 1, "read-only"), ok, System)
				if err != nil {
					t.Error(err)
					return
				}
				if j%3 == 0 {
					if _, err := s.Reject(d.ID, alice, "", ""); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	all := must[[]Draft](t)(stores[1].List())
	if len(all) != 60 {
		t.Fatalf("%d drafts, want 60: a write was lost", len(all))
	}
	rejected := 0
	for _, d := range all {
		if d.State == Rejected {
			rejected++
		}
	}
	if h := must[[]Transition](t)(stores[0].History()); rejected != 20 || len(h) != 80 {
		t.Errorf("rejected %d history %d, want 20 and 80", rejected, len(h))
	}
	// Nothing but the document and the lock is left behind.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != fileName && e.Name() != lockName {
			t.Errorf("stray file %s", filepath.Join(dir, e.Name()))
		}
	}
}

func TestFinishedDraftsPruned(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s, err := Open(t.TempDir(), Options{Now: c.now, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// What a person decided stays, whatever its age: an approval, a
	// rejection, and an approved draft its refinement replaced.
	approved := must[Draft](t)(s.Add(chunk("approved.example.com", 443, 1, "read-only"), ok, System))
	must[Draft](t)(s.Approve(approved.ID, alice, ""))
	rejected := must[Draft](t)(s.Add(chunk("rejected.example.com", 443, 1, "read-only"), ok, System))
	must[Draft](t)(s.Reject(rejected.ID, alice, "no", ""))
	replaced := must[Draft](t)(s.Add(chunk("replaced.example.com", 443, 1, "read-only"), ok, System))
	must[Draft](t)(s.Approve(replaced.ID, alice, ""))
	refined := must[Draft](t)(s.Add(chunk("replaced.example.com", 443, 2, "read-write"), ok, System))
	must[Draft](t)(s.Approve(refined.ID, alice, ""))
	kept := []string{approved.ID, rejected.ID, replaced.ID, refined.ID}

	var expired []string
	for i := range MaxFinished + 5 {
		expired = append(expired, must[Draft](t)(s.Add(chunk(fmt.Sprintf("h%d.example.com", i), 443, 1, "read-only"), ok, System)).ID)
		c.add(time.Minute) // it expires on the next call
	}
	ids := func() map[string]bool {
		m := map[string]bool{}
		for _, d := range must[[]Draft](t)(s.List()) {
			m[d.ID] = true
		}
		return m
	}
	got := ids()
	if len(got) != len(kept)+MaxFinished {
		t.Errorf("%d drafts kept, want %d", len(got), len(kept)+MaxFinished)
	}
	for i, id := range expired {
		if got[id] != (i >= 5) {
			t.Errorf("expired draft %d of %d kept: %v", i, len(expired), got[id])
		}
	}
	for _, tr := range must[[]Transition](t)(s.History()) {
		if slices.Contains(expired[:5], tr.Draft) {
			t.Errorf("history of a dropped draft kept: %+v", tr)
		}
	}
	if _, err := s.Get(expired[0]); !errors.Is(err, ErrNotFound) {
		t.Errorf("dropped draft: %v", err)
	}

	c.add(FinishedRetention + time.Second)
	got = ids()
	if len(got) != len(kept) {
		t.Errorf("after %s: %d drafts, want the %d a person decided", FinishedRetention, len(got), len(kept))
	}
	for _, id := range kept {
		if !got[id] {
			t.Errorf("draft %s a person decided was dropped", id)
		}
	}
}

// BenchmarkListAfterManyExpired: List, which the advisor runs at every
// start and a waiting agent's poll rereads the file for, on a session
// where 1 000 proposals expired unanswered.
func BenchmarkListAfterManyExpired(b *testing.B) {
	c := &clock{t: time.Unix(1000, 0)}
	s, err := Open(b.TempDir(), Options{Now: c.now, TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		if _, err := s.Add(chunk(fmt.Sprintf("h%d.example.com", i), 443, 1, "read-only"), ok, System); err != nil {
			b.Fatal(err)
		}
		c.add(time.Minute)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.List(); err != nil {
			b.Fatal(err)
		}
	}
}
