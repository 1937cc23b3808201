// Package quietlog keeps corral's human-facing log readable when a
// workload causes the same warning thousands of times a second (a flood of
// denied connections, requests with 60 KB paths): each message is
// rate-limited on its own, long values are cut, and what was left out is
// counted on the next record that gets through. The audit log, not this
// one, is the record of every decision.
package quietlog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

const (
	// maxValue bounds each string value written.
	maxValue = 512
	// burst records of one message pass at once, then one per interval.
	burst    = 10
	interval = time.Second
	// maxKeys bounds the messages tracked; the table is emptied when full.
	maxKeys = 1024
)

// New wraps h. Records at error level or above are never held back.
func New(h slog.Handler) slog.Handler {
	return &handler{next: h, st: &state{seen: map[string]*bucket{}}}
}

type bucket struct {
	tokens     float64
	last       time.Time
	suppressed int
}

type state struct {
	mu   sync.Mutex
	seen map[string]*bucket
}

type handler struct {
	next slog.Handler
	st   *state
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{next: h.next.WithAttrs(as), st: h.st}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{next: h.next.WithGroup(name), st: h.st}
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	suppressed := 0
	if r.Level < slog.LevelError {
		var ok bool
		if ok, suppressed = h.st.take(r.Message, r.Time); !ok {
			return nil
		}
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(cut(a))
		return true
	})
	if suppressed > 0 {
		out.AddAttrs(slog.Int("suppressed", suppressed))
	}
	return h.next.Handle(ctx, out)
}

// take reports whether a record with message msg may be written now, and
// how many were held back since the last one that was.
func (s *state) take(msg string, now time.Time) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.seen[msg]
	if b == nil {
		if len(s.seen) >= maxKeys {
			s.seen = map[string]*bucket{}
		}
		b = &bucket{tokens: burst, last: now}
		s.seen[msg] = b
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()/interval.Seconds())
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	n := b.suppressed
	b.suppressed = 0
	return true, n
}

func cut(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); len(s) > maxValue {
			return slog.String(a.Key, fmt.Sprintf("%s…[%d more bytes]", s[:maxValue], len(s)-maxValue))
		}
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			if s := err.Error(); len(s) > maxValue {
				return slog.String(a.Key, fmt.Sprintf("%s…[%d more bytes]", s[:maxValue], len(s)-maxValue))
			}
		}
	case slog.KindGroup:
		as := v.Group()
		out := make([]any, len(as))
		for i, x := range as {
			out[i] = cut(x)
		}
		return slog.Group(a.Key, out...)
	}
	return slog.Attr{Key: a.Key, Value: v}
}
