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
	cmd := exec.Command(exe)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), modeEnv+"=nsinit", targetEnv+"="+exe, addrEnv+"="+dest)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS | unix.CLONE_NEWPID}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("namespace init: %v", err)
	}
	var fds map[string]int
	if err := json.Unmarshal([]byte(line), &fds); err != nil {
		t.Fatalf("namespace init said %q: %v", line, err)
	}
	fd, ok := fds[listener]
	if !ok {
		if os.Getenv("CORRAL_NO_SKIP") == "1" {
			t.Fatalf("no %s listener (IPv6 unavailable in the namespace)", listener)
		}
		t.Skipf("no %s listener (IPv6 unavailable in the namespace)", listener)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	lfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		t.Fatal(err)
	}
	lf := os.NewFile(uintptr(lfd), listener)
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("client did not arrive: %v", err)
	}
	defer conn.Close()
	nsLine, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
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
