//go:build linux

// Package procident answers "who is asking" (ARCHITECTURE §4) for the
// supervisor: given a connection accepted on one of the sandbox's capture
// listeners, it finds the sandbox process that owns the client socket, its
// executable, its ancestors up to the sandbox init and the script paths in
// its command line, and checks each file's SHA-256 trust-on-first-use.
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
)

// maxAncestors bounds the walk up the process tree.
const maxAncestors = 64

// descendantsTTL is how long a snapshot of the sandbox's process tree is
// reused. A connection from a process newer than the snapshot misses and
// forces a fresh one, so the TTL only saves work, never correctness.
const descendantsTTL = 2 * time.Second

// Resolver implements egress.Identifier for one sandbox. The zero value
// with InitPID set is ready; it is safe for concurrent use.
type Resolver struct {
	// InitPID is the host pid of the sandbox's init. Its network namespace
	// is the one the listeners live in, and the sandbox is it and its
	// descendants.
	InitPID int

	procMu  sync.Mutex
	procs   map[int]bool // InitPID and its descendants
	procsAt time.Time

	trustMu sync.Mutex
	trusted map[string]trustEntry // keyed by path as the sandbox sees it

	// hashes counts files hashed, so tests can tell a cache hit from a
	// re-hash.
	hashes atomic.Int64
}

var _ egress.Identifier = (*Resolver)(nil)

// Identify returns the process that owns the sandbox end of conn. A file
// whose content differs from what was first seen at its path yields an
// *egress.DenyError with ReasonIntegrity (Request left for the caller to
// fill); any other failure is a plain error, on which the caller denies.
func (r *Resolver) Identify(conn net.Conn) (egress.Identity, error) {
	if r.InitPID <= 0 {
		return egress.Identity{}, errors.New("procident: no sandbox init pid")
	}
	src, err := addrPort(conn.RemoteAddr())
	if err != nil {
		return egress.Identity{}, err
	}
	inode, err := findSocket(fmt.Sprintf("/proc/%d/net", r.InitPID), src)
	if err != nil {
		return egress.Identity{}, err
	}
	pid, pidfd, err := r.owner(inode)
	if err != nil {
		return egress.Identity{}, fmt.Errorf("procident: client %s: %w", src, err)
	}
	defer unix.Close(pidfd)
	id, err := r.identity(pid)
	if err != nil {
		return egress.Identity{}, err
	}
	// Everything above was read through /proc/<pid>; if the process is
	// still alive now, the pid was not recycled in the meantime, so all of
	// it described the socket's owner.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return egress.Identity{}, fmt.Errorf("procident: pid %d exited while being identified: %w", pid, err)
	}
	return id, nil
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

// owner finds the sandbox process holding the socket and pins it with a
// pidfd. A socket shared by processes running different executables (an
// inherited descriptor) has no single owner and is refused.
func (r *Resolver) owner(inode uint64) (int, int, error) {
	target := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	procs, fresh := r.descendants(false)
	pids := holders(procs, target)
	if len(pids) == 0 && !fresh {
		procs, _ = r.descendants(true)
		pids = holders(procs, target)
	}
	if len(pids) == 0 {
		return 0, -1, fmt.Errorf("socket inode %d is held by no process of sandbox %d", inode, r.InitPID)
	}
	exe := ""
	for i, p := range pids {
		e, err := exePath(p)
		if err != nil {
			return 0, -1, err
		}
		if i > 0 && e != exe {
			return 0, -1, fmt.Errorf("socket inode %d is shared by pid %d (%s) and pid %d (%s)", inode, pids[0], exe, p, e)
		}
		exe = e
	}
	pid := pids[0] // the lowest pid: the likeliest creator
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, -1, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// The pid may have been recycled between the scan and pidfd_open; the
	// process behind the pidfd must still hold the socket.
	if !holds(pid, target) {
		unix.Close(pidfd)
		return 0, -1, fmt.Errorf("pid %d no longer holds socket inode %d", pid, inode)
	}
	return pid, pidfd, nil
}

// holders returns, in ascending order, the pids whose descriptor table
// contains target.
func holders(procs map[int]bool, target string) []int {
	var out []int
	for pid := range procs {
		if holds(pid, target) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// holds reports whether pid has target in its descriptor table. It looks
// from the highest descriptor down: a connection being identified was just
// made, so its socket is almost always the newest descriptor, and a process
// holding a thousand tunnels is then answered with one readlink, not a
// thousand.
func holds(pid int, target string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return false // exited, or not ours to read
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return false
	}
	fds := make([]int, 0, len(names))
	for _, n := range names {
		if fd, err := strconv.Atoi(n); err == nil {
			fds = append(fds, fd)
		}
	}
	slices.Sort(fds)
	for i := len(fds) - 1; i >= 0; i-- {
		if l, err := os.Readlink(dir + "/" + strconv.Itoa(fds[i])); err == nil && l == target {
			return true
		}
	}
	return false
}

// descendants returns InitPID and its descendants, from the cached
// snapshot unless it is stale or force is set; fresh reports whether the
// snapshot was taken by this call.
func (r *Resolver) descendants(force bool) (map[int]bool, bool) {
	r.procMu.Lock()
	defer r.procMu.Unlock()
	if !force && r.procs != nil && time.Since(r.procsAt) < descendantsTTL {
		return r.procs, false
	}
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(pid); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	set := map[int]bool{r.InitPID: true}
	queue := []int{r.InitPID}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !set[c] {
				set[c] = true
				queue = append(queue, c)
			}
		}
	}
	r.procs, r.procsAt = set, time.Now()
	return set, true
}

// parentOf reads the ppid from /proc/<pid>/stat. The command name in
// parentheses may itself contain spaces and parentheses, so the fields are
// taken after the last ')'.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
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
	id := egress.Identity{PID: pid}
	var err error
	if id.Binary, id.BinarySHA256, err = r.exeIdentity(pid); err != nil {
		return egress.Identity{}, err
	}
	p := pid
	for p != r.InitPID {
		pp, err := parentOf(p)
		if err != nil {
			return egress.Identity{}, fmt.Errorf("procident: parent of %d: %w", p, err)
		}
		if pp == r.InitPID {
			break
		}
		if pp <= 1 || len(id.Ancestors) == maxAncestors {
			return egress.Identity{}, fmt.Errorf("procident: pid %d does not descend from sandbox init %d", pid, r.InitPID)
		}
		exe, _, err := r.exeIdentity(pp)
		if err != nil {
			return egress.Identity{}, err
		}
		id.Ancestors = append(id.Ancestors, exe)
		p = pp
	}
	if id.CmdlinePaths, err = r.cmdlinePaths(pid); err != nil {
		return egress.Identity{}, err
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
	sum, err := r.verify(path, f, false)
	if err != nil {
		return "", "", err
	}
	return path, sum, nil
}
