package dns

import (
	"sync"
	"time"
)

// Limits on how many denied-name events reach the audit log. The workload
// controls the query rate, so without them a loop of lookups could fill
// the disk; answers are never limited, only the record of them.
const (
	perNameFirst   = 10   // every one of a name's first denials is recorded
	perNameEvery   = 100  // after that, every 100th
	perNameTracked = 4096 // names remembered before the table starts over
	globalBurst    = 200  // events in a burst across all names
	globalPerSec   = 50   // sustained events per second across all names
)

// eventLimiter decides which denials are written. The per-name rule keeps a
// single hot name from drowning the rest; the global bucket bounds the
// total when every query uses a fresh name (the usual exfiltration shape).
type eventLimiter struct {
	mu         sync.Mutex
	counts     map[string]uint64
	tokens     float64
	last       time.Time
	suppressed uint64
	now        func() time.Time
}

func newEventLimiter() *eventLimiter {
	return &eventLimiter{counts: make(map[string]uint64), tokens: globalBurst, now: time.Now}
}

// allow records one denial of name. When it should be written it returns
// true with the name's denial count so far and how many events the global
// bucket dropped since the last written one.
func (l *eventLimiter) allow(name string) (count, suppressed uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	count, seen := l.counts[name]
	if !seen && len(l.counts) >= perNameTracked {
		// Forgetting everything is crude, but it bounds memory and the
		// global bucket still bounds what the reset lets through.
		clear(l.counts)
	}
	count++
	l.counts[name] = count
	if count > perNameFirst && count%perNameEvery != 0 {
		return count, 0, false
	}

	now := l.now()
	if !l.last.IsZero() {
		l.tokens = min(globalBurst, l.tokens+now.Sub(l.last).Seconds()*globalPerSec)
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return count, 0, false
	}
	l.tokens--
	suppressed, l.suppressed = l.suppressed, 0
	return count, suppressed, true
}

// everyN is a tiny counter for operator log lines that could otherwise
// repeat once per query (pool exhaustion).
type everyN struct {
	mu sync.Mutex
	n  uint64
}

func (e *everyN) tick() (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	return e.n, e.n == 1 || e.n%1000 == 0
}
