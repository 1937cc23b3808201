//go:build linux

package procident

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/seccomp/notify"
)

// Who holds a socket when its connection is identified does not say who
// made the connection: a process can connect, park its descriptor in
// flight in a unix socket (SCM_RIGHTS) and leave an allowed program it
// started holding the only other copy, then take the socket back once the
// connection is allowed. So the sandbox's seccomp filter hands every
// connect(2) to the supervisor before the kernel runs it, and ConnectLog
// notes the socket and the program that connected it. A connection is
// identified only when that process still holds the socket and still runs
// that program.

// maxConnects bounds the log; the oldest entries go first. Entries are
// never needed for long: a connection is identified as soon as it is
// accepted, or once its client has spoken.
const maxConnects = 1 << 15

// ConnectLog records which process connected each socket of one sandbox.
// The zero value is ready; Serve feeds it, unless the kernel keeps the
// record (Kernel).
type ConnectLog struct {
	// Execs, when set, stamps each connector's program, so an exec of the
	// same binary after the connect is seen too.
	Execs *ExecWatch
	// Kernel, when set, is where a cgroup hook recorded each connect
	// (connhook): the process and the time, by socket cookie. The
	// sandbox's filter then hands no connect to the supervisor, and Execs
	// must be set: what a connector ran when it connected is known only
	// from the time of its latest fork or exec.
	Kernel func(cookie uint64) (tgid int, at uint64, ok bool)

	mu      sync.Mutex
	byInode map[uint64]connector
	order   []uint64 // ring of byInode's keys, oldest at next
	next    int
}

// connector is the process that connected a socket and what it ran then:
// the exec watch's stamp of its program when the watch could give one,
// the kernel's time of the connect when a cgroup hook recorded it, else
// its executable.
type connector struct {
	tgid    int
	stamp   uint64
	stamped bool
	at      uint64
	timed   bool
	exe     fileID
}

// Serve records the connects the filter's listener fd reports until no
// sandbox process is left or done is closed, and closes fd. Every connect
// waits for it: while it is not running, none completes.
func (l *ConnectLog) Serve(fd int, done <-chan struct{}) error {
	return notify.Serve(fd, done, func(c notify.Call) { l.record(fd, c) })
}

// record notes the socket of one connect call. The socket is read from the
// caller's descriptor table while the call is blocked; another thread of
// the same process could swap the descriptor meanwhile, but then the
// socket it connects has no entry and is refused, and the one noted was
// made by the same process.
func (l *ConnectLog) record(listener int, c notify.Call) {
	fd := int(int32(c.Args[0]))
	if fd < 0 {
		return
	}
	tid := strconv.Itoa(c.TID)
	var buf [64]byte
	n, err := unix.Readlink("/proc/"+tid+"/fd/"+strconv.Itoa(fd), buf[:])
	if err != nil || n >= len(buf) {
		return
	}
	inode, ok := socketInode(string(buf[:n]))
	if !ok {
		return
	}
	var who connector
	if l.Execs != nil {
		who.tgid, who.stamp, who.stamped = l.Execs.caller(c.TID)
	}
	if !who.stamped {
		if who.tgid, err = tgidOf(c.TID); err != nil {
			return
		}
		if who.exe, err = exeID(who.tgid); err != nil {
			return
		}
	}
	// The numbers read above named the caller only if it is still
	// blocked in this call: a thread that died meanwhile could have had
	// its pid taken by another.
	if !notify.Valid(listener, c.ID) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byInode == nil {
		l.byInode = make(map[uint64]connector)
		l.order = make([]uint64, maxConnects)
	}
	if _, known := l.byInode[inode]; !known {
		if old := l.order[l.next]; old != 0 {
			delete(l.byInode, old)
		}
		l.order[l.next] = inode
		l.next = (l.next + 1) % maxConnects
	}
	l.byInode[inode] = who
}

// socketInode parses a descriptor link "socket:[N]".
func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok || !strings.HasSuffix(s, "]") {
		return 0, false
	}
	n, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	return n, err == nil && n != 0
}

// tgidOf reads the process a thread belongs to.
func tgidOf(tid int) (int, error) {
	s, err := readProcString("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return 0, err
	}
	_, rest, ok := strings.Cut(s, "\nTgid:")
	if !ok {
		return 0, fmt.Errorf("/proc/%d/status has no Tgid", tid)
	}
	v, _, _ := strings.Cut(rest, "\n")
	return strconv.Atoi(strings.TrimSpace(v))
}

// errNotConnected is why a socket with no entry is refused.
var errNotConnected = errors.New("corral saw no connect(2) for it (a socket connected another way, such as TCP Fast Open through sendto, is refused)")

// vouch checks, for each socket refs hold, that the process that connected
// it is one of its holders and runs the program it ran then.
func (l *ConnectLog) vouch(refs []fdRef) error {
	checked := map[uint64]bool{}
	for _, ref := range refs {
		if checked[ref.inode] {
			continue
		}
		checked[ref.inode] = true
		who, ok, err := l.connector(ref)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("socket inode %d: %w", ref.inode, errNotConnected)
		}
		held := false
		for _, r := range refs {
			held = held || (r.inode == ref.inode && r.pid == who.tgid)
		}
		if !held {
			return fmt.Errorf("socket inode %d was connected by pid %d, which no longer holds it: a connection handed to another process is refused", ref.inode, who.tgid)
		}
		if !who.runsStill(l.Execs) {
			return fmt.Errorf("pid %d has run another program since it connected socket inode %d", who.tgid, ref.inode)
		}
	}
	return nil
}

// connector is who connected ref's socket, as recorded.
func (l *ConnectLog) connector(ref fdRef) (connector, bool, error) {
	if l.Kernel != nil {
		cookie := ref.cookie
		if cookie == 0 {
			var err error
			if cookie, err = cookieOf(ref); err != nil {
				return connector{}, false, fmt.Errorf("socket inode %d: the cookie the kernel recorded its connect under: %w", ref.inode, err)
			}
		}
		tgid, at, ok := l.Kernel(cookie)
		return connector{tgid: tgid, at: at, timed: true}, ok, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	who, ok := l.byInode[ref.inode]
	return who, ok, nil
}

// cookieOf reads the cookie of ref's socket through a copy of the holder's
// descriptor, for a socket sock_diag did not find (a snapshot did).
func cookieOf(ref fdRef) (uint64, error) {
	pidfd, err := unix.PidfdOpen(ref.pid, 0)
	if err != nil {
		return 0, fmt.Errorf("pidfd_open %d: %w", ref.pid, err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, ref.fd, 0)
	if err != nil {
		return 0, fmt.Errorf("pidfd_getfd %d/%d: %w", ref.pid, ref.fd, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != ref.inode {
		return 0, fmt.Errorf("pid %d no longer holds it in descriptor %d", ref.pid, ref.fd)
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_COOKIE: %w", err)
	}
	return cookie, nil
}

// runsStill tells whether the connector still runs the program it ran
// when it connected. A stamp or a time the watch can no longer judge (it
// lost events since) falls back to comparing the executable, which the
// watch recorded as of the connector's latest exec.
func (who connector) runsStill(execs *ExecWatch) bool {
	if who.stamped || who.timed {
		var same, known bool
		if who.timed {
			same, known = execs.runsSince(who.tgid, who.at)
		} else {
			same, known = execs.runs(who.tgid, who.stamp)
		}
		if known {
			return same
		}
		execs.mu.Lock()
		rec, ok := execs.exe[int32(who.tgid)]
		execs.mu.Unlock()
		if !ok {
			return false
		}
		who.exe = rec
	}
	exe, err := exeID(who.tgid)
	return err == nil && exe == who.exe
}
