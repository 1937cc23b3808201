//go:build linux

package procident

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/capture"
)

// requireRoot skips a test that needs root, unless CORRAL_NO_SKIP=1 asks
// for every skip to count as a failure (as CI does).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := "needs root (network and PID namespaces, nftables, pidfd_getfd)"
	if os.Getenv("CORRAL_NO_SKIP") == "1" {
		t.Fatal(msg + "; CORRAL_NO_SKIP=1 forbids skipping")
	}
	t.Skip(msg)
}

// nsInitMain is the init of a sandbox-like tree in its own network, mount
// and PID namespaces: it sets up capture, tells the test which descriptors
// hold the transparent listeners (the test takes them with pidfd_getfd, as
// the supervisor would receive them over SCM_RIGHTS), then runs the client
// under sh like initMain.
func nsInitMain() int {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lo:", err)
		return 1
	}
	l, err := capture.Setup(capture.DefaultConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fds := map[string]int{"t4": int(l.Transparent4.Fd())}
	if l.IPv6 {
		fds["t6"] = int(l.Transparent6.Fd())
	}
	b, _ := json.Marshal(fds)
	fmt.Printf("%s\n", b)
	return initMain()
}

// TestIdentifyAcrossNamespaces is the production arrangement: the client
// runs in its own network and PID namespaces behind the capture rules, the
// test (as supervisor) accepts on the sandbox's listener from the host
// namespaces and identifies the client by its host pid.
func TestIdentifyAcrossNamespaces(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct{ listener, dest string }{
		{"t4", "203.0.113.9:443"},
		{"t6", "[2001:db8::1]:443"},
	} {
		t.Run(tc.listener, func(t *testing.T) { identifyInNamespaces(t, tc.listener, tc.dest) })
	}
}

func identifyInNamespaces(t *testing.T, listener, dest string) {
	exe, _ := os.Executable()
	ns := startInNamespaces(t, listener, dest, exe)
	conn, cmd, nsLine := ns.conn, ns.init, ns.line
	orig, err := capture.ConnOriginalDst(conn)
	if err != nil || orig != netip.MustParseAddrPort(dest) {
		t.Errorf("original destination %s, %v; want %s", orig, err, dest)
	}

	r := &Resolver{InitPID: cmd.Process.Pid}
	id, err := r.Identify(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("identity: %+v", id)
	// The client reported its pid inside the namespace; the identity
	// carries the host pid of the same process.
	if got := lastNSpid(t, id.PID); got != strings.TrimSpace(nsLine) {
		t.Errorf("identified pid %d is pid %s in the sandbox, the client is %s", id.PID, got, strings.TrimSpace(nsLine))
	}
	if want := canonical(t, exe); id.Binary != want {
		t.Errorf("Binary %q, want %q", id.Binary, want)
	}
	if want := []string{canonical(t, "/bin/sh")}; !slices.Equal(id.Ancestors, want) {
		t.Errorf("Ancestors %q, want %q", id.Ancestors, want)
	}
}

// nsSandbox is a sandbox-like tree in its own namespaces and the
// connection the test accepted from its client on the capture listener.
type nsSandbox struct {
	init *exec.Cmd
	ln   net.Listener
	conn net.Conn
	// line is the first line the client sent: its pid in the namespace.
	line string
}

// startInNamespaces runs target with args as the client of a tree in
// fresh network, mount and PID namespaces behind the capture rules, and
// accepts its connection to dest on the listener named listener.
func startInNamespaces(tb testing.TB, listener, dest, target string, args ...string) *nsSandbox {
	tb.Helper()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, args...)
	cmd.Dir = tb.TempDir()
	cmd.Env = append(os.Environ(), modeEnv+"=nsinit", targetEnv+"="+target, addrEnv+"="+dest)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS | unix.CLONE_NEWPID}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	ns := &nsSandbox{init: cmd}
	tb.Cleanup(func() {
		if ns.conn != nil {
			ns.conn.Close()
		}
		if ns.ln != nil {
			ns.ln.Close()
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		tb.Fatalf("namespace init: %v", err)
	}
	var fds map[string]int
	if err := json.Unmarshal([]byte(line), &fds); err != nil {
		tb.Fatalf("namespace init said %q: %v", line, err)
	}
	fd, ok := fds[listener]
	if !ok {
		if os.Getenv("CORRAL_NO_SKIP") == "1" {
			tb.Fatalf("no %s listener (IPv6 unavailable in the namespace)", listener)
		}
		tb.Skipf("no %s listener (IPv6 unavailable in the namespace)", listener)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer unix.Close(pidfd)
	lfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		tb.Fatal(err)
	}
	lf := os.NewFile(uintptr(lfd), listener)
	ns.ln, err = net.FileListener(lf)
	lf.Close()
	if err != nil {
		tb.Fatal(err)
	}
	ns.ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	if ns.conn, err = ns.ln.Accept(); err != nil {
		tb.Fatalf("client did not arrive: %v", err)
	}
	if ns.line, err = bufio.NewReader(ns.conn).ReadString('\n'); err != nil {
		tb.Fatal(err)
	}
	return ns
}

// lastNSpid returns the innermost pid of a host pid, from NSpid in
// /proc/<pid>/status.
func lastNSpid(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "NSpid:"); ok {
			f := strings.Fields(rest)
			return f[len(f)-1]
		}
	}
	t.Fatal("no NSpid")
	return ""
}

// sharer connects once, waits for the test to identify that connection,
// then connects again and forks a child that execs sleep with the new
// socket: two programs hold one socket.
const sharer = `import os, socket
host, port = os.environ["CORRAL_PROCIDENT_TEST_ADDR"].rsplit(":", 1)
a = socket.create_connection((host, int(port)))
a.sendall(b"%d\n" % os.getpid())
a.recv(1)
b = socket.create_connection((host, int(port)))
b.set_inheritable(True)
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    os.execv("/bin/sleep", ["sleep", "30"])
os.close(w)
os.read(r, 1)  # EOF once the child has exec'd (close-on-exec)
b.sendall(b"shared\n")
while a.recv(4096):
    pass
`

// watchedPython runs a python3 script in a sandbox-like tree whose forks
// and execs are watched, and returns the tree and a resolver for it.
func watchedPython(t *testing.T, name, source string) (*nsSandbox, *Resolver) {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("/usr/bin/python3 is not installed")
	}
	w, err := WatchExecs()
	if err != nil {
		t.Fatalf("proc connector: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	script := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(script, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := startInNamespaces(t, "t4", "203.0.113.9:443", "/usr/bin/python3", script)
	return ns, &Resolver{InitPID: ns.init.Process.Pid, Execs: w}
}

// TestIdentifySocketSharedAfterFork: a socket held by two programs is not
// attributed to either, also when the second one was forked after the
// sandbox's processes were first listed (the exec watch keeps the list).
func TestIdentifySocketSharedAfterFork(t *testing.T) {
	ns, r := watchedPython(t, "sharer.py", sharer)
	if _, err := r.Identify(ns.conn); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	ns.conn.Write([]byte("g"))
	second, err := ns.ln.Accept()
	if err != nil {
		t.Fatalf("second connection: %v", err)
	}
	defer second.Close()
	if line, err := bufio.NewReader(second).ReadString('\n'); err != nil || line != "shared\n" {
		t.Fatalf("second connection said %q, %v", line, err)
	}
	id, err := r.Identify(second)
	if err == nil {
		t.Fatalf("a socket held by python3 and sleep was attributed to %+v", id)
	}
	if !strings.Contains(err.Error(), "/sleep") {
		t.Errorf("refused for another reason than the second holder: %v", err)
	}
}

// TestIdentifyRebuildsIncompleteTree: a socket that no process of the
// exec watch's list holds sends the lookup back to /proc, which finds the
// process the list lacked.
func TestIdentifyRebuildsIncompleteTree(t *testing.T) {
	ns, r := watchedPython(t, "client.py", pyClient)
	w := r.Execs
	id, err := r.Identify(ns.conn)
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	delete(w.tree.members, int32(id.PID))
	w.mu.Unlock()
	again, err := r.Identify(ns.conn)
	if err != nil {
		t.Fatalf("with the client missing from the list: %v", err)
	}
	if again.PID != id.PID {
		t.Errorf("identified pid %d, want %d", again.PID, id.PID)
	}
}
