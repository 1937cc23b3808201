package socks5

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

type harness struct {
	addr   string
	dialer *egresstest.Dialer
	audit  *egresstest.AuditBuffer
}

func start(t *testing.T, up string) *harness {
	t.Helper()
	h := &harness{dialer: &egresstest.Dialer{Addr: up}, audit: &egresstest.AuditBuffer{}}
	s := &Server{
		Gate: &gate.Gate{
			Decider: egresstest.Decider{"allowed.test": true, "203.0.113.7": true, "2001:db8::1": true},
			Dialer:  h.dialer,
			Audit:   audit.New(h.audit),
		},
		Names: egresstest.Names{netip.MustParseAddr("198.18.0.1"): "allowed.test"},
	}
	h.addr = egresstest.Serve(t, s.Serve)
	return h
}

func (h *harness) dial(t *testing.T) *net.TCPConn { return egresstest.Dial(t, h.addr) }

func connectReq(atyp byte, addr []byte, port uint16) []byte {
	b := []byte{5, 1, 0, atyp}
	if atyp == atypDomain {
		b = append(b, byte(len(addr)))
	}
	b = append(b, addr...)
	return binary.BigEndian.AppendUint16(b, port)
}

// connect greets, sends req and returns the reply code.
func connect(t *testing.T, c net.Conn, req []byte) byte {
	t.Helper()
	if _, err := c.Write(append([]byte{5, 1, methodNoAuth}, req...)); err != nil {
		t.Fatal(err)
	}
	var resp [12]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		t.Fatalf("reply: %v", err)
	}
	if !bytes.Equal(resp[:2], []byte{5, 0}) || resp[2] != 5 || resp[4] != 0 ||
		!bytes.Equal(resp[5:], []byte{atypIPv4, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("reply % x", resp)
	}
	return resp[3]
}

func TestConnectAddressTypes(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	tests := []struct {
		name string
		req  []byte
		want egress.Request
	}{
		{"domain", connectReq(atypDomain, []byte("Allowed.Test"), 5432), egress.Request{Host: "allowed.test", Port: 5432}},
		{"ipv4 synthetic", connectReq(atypIPv4, []byte{198, 18, 0, 1}, 443), egress.Request{Host: "allowed.test", Port: 443}},
		{"ipv4 literal", connectReq(atypIPv4, []byte{203, 0, 113, 7}, 22), egress.Request{IP: netip.MustParseAddr("203.0.113.7"), Port: 22}},
		{"ipv6", connectReq(atypIPv6, netip.MustParseAddr("2001:db8::1").AsSlice(), 443), egress.Request{IP: netip.MustParseAddr("2001:db8::1"), Port: 443}},
		{"literal as domain", connectReq(atypDomain, []byte("203.0.113.7"), 80), egress.Request{IP: netip.MustParseAddr("203.0.113.7"), Port: 80}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := h.dial(t)
			if code := connect(t, c, tt.req); code != RepSucceeded {
				t.Fatalf("reply 0x%02x", code)
			}
			io.WriteString(c, "\x00payload")
			c.CloseWrite()
			if got, err := io.ReadAll(c); err != nil || string(got) != "echo:\x00payload" {
				t.Fatalf("got %q %v", got, err)
			}
			got := h.dialer.Last()
			if got.Host != tt.want.Host || got.IP != tt.want.IP || got.Port != tt.want.Port || got.Via != egress.ViaSOCKS5 {
				t.Fatalf("dialled %+v", got)
			}
		})
	}
}

func TestDenied(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	for _, req := range [][]byte{
		connectReq(atypDomain, []byte("evil.test"), 443),
		connectReq(atypIPv4, []byte{203, 0, 113, 8}, 443),
	} {
		c := h.dial(t)
		if code := connect(t, c, req); code != RepNotAllowed {
			t.Fatalf("reply 0x%02x, want 0x02", code)
		}
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("connection open after refusal")
		}
	}
	evs := h.audit.Events(t)
	if len(evs) != 2 || evs[0][audit.FieldEvent] != audit.NetConnectDenied || evs[0]["host"] != "evil.test" || evs[1]["ip"] != "203.0.113.8" {
		t.Fatalf("events %v", evs)
	}
}

func TestUpstreamRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	h := start(t, closed)
	if code := connect(t, h.dial(t), connectReq(atypDomain, []byte("allowed.test"), 443)); code != RepConnectionRefused {
		t.Fatalf("reply 0x%02x, want 0x05", code)
	}
}

func TestUnsupported(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))

	c := h.dial(t)
	c.Write([]byte{5, 1, 0x02}) // username/password only
	if got, _ := io.ReadAll(c); !bytes.Equal(got, []byte{5, 0xff}) {
		t.Fatalf("method reply % x", got)
	}

	bind := connectReq(atypDomain, []byte("allowed.test"), 443)
	bind[1] = 0x02
	if code := connect(t, h.dial(t), bind); code != RepCommandUnsupported {
		t.Fatalf("BIND reply 0x%02x", code)
	}
	if code := connect(t, h.dial(t), []byte{5, 1, 0, 0x09, 1, 2}); code != RepAddressUnsupported {
		t.Fatalf("bad atyp reply 0x%02x", code)
	}
	if code := connect(t, h.dial(t), connectReq(atypDomain, []byte("bad name!"), 443)); code != RepGeneralFailure {
		t.Fatalf("bad name reply 0x%02x", code)
	}
	if h.dialer.Last().Port != 0 {
		t.Fatal("dialled for an unsupported request")
	}

	c = h.dial(t)
	c.Write([]byte{4, 1, 0, 80, 1, 2, 3, 4, 0}) // SOCKS4
	if got, _ := io.ReadAll(c); len(got) != 0 {
		t.Fatalf("answered SOCKS4 with % x", got)
	}
}

func TestFrontedSNI(t *testing.T) {
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	if code := connect(t, c, connectReq(atypDomain, []byte("allowed.test"), 443)); code != RepSucceeded {
		t.Fatalf("reply 0x%02x", code)
	}
	if err := tls.Client(c, &tls.Config{ServerName: "evil.test"}).Handshake(); err == nil {
		t.Fatal("fronted handshake completed")
	}
	evs := h.audit.Events(t)
	if len(evs) != 2 || evs[1][audit.FieldEvent] != audit.NetConnectDenied || evs[1]["reason"] != egress.ReasonSNIMismatch {
		t.Fatalf("events %v", evs)
	}
}

func TestHandshakeDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the handshake timeout")
	}
	h := start(t, egresstest.Upstream(t, egresstest.EchoAtEOF))
	c := h.dial(t)
	c.SetDeadline(time.Now().Add(HandshakeTimeout + 5*time.Second))
	c.Write([]byte{5, 1})
	begin := time.Now()
	io.ReadAll(c)
	if d := time.Since(begin); d < HandshakeTimeout-time.Second || d > HandshakeTimeout+4*time.Second {
		t.Fatalf("stalled client dropped after %v", d)
	}
}

// Plain HTTP through a SOCKS5 tunnel is checked request by request, like
// every tunnel the gate carries: a keep-alive request for another host
// served at the same address is refused.
func TestKeepAliveFronting(t *testing.T) {
	rec := &egresstest.HostRecorder{}
	h := start(t, egresstest.Upstream(t, rec.Serve))
	c := h.dial(t)
	if code := connect(t, c, connectReq(atypDomain, []byte("allowed.test"), 80)); code != RepSucceeded {
		t.Fatalf("reply 0x%02x", code)
	}
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	io.WriteString(c, "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("the fronted request got an answer: %v", resp.Status)
	}
	evs := h.audit.Events(t)
	if last := evs[len(evs)-1]; last[audit.FieldEvent] != audit.NetConnectDenied || last["reason"] != egress.ReasonHostMismatch {
		t.Fatalf("events %v", evs)
	}
	if hosts := rec.Hosts(); len(hosts) != 1 || hosts[0] != "allowed.test" {
		t.Fatalf("upstream saw %v, want only the first request", hosts)
	}
}

// A client that takes the SOCKS port for an HTTP proxy (Chromium reading
// ALL_PROXY=socks5h://...) is handed to the HTTP proxy with its request
// intact and its connection still a *net.TCPConn; SOCKS clients are not.
func TestNotSOCKSGoesToHTTP(t *testing.T) {
	got := make(chan string, 1)
	s := &Server{
		Gate: &gate.Gate{Decider: egresstest.Decider{"allowed.test": true}, Dialer: &egresstest.Dialer{Addr: egresstest.Upstream(t, egresstest.EchoAtEOF)}, Audit: audit.New(&egresstest.AuditBuffer{})},
		HTTP: func(ctx context.Context, c net.Conn) {
			_, isTCP := c.(*net.TCPConn)
			line, _ := bufio.NewReader(c).ReadString('\n')
			got <- fmt.Sprintf("tcp=%v %q", isTCP, line)
			io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
			c.Close()
		},
	}
	addr := egresstest.Serve(t, s.Serve)

	c := egresstest.Dial(t, addr)
	io.WriteString(c, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if reply, _ := io.ReadAll(c); !strings.HasPrefix(string(reply), "HTTP/1.1 403") {
		t.Errorf("reply %q, want the HTTP handler's", reply)
	}
	if g := <-got; g != `tcp=true "GET http://allowed.test/ HTTP/1.1\r\n"` {
		t.Errorf("the HTTP handler got %s", g)
	}

	// SOCKS5 and SOCKS4 greetings stay here.
	if code := connect(t, egresstest.Dial(t, addr), connectReq(atypDomain, []byte("allowed.test"), 443)); code != RepSucceeded {
		t.Errorf("SOCKS5 CONNECT reply 0x%02x", code)
	}
	c = egresstest.Dial(t, addr)
	c.Write([]byte{4, 1, 0, 80, 1, 2, 3, 4, 0})
	if reply, _ := io.ReadAll(c); len(reply) != 0 {
		t.Errorf("answered SOCKS4 with % x", reply)
	}
	select {
	case g := <-got:
		t.Errorf("a SOCKS greeting reached the HTTP handler: %s", g)
	default:
	}
}
