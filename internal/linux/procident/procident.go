//go:build linux

// Package procident answers "who is asking" for the supervisor, so that a
// network policy can name the binaries allowed to reach a host: given a
// connection accepted on one of the sandbox's capture listeners, it finds
// the sandbox process that owns the client socket, its executable, its
// ancestors up to the sandbox init and the script paths in its command
// line, and checks each file's SHA-256 trust-on-first-use.
//
// The supervisor runs in the host namespaces, so everything goes through
// host /proc: /proc/<init>/net/tcp{,6} is the sandbox namespace's socket
// table, and the sandbox processes appear under their host pids. Paths are
// reported as the sandbox sees them, which is what policies name.
//
// Every failure to attribute a connection is an error: the caller denies.
package procident

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/linux/capture"
)

// maxAncestors bounds the walk up the process tree.
const maxAncestors = 64

// Resolver implements egress.Identifier for one sandbox. The zero value
// with InitPID set is ready; it is safe for concurrent use.
type Resolver struct {
	// InitPID is the host pid of the sandbox's init. Its network namespace
	// is the one the listeners live in, and the sandbox is it and its
	// descendants.
	InitPID int
	// Execs, when set, tells which processes an ancestor forked while
	// running its current binary; only those inherit its binding. Without
	// it (no proc connector) every descendant does.
	Execs *ExecWatch
	// Connects, when set, holds who connected each socket: a connection
	// is identified only while its connector holds the socket and runs
	// what it ran then.
	Connects *ConnectLog

	snapMu sync.Mutex
	snap   *snapshot

	diagOnce sync.Once
	diag     *diag // nil when sock_diag is unavailable

	idMu sync.Mutex
	ids  map[procKey]egress.Identity
	// fdHints holds, by pid, the descriptor in which that process last
	// held a socket being identified. A client that opens one connection
	// after another gets the same lowest free number each time, and one
	// readlink then finds it where listing the descriptors costs five
	// system calls and more. A stale hint (a recycled pid, another
	// number) only costs that readlink.
	fdHints map[int]int

	mountsOnce sync.Once
	mounts     []mountPoint

	trustMu sync.Mutex
	trusted map[string]trustEntry // keyed by path as the sandbox sees it

	// hashes counts files hashed, so tests can tell a cache hit from a
	// re-hash.
	hashes atomic.Int64
}

var _ egress.Identifier = (*Resolver)(nil)

// Identify returns the process that owns the sandbox end of conn. A file
// whose content differs from what was first seen at its path yields an
// error wrapping *egress.IntegrityError; the caller decides what either
// failure means for the connection.
func (r *Resolver) Identify(conn net.Conn) (egress.Identity, error) {
	if r.InitPID <= 0 {
		return egress.Identity{}, errors.New("procident: no sandbox init pid")
	}
	started := time.Now()
	client, err := addrPort(conn.RemoteAddr())
	if err != nil {
		return egress.Identity{}, err
	}
	listener, err := addrPort(conn.LocalAddr())
	if err != nil {
		return egress.Identity{}, err
	}
	// A client that connected to the listener itself (an explicit proxy
	// client) has no other destination.
	origDst, err := capture.ConnOriginalDst(conn)
	if err != nil {
		origDst = listener
	}
	origDst = netip.AddrPortFrom(origDst.Addr().Unmap(), origDst.Port())
	// Only a reading taken after the connection was accepted can know its
	// socket; an older one could know an earlier socket with the same
	// addresses instead. Connections arriving together share one reading.
	refs := r.exact(client, origDst)
	if len(refs) == 0 {
		refs = r.current(started).sockets(listener, client, origDst)
	}
	id, err := r.identifyRefs(refs)
	if err != nil {
		return egress.Identity{}, fmt.Errorf("procident: client %s: %w", client, err)
	}
	// After the identity is read, not before: a connector that execs
	// meanwhile would otherwise pass as the program it became, read
	// from /proc after a check that still saw the one that connected.
	if r.Connects != nil {
		if err := r.Connects.vouch(refs); err != nil {
			return egress.Identity{}, fmt.Errorf("procident: client %s: %w", client, err)
		}
	}
	return id, nil
}

// exact finds the client's socket by its address pair with sock_diag and
// the descriptors holding it; nothing when the pair names no socket (NAT
// rewrote the client port) or sock_diag is unavailable, and the caller
// falls back to a snapshot.
func (r *Resolver) exact(client, origDst netip.AddrPort) []fdRef {
	if !origDst.IsValid() {
		return nil
	}
	r.diagOnce.Do(func() { r.diag, _ = openDiag(r.InitPID) })
	if r.diag == nil {
		return nil
	}
	inode, cookie, ok, err := r.diag.inode(client, origDst)
	if err != nil || !ok {
		return nil
	}
	target := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	refs := r.holders(target, inode)
	if len(refs) == 0 && r.Execs != nil {
		// The exec watch's list may lack the holder; /proc has it.
		r.Execs.forget()
		refs = r.holders(target, inode)
	}
	for i := range refs {
		refs[i].cookie = cookie
	}
	return refs
}

// holders are the descriptors of the sandbox's processes that hold the
// socket target: every one of them, since every holder must have the same
// identity.
func (r *Resolver) holders(target string, inode uint64) []fdRef {
	var refs []fdRef
	for pid := range r.members() {
		if fd := r.holderFD(pid, target); fd >= 0 {
			refs = append(refs, fdRef{pid: pid, fd: fd, inode: inode})
		}
	}
	return refs
}

// holderFD returns a descriptor of pid that holds target, or -1: the
// hinted one if it does, else whatever findFD finds, which becomes the
// hint.
func (r *Resolver) holderFD(pid int, target string) int {
	r.idMu.Lock()
	hint, ok := r.fdHints[pid]
	r.idMu.Unlock()
	if ok && linkIs("/proc/"+strconv.Itoa(pid)+"/fd/"+strconv.Itoa(hint), target) {
		return hint
	}
	fd := findFD(pid, target)
	if fd >= 0 {
		r.idMu.Lock()
		if r.fdHints == nil || len(r.fdHints) >= maxCachedIDs {
			r.fdHints = map[int]int{}
		}
		r.fdHints[pid] = fd
		r.idMu.Unlock()
	}
	return fd
}

// members returns the sandbox's processes that can hold a workload's
// socket: InitPID's descendants. The init itself is left out: no workload
// socket can enter its descriptor table (it receives descriptors from the
// supervisor only, shares its table with no one, and refuses ptrace), and
// reading its ten or so links cost every connection tens of microseconds.
func (r *Resolver) members() map[int]bool {
	var m map[int]bool
	if r.Execs != nil {
		m = r.Execs.members(r.InitPID, descendants)
	} else {
		m = descendants(r.InitPID)
	}
	delete(m, r.InitPID)
	return m
}

// findFD returns the descriptor of pid that holds target, or -1. It looks
// from the highest descriptor down: the socket being identified was just
// made, so it is almost always the newest, and a process holding a
// thousand tunnels is answered with one readlink.
func findFD(pid int, target string) int {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	dfd, err := openRetry(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return -1 // exited, or not ours to read
	}
	defer unix.Close(dfd)
	var fds []int
	if readDirFD(dfd, func(name []byte) {
		if fd, ok := atoi(name); ok {
			fds = append(fds, fd)
		}
	}) != nil {
		return -1
	}
	slices.Sort(fds)
	// Each link is read relative to the open directory: the kernel then
	// looks up one name, not the four of /proc/PID/fd/N.
	var buf [64]byte
	for i := len(fds) - 1; i >= 0; i-- {
		n, err := unix.Readlinkat(dfd, strconv.Itoa(fds[i]), buf[:])
		if err == nil && n < len(buf) && string(buf[:n]) == target {
			return fds[i]
		}
	}
	return -1
}

// identifyRefs identifies the process holding the client's socket. Every
// candidate process must have one identity; usually there is exactly one.
func (r *Resolver) identifyRefs(refs []fdRef) (egress.Identity, error) {
	if len(refs) == 0 {
		return egress.Identity{}, fmt.Errorf("no process of sandbox %d holds the socket: %w", r.InitPID, egress.ErrProcessExited)
	}
	slices.SortStableFunc(refs, func(a, b fdRef) int { return a.pid - b.pid })
	var id egress.Identity
	seen := map[int]bool{}
	for i, ref := range refs {
		if seen[ref.pid] {
			continue
		}
		got, err := r.identify(ref)
		// A process whose candidate socket has closed since the snapshot
		// (a busy client opening and closing connections) is still the
		// holder of its other candidates: any one it still holds pins it.
		// A changed file is a finding about the process, not about the
		// socket, so another candidate cannot clear it.
		var changed *egress.IntegrityError
		for j := i + 1; err != nil && !errors.As(err, &changed) && j < len(refs) && refs[j].pid == ref.pid; j++ {
			got, err = r.identify(refs[j])
		}
		if err != nil {
			return egress.Identity{}, err
		}
		if len(seen) == 0 {
			id = got
		}
		seen[ref.pid] = true
		if !sameIdentity(got, id) {
			return egress.Identity{}, fmt.Errorf("candidate sockets belong to pid %d (%s) and pid %d (%s)",
				id.PID, id.Binary, got.PID, got.Binary)
		}
	}
	return id, nil
}

// identify pins the process holding ref with a pidfd, checks it still holds
// the socket (the pid may have been recycled since the snapshot), reads its
// identity, and checks it is still alive afterwards, so everything read
// through /proc/<pid> described the socket's owner.
func (r *Resolver) identify(ref fdRef) (egress.Identity, error) {
	pidfd, err := unix.PidfdOpen(ref.pid, 0)
	if err != nil {
		return egress.Identity{}, fmt.Errorf("procident: pidfd_open %d: %w", ref.pid, err)
	}
	defer unix.Close(pidfd)
	target := "socket:[" + strconv.FormatUint(ref.inode, 10) + "]"
	if !linkIs("/proc/"+strconv.Itoa(ref.pid)+"/fd/"+strconv.Itoa(ref.fd), target) {
		return egress.Identity{}, fmt.Errorf("procident: pid %d no longer holds socket inode %d: %w", ref.pid, ref.inode, egress.ErrProcessExited)
	}
	id, err := r.identity(ref.pid)
	if err != nil {
		return egress.Identity{}, err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return egress.Identity{}, fmt.Errorf("procident: pid %d exited while being identified: %w", ref.pid, err)
	}
	return id, nil
}

// procKey names one process running one executable: a recycled pid has
// another start time, and an exec another executable.
type procKey struct {
	pid, ppid int
	start     uint64
	exeDev    uint64
	exeIno    uint64
}

// maxCachedIDs bounds the identity cache; it is emptied when full.
const maxCachedIDs = 4096

// processKey reads the parent and start time from /proc/<pid>/stat (fields
// 4 and 22, counted after the parenthesised command name) and the
// executable's inode.
func processKey(pid int) (procKey, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/exe", &st); err != nil {
		return procKey{}, fmt.Errorf("procident: executable of pid %d: %w", pid, err)
	}
	s, err := readProcString("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procKey{}, fmt.Errorf("procident: stat of pid %d: %w", pid, err)
	}
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return procKey{}, fmt.Errorf("procident: /proc/%d/stat too short", pid)
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procKey{}, fmt.Errorf("procident: /proc/%d/stat unparsable", pid)
	}
	return procKey{pid: pid, ppid: ppid, start: start, exeDev: st.Dev, exeIno: st.Ino}, nil
}

// sameIdentity compares what a policy can tell apart.
func sameIdentity(a, b egress.Identity) bool {
	return a.Binary == b.Binary && a.BinarySHA256 == b.BinarySHA256 &&
		slices.Equal(a.Ancestors, b.Ancestors) && slices.Equal(a.CmdlinePaths, b.CmdlinePaths) &&
		a.Untrusted == b.Untrusted
}

func addrPort(a net.Addr) (netip.AddrPort, error) {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
	if a == nil {
		return netip.AddrPort{}, errors.New("procident: connection has no remote address")
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("procident: remote address %q: %w", a, err)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// parentOf reads the ppid from /proc/<pid>/stat. The command name in
// parentheses may itself contain spaces and parentheses, so the fields are
// taken after the last ')'.
func parentOf(pid int) (int, error) {
	s, err := readProcString("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	return strconv.Atoi(f[1])
}

// identity reads the process's executable, ancestors and script paths and
// checks each against the trust-on-first-use record.
func (r *Resolver) identity(pid int) (egress.Identity, error) {
	// The executable and ancestors of a process are fixed once it runs:
	// its executable cannot be written while mapped (ETXTBSY), and its
	// parent changes only by re-parenting, which changes the key. They are
	// read once per process; the script, which can be edited while its
	// interpreter runs, is checked on every connection.
	key, err := processKey(pid)
	if err != nil {
		return egress.Identity{}, err
	}
	r.idMu.Lock()
	id, cached := r.ids[key]
	r.idMu.Unlock()
	if !cached {
		if id, err = r.lineage(pid); err != nil {
			return egress.Identity{}, err
		}
		r.idMu.Lock()
		if r.ids == nil || len(r.ids) >= maxCachedIDs {
			r.ids = map[procKey]egress.Identity{}
		}
		r.ids[key] = id
		r.idMu.Unlock()
	}
	if id.CmdlinePaths, err = r.cmdlinePaths(pid, id.Binary); err != nil {
		return egress.Identity{}, err
	}
	// Code can be loaded at any time (dlopen), so the process itself is
	// looked at on every connection; its ancestors once, with the lineage.
	if id.Untrusted == "" {
		if id.Untrusted, err = r.untrusted(pid, id.Binary); err != nil {
			return egress.Identity{}, err
		}
	}
	return id, nil
}

// lineage reads the process's executable and its ancestors' executables.
func (r *Resolver) lineage(pid int) (egress.Identity, error) {
	id := egress.Identity{PID: pid}
	var err error
	if id.Binary, id.BinarySHA256, err = r.exeIdentity(pid); err != nil {
		return egress.Identity{}, err
	}
	p := pid
	for depth := 0; p != r.InitPID; depth++ {
		pp, err := parentOf(p)
		if err != nil {
			return egress.Identity{}, fmt.Errorf("procident: parent of %d: %w", p, err)
		}
		if pp == r.InitPID {
			break
		}
		if pp <= 1 || depth == maxAncestors {
			return egress.Identity{}, fmt.Errorf("procident: pid %d does not descend from sandbox init %d", pid, r.InitPID)
		}
		if r.Execs != nil && !r.Execs.startedUnder(p, pp) {
			// p predates pp's binary: it runs code pp's binary never
			// vetted, and so does everything p started.
			p = pp
			continue
		}
		exe, _, err := r.exeIdentity(pp)
		if err != nil {
			return egress.Identity{}, err
		}
		if id.Untrusted == "" {
			why, err := r.untrusted(pp, exe)
			if err != nil {
				return egress.Identity{}, err
			}
			if why != "" {
				id.Untrusted = "its ancestor " + exe + " " + why
			}
		}
		id.Ancestors = append(id.Ancestors, exe)
		p = pp
	}
	return id, nil
}

// exePath is the process's executable as its mount namespace names it.
// The kernel appends " (deleted)" when the file has been unlinked or
// replaced since exec; the policy still names the original path.
func exePath(pid int) (string, error) {
	link := "/proc/" + strconv.Itoa(pid) + "/exe"
	p, err := os.Readlink(link)
	if err != nil {
		return "", fmt.Errorf("procident: executable of pid %d: %w", pid, err)
	}
	if trimmed, ok := strings.CutSuffix(p, " (deleted)"); ok {
		var st unix.Stat_t
		if unix.Stat(link, &st) == nil && st.Nlink == 0 {
			p = trimmed
		}
	}
	return p, nil
}

// exeIdentity returns the executable's path and checked hash. The content
// is read through /proc/<pid>/exe, i.e. the image the process actually
// runs, whatever now sits at the path.
func (r *Resolver) exeIdentity(pid int) (string, string, error) {
	path, err := exePath(pid)
	if err != nil {
		return "", "", err
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", "", fmt.Errorf("procident: open executable of pid %d: %w", pid, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", "", fmt.Errorf("procident: stat executable of pid %d: %w", pid, err)
	}
	sum, err := r.verify(path, &st, func() (*os.File, error) { return f, nil }, false)
	if err != nil {
		return "", "", err
	}
	return path, sum, nil
}
