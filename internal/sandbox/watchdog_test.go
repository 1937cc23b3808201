package sandbox

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeClock hands out timers that fire only when the test says so.
type fakeClock struct {
	mu     sync.Mutex
	timers map[time.Duration][]chan time.Time
}

func (c *fakeClock) after(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers[d] = append(c.timers[d], ch)
	return ch
}

// fire fires every timer set for d so far, and reports how many there were.
func (c *fakeClock) fire(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.timers[d] {
		ch <- time.Now()
	}
	n := len(c.timers[d])
	c.timers[d] = nil
	return n
}

// armed counts the timers set for d, without firing them.
func (c *fakeClock) armed(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers[d])
}

// fireOthers fires every timer not set for d (the walltime's duration is
// measured from a real start, so it is not known exactly).
func (c *fakeClock) fireOthers(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, ts := range c.timers {
		if k == d {
			continue
		}
		for _, ch := range ts {
			ch <- time.Now()
			n++
		}
		delete(c.timers, k)
	}
	return n
}

// recorder collects the signals the watchdog sends.
type recorder struct {
	mu   sync.Mutex
	sent []syscall.Signal
}

func (r *recorder) signal(s syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, s)
}

func (r *recorder) got() []syscall.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached")
}

// TestWatchdogStopsOnce: a cancelled run gets one SIGTERM and, after the
// grace, one SIGKILL; the walltime firing later adds nothing.
func TestWatchdogStopsOnce(t *testing.T) {
	clock := &fakeClock{timers: map[time.Duration][]chan time.Time{}}
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	result := make(chan bool, 1)
	w := watchdog{sigs: make(chan os.Signal), signal: rec.signal, walltime: time.Hour, start: time.Now(),
		log: slog.New(slog.DiscardHandler), after: clock.after}
	go func() { result <- w.run(ctx, done) }()

	cancel()
	waitFor(t, func() bool { return len(rec.got()) == 1 })
	time.Sleep(20 * time.Millisecond) // a looping watchdog would send more
	if got := rec.got(); !slices.Equal(got, []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("after cancel: sent %v, want one SIGTERM", got)
	}
	// The signal goes out just before the grace timer is armed.
	waitFor(t, func() bool { return clock.armed(Grace) > 0 })
	if n := clock.fire(Grace); n != 1 {
		t.Fatalf("%d grace timers armed, want 1", n)
	}
	waitFor(t, func() bool { return len(rec.got()) == 2 })
	// The walltime running out after that asks for nothing more.
	if n := clock.fireOthers(Grace); n != 1 {
		t.Fatalf("%d walltime timers armed, want 1", n)
	}
	time.Sleep(20 * time.Millisecond)
	if got := rec.got(); !slices.Equal(got, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
		t.Fatalf("sent %v, want SIGTERM then SIGKILL", got)
	}
	close(done)
	<-result
}

// TestWatchdogWalltime: the walltime stops the workload the same way and
// is reported.
func TestWatchdogWalltime(t *testing.T) {
	clock := &fakeClock{timers: map[time.Duration][]chan time.Time{}}
	rec := &recorder{}
	done := make(chan struct{})
	result := make(chan bool, 1)
	w := watchdog{sigs: make(chan os.Signal), signal: rec.signal, walltime: time.Hour, start: time.Now(),
		log: slog.New(slog.DiscardHandler), after: clock.after}
	go func() { result <- w.run(context.Background(), done) }()

	waitFor(t, func() bool { return clock.fireOthers(Grace) == 1 })
	waitFor(t, func() bool { return len(rec.got()) == 1 })
	// The signal goes out just before the grace timer is armed.
	waitFor(t, func() bool { return clock.armed(Grace) > 0 })
	if n := clock.fire(Grace); n != 1 {
		t.Fatalf("%d grace timers armed, want 1", n)
	}
	waitFor(t, func() bool { return len(rec.got()) == 2 })
	close(done)
	if !<-result {
		t.Error("the walltime fired but was not reported")
	}
	if got := rec.got(); !slices.Equal(got, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
		t.Fatalf("sent %v, want SIGTERM then SIGKILL", got)
	}
}
