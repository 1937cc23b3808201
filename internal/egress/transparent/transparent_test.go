package transparent

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
	"github.com/corral-sandbox/corral/internal/linux/capture"
)

// The fakes are shared with the other listeners' tests.
type (
	decider      = egresstest.Decider
	dialer       = egresstest.Dialer
	names        = egresstest.Names
	lockedBuffer = egresstest.AuditBuffer
)

var echoAtEOF = egresstest.EchoAtEOF

var (
	synthAllowed = netip.MustParseAddr("198.18.0.1")
	synthOther   = netip.MustParseAddr("198.18.0.2")
)

type harness struct {
	addr   string
	dialer *dialer
	audit  *lockedBuffer
}

func start(t *testing.T, dst netip.AddrPort, up func(net.Conn)) *harness {
	t.Helper()
	h := &harness{dialer: &dialer{Addr: egresstest.Upstream(t, up)}, audit: &lockedBuffer{}}
	s := &Server{
		Gate: &gate.Gate{
			Decider: decider{"allowed.test": true, "203.0.113.7": true},
			Dialer:  h.dialer,
			Audit:   audit.New(h.audit),
		},
		Names:       names{synthAllowed: "allowed.test", synthOther: "other.test"},
		PeekTimeout: 50 * time.Millisecond,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil },
	}
	h.addr = egresstest.Serve(t, s.Serve)
	return h
}

func (h *harness) dial(t *testing.T) *net.TCPConn { return egresstest.Dial(t, h.addr) }

// lastEvent returns the last audit event, failing unless it is event.
func (h *harness) lastEvent(t *testing.T, event string) map[string]any {
	t.Helper()
	evs := h.audit.Events(t)
	if len(evs) == 0 {
		t.Fatal("no audit event")
	}
	ev := evs[len(evs)-1]
	if ev[audit.FieldEvent] != event {
		t.Fatalf("last event %v, want %s", ev, event)
	}
	return ev
}

// expectResetOnDial is for refusals that need no client bytes: the reset
// may already arrive while connect completes.
func (h *harness) expectResetOnDial(t *testing.T) {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("got %v, want connection reset", err)
	}
}

// writeOnly is a connection whose reads never return, for a client that
// must only send.
type writeOnly struct{ net.Conn }

func (writeOnly) Read([]byte) (int, error) { select {} }

func expectReset(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v, want connection reset", err)
	}
}

func TestRawTCPRelayed(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 5432), echoAtEOF)
	c := h.dial(t)
	payload := "\x00\x00\x00\x08\x04\xd2\x16\x2fraw"
	io.WriteString(c, payload)
	c.CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "echo:"+payload {
		t.Fatalf("got %q %v", got, err)
	}
	ev := h.lastEvent(t, audit.NetConnectAllowed)
	if ev["host"] != "allowed.test" || ev["port"] != float64(5432) || ev["via"] != egress.ViaTransparent {
		t.Fatalf("event %v", ev)
	}
	if reqs := h.dialer.Requests(); len(reqs) != 1 || reqs[0].Host != "allowed.test" || reqs[0].Sniffed != "" {
		t.Fatalf("dialled %+v", reqs)
	}
}

func TestTLSMatchingSNIReplayed(t *testing.T) {
	got := make(chan string, 1)
	h := start(t, netip.AddrPortFrom(synthAllowed, 443), func(c net.Conn) {
		buf := make([]byte, 0, 4096)
		for {
			n, err := c.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if sni, done, _ := sniff.ClientHelloSNI(buf); done || err != nil {
				got <- sni
				return
			}
		}
	})
	c := h.dial(t)
	go tls.Client(c, &tls.Config{ServerName: "allowed.test"}).Handshake()
	if sni := <-got; sni != "allowed.test" {
		t.Fatalf("upstream saw SNI %q", sni)
	}
	if reqs := h.dialer.Requests(); len(reqs) != 1 || reqs[0].Sniffed != "allowed.test" || reqs[0].SniffedKind != sniff.KindTLS {
		t.Fatalf("dialled %+v", reqs)
	}
}

func TestSNIMismatchReset(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 443), echoAtEOF)
	c := h.dial(t)
	err := tls.Client(c, &tls.Config{ServerName: "evil.test"}).Handshake()
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("handshake: %v, want connection reset", err)
	}
	ev := h.lastEvent(t, audit.NetConnectDenied)
	if ev["reason"] != egress.ReasonSNIMismatch || ev["host"] != "allowed.test" {
		t.Fatalf("event %v", ev)
	}
	if n := len(h.dialer.Requests()); n != 0 {
		t.Fatalf("dialled %d times for a fronted hello", n)
	}
}

func TestHostMismatchReset(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 80), echoAtEOF)
	c := h.dial(t)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	expectReset(t, c)
	if ev := h.lastEvent(t, audit.NetConnectDenied); ev["reason"] != egress.ReasonHostMismatch {
		t.Fatalf("event %v", ev)
	}
}

func TestMalformedOpeningReset(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 80), echoAtEOF)
	c := h.dial(t)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n")
	expectReset(t, c)
	if ev := h.lastEvent(t, audit.NetConnectDenied); ev["reason"] != egress.ReasonHostMismatch {
		t.Fatalf("event %v", ev)
	}
}

func TestHTTPMatchingHostRelayed(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 80), echoAtEOF)
	c := h.dial(t)
	req := "GET / HTTP/1.1\r\nHost: Allowed.test:80\r\n\r\n"
	io.WriteString(c, req)
	c.CloseWrite()
	if got, err := io.ReadAll(c); err != nil || string(got) != "echo:"+req {
		t.Fatalf("got %q %v", got, err)
	}
}

func TestLiteralIP(t *testing.T) {
	h := start(t, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.7"), 22), echoAtEOF)
	c := h.dial(t)
	io.WriteString(c, "SSH-2.0-test\r\n")
	c.CloseWrite()
	if got, err := io.ReadAll(c); err != nil || string(got) != "echo:SSH-2.0-test\r\n" {
		t.Fatalf("got %q %v", got, err)
	}
	if reqs := h.dialer.Requests(); len(reqs) != 1 || reqs[0].Host != "" || reqs[0].IP.String() != "203.0.113.7" || reqs[0].Port != 22 {
		t.Fatalf("dialled %+v", reqs)
	}

	denied := start(t, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.8"), 22), echoAtEOF)
	denied.expectResetOnDial(t)
	if ev := denied.lastEvent(t, audit.NetConnectDenied); ev["ip"] != "203.0.113.8" || ev["reason"] != egress.ReasonNoPolicy {
		t.Fatalf("event %v", ev)
	}
}

func TestDeniedSyntheticName(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthOther, 443), echoAtEOF)
	c := h.dial(t)
	// The handshake only sends its ClientHello: were it to read too, it
	// could take the reset and leave expectReset an EOF.
	go tls.Client(writeOnly{c}, &tls.Config{ServerName: "other.test"}).Handshake()
	expectReset(t, c)
	if ev := h.lastEvent(t, audit.NetConnectDenied); ev["host"] != "other.test" || ev["reason"] != egress.ReasonNoPolicy {
		t.Fatalf("event %v", ev)
	}
}

// banner is a server-first upstream: it greets, then echoes lines.
func banner(c net.Conn) {
	io.WriteString(c, "220 ready\r\n")
	io.Copy(c, c)
}

func TestServerFirst(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 25), banner)
	c := h.dial(t)
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != "220 ready\r\n" {
		t.Fatalf("banner %q %v", line, err)
	}
	io.WriteString(c, "QUIT\r\n")
	if line, err := r.ReadString('\n'); err != nil || line != "QUIT\r\n" {
		t.Fatalf("echo %q %v", line, err)
	}
}

// TestLateFrontingReset waits out the peek, as an evasive client would,
// before naming another host.
func TestLateFrontingReset(t *testing.T) {
	h := start(t, netip.AddrPortFrom(synthAllowed, 80), banner)
	c := h.dial(t)
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if _, err := io.ReadAll(r); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v, want connection reset", err)
	}
	evs := h.audit.Events(t)
	if len(evs) != 2 || evs[0][audit.FieldEvent] != audit.NetConnectAllowed ||
		evs[1][audit.FieldEvent] != audit.NetConnectDenied || evs[1]["reason"] != egress.ReasonHostMismatch {
		t.Fatalf("events %v", evs)
	}
}

func TestNoOriginalDst(t *testing.T) {
	d := &dialer{Addr: "unused"}
	s := &Server{Gate: &gate.Gate{Decider: decider{}, Dialer: d}, OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
		return netip.AddrPort{}, errors.New("no conntrack entry")
	}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Serve(ctx, l)
	(&harness{addr: l.Addr().String()}).expectResetOnDial(t)
	if len(d.Requests()) != 0 {
		t.Fatal("dialled without a destination")
	}
}

// TestOriginalDstWithoutNAT runs the real getsockopt on an unredirected
// loopback connection: with conntrack loaded the kernel reports the
// listener itself, without it an error; never a made-up address.
func TestOriginalDstWithoutNAT(t *testing.T) {
	for network, addr := range map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"} {
		l, err := net.Listen(network, addr)
		if err != nil {
			t.Logf("%s: %v", network, err)
			continue
		}
		defer l.Close()
		c, err := net.Dial(network, l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dst, err := capture.ConnOriginalDst(s.(*net.TCPConn))
		want := l.Addr().(*net.TCPAddr).AddrPort()
		if err == nil && dst != want {
			t.Fatalf("%s: original destination %v, want %v or an error", network, dst, want)
		}
		t.Logf("%s: %v %v", network, dst, err)
	}
}

func TestServeStops(t *testing.T) {
	s := &Server{Gate: &gate.Gate{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background(), l) }()
	l.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the listener closed")
	}
	if err := (&Server{}).Serve(context.Background(), l); err == nil {
		t.Fatal("Serve without a gate started")
	}
}

// Every request on a kept-alive connection is checked, not just the first:
// otherwise a second request could name another site at the same address.
func TestKeepAliveFrontingReset(t *testing.T) {
	rec := &egresstest.HostRecorder{}
	h := start(t, netip.AddrPortFrom(synthAllowed, 80), rec.Serve)
	c := h.dial(t)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	io.WriteString(c, "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if _, err := io.ReadAll(br); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("second request: %v, want connection reset", err)
	}
	if ev := h.lastEvent(t, audit.NetConnectDenied); ev["reason"] != egress.ReasonHostMismatch {
		t.Fatalf("event %v", ev)
	}
	if hosts := rec.Hosts(); len(hosts) != 1 || hosts[0] != "allowed.test" {
		t.Fatalf("upstream saw %v, want only the first request", hosts)
	}
}
