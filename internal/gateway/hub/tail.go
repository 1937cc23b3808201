package hub

import "sync"

// Tail keeps the newest entries of each key (a sandbox's last log lines)
// in memory, so a follower that is only a little behind catches up without
// reading the store.
type Tail[T any] struct {
	mu   sync.Mutex
	n    int
	keys map[string][]T
}

// NewTail keeps up to n entries per key.
func NewTail[T any](n int) *Tail[T] {
	return &Tail[T]{n: n, keys: map[string][]T{}}
}

// Add appends vs to key's tail, dropping the oldest beyond the limit.
func (t *Tail[T]) Add(key string, vs ...T) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := append(t.keys[key], vs...)
	if len(cur) > t.n {
		// Copy down so the backing array does not grow without bound.
		cur = append(make([]T, 0, t.n), cur[len(cur)-t.n:]...)
	}
	t.keys[key] = cur
}

// Get returns a copy of key's tail, oldest first.
func (t *Tail[T]) Get(key string) []T {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]T(nil), t.keys[key]...)
}

// Drop forgets key (a deleted sandbox).
func (t *Tail[T]) Drop(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.keys, key)
}
