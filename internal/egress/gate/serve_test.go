package gate

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
)

// flakyListener fails its first accepts with EMFILE, then hands out one
// end of a pipe per accept until closed.
type flakyListener struct {
	fails   atomic.Int64
	calls   atomic.Int64
	conns   chan net.Conn
	closed  chan struct{}
	closing atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Err: syscall.EMFILE}
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *flakyListener) Close() error {
	if l.closing.CompareAndSwap(false, true) {
		close(l.closed)
	}
	return nil
}

func (l *flakyListener) Addr() net.Addr { return &net.TCPAddr{} }

// An accept loop out of descriptors must neither stop nor spin: it backs
// off, and serves connections again once accept works.
func TestServeSurvivesEMFILE(t *testing.T) {
	l := &flakyListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	l.fails.Store(8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handled := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, l, nil, "test", nil, func(_ context.Context, c net.Conn) {
			c.Close()
			handled <- struct{}{}
		}, func(c net.Conn, _ string) { c.Close() })
	}()
	start := time.Now()
	a, b := net.Pipe()
	defer b.Close()
	l.conns <- a
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection served after the EMFILE errors")
	}
	// 8 failures back off 5+10+20+...+640 ms; a spinning loop would have
	// called Accept thousands of times.
	if elapsed := time.Since(start); elapsed < 500*time.Millisecond {
		t.Errorf("8 EMFILE errors took only %v: the loop does not back off", elapsed)
	}
	if n := l.calls.Load(); n > 10 {
		t.Errorf("Accept called %d times for 8 failures and 1 connection", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve = %v, want nil after cancel", err)
	}
}

// The connection cap refuses what is beyond it with the reason, frees a
// slot when a connection ends, and records refusals at most once a second
// with the number it left out.
func TestAdmission(t *testing.T) {
	var log bytes.Buffer
	adm := NewAdmission(2, audit.New(&log), nil)
	c := func() net.Conn { a, b := net.Pipe(); b.Close(); return a }
	if why := adm.admit("t", c()); why != "" {
		t.Fatalf("first connection refused: %s", why)
	}
	if why := adm.admit("t", c()); why != "" {
		t.Fatalf("second connection refused: %s", why)
	}
	for range 5 {
		if why := adm.admit("t", c()); why != egress.ReasonConnLimit {
			t.Fatalf("third connection: got %q, want %s", why, egress.ReasonConnLimit)
		}
	}
	if adm.Active() != 2 {
		t.Fatalf("active = %d after refusals, want 2", adm.Active())
	}
	adm.release()
	if why := adm.admit("t", c()); why != "" {
		t.Fatalf("connection after a release refused: %s", why)
	}
	if n := strings.Count(log.String(), `"reason":"connection_limit"`); n != 1 {
		t.Fatalf("5 refusals in a burst wrote %d events, want 1:\n%s", n, log.String())
	}
	adm.mu.Lock()
	adm.lastEvent = time.Now().Add(-2 * eventEvery)
	adm.mu.Unlock()
	adm.admit("t", c())
	if !strings.Contains(log.String(), `"suppressed":4`) {
		t.Fatalf("the next event does not count the 4 left out:\n%s", log.String())
	}
	var nilAdm *Admission
	if why := nilAdm.admit("t", c()); why != "" {
		t.Fatalf("a nil Admission refused: %s", why)
	}
}

// The descriptor budget refuses once admitting would eat into the reserve,
// by a fresh count of /proc/self/fd.
func TestFDBudget(t *testing.T) {
	open := openFDs(1 << 20)
	if open <= 2 {
		t.Fatalf("openFDs = %d; stdin, stdout and stderr alone are 3", open)
	}
	b := fdBudget{limit: open + 3}
	if !b.take(2) {
		t.Fatal("refused with room for 3 more descriptors")
	}
	if b.take(2) {
		t.Fatal("admitted past the budget")
	}
}
