package gate_test

import (
	"net"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/relay"
)

// A replayed client only replays what it reads: what the server sends it
// may be spliced, all of it.
func TestReplayedIsUnwatched(t *testing.T) {
	c, _ := net.Pipe()
	defer c.Close()
	w, ok := gate.Replay(c, []byte("GET / HTTP/1.1\r\n")).(relay.Watched)
	if !ok {
		t.Fatal("a replayed connection is not a relay.Watched: the server's bytes would be copied")
	}
	if w.Unwatched() >= 0 || w.Raw() != c {
		t.Errorf("Unwatched %d, Raw %v: want everything unwatched, written to the client itself", w.Unwatched(), w.Raw())
	}
}
