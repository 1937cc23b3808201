// Package relay moves bytes between a sandbox client and its upstream
// once a listener has been allowed to connect them.
package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
// connections the kernel moves a direction's bytes (splice) once it shows
// itself bulk; through any wrapper they are copied.
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

// Watched is a destination that must see some of the bytes written to it
// (a guarded HTTP connection following the server's responses) and can
// say how many of the next ones it need not see: the rest of a body whose
// length the framing gave, say. The relay splices those straight to Raw.
type Watched interface {
	net.Conn
	// Unwatched is how many of the next bytes may go to Raw without
	// Write: 0 when the next ones must be written through, a negative
	// number when none ever need to be again.
	Unwatched() int64
	// Skipped tells it that n bytes (at most Unwatched) went to Raw.
	Skipped(n int64)
	// Raw is the connection Write writes to.
	Raw() net.Conn
}

// minSkip is the least a splice is worth: below it one copy through user
// space costs fewer calls than making and closing a pipe.
const minSkip = 64 << 10

// pipe copies src to dst and then passes src's EOF on to dst.
func pipe(dst, src net.Conn, idle time.Duration, last *atomic.Int64) (int64, error) {
	var n int64
	var err error
	if d, s, ok := sockets(dst, src); ok {
		n, err = bulkCopy(d, s, idle, last)
	} else if w, ok := dst.(Watched); ok {
		n, err = watchedCopy(w, src, idle, last)
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

// bulkCopy moves src's bytes to dst, through a buffer until one read fills
// it, then with splice(2) to the end. A splice costs a pipe and four more
// system calls than a read and a write per burst, which the small
// exchanges of a request-response protocol never earn back; a read that
// fills the buffer says more is queued, and from then on the kernel moves
// the bytes.
func bulkCopy(dst, src *net.TCPConn, idle time.Duration, last *atomic.Int64) (int64, error) {
	rs, err := src.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("relay: %w", err)
	}
	var n int64
	for {
		m, full, err := copyBurst(dst, src, rs, idle, last)
		n += int64(m)
		if err != nil || m == 0 {
			return n, err
		}
		if full {
			break
		}
	}
	m, err := spliceCopy(dst, src, -1, idle, last)
	n += m
	if errors.Is(err, errNoPipe) {
		// Out of descriptors for a pipe: the tunnel still works,
		// through user space.
		m, err = copyLoop(dst, src, idle, last)
		n += m
	}
	return n, err
}

// copyBurst moves what one read of src (rs its raw connection) returns to
// dst, with copyOnce's deadlines, and reports whether it filled the
// buffer; n == 0 with a nil error is src's EOF. The buffer is taken only
// once src has bytes, so a quiet tunnel holds none, as a spliced one holds
// no pipe.
func copyBurst(dst, src *net.TCPConn, rs syscall.RawConn, idle time.Duration, last *atomic.Int64) (n int, full bool, err error) {
	var bp *[]byte
	defer func() {
		if bp != nil {
			bufPool.Put(bp)
		}
	}()
	for {
		if idle > 0 {
			if err := src.SetReadDeadline(time.Now().Add(idle)); err != nil {
				return 0, false, err
			}
		}
		var nr int
		var rerr error
		err := rs.Read(func(fd uintptr) bool {
			if bp == nil {
				bp = bufPool.Get().(*[]byte)
			}
			for {
				nr, rerr = unix.Read(int(fd), *bp)
				if !errors.Is(rerr, unix.EINTR) {
					break
				}
			}
			if errors.Is(rerr, unix.EAGAIN) {
				bufPool.Put(bp)
				bp = nil
				return false
			}
			return true
		})
		switch {
		case err != nil:
			if idle > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				if time.Since(time.Unix(0, last.Load())) >= idle {
					return 0, false, ErrIdle
				}
				continue
			}
			return 0, false, err
		case rerr != nil:
			return 0, false, opError("read", "read", src, rerr)
		case nr == 0:
			return 0, false, nil
		}
		last.Store(time.Now().UnixNano())
		if idle > 0 {
			if err := dst.SetWriteDeadline(time.Now().Add(idle)); err != nil {
				return 0, false, err
			}
		}
		nw, werr := dst.Write((*bp)[:nr])
		if errors.Is(werr, os.ErrDeadlineExceeded) {
			werr = ErrIdle
		}
		return nw, nr == len(*bp), werr
	}
}

// watchedCopy copies src to dst, writing through dst what it must see and
// splicing the rest straight to its raw connection.
func watchedCopy(dst Watched, src net.Conn, idle time.Duration, last *atomic.Int64) (int64, error) {
	raw, s, canSplice := sockets(dst.Raw(), src)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	var n int64
	for {
		if skip := dst.Unwatched(); canSplice && (skip < 0 || skip >= minSkip) {
			m, err := spliceCopy(raw, s, skip, idle, last)
			n += m
			if skip >= 0 {
				dst.Skipped(m)
			}
			switch {
			case errors.Is(err, errNoPipe):
				// Out of descriptors: through user space from here.
				canSplice = false
				continue
			case err != nil, skip < 0, m < skip:
				// An error, or EOF from src.
				return n, err
			}
			continue
		}
		m, eof, err := copyOnce(dst, src, *bp, idle, last)
		n += int64(m)
		if err != nil || eof {
			return n, err
		}
	}
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
	var n int64
	for {
		m, eof, err := copyOnce(dst, src, *bp, idle, last)
		n += int64(m)
		if err != nil || eof {
			return n, err
		}
	}
}

// copyOnce moves what one read of src returns to dst, with copyIdle's
// deadlines when idle > 0. eof reports that src has ended.
func copyOnce(dst, src net.Conn, buf []byte, idle time.Duration, last *atomic.Int64) (n int, eof bool, err error) {
	if idle > 0 {
		if err := src.SetReadDeadline(time.Now().Add(idle)); err != nil {
			return 0, false, err
		}
	}
	nr, rerr := src.Read(buf)
	if nr > 0 {
		last.Store(time.Now().UnixNano())
		if idle > 0 {
			if err := dst.SetWriteDeadline(time.Now().Add(idle)); err != nil {
				return 0, false, err
			}
		}
		nw, werr := dst.Write(buf[:nr])
		if werr != nil {
			if errors.Is(werr, os.ErrDeadlineExceeded) {
				return nw, false, ErrIdle
			}
			return nw, false, werr
		}
		n = nw
	}
	switch {
	case rerr == nil:
		return n, false, nil
	case errors.Is(rerr, io.EOF):
		return n, true, nil
	case errors.Is(rerr, os.ErrDeadlineExceeded):
		if time.Since(time.Unix(0, last.Load())) >= idle {
			return n, false, ErrIdle
		}
		return n, false, nil
	default:
		return n, false, rerr
	}
}
