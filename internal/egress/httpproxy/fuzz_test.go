package httpproxy

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

// FuzzHandshake feeds arbitrary request heads (CONNECT and absolute-URI
// forms) to the proxy. Nothing is allowed, so every input ends in a refusal
// or an error reply; the proxy must never panic or hang.
func FuzzHandshake(f *testing.F) {
	for _, seed := range []string{
		"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
		"CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n",
		"CONNECT 203.0.113.7:22 HTTP/1.0\r\n\r\n",
		"GET http://example.com/path?q=1 HTTP/1.1\r\nHost: example.com\r\nConnection: keep-alive\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT :0 HTTP/1.1\r\n\r\n",
		"CONNECT a:b:c HTTP/1.1\r\n\r\n",
		"\x16\x03\x01\x00\x05hello",
	} {
		f.Add([]byte(seed))
	}
	s := &Server{Gate: &gate.Gate{Decider: egresstest.Decider{}, Dialer: &egresstest.Dialer{Addr: "127.0.0.1:1"}}}
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.handle(context.Background(), server)
			server.Close()
		}()
		_ = client.SetDeadline(time.Now().Add(2 * time.Second))
		go func() { _, _ = client.Write(in); _ = client.Close() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatalf("proxy did not finish with input %q", in)
		}
		_, _ = io.Copy(io.Discard, client)
	})
}
