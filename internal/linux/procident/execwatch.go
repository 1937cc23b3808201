//go:build linux

package procident

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// An ancestor lends its binary's binding only to what it started while
// running that binary. A child forked before its parent exec'd an allowed
// binary (fork, then exec curl in the parent) runs code that curl never
// vetted, yet /proc shows curl as its parent. Nothing in /proc records
// exec order, so ExecWatch follows forks and execs as the kernel reports
// them through the proc connector (netlink; root, or any user since Linux
// 6.6).

// Proc connector constants (linux/cn_proc.h, linux/connector.h).
const (
	cnIdxProc         = 1
	cnValProc         = 1
	procCnMcastListen = 1
	procEventNone     = 0x00000000
	procEventFork     = 0x00000001
	procEventExec     = 0x00000002
	procEventExit     = 0x80000000
	// nlmsghdr (16) + cn_msg header (20) + proc_event header (16).
	eventData = 16 + 20 + 16
	// maxTracked bounds the tables; the system's whole process churn
	// passes through them.
	maxTracked = 1 << 16
)

// birth is what a process's fork said: its parent and how many execs the
// parent had done by then.
type birth struct {
	parent int32
	gen    uint32
}

// ExecWatch records forks and execs system-wide.
type ExecWatch struct {
	fd int

	mu     sync.Mutex
	gen    map[int32]uint32 // tgid -> execs seen
	births map[int32]birth  // tgid -> its fork
	// argv is an interpreter's command line as it was at exec, before the
	// process ran any code of its own (it can rewrite the live one), and
	// inherited by its forks, which share that memory's contents.
	argv map[int32][]string
	// lost is set when the kernel dropped events (the receive queue
	// overflowed): an exec may have gone unseen, so from then on no fork
	// is vouched for and ancestors lend nothing.
	lost bool
	done chan struct{}
	// Lost is called once when events were first lost.
	Lost func()
	// ackSeq and acked carry the kernel's answer to the subscription.
	ackSeq uint32
	acked  chan uint32
}

// WatchExecs subscribes to the proc connector. Before Linux 6.6 it fails
// without CAP_NET_ADMIN in the initial user namespace (rootless).
func WatchExecs() (*ExecWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("proc connector socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind proc connector: %w", err)
	}
	// The request's ack number tells its acknowledgement (which carries
	// it plus one) from those of other listeners, which the group
	// receives too.
	seq := uint32(os.Getpid())
	msg := make([]byte, 16+20+4)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], unix.NLMSG_DONE)
	binary.NativeEndian.PutUint32(msg[16:], cnIdxProc)
	binary.NativeEndian.PutUint32(msg[20:], cnValProc)
	binary.NativeEndian.PutUint32(msg[28:], seq)
	binary.NativeEndian.PutUint16(msg[32:], 4)
	binary.NativeEndian.PutUint32(msg[36:], procCnMcastListen)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen to proc connector: %w", err)
	}
	w := &ExecWatch{fd: fd, gen: map[int32]uint32{}, births: map[int32]birth{}, argv: map[int32][]string{},
		done: make(chan struct{}), ackSeq: seq + 1, acked: make(chan uint32, 1)}
	// A kernel that refuses the request (before 6.6, without
	// CAP_NET_ADMIN) says so only in its acknowledgement, or sends none
	// when nobody else listens; a granted one is acknowledged at once.
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(250 * time.Millisecond); ; {
		left := time.Until(deadline)
		if left <= 0 {
			unix.Close(fd)
			return nil, errors.New("listen to proc connector: no acknowledgement from the kernel")
		}
		if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			unix.Close(fd)
			return nil, fmt.Errorf("listen to proc connector: %w", err)
		}
		w.drain()
		select {
		case code := <-w.acked:
			if code != 0 {
				unix.Close(fd)
				return nil, fmt.Errorf("listen to proc connector: %w", unix.Errno(code))
			}
			go w.follow()
			return w, nil
		default:
		}
	}
}

// follow keeps the queue short between connections, so a quiet sandbox on
// a busy host does not overflow it.
func (w *ExecWatch) follow() {
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		select {
		case <-w.done:
			return
		default:
		}
		if n, err := unix.Poll(fds, 100); err != nil && !errors.Is(err, unix.EINTR) {
			return
		} else if n > 0 {
			w.mu.Lock()
			w.drain()
			w.mu.Unlock()
		}
	}
}

// Close stops watching.
func (w *ExecWatch) Close() error {
	close(w.done)
	w.mu.Lock()
	defer w.mu.Unlock()
	fd := w.fd
	w.fd = -1
	return unix.Close(fd)
}

// drain reads every queued event. Forks and execs are reported by the
// kernel before the process continues, so once drained, everything that
// happened before a connection was made is known.
func (w *ExecWatch) drain() {
	if w.fd < 0 {
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(w.fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.ENOBUFS) {
			if !w.lost && w.Lost != nil {
				w.Lost()
			}
			w.lost = true
			continue
		}
		if err != nil || n == 0 {
			return
		}
		for b := buf[:n]; len(b) >= 16; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < 16 || l > len(b) {
				break
			}
			w.event(b[:l])
			b = b[(l+3)&^3:]
		}
	}
}

func (w *ExecWatch) event(m []byte) {
	if len(m) < eventData {
		return
	}
	what := binary.NativeEndian.Uint32(m[36:])
	d := m[eventData:]
	u32 := func(i int) int32 { return int32(binary.NativeEndian.Uint32(d[4*i:])) }
	switch what {
	case procEventNone:
		// An acknowledgement: its cn_msg ack answers the request's.
		if len(d) >= 4 && binary.NativeEndian.Uint32(m[28:]) == w.ackSeq {
			select {
			case w.acked <- uint32(u32(0)):
			default:
			}
		}
	case procEventFork:
		if len(d) < 16 {
			return
		}
		parentTgid, childPid, childTgid := u32(1), u32(2), u32(3)
		if childPid != childTgid {
			return // a thread
		}
		if len(w.births) >= maxTracked {
			w.births, w.lost = map[int32]birth{}, true
		}
		w.births[childTgid] = birth{parent: parentTgid, gen: w.gen[parentTgid]}
		delete(w.gen, childTgid)
		if a, ok := w.argv[parentTgid]; ok {
			w.argv[childTgid] = a
		} else {
			delete(w.argv, childTgid)
		}
	case procEventExec:
		if len(d) < 8 {
			return
		}
		if len(w.gen) >= maxTracked {
			w.gen, w.lost = map[int32]uint32{}, true
		}
		tgid := u32(1)
		w.gen[tgid]++
		w.snapshotArgv(tgid)
	case procEventExit:
		if len(d) < 8 || u32(0) != u32(1) {
			return // a thread
		}
		delete(w.gen, u32(1))
		delete(w.births, u32(1))
		delete(w.argv, u32(1))
	}
}

// snapshotArgv records an interpreter's command line right after its exec:
// the kernel reports the exec before the new program runs, and an
// interpreter starts up for milliseconds before any script code could
// rewrite its argv. Other programs have no script slot and are skipped.
func (w *ExecWatch) snapshotArgv(tgid int32) {
	delete(w.argv, tgid)
	exe, err := exePath(int(tgid))
	if err != nil || grammarOf(exe) == nil {
		return
	}
	if len(w.argv) >= maxTracked {
		w.argv, w.lost = map[int32][]string{}, true
	}
	if args, err := readArgs(int(tgid)); err == nil {
		w.argv[tgid] = args
	}
}

// argvAtExec is pid's command line as its exec left it, when known.
func (w *ExecWatch) argvAtExec(pid int) ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	a, ok := w.argv[int32(pid)]
	return a, ok
}

// startedUnder reports whether child was forked by parent after parent's
// latest exec, i.e. while it ran the binary it runs now.
func (w *ExecWatch) startedUnder(child, parent int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	b, ok := w.births[int32(child)]
	return ok && !w.lost && b.parent == int32(parent) && b.gen == w.gen[int32(parent)]
}
