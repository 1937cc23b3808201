// Package trace prints the steps of a sandbox's start-up, one line each,
// with when each ended and how long it took: `corral run --trace` (or
// CORRAL_TRACE=1). The supervisor and the sandbox's init are separate
// processes; each writes its own lines to its stderr against one timeline,
// CLOCK_MONOTONIC, which every process on the host shares, from an origin
// the supervisor hands down in the stages' configuration.
//
// A nil *Tracer is tracing off: every method returns at once, so the hooks
// cost a nil check when nobody asked.
package trace

//go:generate go tool msgp -file trace.go -o trace_msgp.go -tests=false -io=false -d "tag json" -d "ignore Tracer"

import (
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/trace/start"
)

// Env turns tracing on when set to 1, like --trace.
const Env = "CORRAL_TRACE"

// processStart is the earliest reading of the clock this process took
// (package start), on the timeline of Now: Go's monotonic clock is
// CLOCK_MONOTONIC.
var processStart = Now() - time.Since(start.At).Nanoseconds()

// Now reads CLOCK_MONOTONIC in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	// CLOCK_MONOTONIC cannot fail on Linux; a zero would only skew a line.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Clock is what a child stage needs to trace on its parent's timeline:
// the run's origin, and when the parent started the child, which is where
// the child's first step begins.
type Clock struct {
	Origin int64 `json:"origin"`
	Since  int64 `json:"since"`
}

// Tracer writes one line per step: the time since the origin at which the
// step ended, the step's own duration (since the previous step of the
// same process), and its name.
type Tracer struct {
	mu     sync.Mutex
	w      io.Writer
	origin int64
	last   int64
}

// New starts a timeline whose origin is this process's earliest clock
// reading (package start): its first step holds nearly all of package
// initialisation, but not the exec and the runtime's own start before it
// (`GODEBUG=inittrace=1` shows when package start ran).
func New(w io.Writer) *Tracer {
	return &Tracer{w: w, origin: processStart, last: processStart}
}

// Resume continues the timeline of c in a child stage; nil c means
// tracing is off and gives a nil Tracer.
func Resume(w io.Writer, c *Clock) *Tracer {
	if c == nil {
		return nil
	}
	return &Tracer{w: w, origin: c.Origin, last: c.Since}
}

// Step records that the step name has just ended.
func (t *Tracer) Step(name string) {
	if t != nil {
		t.StepAt(name, Now())
	}
}

// StepAt records that the step name ended at end (a Now reading), for a
// step whose end was noted before the tracer existed.
func (t *Tracer) StepAt(name string, end int64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// One write per line, so lines of concurrent processes on one
	// stderr do not mix.
	fmt.Fprintf(t.w, "trace %8.1fms %+8.1fms  %s\n", ms(end-t.origin), ms(end-t.last), name)
	t.last = end
}

// Fork returns a tracer on the same timeline for work of this process
// that runs alongside the steps of t: the first of its steps counts from
// now, and each later one from the one before it, apart from t's.
func (t *Tracer) Fork() *Tracer {
	if t == nil {
		return nil
	}
	return &Tracer{w: t.w, origin: t.origin, last: Now()}
}

// Child returns the clock for a stage about to be started; nil when
// tracing is off.
func (t *Tracer) Child() *Clock {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := Now()
	t.last = now
	return &Clock{Origin: t.origin, Since: now}
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }
