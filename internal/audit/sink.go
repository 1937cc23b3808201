package audit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Sink takes the audit trail's finished records: the file today; an
// aggregator or a remote collector are Sinks too, side by side through
// FanOut. A Logger made with NewSink or Open puts a bounded queue in front
// of it, so a slow Sink costs events, counted in audit.dropped, never the
// proxy's time.
type Sink interface {
	Write(r slog.Record) error
	Close() error
}

// JSONLines is a Sink writing one JSON object per line to w with corral's
// field names; Close closes c, if any.
func JSONLines(w io.Writer, c io.Closer) Sink {
	return jsonLines{h: slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: rename}), c: c}
}

type jsonLines struct {
	h slog.Handler
	c io.Closer
}

func (j jsonLines) Write(r slog.Record) error { return j.h.Handle(context.Background(), r) }

func (j jsonLines) Close() error {
	if j.c == nil {
		return nil
	}
	return j.c.Close()
}

// FanOut is a Sink writing every record to each of sinks; one that fails
// does not keep the record from the others.
func FanOut(sinks ...Sink) Sink { return fanOut(sinks) }

type fanOut []Sink

func (f fanOut) Write(r slog.Record) error {
	var errs []error
	for _, s := range f {
		if err := s.Write(r.Clone()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (f fanOut) Close() error {
	var errs []error
	for _, s := range f {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// sink writes records to out, either at once (New) or through a bounded
// queue drained by one writer goroutine (Open, NewSink), so that a slow or
// stuck sink costs events, counted, never a proxy's time.
type sink struct {
	cfg config
	out Sink
	lim *limiter

	mu     sync.RWMutex // held for writing only to close q
	closed bool
	// q holds pointers: a slot costs 8 bytes until used, where a queue
	// of records would be a megabyte, live for the whole run, that every
	// garbage collection scans (a page fault per page the first time).
	q    chan *slog.Record // nil when writing at once
	done chan struct{}

	dropped   atomic.Int64
	dropSince atomic.Int64 // unix nanoseconds of the first drop not yet reported
	failing   atomic.Bool  // a write failed and the warning has been given

	closeOnce sync.Once
	closeErr  error
}

// How long a lifecycle event waits for room in the queue, and Close for
// the writer to finish.
const (
	lifecycleWait = 2 * time.Second
	closeWait     = 5 * time.Second
)

func newSink(out Sink, c config, async bool) *sink {
	s := &sink{cfg: c, out: out}
	s.lim = newLimiter(&s.cfg)
	if async {
		s.q = make(chan *slog.Record, c.queue)
		s.done = make(chan struct{})
		go s.run()
	}
	return s
}

// rename gives slog's built-in keys corral's names and drops the level.
func rename(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.LevelKey:
		return slog.Attr{}
	case slog.MessageKey:
		a.Key = FieldEvent
	case slog.TimeKey:
		a.Key = FieldTime
	}
	return a
}

// put hands r to the writer. Lifecycle events wait for room in the queue:
// they are few and must not be lost; any other event is dropped, and
// counted, when the queue is full.
func (s *sink) put(r slog.Record, wait bool, now time.Time) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	if s.q == nil {
		s.write(r)
		for _, rep := range s.lim.flush(now, false) {
			s.write(rep)
		}
		return
	}
	if wait {
		// A sink stuck for good (a hung disk, a dead collector) must not
		// hang the sandbox's start or exit: lifecycle events wait a while,
		// then count as dropped like the rest.
		select {
		case s.q <- &r:
		case <-time.After(lifecycleWait):
			s.dropSince.CompareAndSwap(0, now.UnixNano())
			s.dropped.Add(1)
		}
		return
	}
	select {
	case s.q <- &r:
	default:
		s.dropSince.CompareAndSwap(0, now.UnixNano())
		s.dropped.Add(1)
	}
}

func (s *sink) run() {
	defer close(s.done)
	tick := time.NewTicker(s.cfg.reportEvery)
	defer tick.Stop()
	for {
		select {
		case r, ok := <-s.q:
			if !ok {
				s.reportDropped()
				s.writeAll(s.lim.flush(s.cfg.now(), true))
				return
			}
			s.write(*r)
			if len(s.q) == 0 {
				s.reportDropped()
			}
		case <-tick.C:
			// A writer that never catches up still says what it lost.
			s.reportDropped()
			s.writeAll(s.lim.flush(s.cfg.now(), false))
		}
	}
}

// reportDropped writes audit.dropped once the writer has caught up (or
// at the next tick).
func (s *sink) reportDropped() {
	n := s.dropped.Swap(0)
	if n == 0 {
		return
	}
	now := s.cfg.now()
	since := time.Unix(0, s.dropSince.Swap(0))
	r := slog.NewRecord(now, slog.LevelInfo, AuditDropped, 0)
	r.AddAttrs(slog.Int64(FieldCount, n), slog.Time(FieldWindowStart, since), slog.Time(FieldWindowEnd, now),
		slog.String("reason", "queue_full"))
	s.write(r)
}

func (s *sink) writeAll(rs []slog.Record) {
	for _, r := range rs {
		s.write(r)
	}
}

// write never fails its caller: a sink that cannot be written is worth one
// warning per run of failures, not a crash or a stalled proxy.
func (s *sink) write(r slog.Record) {
	if err := s.out.Write(r); err != nil {
		if s.failing.CompareAndSwap(false, true) {
			slog.Default().Warn("audit: cannot write the audit log; events are being lost until it can", "err", err)
		}
		return
	}
	if s.failing.Load() {
		s.failing.Store(false)
		slog.Default().Warn("audit: writing the audit log again")
	}
}

func (s *sink) close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		if s.q != nil {
			close(s.q)
		}
		s.mu.Unlock()
		if s.q != nil {
			select {
			case <-s.done:
			case <-time.After(closeWait):
				slog.Default().Warn("audit: the audit sink did not take the last events in time; they are lost")
			}
		} else {
			s.writeAll(s.lim.flush(s.cfg.now(), true))
		}
		s.closeErr = s.out.Close()
	})
	return s.closeErr
}
