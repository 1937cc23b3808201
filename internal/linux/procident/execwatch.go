//go:build linux

package procident

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
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

// progStamp is a process's current program: its number, and when the kernel
// timed the fork or exec that gave it (CLOCK_MONOTONIC), so that a connect
// timed after it was made by that program.
type progStamp struct {
	n, at uint64
}

// birth is what a process's fork said: its parent and the stamp of the
// program the parent ran then.
type birth struct {
	parent int32
	gen    uint64
}

// ExecWatch records forks and execs system-wide.
type ExecWatch struct {
	fd int

	mu sync.Mutex
	// gen stamps each process's current program: a fork or an exec
	// gives it the next value of stamps, so no two programs share one.
	gen    map[int32]progStamp
	stamps uint64
	// threads maps each thread the watch saw start, other than a
	// process's first, to its process.
	threads map[int32]int32
	births  map[int32]birth // tgid -> its fork
	// seen is what each process's exec left, read as the kernel reports
	// the exec, before the new program could change it (its argv and
	// environment are its own memory), and inherited by its forks, which
	// share that memory's contents.
	seen map[int32]execRecord
	// exe is the executable (device, inode) a process ran as of its latest
	// reported exec, inherited by its forks: the kernel shows a new exe in
	// /proc before it reports the exec, and a comparison with it catches an
	// exec under way.
	exe map[int32]fileID
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
	// tree is the sandbox's processes as the events built it, once
	// seeded; nil before, or for another root.
	tree *tree
	// buf receives events; drain runs with mu held.
	buf []byte
}

// tree holds a root and every process forked under it (by tgid), so the
// processes that may hold a socket are known without walking /proc on
// every connection. It may also hold pids that have since exited, or
// processes reparented away from the root: a candidate too many costs a
// failed open or a lineage that does not reach the root (a denial),
// while a candidate missing would leave a holder unchecked. Exit events
// cannot remove a pid: a thread group leader that exits alone reports
// the same event as its process, whose other threads still run. A pid
// leaves when its number is reused outside the tree.
type tree struct {
	root    int32
	members map[int32]bool
	// exited are members that reported an exit since the last look;
	// each is dropped once /proc shows it gone.
	exited []int32
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
	w := &ExecWatch{fd: fd, gen: map[int32]progStamp{}, threads: map[int32]int32{}, births: map[int32]birth{}, seen: map[int32]execRecord{}, exe: map[int32]fileID{},
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
	if w.buf == nil {
		// One datagram per event, each under a hundred bytes.
		w.buf = make([]byte, 16<<10)
	}
	buf := w.buf
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
	at := binary.NativeEndian.Uint64(m[44:])
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
		w.treeFork(parentTgid, childPid, childTgid)
		if childPid != childTgid {
			if len(w.threads) >= maxTracked {
				w.threads, w.lost = map[int32]int32{}, true
			}
			w.threads[childPid] = childTgid
			return
		}
		delete(w.threads, childPid)
		if len(w.births) >= maxTracked {
			w.births, w.lost = map[int32]birth{}, true
		}
		w.births[childTgid] = birth{parent: parentTgid, gen: w.gen[parentTgid].n}
		w.stamp(childTgid, at)
		if e, ok := w.exe[parentTgid]; ok {
			w.exe[childTgid] = e
		} else {
			delete(w.exe, childTgid)
		}
		if rec, ok := w.seen[parentTgid]; ok {
			w.seen[childTgid] = rec
		} else {
			delete(w.seen, childTgid)
		}
	case procEventExec:
		if len(d) < 8 {
			return
		}
		tgid := u32(1)
		w.stamp(tgid, at)
		w.snapshot(tgid)
		if len(w.exe) >= maxTracked {
			w.exe, w.lost = map[int32]fileID{}, true
		}
		if id, err := exeID(int(tgid)); err == nil {
			w.exe[tgid] = id
		} else {
			delete(w.exe, tgid)
		}
	case procEventExit:
		if len(d) < 8 {
			return
		}
		if u32(0) != u32(1) {
			delete(w.threads, u32(0))
			return
		}
		if w.tree != nil && w.tree.members[u32(1)] {
			w.tree.exited = append(w.tree.exited, u32(1))
		}
		delete(w.gen, u32(1))
		delete(w.births, u32(1))
		delete(w.seen, u32(1))
		delete(w.exe, u32(1))
	}
}

// snapshot records what a program's exec left: whether its environment
// has the dynamic loader load code besides it and, for an interpreter,
// its command line and whether its environment or home loads code besides
// its script. The kernel reports the exec before the new program runs; a
// preloaded library's constructor, and far more an interpreter's start-up,
// come after: a race corral wins, not a guarantee.
func (w *ExecWatch) snapshot(tgid int32) {
	delete(w.seen, tgid)
	env, err := readEnv(int(tgid))
	if err != nil {
		return
	}
	rec := execRecord{preload: preloadVar(env)}
	if exe, err := exePath(int(tgid)); err == nil && grammarOf(exe) != nil {
		args, err := readArgs(int(tgid))
		if err != nil {
			return
		}
		if rec.loads, err = execLoads(int(tgid), exe, args[1:], env); err != nil {
			return
		}
		rec.args = args
	}
	if len(w.seen) >= maxTracked {
		w.seen, w.lost = map[int32]execRecord{}, true
	}
	w.seen[tgid] = rec
}

// execRecord is what an exec left: why its environment had the loader
// load code besides the program ("" if it did not) and, for an
// interpreter, its command line and why it runs code besides its script.
type execRecord struct {
	preload string
	args    []string
	loads   string
}

// atExec is what pid's exec left, when the watch saw it.
func (w *ExecWatch) atExec(pid int) (execRecord, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	rec, ok := w.seen[int32(pid)]
	return rec, ok
}

// stamp gives tgid's program the next stamp, given at the kernel's time at.
func (w *ExecWatch) stamp(tgid int32, at uint64) {
	if len(w.gen) >= maxTracked {
		w.gen, w.lost = map[int32]progStamp{}, true
	}
	w.stamps++
	w.gen[tgid] = progStamp{n: w.stamps, at: at}
}

// caller returns the process thread tid belongs to and the stamp of the
// program it runs now, from the events alone; false when the watch cannot
// vouch for them (it lost events, or never saw the process start). A
// thread starts only after its creation is reported, so once drained, a
// tid the watch did not see start as a thread is a process's first.
func (w *ExecWatch) caller(tid int) (int, uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	tgid, ok := w.threads[int32(tid)]
	if !ok {
		tgid = int32(tid)
	}
	g, ok := w.gen[tgid]
	return int(tgid), g.n, ok && !w.lost && w.fd >= 0
}

// runs tells whether pid still runs the program stamped: no exec has been
// reported since, and none is under way (the kernel shows a new exe in
// /proc before it reports the exec). known is false when the watch can no
// longer tell.
func (w *ExecWatch) runs(pid int, n uint64) (same, known bool) {
	return w.unchanged(pid, func() bool {
		g, ok := w.gen[int32(pid)]
		return ok && g.n == n
	})
}

// runsSince tells whether pid runs the program it ran at the kernel's time
// at (CLOCK_MONOTONIC), as runs does for a stamp: its latest fork or exec
// was reported, and timed before at.
func (w *ExecWatch) runsSince(pid int, at uint64) (same, known bool) {
	return w.unchanged(pid, func() bool {
		g, ok := w.gen[int32(pid)]
		return ok && g.at < at
	})
}

// unchanged is runs and runsSince: stampHolds, called with the events
// drained, tells whether the process's stamp is still the one asked
// about.
func (w *ExecWatch) unchanged(pid int, stampHolds func() bool) (same, known bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	if w.lost || w.fd < 0 {
		return false, false
	}
	if !stampHolds() {
		return false, true
	}
	rec, ok := w.exe[int32(pid)]
	if !ok {
		return false, true
	}
	cur, err := exeID(pid)
	return err == nil && cur == rec, true
}

// startedUnder reports whether child was forked by parent after parent's
// latest exec, i.e. while it ran the binary it runs now.
func (w *ExecWatch) startedUnder(child, parent int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	b, ok := w.births[int32(child)]
	if !ok || w.lost || b.parent != int32(parent) || b.gen != w.gen[int32(parent)].n {
		return false
	}
	// An exec the kernel has switched parent to but not reported yet shows
	// only in /proc: parent is then no longer what child was forked under.
	if rec, known := w.exe[int32(parent)]; known {
		if cur, err := exeID(parent); err != nil || cur != rec {
			return false
		}
	}
	return true
}

// fileID identifies a file by device and inode.
type fileID struct{ dev, ino uint64 }

// exeID is the executable pid runs as now.
func exeID(pid int) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/exe", &st); err != nil {
		return fileID{}, err
	}
	return fileID{st.Dev, st.Ino}, nil
}

// treeFork follows one new task into or out of the tree. A task number
// that was a member and now names a thread, or a process forked outside
// the tree, is a reused pid: it no longer names a member.
func (w *ExecWatch) treeFork(parentTgid, childPid, childTgid int32) {
	t := w.tree
	if t == nil {
		return
	}
	if childPid == childTgid && t.members[parentTgid] {
		t.members[childPid] = true
		return
	}
	delete(t.members, childPid)
}

// maxMembers bounds the tree; past it the tree is rebuilt from /proc.
// maxExited bounds the exited members still waiting to be reaped.
const (
	maxMembers = 1 << 14
	maxExited  = 1 << 10
)

// members returns root and its descendants. While every event has been
// received they come from the tree the events keep (seeded from /proc by
// walk on first use); otherwise, or for another root, from walk itself.
// Forks are reported before the child runs, so once the queue is drained
// every process that could have made a connection already accepted is
// in the tree.
func (w *ExecWatch) members(root int, walk func(int) map[int]bool) map[int]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	if w.lost || w.fd < 0 {
		// Events were dropped, or are no longer received.
		w.tree = nil
		return walk(root)
	}
	t := w.tree
	if t == nil || t.root != int32(root) || len(t.members) > maxMembers {
		return w.seed(root, walk)
	}
	// A zombie or a process whose leader thread alone exited is still
	// there; it is looked at again next time.
	live := t.exited[:0]
	for _, pid := range t.exited {
		var st unix.Stat_t
		if errors.Is(unix.Stat("/proc/"+strconv.Itoa(int(pid)), &st), unix.ENOENT) {
			delete(t.members, pid)
		} else if t.members[pid] && len(live) < maxExited {
			live = append(live, pid)
		}
	}
	t.exited = live
	set := make(map[int]bool, len(t.members))
	for pid := range t.members {
		set[int(pid)] = true
	}
	return set
}

// maxSeedWalks bounds the walks of one seeding.
const maxSeedWalks = 3

// seed builds the tree from a walk of /proc. Events queued from then on
// are applied on top of it; those that raced the walk only repeat what it
// saw, in order. A process that exits during the walk is the exception:
// its children move to a reaper, and a walk that read the reaper before
// the move and the parent after it misses them, and so would the tree
// for good (their forks are behind it). So a member's exit reported
// right after the walk makes the walk start again.
func (w *ExecWatch) seed(root int, walk func(int) map[int]bool) map[int]bool {
	for i := 1; ; i++ {
		set := walk(root)
		t := &tree{root: int32(root), members: make(map[int32]bool, len(set))}
		for pid := range set {
			t.members[int32(pid)] = true
		}
		w.tree = t
		w.drain()
		if w.lost || w.fd < 0 {
			w.tree = nil
			return set
		}
		if len(t.exited) == 0 {
			return set
		}
		if i == maxSeedWalks {
			// Still moving: this walk answers this call, the next
			// call walks again.
			w.tree = nil
			return set
		}
	}
}

// forget drops the tree, so the next members walks /proc again: a socket
// none of the tree's members holds may be held by a process it missed.
func (w *ExecWatch) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tree = nil
}
