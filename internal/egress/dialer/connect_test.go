package dialer

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/egress"
)

// TestConnectTCP: the connection connectTCP returns carries bytes both
// ways and names both ends, over IPv4 and IPv6, and to an IPv4 address
// in its IPv4-mapped IPv6 form.
func TestConnectTCP(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "mapped"} {
		mapped := addr == "mapped"
		if mapped {
			addr = "127.0.0.1:0"
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v", addr, err)
			continue
		}
		defer l.Close()
		go func() {
			c, err := l.Accept()
			if err == nil {
				io.Copy(c, c)
				c.Close()
			}
		}()
		ap := l.Addr().(*net.TCPAddr).AddrPort()
		dial := ap
		if mapped {
			dial = netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
		}
		c, err := connectTCP(context.Background(), dial, time.Second)
		if err != nil {
			t.Fatalf("%s: %v", dial, err)
		}
		if _, ok := c.(*net.TCPConn); !ok || c.RemoteAddr().(*net.TCPAddr).AddrPort() != ap {
			t.Errorf("%s: got a %T to %v", dial, c, c.RemoteAddr())
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Errorf("%s: echoed %q, %v", ap, buf, err)
		}
		c.Close()
	}
}

// TestConnectTCPBeyondThreads: with every thread's worth of handshakes in
// progress, a dial still connects, through the network poller.
func TestConnectTCPBeyondThreads(t *testing.T) {
	for range maxThreadDials {
		threadDials <- struct{}{}
	}
	defer func() {
		for range maxThreadDials {
			<-threadDials
		}
	}()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ap := l.Addr().(*net.TCPAddr).AddrPort()
	c, err := connectTCP(context.Background(), ap, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	l.Close()
	_, err = connectTCP(context.Background(), ap, time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) || err.Error() != "dial tcp "+ap.String()+": connect: connection refused" {
		t.Fatalf("got %v, want the same refusal as on a thread", err)
	}
}

// TestConnectTCPRefused: a refusal reads as net.Dialer's does, and is
// not a timeout.
func TestConnectTCPRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := l.Addr().(*net.TCPAddr).AddrPort()
	l.Close()
	_, err = connectTCP(context.Background(), ap, time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) || err.Error() != "dial tcp "+ap.String()+": connect: connection refused" {
		t.Fatalf("got %v, want net.Dialer's connection refused", err)
	}
	if r := egress.UpstreamReason(err, egress.ReasonUpstream); r != egress.ReasonUpstream {
		t.Errorf("reason %s", r)
	}
}

// TestConnectTCPTimeout: a server that never answers the SYN (its accept
// queue is full, so the kernel drops it) fails the dial once the Dialer's
// timeout or the context's sooner deadline passes, as an upstream
// timeout.
func TestConnectTCPTimeout(t *testing.T) {
	ap := fullListener(t)
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		ctx     time.Duration
	}{
		{"timeout", 300 * time.Millisecond, 0},
		{"context deadline", 10 * time.Second, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			start := time.Now()
			// Backend: the one way the Dialer reaches this host's loopback.
			c, err := (&Dialer{Timeout: tc.timeout}).Backend(ctx, egress.Request{IP: ap.Addr(), Port: ap.Port()})
			took := time.Since(start)
			if err == nil {
				c.Close()
				t.Fatal("connected to a server that drops every SYN")
			}
			if r := egress.UpstreamReason(err, egress.ReasonUpstream); r != egress.ReasonUpstreamTimeout || !strings.Contains(err.Error(), "i/o timeout") {
				t.Errorf("reason %s for %v, want %s", r, err, egress.ReasonUpstreamTimeout)
			}
			if took < 250*time.Millisecond || took > 5*time.Second {
				t.Errorf("gave up after %v, want about 300ms", took)
			}
		})
	}
}

// fullListener returns the address of a loopback listener whose accept
// queue is full: the kernel drops the SYNs of further connections.
func fullListener(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	// Fill the queue: these complete their handshakes and are never
	// accepted; the next SYN finds no room.
	for range 2 {
		c, err := net.DialTimeout("tcp", ap.String(), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return ap
}
