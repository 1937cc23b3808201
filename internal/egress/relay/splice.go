package relay

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// errNoPipe ends a splice before it moved anything of the bytes at hand:
// there was no descriptor for the pipe.
var errNoPipe = errors.New("relay: no pipe for splice")

// spliceChunk is the most one splice(2) call moves, and the pipe size asked
// for: larger pipes mean fewer calls per gigabyte.
const spliceChunk = 1 << 20

// sockets returns src and dst as TCP sockets when the kernel can move bytes
// between them without a copy through user space. Any wrapper (a replayed
// prefix, a guarded opening) means the bytes must be looked at, so only the
// bare type qualifies.
func sockets(dst, src net.Conn) (d, s *net.TCPConn, ok bool) {
	d, dok := dst.(*net.TCPConn)
	s, sok := src.(*net.TCPConn)
	return d, s, dok && sok
}

// spliceCopy moves src's bytes to dst through a pipe with splice(2), with
// the copy loops' semantics: n counts bytes written to dst, EOF ends it
// with nil, idle > 0 bounds how long a read may wait while the other
// direction is quiet too and how long a write may wait at all. limit >= 0
// ends it with nil once that many bytes have moved (n < limit then means
// EOF came first); a negative limit moves everything until EOF.
//
// The pipe exists only while bytes are in flight: it is made when src has
// data and closed as soon as src has none, so an idle tunnel holds no more
// descriptors than its two sockets (the supervisor's admission budgets two
// per tunnel) and nothing outlives the tunnel. Go's own TCPConn.ReadFrom
// splices too, but holds its pipe for the whole copy and then parks it in
// a pool only the garbage collector empties. Keeping the pipe across short
// gaps between bursts saved no measurable CPU with curl through the
// transparent path, so the simpler rule stays.
func spliceCopy(dst, src *net.TCPConn, limit int64, idle time.Duration, last *atomic.Int64) (int64, error) {
	rs, err := src.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("relay: %w", err)
	}
	rd, err := dst.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("relay: %w", err)
	}
	p := &spliceSession{}
	defer p.close()
	var n int64
	for limit < 0 || n < limit {
		if idle > 0 {
			if err := src.SetReadDeadline(time.Now().Add(idle)); err != nil {
				return n, err
			}
		}
		want := spliceChunk
		if limit >= 0 {
			want = int(min(limit-n, spliceChunk))
		}
		var nr int
		var serr error
		rerr := rs.Read(func(fd uintptr) bool {
			nr, serr = p.fill(int(fd), want)
			return !errors.Is(serr, unix.EAGAIN)
		})
		switch {
		case rerr != nil:
			if idle > 0 && errors.Is(rerr, os.ErrDeadlineExceeded) {
				if time.Since(time.Unix(0, last.Load())) >= idle {
					return n, ErrIdle
				}
				continue
			}
			return n, rerr
		case errors.Is(serr, errNoPipe):
			return n, serr
		case serr != nil:
			return n, opError("read", "splice", src, serr)
		case nr == 0:
			return n, nil
		}
		last.Store(time.Now().UnixNano())
		if idle > 0 {
			if err := dst.SetWriteDeadline(time.Now().Add(idle)); err != nil {
				return n, err
			}
		}
		for nr > 0 {
			var nw int
			var werr error
			err := rd.Write(func(fd uintptr) bool {
				nw, werr = p.drain(int(fd), nr)
				return !errors.Is(werr, unix.EAGAIN)
			})
			if err == nil && werr != nil {
				err = opError("write", "splice", dst, werr)
			}
			n += int64(nw)
			nr -= nw
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					return n, ErrIdle
				}
				return n, err
			}
		}
	}
	return n, nil
}

// pipesMade counts the pipes made for splices, so tests can tell which
// path a tunnel's bytes took.
var pipesMade atomic.Int64

// spliceSession is one direction's pipe, open only while bytes are in it.
type spliceSession struct {
	r, w int
	open bool
}

// fill splices up to max of what src has into the pipe, making the pipe
// first if src has data or its EOF. When src has nothing the (then empty)
// pipe is closed before waiting.
func (p *spliceSession) fill(src, max int) (int, error) {
	if !p.open {
		// A peek costs one call where making and closing a pipe for
		// nothing would cost four.
		var b [1]byte
		n, _, err := unix.Recvfrom(src, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err != nil || n == 0 {
			return 0, err
		}
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			return 0, fmt.Errorf("%w: %w", errNoPipe, err)
		}
		p.r, p.w, p.open = fds[0], fds[1], true
		pipesMade.Add(1)
		// Best effort: a smaller pipe only means more calls.
		_, _ = unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, spliceChunk)
	}
	for {
		n, err := unix.Splice(src, nil, p.w, nil, max, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			p.close()
		}
		return int(n), err
	}
}

// drain splices up to n bytes from the pipe to dst.
func (p *spliceSession) drain(dst, n int) (int, error) {
	for {
		m, err := unix.Splice(p.r, nil, dst, nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return int(m), err
	}
}

func (p *spliceSession) close() {
	if p.open {
		unix.Close(p.r)
		unix.Close(p.w)
		p.open = false
	}
}

// opError gives a failed system call the shape a Read or Write on c would
// have given it, so callers see the same errors on either path.
func opError(op, call string, c net.Conn, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(call, err)}
}
