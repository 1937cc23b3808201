// Package egresstest holds the fakes the listener tests share: a decider
// that allows a fixed set of targets, a dialer that sends every allowed
// request to one local upstream, a synthetic-name table, an audit sink the
// test can read while the listener writes, and local upstream servers.
package egresstest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
)

// Decider allows exactly the hosts and IP literals it maps to true.
type Decider map[string]bool

// Decide implements egress.Decider.
func (d Decider) Decide(_ context.Context, r egress.Request) egress.Decision {
	target := r.Host
	if target == "" {
		target = r.IP.String()
	}
	if d[target] {
		return egress.Decision{Allow: true, Policy: "test"}
	}
	return egress.Decision{Reason: egress.ReasonNoPolicy, Detail: "not in test policy"}
}

// NameAllowed implements egress.Decider.
func (d Decider) NameAllowed(host string) bool { return d[host] }

// Dialer connects every allowed request to one local upstream and keeps the
// requests it was asked for.
type Dialer struct {
	Addr string
	// Err, when set, is what every dial fails with instead.
	Err  error
	mu   sync.Mutex
	reqs []egress.Request
}

// Dial implements egress.Dialer.
func (d *Dialer) Dial(ctx context.Context, r egress.Request, _ []netip.Prefix) (net.Conn, error) {
	d.mu.Lock()
	d.reqs = append(d.reqs, r)
	d.mu.Unlock()
	if d.Err != nil {
		return nil, d.Err
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", d.Addr)
}

// Requests returns the requests dialled so far.
func (d *Dialer) Requests() []egress.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]egress.Request(nil), d.reqs...)
}

// Last returns the latest request dialled, or the zero Request.
func (d *Dialer) Last() egress.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reqs) == 0 {
		return egress.Request{}
	}
	return d.reqs[len(d.reqs)-1]
}

// Names maps synthetic addresses to names.
type Names map[netip.Addr]string

// Lookup implements egress.Names.
func (n Names) Lookup(ip netip.Addr) (string, bool) { h, ok := n[ip]; return h, ok }

// AuditBuffer is an audit (or log) sink the test reads while listeners
// write to it.
type AuditBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *AuditBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *AuditBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Events decodes the events written so far.
func (l *AuditBuffer) Events(t testing.TB) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range bytes.Lines(l.b.Bytes()) {
		var ev map[string]any
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		out = append(out, ev)
	}
	return out
}

// EchoAtEOF answers "echo:" and everything the client sent, once it is done.
func EchoAtEOF(c net.Conn) {
	b, _ := io.ReadAll(c)
	c.Write(append([]byte("echo:"), b...))
}

// Upstream serves handler on 127.0.0.1:0 until the test ends.
func Upstream(t testing.TB, handler func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handler(c)
			}()
		}
	}()
	return l.Addr().String()
}

// Serve runs a listener's Serve on 127.0.0.1:0 until the test ends, fails
// the test if Serve returns an error, and returns the address.
func Serve(t testing.TB, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return l.Addr().String()
}

// Dial connects to addr with a 5 s deadline, closed when the test ends.
func Dial(t testing.TB, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c.(*net.TCPConn)
}

// HostRecorder is an upstream handler answering every HTTP/1 request on a
// connection with a 200 and recording the Host each one named, for tests
// that must show a refused request never arrived.
type HostRecorder struct {
	mu    sync.Mutex
	hosts []string
}

// Serve handles one upstream connection.
func (h *HostRecorder) Serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		h.mu.Lock()
		h.hosts = append(h.hosts, req.Host)
		h.mu.Unlock()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	}
}

// Hosts returns the Host of every request received so far.
func (h *HostRecorder) Hosts() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.hosts)
}
