//go:build linux

package procident

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// snapshot is one reading of the sandbox's connection-tracking table,
// socket tables and descriptor tables, shared by every Identify that
// starts before the next reading. A burst of a thousand connections then
// costs a few readings instead of a thousand full scans of /proc.
type snapshot struct {
	taken time.Time
	// original maps a tracked connection's reply direction (what the
	// supervisor's accepted socket sees: local, remote) to its original
	// direction (what the sandbox's socket sees: source, destination).
	original map[tuple]tuple
	// conntrack is read only when a connection's socket cannot be found
	// without it, which is rare: reading it costs more than the rest.
	conntrackOnce sync.Once
	conntrackPath string
	byTuple       map[tuple][]uint64          // sandbox socket (local, remote) → inodes
	byLocal       map[netip.AddrPort][]uint64 // sandbox socket local address → inodes
	byPeer        map[peer][]uint64           // sandbox socket (local address, remote) → inodes
	holders       map[uint64][]fdRef          // socket inode → descriptors holding it
	procs         map[int]bool                // InitPID and its descendants
}

type tuple struct{ a, b netip.AddrPort }

type peer struct {
	local  netip.Addr
	remote netip.AddrPort
}

// fdRef is one descriptor of one process, and the socket it holds.
type fdRef struct {
	pid, fd int
	inode   uint64
	// cookie is the socket's, when sock_diag found it; 0 when a snapshot
	// did.
	cookie uint64
}

// current returns the newest snapshot, taking one if there is none or it
// was taken before notBefore: a connection accepted at notBefore is in
// every snapshot taken after it, so one snapshot serves all connections
// that arrived while it was being read.
func (r *Resolver) current(notBefore time.Time) *snapshot {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	if r.snap != nil && !r.snap.taken.Before(notBefore) {
		return r.snap
	}
	r.snap = r.read()
	return r.snap
}

func (r *Resolver) read() *snapshot {
	s := &snapshot{
		taken:    time.Now(),
		original: map[tuple]tuple{},
		byTuple:  map[tuple][]uint64{},
		byLocal:  map[netip.AddrPort][]uint64{},
		byPeer:   map[peer][]uint64{},
		holders:  map[uint64][]fdRef{},
	}
	netDir := fmt.Sprintf("/proc/%d/net", r.InitPID)
	s.conntrackPath = netDir + "/nf_conntrack"
	for _, f := range []string{"tcp", "tcp6"} {
		s.readSockets(netDir + "/" + f)
	}
	s.procs = r.members()
	for pid := range s.procs {
		s.readFDs(pid)
	}
	return s
}

// readConntrack fills original. Kernels built without the conntrack procfs
// file leave it empty; the lookup then falls back to the local address.
func (s *snapshot) readConntrack(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		// Closed connections linger in the table; none of them is being
		// identified.
		if !strings.Contains(line, " tcp ") || strings.Contains(line, "TIME_WAIT") || strings.Contains(line, " CLOSE") {
			continue
		}
		if t := parseTuples(line); len(t) == 2 {
			s.original[tuple{t[1][0], t[1][1]}] = tuple{t[0][0], t[0][1]}
		}
	}
}

// readSockets indexes the non-listening sockets of one /proc/net/tcp{,6}
// file. Sockets with inode 0 (TIME_WAIT, orphans) belong to no process.
func (s *snapshot) readSockets(path string) {
	f, err := os.Open(path)
	if err != nil {
		return // a kernel without IPv6 has no tcp6
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// Inode 0 (TIME_WAIT, orphans) belongs to no process; these are
		// most rows after a burst, so they are skipped before parsing.
		if len(fields) < 10 || fields[3] == tcpListen || fields[9] == "0" {
			continue
		}
		local, err1 := parseHexAddrPort(fields[1])
		remote, err2 := parseHexAddrPort(fields[2])
		inode, err3 := strconv.ParseUint(fields[9], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || inode == 0 {
			continue
		}
		// A dual-stack socket lists IPv4 peers in their v4-mapped form.
		local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
		remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
		s.byTuple[tuple{local, remote}] = append(s.byTuple[tuple{local, remote}], inode)
		s.byLocal[local] = append(s.byLocal[local], inode)
		s.byPeer[peer{local.Addr(), remote}] = append(s.byPeer[peer{local.Addr(), remote}], inode)
	}
}

// readFDs records which sockets pid holds.
func (s *snapshot) readFDs(pid int) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	d, err := os.Open(dir)
	if err != nil {
		return // exited, or not ours to read
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		l, err := os.Readlink(dir + n)
		if err != nil {
			continue
		}
		num, ok := strings.CutPrefix(l, "socket:[")
		if !ok {
			continue
		}
		inode, err := strconv.ParseUint(strings.TrimSuffix(num, "]"), 10, 64)
		fd, err2 := strconv.Atoi(n)
		if err == nil && err2 == nil {
			s.holders[inode] = append(s.holders[inode], fdRef{pid: pid, fd: fd})
		}
	}
}

// sockets finds the sandbox sockets that can be the other end of a
// connection the supervisor accepted on listener from client; origDst is
// the connection's original destination (SO_ORIGINAL_DST). It returns the
// descriptors holding them; none means this snapshot does not know the
// connection.
//
// NAT may have changed the connection on its way to the listener: REDIRECT
// rewrites the destination, and when two connections that differ only in
// destination meet at one listener, conntrack rewrites the source port of
// one of them too, so the client port seen here may name no socket, or
// another one. The sockets from the client's address to the original
// destination are the candidates. When one process holds them all (the
// usual case) that process is the answer whichever socket it is. Otherwise
// the conntrack table, where readable, gives the exact original tuple;
// where it is not (a rootless supervisor cannot read it) the caller accepts
// the candidates only if all their processes have one identity.
func (s *snapshot) sockets(listener, client, origDst netip.AddrPort) []fdRef {
	var refs []fdRef
	if origDst.IsValid() {
		// Without a port rewrite the full tuple names the socket itself.
		// Conntrack picks a rewritten port that no other connection to the
		// listener uses, so a socket with this tuple is never another one.
		if exact := s.refs(s.byTuple[tuple{client, origDst}]); len(exact) > 0 {
			return exact
		}
		refs = s.refs(s.byPeer[peer{client.Addr(), origDst}])
	}
	if len(refs) > 0 && onePID(refs) {
		return refs
	}
	s.conntrackOnce.Do(func() { s.readConntrack(s.conntrackPath) })
	if o, tracked := s.original[tuple{listener, client}]; tracked {
		return s.refs(s.byTuple[o])
	}
	if len(refs) > 0 {
		return refs
	}
	return s.refs(s.byLocal[client])
}

func (s *snapshot) refs(inodes []uint64) []fdRef {
	var out []fdRef
	for _, in := range inodes {
		for _, ref := range s.holders[in] {
			ref.inode = in
			out = append(out, ref)
		}
	}
	return out
}

func onePID(refs []fdRef) bool {
	for _, r := range refs[1:] {
		if r.pid != refs[0].pid {
			return false
		}
	}
	return true
}

// descendants returns root and every process below it. With
// CONFIG_PROC_CHILDREN it walks down from root through each thread's
// children list, touching only the sandbox's processes; otherwise it reads
// the parent of every process on the host.
func descendants(root int) map[int]bool {
	set := map[int]bool{root: true}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d/children", root, root)); err != nil {
		return descendantsByParent(root)
	}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks := "/proc/" + strconv.Itoa(p) + "/task/"
		var tids []int
		listDir(tasks, func(name []byte) {
			if tid, ok := atoi(name); ok {
				tids = append(tids, tid)
			}
		})
		for _, tid := range tids {
			bp, err := readProc(tasks + strconv.Itoa(tid) + "/children")
			if err != nil {
				continue
			}
			for _, f := range bytes.Fields(*bp) {
				if c, ok := atoi(f); ok && !set[c] {
					set[c] = true
					queue = append(queue, c)
				}
			}
			putBuf(bp)
		}
	}
	return set
}

func descendantsByParent(root int) map[int]bool {
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
	set := map[int]bool{root: true}
	queue := []int{root}
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
	return set
}
