package relay

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// watcher is a Watched destination that must see the bytes of its heads
// (start and length in the stream) and nothing else; after the last head
// it needs to see nothing more.
type watcher struct {
	*net.TCPConn
	heads [][2]int64

	mu      sync.Mutex
	t       *testing.T
	pos     int64 // bytes of the stream past, seen or skipped
	seen    int64 // of them through Write
	skipped int64
}

// next returns the head at or after pos, if any.
func (w *watcher) next() ([2]int64, bool) {
	for _, h := range w.heads {
		if h[0]+h[1] > w.pos {
			return h, true
		}
	}
	return [2]int64{}, false
}

func (w *watcher) Unwatched() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.next()
	switch {
	case !ok:
		return -1
	case w.pos >= h[0]:
		return 0
	}
	return h[0] - w.pos
}

func (w *watcher) Skipped(n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h, ok := w.next(); ok && w.pos+n > h[0] {
		w.t.Errorf("skipped %d bytes at %d, into the head at %d", n, w.pos, h[0])
	}
	w.pos += n
	w.skipped += n
}

func (w *watcher) Write(p []byte) (int, error) {
	n, err := w.TCPConn.Write(p)
	w.mu.Lock()
	w.pos += int64(n)
	w.seen += int64(n)
	w.mu.Unlock()
	return n, err
}

func (w *watcher) Raw() net.Conn { return w.TCPConn }

// What a Watched destination must see goes through its Write; the bodies
// between (and everything after the last head) go straight to the raw
// connection, every byte intact and in order.
func TestRelayWatched(t *testing.T) {
	for _, idle := range []time.Duration{0, 5 * time.Second} {
		client, a := tcpPair(t)
		b, server := tcpPair(t)
		const body = 3 << 20
		heads := [][2]int64{{0, 100}, {100 + body, 100}, {200 + body + 10, 50}}
		w := &watcher{TCPConn: a.(*net.TCPConn), heads: heads, t: t}
		stream := make([]byte, 200+2*body)
		r := rand.New(rand.NewPCG(1, 2))
		for i := range stream {
			stream[i] = byte(r.Uint32())
		}
		go func() {
			server.Write(stream)
			server.(*net.TCPConn).CloseWrite()
		}()
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(client)
			got <- b
		}()
		client.(*net.TCPConn).CloseWrite()
		if _, _, err := Relay(w, b, idle); err != nil {
			t.Fatalf("idle %v: Relay: %v", idle, err)
		}
		if g := <-got; !bytes.Equal(g, stream) {
			t.Fatalf("idle %v: the client got %d bytes, not the %d sent, or not in order", idle, len(g), len(stream))
		}
		// The heads were written through, each with at most one read's
		// worth of what follows it; the rest was spliced (the first body
		// reported skipped, everything after the last head not even
		// that).
		if w.seen < 250 || w.seen > 3*32<<10 || w.skipped < body-32<<10 {
			t.Errorf("idle %v: %d bytes seen, %d skipped; want the 250 of the heads seen and the bodies spliced", idle, w.seen, w.skipped)
		}
	}
}
