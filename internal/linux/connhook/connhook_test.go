//go:build linux

package connhook

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/cgroup"
)

// connector connects to each address given and prints, per socket, its
// pid and the socket's cookie.
const connector = `import os, socket, sys
for a in sys.argv[1:]:
    host, port = a.rsplit(":", 1)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.connect((host.strip("[]"), int(port)))
    print(os.getpid(), int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), "little"), flush=True)
`

// groupsMade numbers the test's groups.
var groupsMade atomic.Int64

// testCgroup makes a cgroup v2 directory of the test's own, outside the
// corral/ directory that sandboxes sweep, and a group below it for the
// processes the test starts. Removing it, at the end, detaches the hook.
func testCgroup(t testing.TB) (parent, child string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs into a cgroup")
	}
	f := cgroup.Detect()
	if f.Unified == "" {
		t.Skip("no cgroup2 hierarchy: " + f.Reason)
	}
	parent = filepath.Join(f.Unified, fmt.Sprintf("corral-connhook-test-%d-%d", os.Getpid(), groupsMade.Add(1)))
	child = filepath.Join(parent, "sandbox")
	for _, d := range []string{parent, child} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{child, parent} {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove test cgroup: %v", err)
			}
		}
	})
	return parent, child
}

// connect runs the connector, inside dir's cgroup when dir is set, and
// returns its pid and one cookie per address.
func connect(t *testing.T, dir string, addrs ...string) (int, []uint64) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	join := ""
	if dir != "" {
		join = "echo $$ > " + filepath.Join(dir, "cgroup.procs") + " && "
	}
	out, err := exec.Command("sh", append([]string{"-c", join + `exec python3 -c "$0" "$@"`, connector}, addrs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("connector: %v\n%s", err, out)
	}
	pid := 0
	var cookies []uint64
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("connector said %q", out)
		}
		pid, _ = strconv.Atoi(f[0])
		c, _ := strconv.ParseUint(f[1], 10, 64)
		cookies = append(cookies, c)
	}
	return pid, cookies
}

func listen(t *testing.T, network, addr string) string {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

func monotonic(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// TestRecordsConnects: a process of the sandbox's group is recorded for
// each socket it connects, IPv4 and IPv6, with the time it connected; one
// of another group below the same parent (another sandbox) is not, nor
// one outside, nor one once the hook is closed.
func TestRecordsConnects(t *testing.T) {
	parent, child := testCgroup(t)
	other := sibling(t, parent)
	h, err := Open(parent, child)
	if err != nil {
		t.Fatal(err)
	}
	v4 := listen(t, "tcp4", "127.0.0.1:0")
	v6 := listen(t, "tcp6", "[::1]:0")
	before := monotonic(t)
	pid, cookies := connect(t, child, v4, v6)
	after := monotonic(t)
	for i, c := range cookies {
		rec, ok := h.Lookup(c)
		if !ok {
			t.Fatalf("socket %d (cookie %d): no record", i, c)
		}
		if rec.TGID != pid || rec.At < before || rec.At > after {
			t.Errorf("socket %d: record %+v, want pid %d between %d and %d", i, rec, pid, before, after)
		}
	}
	for _, dir := range []string{other, ""} {
		if _, cookies := connect(t, dir, v4); len(cookies) != 1 {
			t.Fatal("no cookie")
		} else if rec, ok := h.Lookup(cookies[0]); ok {
			t.Errorf("a process outside the sandbox's group (%q) was recorded: %+v", dir, rec)
		}
	}
	// A sandbox that ends leaves its map for the next, which takes it
	// rather than allocating one.
	used := idOf(t, h.records)
	again := openAgain(t, h, parent, child)
	if got := idOf(t, again.records); got != used {
		t.Errorf("the next sandbox made map %d, not taking the ended one's %d", got, used)
	}
	wantRecorded(t, again, child, v4, "the map taken again")
}

// TestFloodKeepsOthersRecords: a sandbox that connects more sockets than
// its map holds loses its own oldest records, not another sandbox's: were
// the records of every sandbox in one map, the flood would push out the
// other's record before its connection was identified.
func TestFloodKeepsOthersRecords(t *testing.T) {
	parent, child := testCgroup(t)
	other := sibling(t, parent)
	h, err := Open(parent, child)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	flooder, err := Open(parent, other)
	if err != nil {
		t.Fatal(err)
	}
	defer flooder.Close()
	pid, cookies := connect(t, child, listen(t, "tcp4", "127.0.0.1:0"))
	// UDP sockets: a connect each, no handshake, nothing to accept.
	flood := `import socket, sys
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", 9))
    s.close()
`
	n := strconv.Itoa(2 * maxRecords) // the least recently written go first, roughly
	join := "echo $$ > " + filepath.Join(other, "cgroup.procs") + " && "
	if out, err := exec.Command("sh", "-c", join+`exec python3 -c "$0" "$1"`, flood, n).CombinedOutput(); err != nil {
		t.Fatalf("flood: %v\n%s", err, out)
	}
	if rec, ok := h.Lookup(cookies[0]); !ok || rec.TGID != pid {
		t.Errorf("after another sandbox's %s connects the record is %+v, %v; want pid %d", n, rec, ok, pid)
	}
}

// openAgain closes h, as a sandbox that ended, and opens the hook for
// group again, as the next sandbox; the test's end closes that one.
func openAgain(t *testing.T, h *Hook, dir, group string) *Hook {
	t.Helper()
	h.Close()
	again, err := Open(dir, group)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { again.Close() })
	return again
}

// sibling makes another sandbox's group next to the test's.
func sibling(t *testing.T, parent string) string {
	t.Helper()
	dir := filepath.Join(parent, "other")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// wantRecorded connects from group to addr and wants h to hold the
// connector's record.
func wantRecorded(t *testing.T, h *Hook, group, addr, what string) {
	t.Helper()
	pid, cookies := connect(t, group, addr)
	if rec, ok := h.Lookup(cookies[0]); !ok || rec.TGID != pid {
		t.Errorf("%s does not record: %+v, %v", what, rec, ok)
	}
}

// TestOpenPrunesEndedGroups: registrations whose group is gone (a
// supervisor killed before Close, its group removed since) are removed by
// the next Open, even when they fill the map of maps, which would
// otherwise refuse the new sandbox; a running sandbox's registration
// stays and it goes on recording.
func TestOpenPrunesEndedGroups(t *testing.T) {
	parent, child := testCgroup(t)
	running, err := Open(parent, sibling(t, parent))
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	ended := filepath.Join(parent, "ended")
	if err := os.Mkdir(ended, 0o755); err != nil {
		t.Fatal(err)
	}
	killed, err := Open(parent, ended)
	if err != nil {
		os.Remove(ended)
		t.Fatal(err)
	}
	killed.records.Close() // what the kernel does for a killed process
	killed.groups.Close()
	if err := os.Remove(ended); err != nil {
		t.Fatal(err)
	}
	// Fill the rest with registrations of groups that never existed here
	// (ids no cgroup has), as thousands of killed supervisors would.
	var filled []uint64
	for i := uint64(1); ; i++ {
		k := 1<<62 | i
		if err := running.groups.Update(k, running.records, ebpf.UpdateNoExist); err != nil {
			if len(filled) == 0 {
				t.Fatalf("register: %v", err)
			}
			break
		}
		filled = append(filled, k)
	}
	h, err := Open(parent, child)
	if err != nil {
		t.Fatalf("Open with the map of maps full of ended groups: %v", err)
	}
	defer h.Close()
	var m *ebpf.Map
	for _, k := range append(filled, killed.group) {
		if h.groups.Lookup(k, &m) == nil {
			m.Close()
			t.Fatalf("group %d is still registered", k)
		}
	}
	if err := h.groups.Lookup(running.group, &m); err != nil {
		t.Fatalf("the running sandbox's registration is gone: %v", err)
	}
	m.Close()
	addr := listen(t, "tcp4", "127.0.0.1:0")
	wantRecorded(t, running, filepath.Join(parent, "other"), addr, "the running sandbox")
	wantRecorded(t, h, child, addr, "the new sandbox")
}

// TestOpenFindsTheHook: a second Open finds the programs the first
// attached, and their map, rather than attaching more.
func TestOpenFindsTheHook(t *testing.T) {
	parent, child := testCgroup(t)
	first, err := Open(parent, child)
	if err != nil {
		t.Fatal(err)
	}
	firstMap := idOf(t, first.groups)
	second := openAgain(t, first, parent, child)
	if got := idOf(t, second.groups); got != firstMap {
		t.Errorf("the second Open uses map %d, the first's is %d: it attached the hook again", got, firstMap)
	}
	for _, at := range attachTypes {
		if n := countAttached(t, parent, at, progName); n != 1 {
			t.Errorf("%v: %d programs attached, want 1", at, n)
		}
	}
	wantRecorded(t, second, child, listen(t, "tcp4", "127.0.0.1:0"), "the hook found again")
}

// TestOpenReplacesAnotherVersion: programs of corral's name that are not
// this version's are detached once no other group below the hook's runs,
// and left for the sandboxes that may use them while one does; this
// version's are attached either way, and others' programs left alone.
func TestOpenReplacesAnotherVersion(t *testing.T) {
	for _, others := range []bool{false, true} {
		t.Run(fmt.Sprintf("other_sandboxes=%v", others), func(t *testing.T) {
			parent, child := testCgroup(t)
			if others {
				sibling(t, parent)
			}
			plantOld(t, parent)
			h, err := Open(parent, child)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			wantOld := 0
			if others {
				wantOld = 1
			}
			for _, at := range attachTypes {
				if n := countAttached(t, parent, at, progName); n != 1+wantOld {
					t.Errorf("%v: %d of corral's programs attached, want this version's and %d old", at, n, wantOld)
				}
				if n := countAttached(t, parent, at, "someone_else"); n != 1 {
					t.Errorf("%v: %d of another's programs attached, want it left", at, n)
				}
			}
			wantRecorded(t, h, child, listen(t, "tcp4", "127.0.0.1:0"), "this version's hook")
		})
	}
}

// plantOld attaches to dir, for each hook, a program of corral's name
// that is not this version's and one of someone else's.
func plantOld(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	allow := asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}
	for _, at := range attachTypes {
		for _, name := range []string{progName, "someone_else"} {
			p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.CGroupSockAddr, AttachType: at, Instructions: allow, License: "MIT"})
			if err != nil {
				t.Fatal(err)
			}
			err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(d.Fd()), Program: p, Attach: at, Flags: unix.BPF_F_ALLOW_MULTI})
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// countAttached counts the programs named name attached to dir for at.
func countAttached(t *testing.T, dir string, at ebpf.AttachType, name string) int {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(d.Fd()), Attach: at})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, a := range q.Programs {
		p, err := ebpf.NewProgramFromID(a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := p.Info(); err == nil && info.Name == name {
			n++
		}
		p.Close()
	}
	return n
}

// idOf is the kernel's id of m.
func idOf(t testing.TB, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Skip("the kernel does not tell map ids")
	}
	return id
}

// BenchmarkOpen is what a sandbox's start pays for the hook: "attach"
// when no sandbox ran before it (the programs loaded and attached, the
// map of maps and the sandbox's map allocated), "found" when the programs
// are attached and an ended sandbox's map waits to be taken.
func BenchmarkOpen(b *testing.B) {
	b.Run("attach", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			parent, child := testCgroup(b)
			b.StartTimer()
			h, err := Open(parent, child)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			h.Close()
			// Removing the groups detaches the programs.
			os.Remove(child)
			os.Remove(parent)
			b.StartTimer()
		}
	})
	b.Run("found", func(b *testing.B) {
		parent, child := testCgroup(b)
		h, err := Open(parent, child)
		if err != nil {
			b.Fatal(err)
		}
		h.Close()
		for b.Loop() {
			h, err := Open(parent, child)
			if err != nil {
				b.Fatal(err)
			}
			h.Close()
		}
	})
}
