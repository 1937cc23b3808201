// Package hub fans the gateway's changes out to the streams that wait for
// them: sandbox phase changes to watchers, policy and route changes to
// subscribed supervisors, log entries to followers. Publishing never
// blocks: a subscriber that falls a whole buffer behind is cut off (its
// channel closed and Lagged set) and resumes from the store, which is
// better than stalling every publisher or silently skipping events.
package hub

import (
	"sync"
	"sync/atomic"
)

// Hub delivers published values to its subscribers.
type Hub[T any] struct {
	mu   sync.Mutex
	subs map[*Sub[T]]struct{}
}

// Sub is one subscription. Read C until it is closed; then Lagged says
// whether the hub cut the subscriber off for falling behind.
type Sub[T any] struct {
	C      <-chan T
	c      chan T
	match  func(T) bool
	lagged atomic.Bool
	hub    *Hub[T]
}

// New returns an empty hub.
func New[T any]() *Hub[T] {
	return &Hub[T]{subs: map[*Sub[T]]struct{}{}}
}

// Subscribe registers a subscriber that receives the values match accepts
// (every value when match is nil), buffering up to buf of them. Call
// Close when done.
func (h *Hub[T]) Subscribe(buf int, match func(T) bool) *Sub[T] {
	c := make(chan T, buf)
	s := &Sub[T]{C: c, c: c, match: match, hub: h}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

// Publish hands v to every matching subscriber without waiting.
func (h *Hub[T]) Publish(v T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if s.match != nil && !s.match(v) {
			continue
		}
		select {
		case s.c <- v:
		default:
			s.lagged.Store(true)
			delete(h.subs, s)
			close(s.c)
		}
	}
}

// Len is the number of subscribers.
func (h *Hub[T]) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Lagged reports whether the hub cut this subscriber off.
func (s *Sub[T]) Lagged() bool { return s.lagged.Load() }

// Close unsubscribes; it is safe to call more than once and after the hub
// cut the subscriber off.
func (s *Sub[T]) Close() {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.c)
	}
}
