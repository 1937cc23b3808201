package relay

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (net.Conn, net.Conn) {
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
	return c, s
}

// TestRelayHalfClose runs client ⇄ [a relay b] ⇄ server where the server
// answers only after reading the client's EOF, which passes only if the
// relay half-closes instead of closing.
func TestRelayHalfClose(t *testing.T) {
	for _, idle := range []time.Duration{0, time.Second} {
		client, a := tcpPair(t)
		b, server := tcpPair(t)
		go func() {
			req, _ := io.ReadAll(server)
			io.WriteString(server, "reply to "+string(req))
			server.Close()
		}()
		type counts struct {
			ab, ba int64
			err    error
		}
		done := make(chan counts, 1)
		go func() {
			ab, ba, err := Relay(a, b, idle)
			done <- counts{ab, ba, err}
		}()
		io.WriteString(client, "ping")
		client.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(client)
		if err != nil || string(got) != "reply to ping" {
			t.Fatalf("idle=%v: got %q %v", idle, got, err)
		}
		c := <-done
		if c.err != nil || c.ab != 4 || c.ba != int64(len("reply to ping")) {
			t.Fatalf("idle=%v: relay returned %d %d %v", idle, c.ab, c.ba, c.err)
		}
	}
}

func TestRelayIdle(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	// One direction stays busy past the idle timeout: not idle.
	go func() {
		for range 6 {
			if _, err := io.WriteString(server, "x"); err != nil {
				return
			}
			time.Sleep(30 * time.Millisecond)
		}
	}()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, _, err := Relay(a, b, 100*time.Millisecond)
		done <- err
	}()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(client, buf); err != nil {
		t.Fatalf("busy relay cut short: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrIdle) {
			t.Fatalf("err = %v, want ErrIdle", err)
		}
		if time.Since(start) < 250*time.Millisecond {
			t.Fatal("ended while still busy")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("idle relay never ended")
	}
	if _, err := client.Read(buf); err == nil {
		t.Fatal("client still open after idle end")
	}
}

func TestRelayErrorClosesBoth(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	done := make(chan error, 1)
	go func() {
		_, _, err := Relay(a, b, 0)
		done <- err
	}()
	// An abortive close upstream must tear the client down too, even
	// though the client never sent anything.
	server.(*net.TCPConn).SetLinger(0)
	server.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not end after upstream reset")
	}
	client.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err == nil || errors.Is(err, net.ErrClosed) {
		t.Fatalf("client read: %v", err)
	}
}
