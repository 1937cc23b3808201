package relay

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// lineDone is enough once a line has arrived.
func lineDone(b []byte) bool { return bytes.IndexByte(b, '\n') >= 0 }

func TestOpening(t *testing.T) {
	type ends struct{ client, a, b, server net.Conn }
	setup := func(t *testing.T) ends {
		client, a := tcpPair(t)
		b, server := tcpPair(t)
		return ends{client, a, b, server}
	}
	opening := func(e ends, idle time.Duration) ([]byte, error) {
		return Opening(e.a.(*net.TCPConn), e.b.(*net.TCPConn), idle, 100*time.Millisecond, 1024, lineDone)
	}
	// consumed reads what is left on c: Opening must have taken nothing.
	left := func(t *testing.T, c net.Conn, want string) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, len(want))
		if _, err := io.ReadFull(c, b); err != nil || string(b) != want {
			t.Fatalf("left on the socket: %q %v, want %q", b, err, want)
		}
	}

	t.Run("client first, in parts", func(t *testing.T) {
		e := setup(t)
		go func() {
			e.client.Write([]byte("hel"))
			time.Sleep(30 * time.Millisecond)
			e.client.Write([]byte("lo\nmore"))
		}()
		got, err := opening(e, 0)
		if err != nil || !bytes.HasPrefix(got, []byte("hello\n")) {
			t.Fatalf("got %q %v", got, err)
		}
		left(t, e.a, string(got))
	})
	t.Run("server first", func(t *testing.T) {
		e := setup(t)
		e.server.Write([]byte("banner\n"))
		got, err := opening(e, 0)
		if err != nil || got != nil {
			t.Fatalf("got %q %v, want nothing", got, err)
		}
		left(t, e.b, "banner\n")
	})
	t.Run("server while the client is part way", func(t *testing.T) {
		e := setup(t)
		e.client.Write([]byte("hel"))
		go func() {
			time.Sleep(30 * time.Millisecond)
			e.server.Write([]byte("x"))
		}()
		got, err := opening(e, 0)
		if err != nil || got != nil {
			t.Fatalf("got %q %v, want nothing", got, err)
		}
		left(t, e.a, "hel")
	})
	t.Run("client stops part way", func(t *testing.T) {
		e := setup(t)
		e.client.Write([]byte("hel"))
		start := time.Now()
		got, err := opening(e, time.Minute)
		if err != nil || got != nil || time.Since(start) < 100*time.Millisecond {
			t.Fatalf("got %q %v after %v, want nothing after the quiet timeout", got, err, time.Since(start))
		}
		left(t, e.a, "hel")
	})
	t.Run("client ends", func(t *testing.T) {
		e := setup(t)
		e.client.(*net.TCPConn).CloseWrite()
		got, err := opening(e, 0)
		if err != nil || got != nil {
			t.Fatalf("got %q %v, want nothing", got, err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		e := setup(t)
		_, err := opening(e, 150*time.Millisecond)
		if !errors.Is(err, ErrIdle) {
			t.Fatalf("err = %v, want ErrIdle", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		e := setup(t)
		go func() {
			time.Sleep(30 * time.Millisecond)
			e.a.Close()
		}()
		if _, err := opening(e, 0); err == nil {
			t.Fatal("a closed client gave no error")
		}
	})
}
