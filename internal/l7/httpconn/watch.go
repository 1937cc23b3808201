package httpconn

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"
)

// watchAfter is how long an inline request runs before a client that
// hangs up is watched for.
const watchAfter = 10 * time.Millisecond

// watchdog gives each inline request still running after watchAfter (a
// stream, a long poll) what net/http's server gives every request: a
// read that cancels it when the client hangs up, so that an abandoned
// stream lets go of its upstream. One goroutine ticks for every
// connection while any request runs: a timer per request would, on most
// requests, wake the runtime's network poller to re-arm it.
type watchdog struct {
	mu      sync.Mutex
	running map[*watch]struct{}
	ticking bool
}

var dog = &watchdog{running: map[*watch]struct{}{}}

// watch is one request in flight on a connection.
type watch struct {
	s      *inline
	cancel context.CancelFunc
	start  time.Time
	// done is closed when the read ends; nil until one starts.
	done chan struct{}
}

// begin registers w's request.
func (d *watchdog) begin(w *watch) {
	w.start = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	w.done = nil
	d.running[w] = struct{}{}
	if !d.ticking {
		d.ticking = true
		go d.tick()
	}
}

// end unregisters w's request and stops its read if one started, so the
// connection is the loop's alone again.
func (d *watchdog) end(w *watch) {
	d.mu.Lock()
	delete(d.running, w)
	done := w.done
	d.mu.Unlock()
	if done != nil {
		w.s.c.SetReadDeadline(time.Unix(1, 0))
		<-done
		w.s.c.SetReadDeadline(time.Time{})
	}
}

func (d *watchdog) tick() {
	t := time.NewTicker(watchAfter)
	defer t.Stop()
	for now := range t.C {
		d.mu.Lock()
		if len(d.running) == 0 {
			d.ticking = false
			d.mu.Unlock()
			return
		}
		for w := range d.running {
			if w.done == nil && now.Sub(w.start) >= watchAfter {
				// Before end can set its own, under the lock.
				w.s.c.SetReadDeadline(time.Time{})
				w.done = make(chan struct{})
				go w.read(w.done)
			}
		}
		d.mu.Unlock()
	}
}

// read waits for the client's next byte: a byte of the next request
// stays buffered for the loop, an end or an error cancels the request.
// Only this reads the connection while the request runs.
func (w *watch) read(done chan struct{}) {
	defer close(done)
	if _, err := w.s.br.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		w.cancel()
	}
}
