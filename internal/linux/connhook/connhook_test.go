//go:build linux

package connhook

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// testCgroup makes a cgroup v2 directory of the test's own, outside the
// corral/ directory that sandboxes sweep, and a group below it for the
// processes the test starts. Removing it, at the end, detaches the hook.
func testCgroup(t *testing.T) (parent, child string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs into a cgroup")
	}
	f := cgroup.Detect()
	if f.Unified == "" {
		t.Skip("no cgroup2 hierarchy: " + f.Reason)
	}
	parent = filepath.Join(f.Unified, fmt.Sprintf("corral-connhook-test-%d", os.Getpid()))
	child = filepath.Join(parent, "sandbox")
	for _, d := range []string{parent, child} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{child, parent} {
			if err := os.Remove(d); err != nil {
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
	other := filepath.Join(parent, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(other)
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
	used := recordsID(t, h)
	h.Close()
	again, err := Open(parent, child)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got := recordsID(t, again); got != used {
		t.Errorf("the next sandbox made map %d, not taking the ended one's %d", got, used)
	}
	pid, cookies = connect(t, child, v4)
	if rec, ok := again.Lookup(cookies[0]); !ok || rec.TGID != pid {
		t.Errorf("the map taken again does not record: %+v, %v", rec, ok)
	}
}

func recordsID(t *testing.T, h *Hook) ebpf.MapID {
	t.Helper()
	info, err := h.records.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// TestOpenFindsTheHook: a second Open finds the programs the first
// attached, and their map, rather than attaching more.
func TestOpenFindsTheHook(t *testing.T) {
	parent, child := testCgroup(t)
	first, err := Open(parent, child)
	if err != nil {
		t.Fatal(err)
	}
	firstMap := mapID(t, first)
	first.Close() // as a sandbox that ended
	second, err := Open(parent, child)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if got := mapID(t, second); got != firstMap {
		t.Errorf("the second Open uses map %d, the first's is %d: it attached the hook again", got, firstMap)
	}
	for _, at := range attachTypes {
		if n := countAttached(t, parent, at, progName); n != 1 {
			t.Errorf("%v: %d programs attached, want 1", at, n)
		}
	}
	v4 := listen(t, "tcp4", "127.0.0.1:0")
	pid, cookies := connect(t, child, v4)
	if rec, ok := second.Lookup(cookies[0]); !ok || rec.TGID != pid {
		t.Errorf("the hook found again does not record: %+v, %v", rec, ok)
	}
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
				other := filepath.Join(parent, "other")
				if err := os.Mkdir(other, 0o755); err != nil {
					t.Fatal(err)
				}
				defer os.Remove(other)
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
			v4 := listen(t, "tcp4", "127.0.0.1:0")
			pid, cookies := connect(t, child, v4)
			if rec, ok := h.Lookup(cookies[0]); !ok || rec.TGID != pid {
				t.Errorf("this version's hook does not record: %+v, %v", rec, ok)
			}
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

func mapID(t *testing.T, h *Hook) ebpf.MapID {
	t.Helper()
	info, err := h.groups.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Skip("the kernel does not tell map ids")
	}
	return id
}
