package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// control says when an attack is also run directly on the host as the
// workload's uid, where it must succeed: that proves the attack is real and
// that it is the sandbox, not plain file permissions, that stops it.
type control int

const (
	noControl control = iota
	controlAlways
	controlRootless // only where the host uid can reach the target
)

type escape struct {
	name      string
	args      []string // attack subcommand and arguments, {VARS} expanded
	policy    string
	flags     []string
	wantErrno string // errno that must appear in the BLOCKED line
	// wantCode, when set, is the exit status instead of "refused" (3): the
	// workload was killed or ran out of time.
	wantCode int
	// through marks an attack that must succeed here: the counterpart of a
	// blocked one, showing which part of the sandbox did the blocking.
	through  bool
	setup    func(t *testing.T, fx *fixture)
	check    func(t *testing.T, fx *fixture, r *result)
	control  control
	rootOnly bool
}

var uniq = strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)

// hostVictim creates a host file that anyone may write (0666 in a 0755
// directory), so only the sandbox stands between the workload and it.
func hostVictim(t *testing.T, fx *fixture) {
	t.Helper()
	dir := newDir(t, fx.m, "victim-")
	p := filepath.Join(dir, "victim.txt")
	if err := os.WriteFile(p, []byte("original\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	fx.vars["VICTIM"] = p
}

func victimUnchanged(t *testing.T, fx *fixture, r *result) {
	t.Helper()
	b, err := os.ReadFile(fx.vars["VICTIM"])
	if err != nil || string(b) != "original\n" {
		t.Fatalf("host file %s was changed from inside the sandbox: %q, %v\n%s", fx.vars["VICTIM"], b, err, r)
	}
}

func hostPathAbsent(key string) func(t *testing.T, fx *fixture, r *result) {
	return func(t *testing.T, fx *fixture, r *result) {
		t.Helper()
		p := fx.vars[key]
		if _, err := os.Lstat(p); err == nil {
			os.Remove(p)
			t.Fatalf("host path %s was created from inside the sandbox\n%s", p, r)
		}
	}
}

// hostName names a host path (unique per mode) that an attack tries to
// create; it is removed afterwards should the attack ever succeed.
func hostName(prefix string) func(t *testing.T, fx *fixture) {
	return func(t *testing.T, fx *fixture) {
		name := prefix + "-" + fx.m.name
		fx.vars["HOSTFILE"] = name
		t.Cleanup(func() { os.Remove(name) })
	}
}

var escapes = []escape{
	// ---- files ----
	{name: "read-shadow", args: []string{"read", "/etc/shadow"}},
	{name: "read-home-secret", args: []string{"read", "{SECRET}"}, wantErrno: "ENOENT", control: controlRootless,
		setup: func(t *testing.T, fx *fixture) {
			// The host's real $HOME for root mode; for rootless, the HOME
			// corral itself runs with (readable by the workload's uid).
			home, _ := os.UserHomeDir()
			if fx.m.rootless {
				home = fx.m.home
			}
			p := filepath.Join(home, ".corral-e2e-secret-"+uniq+"-"+fx.m.name)
			if err := os.WriteFile(p, []byte("TOP SECRET\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(p) })
			fx.vars["SECRET"] = p
		}},
	{name: "write-etc", args: []string{"write", "{HOSTFILE}"}, setup: hostName("/etc/corral-e2e-" + uniq),
		check: hostPathAbsent("HOSTFILE")},
	{name: "write-usr", args: []string{"write", "{HOSTFILE}"}, setup: hostName("/usr/corral-e2e-" + uniq),
		check: hostPathAbsent("HOSTFILE")},
	{name: "write-passwd", args: []string{"write", "/etc/passwd"}},
	{name: "write-root-dir", args: []string{"write", "{HOSTFILE}"}, setup: hostName("/corral-e2e-" + uniq),
		check: hostPathAbsent("HOSTFILE")},
	// /tmp is private: the write succeeds inside and must not reach the host.
	{name: "write-tmp-private", args: []string{"write", "{HOSTFILE}"}, through: true,
		setup: hostName("/tmp/corral-e2e-" + uniq), check: hostPathAbsent("HOSTFILE")},
	{name: "write-proc-self-root", args: []string{"write", "/proc/self/root{HOSTFILE}"},
		setup: hostName("/etc/corral-e2e-self-root-" + uniq), check: hostPathAbsent("HOSTFILE")},
	{name: "write-proc-init-root", args: []string{"write", "/proc/1/root{HOSTFILE}"},
		setup: hostName("/etc/corral-e2e-init-root-" + uniq), check: hostPathAbsent("HOSTFILE")},
	{name: "write-proc-hostpid-root", args: []string{"write", "/proc/{HOSTPID}/root{VICTIM}"}, wantErrno: "ENOENT",
		setup: hostVictim, check: victimUnchanged},
	{name: "write-host-planted-symlink", args: []string{"write", "{W}/victim-link"}, control: controlAlways,
		setup: func(t *testing.T, fx *fixture) {
			hostVictim(t, fx)
			if err := os.Symlink(fx.vars["VICTIM"], filepath.Join(fx.W, "victim-link")); err != nil {
				t.Fatal(err)
			}
		},
		check: victimUnchanged},
	{name: "write-self-planted-symlink", args: []string{"symlink-write", "{VICTIM}", "{W}/my-link"}, setup: hostVictim,
		check: victimUnchanged},
	{name: "write-proc-sys-hostname", args: []string{"write", "/proc/sys/kernel/hostname", "pwned"},
		check: func(t *testing.T, fx *fixture, r *result) {
			if h, _ := os.Hostname(); h == "pwned" {
				t.Fatalf("host hostname changed\n%s", r)
			}
		}},
	// "h" only prints the SysRq help, should the write ever get through.
	{name: "write-sysrq-trigger", args: []string{"write", "/proc/sysrq-trigger", "h"}},
	{name: "read-kcore", args: []string{"read", "/proc/kcore"}},
	{name: "open-block-device", args: []string{"blockdev"}},
	{name: "mknod", args: []string{"mknod"}, wantErrno: "EPERM"},
	// The built-in policy: proxy mode (the init holds the seccomp
	// listener) with a pids limit (as root, the init holds pids.max).
	{name: "inherited-descriptors", args: []string{"descriptors"}},

	// ---- processes ----
	{name: "see-host-processes", args: []string{"procs"},
		check: func(t *testing.T, fx *fixture, r *result) {
			m := regexp.MustCompile(`PIDS: (.*)`).FindStringSubmatch(r.stdout)
			if m == nil || len(strings.Fields(m[1])) > 4 {
				t.Fatalf("want only the sandbox's own few processes in /proc\n%s", r)
			}
		}},
	{name: "kill-host-and-supervisor", args: []string{"kill", "HOSTPID", "SUPPID"}, wantErrno: "ESRCH",
		check: func(t *testing.T, fx *fixture, r *result) {
			for _, v := range []string{"HOSTPID", "SUPPID"} {
				if !strings.Contains(r.stdout, "kill("+v+"): ESRCH") {
					t.Fatalf("kill(%s) must fail with ESRCH\n%s", v, r)
				}
			}
		}},
	{name: "kill-everything", args: []string{"kill-all"}, wantErrno: "ESRCH",
		setup: func(t *testing.T, fx *fixture) {
			// A host process of the workload's own uid: kill(-1) would
			// reach it if the pid namespace leaked.
			c := exec.Command("/bin/sleep", "300")
			c.SysProcAttr = &syscall.SysProcAttr{}
			if os.Geteuid() == 0 {
				c.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(fx.m.uid), Gid: uint32(fx.m.gid), Groups: []uint32{}}
			}
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = c.Wait(); close(done) }()
			t.Cleanup(func() { _ = c.Process.Kill(); <-done })
			fx.check = func(t *testing.T, r *result) {
				select {
				case <-done:
					t.Fatalf("a host process of uid %d was killed from inside the sandbox\n%s", fx.m.uid, r)
				case <-time.After(200 * time.Millisecond):
				}
			}
		}},
	{name: "ptrace-supervisor", args: []string{"ptrace", "SUPPID"}, wantErrno: "ESRCH|EPERM"},
	{name: "ptrace-host-process", args: []string{"ptrace", "HOSTPID"}, wantErrno: "ESRCH|EPERM"},
	{name: "ptrace-init", args: []string{"ptrace", "1"}, wantErrno: "EPERM"},
	// With ptrace allowed by the profile, the init (the workload's own uid
	// when rootless) is still out of reach: it is not dumpable.
	{name: "ptrace-init-relaxed-seccomp", args: []string{"ptrace", "1"}, wantErrno: "EPERM",
		policy: "version: 1\nseccomp: relaxed\n"},
	// Landlock's signal scope (ABI >= 6) keeps signals inside the domain:
	// the sandbox's init, outside it, cannot be signalled.
	{name: "signal-init", args: []string{"kill", "INITPID"}, flags: []string{"--env", "INITPID=1"}, wantErrno: "EPERM"},
	// The workload is forked by the init from its main thread: no thread
	// of the init takes a signal or a pidfd from it, in either profile.
	{name: "signal-init-threads", args: []string{"signal-init-all"}, wantErrno: "EPERM"},
	{name: "signal-init-threads-relaxed", args: []string{"signal-init-all"}, wantErrno: "EPERM",
		policy: "version: 1\nseccomp: relaxed\n"},
	// With the host's network namespace shared, its abstract UNIX sockets
	// are one connect() away; Landlock's scope (ABI >= 6) refuses them.
	{name: "host-abstract-socket", args: []string{"abstract-connect", "{ABSTRACT}"},
		policy: "version: 1\nnetwork: {mode: allow}\n", wantErrno: "EPERM",
		setup: func(t *testing.T, fx *fixture) {
			name := fmt.Sprintf("corral-e2e-%s-%s-%d", uniq, fx.m.name, time.Now().UnixNano())
			l, err := net.Listen("unix", "@"+name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			fx.vars["ABSTRACT"] = name
		}},
	{name: "ptrace-sibling", args: []string{"ptrace-sibling"}, wantErrno: "EPERM", control: controlAlways},
	{name: "pidfd-getfd-sibling", args: []string{"pidfd-getfd-sibling"}, wantErrno: "EPERM", control: controlAlways},
	{name: "proc-mem-sibling", args: []string{"proc-mem-sibling"}, wantErrno: "EROFS", control: controlAlways},
	// Under the relaxed profile the same attach goes through: the EPERM
	// above comes from the seccomp filter, not from something else.
	{name: "ptrace-sibling-relaxed-seccomp", args: []string{"ptrace-sibling"}, policy: "version: 1\nseccomp: relaxed\n",
		through: true},
	{name: "zombie-reaped", args: []string{"zombie"}},

	// ---- mounts and namespaces ----
	{name: "mount", args: []string{"mount"}, wantErrno: "EPERM"},
	{name: "umount", args: []string{"umount"}, wantErrno: "EPERM"},
	{name: "pivot-root", args: []string{"pivot-root"}, wantErrno: "EPERM"},
	{name: "chroot", args: []string{"chroot"}, wantErrno: "EPERM"},
	{name: "open-tree", args: []string{"open-tree"}, wantErrno: "EPERM"},
	{name: "fsopen", args: []string{"fsopen"}, wantErrno: "EPERM"},
	{name: "unshare-user", args: []string{"unshare-user"}, wantErrno: "EPERM", control: controlAlways},
	{name: "unshare-mount", args: []string{"unshare-ns"}, wantErrno: "EPERM"},
	{name: "clone-newns", args: []string{"clone-newns"}, wantErrno: "EPERM"},
	{name: "clone-newuser", args: []string{"clone-newuser"}, wantErrno: "EPERM", control: controlAlways},
	{name: "clone3-newuser", args: []string{"clone3"}, wantErrno: "ENOSYS", control: controlAlways},
	{name: "setns", args: []string{"setns"}, wantErrno: "EPERM"},

	// ---- kernel interfaces ----
	{name: "kexec-load", args: []string{"kexec-load"}, wantErrno: "EPERM"},
	{name: "init-module", args: []string{"init-module"}, wantErrno: "EPERM"},
	{name: "finit-module", args: []string{"finit-module"}, wantErrno: "EPERM"},
	{name: "bpf", args: []string{"bpf"}, wantErrno: "EPERM"},
	{name: "perf-event-open", args: []string{"perf-event-open"}, wantErrno: "EPERM", control: controlAlways},
	{name: "userfaultfd", args: []string{"userfaultfd"}, wantErrno: "EPERM", control: controlAlways},
	{name: "keyctl", args: []string{"keyctl"}, wantErrno: "EPERM", control: controlAlways},
	{name: "add-key", args: []string{"add-key"}, wantErrno: "EPERM", control: controlAlways},
	{name: "io-uring-setup", args: []string{"io-uring-setup"}, wantErrno: "EPERM", control: controlAlways},

	// ---- sockets (the default policy's network mode is block) ----
	{name: "socket-netlink", args: []string{"socket-netlink"}, wantErrno: "EPERM", control: controlAlways},
	{name: "socket-netlink-high-bits", args: []string{"socket-netlink-hi"}, wantErrno: "EPERM", control: controlAlways},
	{name: "socket-packet", args: []string{"socket-packet"}, wantErrno: "EPERM"},
	{name: "socket-vsock", args: []string{"socket-vsock"}, wantErrno: "EPERM"},
	{name: "socket-bluetooth", args: []string{"socket-bluetooth"}, wantErrno: "EPERM"},
	// In block mode inet sockets are refused outright; in proxy mode (the
	// default) they are allowed and every connection is captured.
	{name: "socket-inet", args: []string{"socket-inet"}, policy: systemPolicy(""), wantErrno: "EPERM", control: controlAlways},
	{name: "socket-inet6", args: []string{"socket-inet6"}, policy: systemPolicy(""), wantErrno: "EPERM", control: controlAlways},

	// ---- privileges ----
	{name: "setuid-0", args: []string{"setuid"}},
	{name: "setresuid-0", args: []string{"setresuid"}},
	{name: "setgid-0", args: []string{"setgid"}},
	{name: "setuid-root-binary", args: []string{"setuid-exec", "{W}/suid-attack"}, rootOnly: true,
		setup: func(t *testing.T, fx *fixture) {
			p := filepath.Join(fx.W, "suid-attack")
			copyFile(t, attackBin, p, 0o755)
			if err := os.Chown(p, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, os.ModeSetuid|0o755); err != nil {
				t.Fatal(err)
			}
			// The planted binary really is setuid root outside.
			code, out := runOnHost(t, fx.m.uid, fx.m.gid, fx.W, "setuid-exec", p)
			if code != 0 || !strings.Contains(out, "euid=0") {
				requireFeature(t, "the setuid control does not gain euid 0 on this host: "+out)
			}
		},
		check: func(t *testing.T, fx *fixture, r *result) {
			if !strings.Contains(r.stdout, "NoNewPrivs=1") {
				t.Fatalf("want NoNewPrivs=1 inside\n%s", r)
			}
			if !regexp.MustCompile(fmt.Sprintf(`euid=%d\b`, fx.m.uid)).MatchString(r.stdout) {
				t.Fatalf("the setuid binary must keep the workload's euid %d\n%s", fx.m.uid, r)
			}
		}},
	{name: "host-setuid-binary", args: []string{"su-probe", "{SUID}", "root", "-c", "true"}, rootOnly: true,
		setup: func(t *testing.T, fx *fixture) {
			suid := hostSetuidBinary()
			if suid == "" {
				requireFeature(t, "no setuid-root su or passwd in /usr/bin")
			}
			fx.vars["SUID"] = suid
			code, out := runOnHost(t, fx.m.uid, fx.m.gid, fx.W, "su-probe", suid, "root", "-c", "true")
			if code != 0 {
				t.Fatalf("control: %s does not run with euid 0 on the host: %s", suid, out)
			}
		},
		check: func(t *testing.T, fx *fixture, r *result) {
			if !strings.Contains(r.stdout, "NoNewPrivs=1") {
				t.Fatalf("want NoNewPrivs=1 inside\n%s", r)
			}
			// The probe must have seen the binary running, with the
			// workload's euid, not merely failed to start it.
			if !regexp.MustCompile(fmt.Sprintf(`Uid: \d+\s+%d\b`, fx.m.uid)).MatchString(r.stdout) {
				t.Fatalf("want the setuid binary observed running with euid %d\n%s", fx.m.uid, r)
			}
		}},

	// ---- seccomp kills ----
	{name: "iopl-sigsys", args: []string{"iopl"}, wantCode: 128 + int(syscall.SIGSYS),
		check: func(t *testing.T, fx *fixture, r *result) {
			if reportLine(r.stdout) != "" {
				t.Fatalf("iopl returned instead of killing the process\n%s", r)
			}
			r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "seccomp", "signal": "SIGSYS"})
		}},

	// ---- walltime ----
	{name: "walltime", args: []string{"sleep", "60"}, flags: []string{"--timeout", "5s"}, wantCode: 124,
		check: func(t *testing.T, fx *fixture, r *result) {
			if r.elapsed < 5*time.Second || r.elapsed > 10*time.Second {
				t.Fatalf("walltime 5s ended the run after %v, want 5-10 s\n%s", r.elapsed, r)
			}
			r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "walltime_exceeded"})
		}},
	// The walltime counts from corral's start: under a loaded CI machine
	// set-up alone can take a second or two, and a SIGTERM that lands
	// before the workload traps it ends the test's premise.
	{name: "walltime-sigterm-trapped", args: []string{"trap-term"}, flags: []string{"--timeout", "4s"}, wantCode: 124,
		check: func(t *testing.T, fx *fixture, r *result) {
			if !strings.Contains(r.stdout, "caught SIGTERM") {
				t.Fatalf("the workload never saw the walltime's SIGTERM\n%s", r)
			}
			// 4 s walltime + 5 s grace before SIGKILL.
			if r.elapsed < 8500*time.Millisecond || r.elapsed > 16*time.Second {
				t.Fatalf("a SIGTERM-trapping workload ended after %v, want SIGKILL about 5 s after the 4 s walltime\n%s", r.elapsed, r)
			}
			r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "walltime_exceeded"})
		}},
}

// hostSetuidBinary finds a setuid-root program that waits for a password.
func hostSetuidBinary() string {
	for _, p := range []string{"/usr/bin/su", "/bin/su", "/usr/bin/passwd"} {
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid == 0 && st.Mode()&os.ModeSetuid != 0 {
			return p
		}
	}
	return ""
}

func TestEscapes(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, e := range escapes {
			t.Run(e.name, func(t *testing.T) {
				t.Parallel()
				runEscape(t, m, e)
			})
		}
	})
}

func runEscape(t *testing.T, m *mode, e escape) {
	if e.rootOnly {
		requireRoot(t)
	}
	fx := newFixture(t, m)
	if e.setup != nil {
		e.setup(t, fx)
	}
	args := fx.expand(append([]string{fx.attack}, e.args...))
	r := runCorral(t, fx, runOpts{args: args, policy: e.policy, flags: e.flags})
	switch {
	case e.through:
		if r.code != 0 || !strings.HasPrefix(reportLine(r.stdout), "ESCAPED:") {
			t.Fatalf("want this attempt to go through here\n%s", r)
		}
	case e.wantCode != 0:
		if r.code != e.wantCode {
			t.Fatalf("want exit %d\n%s", e.wantCode, r)
		}
	default:
		requireBlocked(t, r, e.wantErrno)
	}
	if e.check != nil {
		e.check(t, fx, r)
	}
	if fx.check != nil {
		fx.check(t, r)
	}
	if e.control == controlAlways || (e.control == controlRootless && m.rootless) {
		code, out := runOnHost(t, m.uid, m.gid, fx.W, fx.expand(e.args)...)
		if code != 0 || !strings.HasPrefix(reportLine(out), "ESCAPED:") {
			t.Fatalf("control: outside the sandbox, as uid %d, this attack should succeed but got exit %d:\n%s", m.uid, code, out)
		}
	}
}

// TestPlantedSymlinkAcrossRuns: a first run plants W/data pointing at a host
// directory; a second run whose policy mounts W/data must not follow it.
func TestPlantedSymlinkAcrossRuns(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		secretDir := newDir(t, m, "hostsecret-")
		secret := filepath.Join(secretDir, "id_ed25519")
		if err := os.WriteFile(secret, []byte("PRIVATE KEY\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(fx.W, "data")
		r := runCorral(t, fx, runOpts{args: []string{fx.attack, "plant", secretDir, data}})
		if r.code != 0 || !strings.Contains(r.stdout, "PLANTED") {
			t.Fatalf("run 1 could not plant the symlink\n%s", r)
		}
		if target, err := os.Readlink(data); err != nil || target != secretDir {
			t.Fatalf("run 1 left no symlink on the host: %q %v", target, err)
		}
		pol := fmt.Sprintf("version: 1\nfilesystem_policy:\n  read_only: [%s]\nnetwork:\n  mode: block\n", data)
		r = runCorral(t, fx, runOpts{args: []string{fx.attack, "read", filepath.Join(data, "id_ed25519")}, policy: pol})
		requireBlocked(t, r, "")
		if !strings.Contains(r.stderr, "symlink") {
			t.Fatalf("corral did not warn that it refused to follow the planted symlink\n%s", r)
		}
	})
}

// TestTIOCSTI pushes a byte into the terminal's input queue: a workload
// that could do this on the user's terminal could type commands into the
// user's shell after it exits.
func TestTIOCSTI(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		r := runCorral(t, fx, runOpts{args: []string{fx.attack, "tiocsti"}, pty: true})
		requireBlocked(t, r, "EPERM")
		if b, err := os.ReadFile("/proc/sys/dev/tty/legacy_tiocsti"); err == nil && strings.TrimSpace(string(b)) == "0" {
			return // no control: the kernel refuses TIOCSTI to everyone
		}
		cmd := exec.Command(attackBin, "tiocsti")
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(m.uid), Gid: uint32(m.gid), Groups: []uint32{}}}
		}
		ptm, err := pty.Start(cmd)
		if err != nil {
			t.Fatal(err)
		}
		defer ptm.Close()
		out := &syncBuffer{}
		go func() { _, _ = out.ReadFromPty(ptm) }()
		_ = cmd.Wait()
		time.Sleep(100 * time.Millisecond)
		if !strings.Contains(out.String(), "ESCAPED") {
			t.Fatalf("control: TIOCSTI on a terminal outside the sandbox should work: %s", out)
		}
	})
}

// ReadFromPty copies until the pty reports EOF (EIO).
func (s *syncBuffer) ReadFromPty(f *os.File) (int64, error) {
	buf := make([]byte, 4096)
	var n int64
	for {
		k, err := f.Read(buf)
		if k > 0 {
			_, _ = s.Write(buf[:k])
			n += int64(k)
		}
		if err != nil {
			return n, err
		}
	}
}
