//go:build linux

package procident

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/egress"
)

// The tests build a small process tree standing in for a sandbox:
//
//	test binary (mode init)   <- Resolver.InitPID
//	  sh -c '"$0" "$@"; exit $?'
//	    target (mode client)  <- connects to the test's listener
//
// The client writes its pid on the connection and stays until the test
// closes it, so the test decides how long the process lives.
const (
	modeEnv   = "CORRAL_PROCIDENT_TEST_MODE"
	targetEnv = "CORRAL_PROCIDENT_TEST_TARGET"
	addrEnv   = "CORRAL_PROCIDENT_TEST_ADDR"
	// mapEnv names a file the client maps executable before connecting,
	// as a loaded library would be; "memfd" maps an anonymous file made
	// with memfd_create, as fileless loaders do.
	mapEnv = "CORRAL_PROCIDENT_TEST_MAPX"
	// reexecEnv makes the client, once told to on its connection, exec
	// its own binary again with LD_PRELOAD set and connect anew.
	reexecEnv = "CORRAL_PROCIDENT_TEST_REEXEC"
)

func TestMain(m *testing.M) {
	switch os.Getenv(modeEnv) {
	case "init":
		os.Exit(initMain())
	case "client":
		os.Exit(clientMain())
	case "nsinit":
		os.Exit(nsInitMain())
	}
	os.Exit(m.Run())
}

func initMain() int {
	// The trailing "exit" keeps sh from exec'ing the target in its place,
	// so sh stays in the tree as the client's parent.
	args := append([]string{"-c", `"$0" "$@"; exit $?`, os.Getenv(targetEnv)}, os.Args[1:]...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = append(os.Environ(), modeEnv+"=client")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	return 0
}

func clientMain() int {
	if p := os.Getenv(mapEnv); p != "" {
		var f *os.File
		var err error
		if p == "memfd" {
			var fd int
			if fd, err = unix.MemfdCreate("payload", 0); err == nil {
				f = os.NewFile(uintptr(fd), "memfd")
				err = f.Truncate(4096)
			}
		} else {
			f, err = os.Open(p)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			return 1
		}
		if _, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE); err != nil {
			fmt.Fprintln(os.Stderr, "client: mmap:", err)
			return 1
		}
		f.Close()
	}
	c, err := net.Dial("tcp", os.Getenv(addrEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	fmt.Fprintf(c, "%d\n", os.Getpid())
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	if os.Getenv(reexecEnv) != "" && os.Getenv("LD_PRELOAD") == "" {
		if line, _ := bufio.NewReader(c).ReadString('\n'); line == "again\n" {
			exe, _ := os.Executable()
			err := syscall.Exec(exe, os.Args, append(os.Environ(), "LD_PRELOAD=:"))
			fmt.Fprintln(os.Stderr, "client: exec:", err)
			return 1
		}
	}
	io.Copy(io.Discard, c) // until the test closes the connection
	return 0
}

// sandbox is one running tree and the accepted connection from its client.
type sandbox struct {
	init      *exec.Cmd
	conn      net.Conn
	clientPID int
}

// start runs target as the client under a fresh init, in dir, with args.
func start(t *testing.T, target, dir string, args ...string) *sandbox {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), modeEnv+"=init", targetEnv+"="+target, addrEnv+"="+ln.Addr().String())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sandbox{init: cmd}
	t.Cleanup(s.stop)
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	if s.conn, err = ln.Accept(); err != nil {
		t.Fatalf("client did not connect: %v", err)
	}
	line, err := bufio.NewReader(s.conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if s.clientPID, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *sandbox) stop() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	if s.init != nil {
		s.init.Wait()
		s.init = nil
	}
}

func canonical(t *testing.T, p string) string {
	t.Helper()
	c, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIdentifyProcessTree(t *testing.T) {
	exe, _ := os.Executable()
	s := start(t, exe, t.TempDir())
	r := &Resolver{InitPID: s.init.Process.Pid}
	id, err := r.Identify(s.conn)
	if err != nil {
		t.Fatal(err)
	}
	if id.PID != s.clientPID {
		t.Errorf("PID %d, want %d", id.PID, s.clientPID)
	}
	if want := canonical(t, exe); id.Binary != want {
		t.Errorf("Binary %q, want %q", id.Binary, want)
	}
	if want := []string{canonical(t, "/bin/sh")}; !slices.Equal(id.Ancestors, want) {
		t.Errorf("Ancestors %q, want %q (init itself excluded)", id.Ancestors, want)
	}
	if len(id.BinarySHA256) != 64 {
		t.Errorf("BinarySHA256 %q", id.BinarySHA256)
	}
	// A second connection attribution of the same unchanged files is
	// answered from the cache.
	before := r.hashes.Load()
	if _, err := r.Identify(s.conn); err != nil {
		t.Fatal(err)
	}
	if n := r.hashes.Load() - before; n != 0 {
		t.Errorf("unchanged files re-hashed %d times", n)
	}
}

func TestIdentifyCmdlinePaths(t *testing.T) {
	dir := canonical(t, t.TempDir())
	other := canonical(t, t.TempDir())
	write := func(p string) {
		if err := os.WriteFile(p, []byte("#!/bin/true\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "tool.py"))
	write(filepath.Join(dir, "real.sh"))
	write(filepath.Join(other, "abs.js"))
	if err := os.Symlink("real.sh", filepath.Join(dir, "link.sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Only interpreters have a script slot: the test binary plays one
	// under an interpreter's name, and then a loader's.
	exe := copyAs(t, "python3")
	s := start(t, exe, dir,
		"./tool.py", "-v", filepath.Join(other, "abs.js"), "link.sh", "missing.py", "subdir", "/dev/null", "./tool.py")
	r := &Resolver{InitPID: s.init.Process.Pid}
	id, err := r.Identify(s.conn)
	if err != nil {
		t.Fatal(err)
	}
	// Only the script position counts; later arguments name files the
	// script reads, which must not lend it their policy.
	want := []string{filepath.Join(dir, "tool.py")}
	if !slices.Equal(id.CmdlinePaths, want) {
		t.Errorf("CmdlinePaths %q, want %q", id.CmdlinePaths, want)
	}
	s2 := start(t, exe, dir, "-v", "link.sh", filepath.Join(other, "abs.js"))
	id2, err := (&Resolver{InitPID: s2.init.Process.Pid}).Identify(s2.conn)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "real.sh")}; !slices.Equal(id2.CmdlinePaths, want) {
		t.Errorf("symlinked script: CmdlinePaths %q, want %q", id2.CmdlinePaths, want)
	}

	loader := copyAs(t, "ld-linux-x86-64.so.2")
	s3 := start(t, loader, dir, "./tool.py")
	id3, err := (&Resolver{InitPID: s3.init.Process.Pid}).Identify(s3.conn)
	if err != nil {
		t.Fatal(err)
	}
	if len(id3.CmdlinePaths) != 0 {
		t.Errorf("a program that is no interpreter was bound by its argument: CmdlinePaths %q", id3.CmdlinePaths)
	}

	// A script edited after first use is an integrity failure like a
	// binary.
	if err := os.WriteFile(filepath.Join(dir, "tool.py"), []byte("import evil\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = r.Identify(s.conn)
	assertIntegrity(t, err, filepath.Join(dir, "tool.py"))
}

// copyAs copies the test binary to a file called name.
func copyAs(t *testing.T, name string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(canonical(t, t.TempDir()), name)
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

func assertIntegrity(t *testing.T, err error, path string) {
	t.Helper()
	var changed *egress.IntegrityError
	if !errors.As(err, &changed) {
		t.Fatalf("got %v, want an IntegrityError", err)
	}
	if changed.Path != path || changed.Want == "" || changed.Got == "" || changed.Want == changed.Got {
		t.Fatalf("got %+v, want %s with the first and the current hash", changed, path)
	}
}

func TestIdentifyTOFU(t *testing.T) {
	exe, _ := os.Executable()
	orig, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	dir := canonical(t, t.TempDir())
	app := filepath.Join(dir, "app")
	if err := os.WriteFile(app, orig, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Resolver{}
	identify := func() (egress.Identity, error) {
		s := start(t, app, dir)
		defer s.stop()
		r.InitPID = s.init.Process.Pid // one resolver, like one sandbox's life
		return r.Identify(s.conn)
	}

	id, err := identify()
	if err != nil {
		t.Fatal(err)
	}
	if id.Binary != app {
		t.Fatalf("Binary %q, want %q", id.Binary, app)
	}
	trusted := id.BinarySHA256

	// Same inode, new content (trailing bytes do not stop an ELF running).
	f, err := os.OpenFile(app, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("tampered"))
	f.Close()
	_, err = identify()
	assertIntegrity(t, err, app)

	// New inode with the original content: the fingerprint changed, so it
	// is re-hashed, and the hash is the trusted one again.
	if err := os.WriteFile(app+".new", orig, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(app+".new", app); err != nil {
		t.Fatal(err)
	}
	before := r.hashes.Load()
	if id, err = identify(); err != nil {
		t.Fatalf("original content refused: %v", err)
	}
	if id.BinarySHA256 != trusted {
		t.Errorf("hash %s, want %s", id.BinarySHA256, trusted)
	}
	if r.hashes.Load() == before {
		t.Error("replaced file was not re-hashed")
	}

	// New inode, new content.
	if err := os.WriteFile(app+".new", append(orig, "other"...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(app+".new", app); err != nil {
		t.Fatal(err)
	}
	_, err = identify()
	assertIntegrity(t, err, app)
}

func TestIdentifyFailsClosed(t *testing.T) {
	exe, _ := os.Executable()
	s := start(t, exe, t.TempDir())

	// A connection from a process outside the sandbox tree (the test
	// itself) must not be attributed to anyone.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	r := &Resolver{InitPID: s.init.Process.Pid}
	if id, err := r.Identify(sc); err == nil {
		t.Errorf("outsider identified as %+v", id)
	}
	if _, err := (&Resolver{}).Identify(s.conn); err == nil {
		t.Error("resolver without InitPID identified a connection")
	}
	// After the client is gone its socket is gone too.
	s.conn.(*net.TCPConn).SetLinger(0)
	conn := s.conn
	s.stop()
	if id, err := r.Identify(conn); err == nil {
		t.Errorf("exited client identified as %+v", id)
	}
}

func TestParseHexAddrPort(t *testing.T) {
	// Build the kernel's notation the way it prints it: each 32-bit word
	// of the address as a host-order integer.
	enc := func(ap netip.AddrPort) string {
		b := ap.Addr().AsSlice()
		var sb strings.Builder
		for i := 0; i < len(b); i += 4 {
			fmt.Fprintf(&sb, "%08X", binary.NativeEndian.Uint32(b[i:]))
		}
		return fmt.Sprintf("%s:%04X", sb.String(), ap.Port())
	}
	for _, s := range []string{"127.0.0.1:8080", "198.19.255.254:43210", "[2001:db8::1]:443", "[::ffff:198.19.255.254]:1"} {
		want := netip.MustParseAddrPort(s)
		got, err := parseHexAddrPort(enc(want))
		if err != nil || got != want {
			t.Errorf("%s: got %s, %v", s, got, err)
		}
	}
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 { // little-endian: check a literal kernel line
		got, err := parseHexAddrPort("0100007F:1F90")
		if err != nil || got != netip.MustParseAddrPort("127.0.0.1:8080") {
			t.Errorf("0100007F:1F90: got %s, %v", got, err)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007:1F90", "0100007F:XYZ", "0100007F0100007F:0050"} {
		if _, err := parseHexAddrPort(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/lib/tool"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/lib/tool/cli.js"), nil, 0o644))
	// An absolute link must resolve inside root, not on the host.
	must(os.Symlink("/usr/lib/tool/cli.js", filepath.Join(root, "usr/bin/tool")))
	must(os.Symlink("../lib/tool", filepath.Join(root, "usr/bin/tooldir")))
	must(os.Symlink("/../../../../usr/lib", filepath.Join(root, "escape")))
	must(os.Symlink("loop2", filepath.Join(root, "loop1")))
	must(os.Symlink("loop1", filepath.Join(root, "loop2")))
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(err)
	defer unix.Close(fd)
	for in, want := range map[string]string{
		"/usr/bin/tool":            "/usr/lib/tool/cli.js",
		"/usr/bin/tooldir/cli.js":  "/usr/lib/tool/cli.js",
		"/usr/bin/../../../../usr": "/usr",
		"/escape/tool/cli.js":      "/usr/lib/tool/cli.js",
	} {
		got, err := resolveInRoot(fd, in)
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := resolveInRoot(fd, "/loop1"); err == nil {
		t.Error("symlink loop resolved")
	}
	if _, err := resolveInRoot(fd, "/usr/bin/missing"); err == nil {
		t.Error("missing file resolved")
	}
	var st unix.Stat_t
	pfd, err := openRegular(fd, "/usr/lib/tool/cli.js", &st)
	must(err)
	f, err := reopen(pfd, "cli.js")
	must(err)
	var fst unix.Stat_t
	must(unix.Fstat(int(f.Fd()), &fst))
	if fst.Ino != st.Ino || fst.Dev != st.Dev {
		t.Error("reopen reached another file than the one openRegular checked")
	}
	f.Close()
	unix.Close(pfd)
	if _, err := openRegular(fd, "/usr/bin/tool", &st); err == nil {
		t.Error("openRegular followed a symlink")
	}
	if _, err := openRegular(fd, "/usr/lib", &st); err == nil {
		t.Error("openRegular opened a directory")
	}
}

// startTalking starts this test binary with env added, in a fresh
// directory, and returns it with a function that accepts its next
// connection and the line it sends first. Everything is closed and waited
// for when the test ends.
func startTalking(t *testing.T, env ...string) (*exec.Cmd, func() (net.Conn, string)) {
	t.Helper()
	exe, _ := os.Executable()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Dir = t.TempDir()
	cmd.Env = append(append(os.Environ(), addrEnv+"="+ln.Addr().String()), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		for _, c := range conns {
			c.Close()
		}
		cmd.Wait()
	})
	return cmd, func() (net.Conn, string) {
		t.Helper()
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			t.Fatalf("client did not connect: %v", err)
		}
		conns = append(conns, c)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return c, line
	}
}

// The init is never taken for the holder of a socket: no workload socket
// can reach its descriptor table, so a connection only it holds is no
// process's of the sandbox and is refused.
func TestIdentifyNeverTheInit(t *testing.T) {
	// The "init" here is itself the client.
	cmd, accept := startTalking(t, modeEnv+"=client")
	conn, _ := accept()
	r := &Resolver{InitPID: cmd.Process.Pid}
	if id, err := r.Identify(conn); !errors.Is(err, egress.ErrProcessExited) {
		t.Fatalf("Identify = %+v, %v; want no holder (ErrProcessExited)", id, err)
	}
}

// A process seen once, clean, that execs its own binary again with
// LD_PRELOAD keeps its pid, parent, start time and executable; its next
// connection is still judged on its new environment.
func TestIdentifyReexecWithPreload(t *testing.T) {
	exe, _ := os.Executable()
	cmd, accept := startTalking(t, modeEnv+"=init", targetEnv+"="+exe, reexecEnv+"=1")
	r := &Resolver{InitPID: cmd.Process.Pid}
	r.mountsOnce.Do(func() {})
	r.mounts = []mountPoint{{point: "/"}}
	first, pid := accept()
	if id, err := r.Identify(first); err != nil || id.Untrusted != "" {
		t.Fatalf("first connection: %+v, %v; want a clean identity", id, err)
	}
	fmt.Fprintln(first, "again")
	second, again := accept()
	if again != pid {
		t.Fatalf("the client came back as pid %s, not %s", again, pid)
	}
	id, err := r.Identify(second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(id.Untrusted, "started with LD_PRELOAD") {
		t.Fatalf("after exec with LD_PRELOAD: Untrusted %q", id.Untrusted)
	}
}

// TestIdentifyUntrusted: a process that maps code from a place the sandbox
// can write, or was started with LD_PRELOAD, is not the binary it names.
func TestIdentifyUntrusted(t *testing.T) {
	writable := canonical(t, t.TempDir())
	lib := filepath.Join(writable, "evil.so")
	if err := os.WriteFile(lib, make([]byte, 4096), 0o755); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	for _, tc := range []struct {
		name, env, want string
	}{
		{"clean", "", ""},
		{"library from a writable place", mapEnv + "=" + lib, "maps executable code from " + lib},
		{"memfd", mapEnv + "=memfd", "runs code from a memfd"},
		{"LD_PRELOAD", "LD_PRELOAD=:", "started with LD_PRELOAD"},
		{"LD_AUDIT", "LD_AUDIT=:", "started with LD_AUDIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv(strings.SplitN(tc.env, "=", 2)[0], strings.SplitN(tc.env, "=", 2)[1])
			}
			s := start(t, exe, writable)
			r := &Resolver{InitPID: s.init.Process.Pid}
			// The host's own root is writable; here only the test's
			// directory plays a place the sandbox can write.
			r.mountsOnce.Do(func() {})
			r.mounts = []mountPoint{{point: "/"}, {point: writable, writable: true}}
			id, err := r.Identify(s.conn)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" && id.Untrusted != "" || !strings.Contains(id.Untrusted, tc.want) {
				t.Fatalf("Untrusted %q, want %q", id.Untrusted, tc.want)
			}
		})
	}
}

// The descriptor hint is only a first guess: a hint naming another
// descriptor, or one of a process that holds nothing, never yields a
// holder, and the descriptor really holding the socket becomes the hint.
func TestHolderFDHint(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	open := true
	defer func() {
		if open {
			unix.Close(fds[1])
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(fds[1], &st); err != nil {
		t.Fatal(err)
	}
	target := "socket:[" + strconv.FormatUint(st.Ino, 10) + "]"
	pid := os.Getpid()
	r := &Resolver{fdHints: map[int]int{pid: fds[0]}}
	if fd := r.holderFD(pid, target); fd != fds[1] {
		t.Fatalf("holderFD with a wrong hint = %d, want %d", fd, fds[1])
	}
	if r.fdHints[pid] != fds[1] {
		t.Errorf("hint is %d after finding %d", r.fdHints[pid], fds[1])
	}
	if fd := r.holderFD(pid, target); fd != fds[1] {
		t.Errorf("holderFD with the right hint = %d, want %d", fd, fds[1])
	}
	unix.Close(fds[1])
	open = false
	if fd := r.holderFD(pid, target); fd >= 0 {
		t.Errorf("holderFD found closed socket %s in descriptor %d", target, fd)
	}
}
