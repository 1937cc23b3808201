// Package relay moves bytes between a sandbox client and its upstream
// once a listener has been allowed to connect them.
package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// bufPool holds copy buffers; a direction holds one only while copying.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ErrIdle ends a relay in which neither side sent anything for the idle
// timeout.
var ErrIdle = errors.New("relay: idle timeout")

// Relay copies a→b and b→a until both directions have ended, then closes
// both connections. When one side finishes sending, the other is
// half-closed (CloseWrite) so its reader sees EOF while replies still flow
// back, as request/response protocols over a shutdown() socket need. An
// error in either direction ends both. idle > 0 ends the relay after that
// long without a byte either way; 0 means no limit. Between two bare TCP
// connections the kernel moves the bytes (splice); through any wrapper they
// are copied.
func Relay(a, b net.Conn, idle time.Duration) (aToB, bToA int64, err error) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	type result struct {
		n       int64
		err     error
		forward bool
	}
	done := make(chan result, 2)
	go func() {
		n, err := pipe(b, a, idle, &last)
		done <- result{n, err, true}
	}()
	go func() {
		n, err := pipe(a, b, idle, &last)
		done <- result{n, err, false}
	}()
	for range 2 {
		r := <-done
		if r.forward {
			aToB = r.n
		} else {
			bToA = r.n
		}
		if r.err != nil && err == nil {
			err = r.err
			// Unblock the other direction: after a failure nothing more
			// can usefully be delivered.
			a.Close()
			b.Close()
		}
	}
	a.Close()
	b.Close()
	return aToB, bToA, err
}

// pipe copies src to dst and then passes src's EOF on to dst.
func pipe(dst, src net.Conn, idle time.Duration, last *atomic.Int64) (int64, error) {
	var n int64
	var err error
	if d, s, ok := sockets(dst, src); ok {
		n, err = spliceCopy(d, s, idle, last)
		if errors.Is(err, errNoPipe) {
			// Out of descriptors for a pipe: the tunnel still works,
			// through user space.
			var m int64
			m, err = copyLoop(dst, src, idle, last)
			n += m
		}
	} else {
		n, err = copyLoop(dst, src, idle, last)
	}
	if err != nil {
		return n, err
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			return n, err
		}
	}
	return n, nil
}

// copyLoop copies src to dst through a buffer.
func copyLoop(dst, src net.Conn, idle time.Duration, last *atomic.Int64) (int64, error) {
	if idle > 0 {
		return copyIdle(dst, src, idle, last)
	}
	// Not io.Copy's ReadFrom: a wrapper may still unwrap to a TCPConn
	// there, and Go's splice parks two pipes (four descriptors) per
	// tunnel in a pool that only the garbage collector empties.
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *buf)
}

// copyIdle copies with a deadline per read, treating a timeout as idleness
// only if the other direction has been quiet too: a long download with a
// silent client is not idle.
func copyIdle(dst, src net.Conn, idle time.Duration, last *atomic.Int64) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int64
	for {
		if err := src.SetReadDeadline(time.Now().Add(idle)); err != nil {
			return n, err
		}
		nr, rerr := src.Read(buf)
		if nr > 0 {
			last.Store(time.Now().UnixNano())
			if err := dst.SetWriteDeadline(time.Now().Add(idle)); err != nil {
				return n, err
			}
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				if errors.Is(werr, os.ErrDeadlineExceeded) {
					return n, ErrIdle
				}
				return n, werr
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			return n, nil
		case errors.Is(rerr, os.ErrDeadlineExceeded):
			if time.Since(time.Unix(0, last.Load())) >= idle {
				return n, ErrIdle
			}
		default:
			return n, rerr
		}
	}
}
