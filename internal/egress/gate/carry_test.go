package gate_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

// clientHello returns the first record a TLS client sends for sni.
func clientHello(t *testing.T, sni string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		tls.Client(c, &tls.Config{ServerName: sni}).Handshake()
	}()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	head := make([]byte, 5)
	if _, err := io.ReadFull(s, head); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(head[3])<<8|int(head[4]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()
	return append(head, body...)
}

// tcpPair returns a connected client and the listener's end, as a listener
// accepts them.
func tcpPair(t *testing.T) (client, accepted *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// recorder is an upstream that keeps what it was sent and echoes it back
// with a prefix once the client is done.
func recorder(got chan<- []byte) func(net.Conn) {
	return func(c net.Conn) {
		b, _ := io.ReadAll(c)
		got <- b
		c.Write(append([]byte("echo:"), b...))
	}
}

// carry runs one tunnel for r through a gate allowing a.test with ahead as
// the bytes the listener read, and returns the client's end and the
// upstream's record.
func carry(t *testing.T, r egress.Request, ahead []byte) (*net.TCPConn, chan []byte, chan struct{}) {
	t.Helper()
	got := make(chan []byte, 1)
	up := egresstest.Upstream(t, recorder(got))
	g := &gate.Gate{Decider: egresstest.Decider{"a.test": true}, Dialer: &egresstest.Dialer{Addr: up}}
	client, proxySide := tcpPair(t)
	tun, err := g.Connect(context.Background(), proxySide, r)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		g.Carry(context.Background(), proxySide, tun, ahead, time.Minute)
		close(done)
	}()
	return client, got, done
}

// A tunnel whose complete opening the listener already read is relayed
// bare: the opening first, then the rest, both ways, half-close included.
func TestCarrySettledOpeningFirst(t *testing.T) {
	hello := clientHello(t, "a.test")
	for _, tc := range []struct {
		name  string
		r     egress.Request
		ahead []byte
	}{
		{"tls", egress.Request{Host: "a.test", Port: 443, Sniffed: "a.test", SniffedKind: "tls_sni"}, hello},
		{"raw", egress.Request{Host: "a.test", Port: 7001}, []byte("1234\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, got, done := carry(t, tc.r, tc.ahead)
			client.Write([]byte("rest"))
			client.CloseWrite()
			want := append(append([]byte(nil), tc.ahead...), "rest"...)
			select {
			case b := <-got:
				if !bytes.Equal(b, want) {
					t.Fatalf("upstream got %q, want %q", b, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("upstream got nothing")
			}
			reply, _ := io.ReadAll(client)
			if !bytes.Equal(reply, append([]byte("echo:"), want...)) {
				t.Fatalf("client got %q", reply)
			}
			<-done
		})
	}
}

// A fronted opening (allowed name dialled, another name in the SNI) is
// refused whether the listener read all of it ahead (the bare path's own
// check) or only part (the guard's): the upstream receives nothing and the
// client is reset.
func TestCarryFrontedOpeningRefused(t *testing.T) {
	hello := clientHello(t, "evil.test")
	for _, split := range []int{len(hello), len(hello) / 2} {
		client, got, done := carry(t, egress.Request{Host: "a.test", Port: 443}, hello[:split])
		client.Write(hello[split:])
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("split %d: a fronted opening is being carried", split)
		}
		if b := <-got; len(b) != 0 {
			t.Fatalf("split %d: upstream got %d bytes of a refused opening", split, len(b))
		}
		client.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := client.Read(make([]byte, 1)); err == nil {
			t.Fatalf("split %d: client still open", split)
		}
	}
}

// carryTo is carry with the upstream's handler given.
func carryTo(t *testing.T, r egress.Request, handler func(net.Conn)) (*net.TCPConn, chan struct{}) {
	t.Helper()
	up := egresstest.Upstream(t, handler)
	g := &gate.Gate{Decider: egresstest.Decider{"a.test": true}, Dialer: &egresstest.Dialer{Addr: up}}
	client, proxySide := tcpPair(t)
	tun, err := g.Connect(context.Background(), proxySide, r)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		g.Carry(context.Background(), proxySide, tun, nil, time.Minute)
		close(done)
	}()
	return client, done
}

// With nothing read ahead (CONNECT), the opening the client sends first is
// still checked: the allowed name goes through, a fronted one is refused
// before any byte reaches the upstream, whether it arrives whole or in two
// parts.
func TestCarryOpeningAfterConnect(t *testing.T) {
	for _, sni := range []string{"a.test", "evil.test"} {
		hello := clientHello(t, sni)
		for _, split := range []int{len(hello), 40} {
			got := make(chan []byte, 1)
			client, done := carryTo(t, egress.Request{Host: "a.test", Port: 443}, recorder(got))
			client.Write(hello[:split])
			time.Sleep(20 * time.Millisecond)
			client.Write(hello[split:])
			if sni == "a.test" {
				client.CloseWrite()
			}
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				if sni != "a.test" {
					t.Fatalf("%s split %d: a fronted opening is being carried", sni, split)
				}
			}
			b := <-got
			switch {
			case sni == "a.test" && !bytes.Equal(b, hello):
				t.Errorf("split %d: upstream got %d bytes, want the %d of the opening", split, len(b), len(hello))
			case sni != "a.test" && len(b) != 0:
				t.Errorf("split %d: upstream got %d bytes of a refused opening", split, len(b))
			}
		}
	}
}

// A server that speaks first is relayed at once: the tunnel does not wait
// for a client that is waiting for the server.
func TestCarryServerFirst(t *testing.T) {
	client, done := carryTo(t, egress.Request{Host: "a.test", Port: 22}, func(c net.Conn) {
		c.Write([]byte("SSH-2.0-lab\r\n"))
		b := make([]byte, 64)
		n, _ := c.Read(b)
		c.Write(append([]byte("got "), b[:n]...))
		c.Close()
	})
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	banner := make([]byte, len("SSH-2.0-lab\r\n"))
	if _, err := io.ReadFull(client, banner); err != nil {
		t.Fatalf("no banner: %v", err)
	}
	client.Write([]byte("SSH-2.0-client\r\n"))
	rest, _ := io.ReadAll(client)
	if string(rest) != "got SSH-2.0-client\r\n" {
		t.Fatalf("client got %q", rest)
	}
	client.Close()
	<-done
}

// A plain HTTP connection is never relayed bare: with nothing read ahead
// its first request is let through and a later one naming another host is
// refused, as the guard has always done.
func TestCarryHTTPStaysGuarded(t *testing.T) {
	got := make(chan []byte, 1)
	client, done := carryTo(t, egress.Request{Host: "a.test", Port: 80}, recorder(got))
	first := "GET /1 HTTP/1.1\r\nHost: a.test\r\n\r\n"
	client.Write([]byte(first))
	client.Write([]byte("GET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a request for another host is being carried")
	}
	if b := <-got; bytes.Contains(b, []byte("evil.test")) || !bytes.Contains(b, []byte("GET /1 ")) {
		t.Fatalf("upstream got %q", b)
	}
}

// A large response body, whole or in one chunk, is spliced past the guard,
// and the guard still knows where the next response starts: a later request for another host
// on the same connection is refused, and a WebSocket the server accepts
// after such a body is still recognised (its frames then pass unchecked).
func TestCarryHTTPLargeBodyStaysGuarded(t *testing.T) {
	const size = 4 << 20
	body := bytes.Repeat([]byte("HTTP/1.1 101 Switching Protocols\r\n"), size/34+1)[:size]
	fronted := "GET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	ws := "GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	for _, tc := range []struct {
		name, second      string
		upgraded, chunked bool
	}{
		{"fronted", fronted, false, false},
		{"websocket", ws, true, false},
		{"fronted-chunked", fronted, false, true},
		{"websocket-chunked", ws, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan string, 4)
			client, done := carryTo(t, egress.Request{Host: "a.test", Port: 80}, func(c net.Conn) {
				br := bufio.NewReader(c)
				if req, err := http.ReadRequest(br); err == nil {
					got <- req.Host + req.URL.Path
					if tc.chunked {
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", size)
						c.Write(body)
						io.WriteString(c, "\r\n0\r\n\r\n")
					} else {
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
						c.Write(body)
					}
				}
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				got <- req.Host + req.URL.Path
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				frame, _ := br.ReadString('\n')
				got <- "frame " + frame
			})
			client.Write([]byte("GET /1 HTTP/1.1\r\nHost: a.test\r\n\r\n"))
			br := bufio.NewReader(client)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := io.ReadAll(resp.Body); !bytes.Equal(b, body) {
				t.Fatalf("the client got %d body bytes, not the %d sent", len(b), size)
			}
			client.Write([]byte(tc.second))
			if !tc.upgraded {
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("a request for another host is being carried")
				}
				if g := <-got; g != "a.test/1" || len(got) != 0 {
					t.Fatalf("upstream got %q and %d more", g, len(got))
				}
				return
			}
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			// Not a request: only an upgrade the guard saw accepted lets
			// it through.
			client.Write([]byte("\x81\x05hello\n"))
			for _, want := range []string{"a.test/1", "a.test/ws", "frame \x81\x05hello\n"} {
				select {
				case g := <-got:
					if g != want {
						t.Fatalf("upstream got %q, want %q", g, want)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("upstream never got %q", want)
				}
			}
		})
	}
}
