package dialer

import (
	"context"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxThreadDials bounds the handshakes waited for on threads of their own
// at once; beyond it connectTCP waits in the network poller, so that
// upstreams that never answer cannot make the supervisor start a thread
// per connection the sandbox opens.
const maxThreadDials = 64

var threadDials = make(chan struct{}, maxThreadDials)

// connectTCP connects to ap and waits for the handshake in poll(2) on the
// calling goroutine's thread, not in Go's network poller. In a busy
// supervisor, parking the goroutine in the poller and having it scheduled
// again once the handshake is done cost every connection about as much as
// the handshake itself (`go test -bench ConnectionSetup ./test/bench/`,
// the dial's share measured at p50). The price is a thread per handshake
// in progress, up to maxThreadDials; more at once go through net.Dialer.
//
// timeout bounds the wait, and so does ctx's deadline if it is sooner;
// with neither, the kernel's SYN retries do. On a thread of its own a
// cancellation of ctx without a deadline does not cut the wait short.
// Errors read as net.Dialer's do ("dial tcp ADDR: connect: connection
// refused", or a timeout).
func connectTCP(ctx context.Context, ap netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	select {
	case threadDials <- struct{}{}:
		defer func() { <-threadDials }()
	default:
		return (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", ap.String())
	}
	deadline, hasDeadline := ctx.Deadline()
	if timeout > 0 && (!hasDeadline || time.Until(deadline) > timeout) {
		deadline, hasDeadline = time.Now().Add(timeout), true
	}
	// net.Dialer makes the socket and the connection around it; the
	// handshake is done in its Control hook, and the dialer's own
	// connect(2) then finds the socket connected (EISCONN), which it
	// takes as success. Connecting a socket of our own and adopting it
	// with net.FileConn instead made a duplicate descriptor and queried
	// and registered both with the poller before closing the original.
	d := net.Dialer{ControlContext: func(_ context.Context, network, _ string, c syscall.RawConn) error {
		// The address in the family of the socket the dialer made.
		sa := unix.Sockaddr(&unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
		if network == "tcp4" {
			sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
		}
		var herr error
		if err := c.Control(func(fd uintptr) { herr = handshake(int(fd), sa, deadline, hasDeadline) }); err != nil {
			return err
		}
		return herr
	}}
	return d.DialContext(ctx, "tcp", ap.String())
}

// handshake starts the connect on the non-blocking socket fd and waits
// until it completes, fails or the deadline passes.
func handshake(fd int, sa unix.Sockaddr, deadline time.Time, hasDeadline bool) error {
	err := unix.Connect(fd, sa)
	if err == nil {
		return nil
	}
	if err != unix.EINPROGRESS && err != unix.EINTR {
		return os.NewSyscallError("connect", err)
	}
	for {
		wait := -1
		if hasDeadline {
			left := time.Until(deadline)
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			wait = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(p, wait)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("poll", err)
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return os.NewSyscallError("getsockopt", err)
		}
		if soErr != 0 {
			return os.NewSyscallError("connect", unix.Errno(soErr))
		}
		return nil
	}
}
