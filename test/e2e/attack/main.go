// Command attack is the payload of corral's escape suite: each subcommand
// tries one way out of the sandbox. It prints "ESCAPED: <detail>" and exits 0
// when the attack worked, and "BLOCKED: <errno/detail>" with exit 3 when the
// system refused it, so the test can tell a refusal from a crash (exit 2).
//
// It is built static (CGO_ENABLED=0) so that it runs inside a sandbox that
// mounts no system libraries at all.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	exitEscaped = 0
	exitUsage   = 2
	exitBlocked = 3
)

func escaped(format string, args ...any) int {
	fmt.Printf("ESCAPED: "+format+"\n", args...)
	return exitEscaped
}

func blocked(format string, args ...any) int {
	fmt.Printf("BLOCKED: "+format+"\n", args...)
	return exitBlocked
}

// errno names the error the way the tests match it (EPERM, ENOENT, ...).
func errno(err error) string {
	var en unix.Errno
	if errors.As(err, &en) {
		if name := unix.ErrnoName(en); name != "" {
			return name
		}
		return fmt.Sprintf("errno %d", int(en))
	}
	return err.Error()
}

// verdict turns the result of one attempt into the process outcome.
func verdict(what string, err error) int {
	if err != nil {
		return blocked("%s: %s", what, errno(err))
	}
	return escaped("%s succeeded", what)
}

type attackFunc func(args []string) int

// attacks is filled by init functions: this file's and those of the files
// beside it that add a class of attacks (each registers its own names).
var attacks = map[string]attackFunc{}

func init() {
	for name, f := range map[string]attackFunc{
		// Helpers that are not attacks but let the test drive the sandbox.
		"exit":        cmdExit,
		"raise":       cmdRaise,
		"sleep":       cmdSleep,
		"env":         cmdEnv,
		"https-get":   cmdHTTPSGet,
		"hostname":    cmdHostname,
		"whoami":      cmdWhoami,
		"plant":       cmdPlant,
		"trap-term":   cmdTrapTerm,
		"term-exit":   cmdTermExit,
		"zombie-half": cmdZombieHalf,

		// Files.
		"read":          cmdRead,
		"write":         cmdWrite,
		"symlink-write": cmdSymlinkWrite,
		"blockdev":      cmdBlockdev,
		"mknod":         cmdMknod,

		// Processes.
		"procs":            cmdProcs,
		"kill":             cmdKill,
		"kill-all":         cmdKillAll,
		"signal-init-all":  cmdSignalInitAll,
		"abstract-connect": cmdAbstractConnect,
		"ptrace":           cmdPtrace,
		"ptrace-sibling":   cmdPtraceSibling,
		"zombie":           cmdZombie,
		"fork-bomb":        cmdForkBomb,
		"descriptors":      cmdDescriptors,
		"alloc":            cmdAlloc,

		// Privileges.
		"setuid":      func([]string) int { return verdict("setuid(0)", rawErr(unix.SYS_SETUID, 0, 0, 0)) },
		"setresuid":   func([]string) int { return verdict("setresuid(0,0,0)", rawErr(unix.SYS_SETRESUID, 0, 0, 0)) },
		"setgid":      func([]string) int { return verdict("setgid(0)", rawErr(unix.SYS_SETGID, 0, 0, 0)) },
		"setuid-exec": cmdSetuidExec,
		"su-probe":    cmdSuProbe,
		"tiocsti":     cmdTIOCSTI,
		"iopl":        cmdIopl,

		// Mounts and namespaces.
		"mount":      func([]string) int { return verdict("mount tmpfs on /tmp", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "")) },
		"umount":     func([]string) int { return verdict("umount2 /proc", unix.Unmount("/proc", unix.MNT_DETACH)) },
		"pivot-root": func([]string) int { return verdict("pivot_root(/tmp, /tmp)", unix.PivotRoot("/tmp", "/tmp")) },
		"chroot":     func([]string) int { return verdict("chroot(/tmp)", unix.Chroot("/tmp")) },
		"open-tree":  cmdOpenTree,
		"fsopen":     cmdFsopen,
		"unshare-user": func([]string) int {
			return childWith(&syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWUSER}, "unshare(CLONE_NEWUSER)")
		},
		"unshare-ns": func([]string) int {
			return childWith(&syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS}, "unshare(CLONE_NEWNS)")
		},
		"clone-newns": func([]string) int {
			return childWith(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}, "clone(CLONE_NEWNS)")
		},
		"clone-newuser": func([]string) int {
			return childWith(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}, "clone(CLONE_NEWUSER)")
		},
		"clone3": cmdClone3,
		"setns":  cmdSetns,

		// Kernel interfaces.
		"kexec-load":      func([]string) int { return verdict("kexec_load", rawErr(unix.SYS_KEXEC_LOAD, 0, 0, 0)) },
		"init-module":     func([]string) int { return verdict("init_module", unix.InitModule([]byte{0}, "")) },
		"finit-module":    cmdFinitModule,
		"bpf":             cmdBPF,
		"perf-event-open": cmdPerfEventOpen,
		"userfaultfd":     cmdUserfaultfd,
		"keyctl":          cmdKeyctl,
		"add-key":         cmdAddKey,
		"io-uring-setup":  cmdIoUringSetup,

		// Sockets.
		"socket-netlink": func([]string) int {
			return socketAttack("AF_NETLINK", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
		},
		"socket-packet":    func([]string) int { return socketAttack("AF_PACKET", unix.AF_PACKET, unix.SOCK_RAW, 0) },
		"socket-vsock":     func([]string) int { return socketAttack("AF_VSOCK", unix.AF_VSOCK, unix.SOCK_STREAM, 0) },
		"socket-bluetooth": func([]string) int { return socketAttack("AF_BLUETOOTH", unix.AF_BLUETOOTH, unix.SOCK_RAW, 0) },
		"socket-inet":      func([]string) int { return socketAttack("AF_INET", unix.AF_INET, unix.SOCK_STREAM, 0) },
		"socket-inet6":     func([]string) int { return socketAttack("AF_INET6", unix.AF_INET6, unix.SOCK_DGRAM, 0) },
		// The upper 32 bits of an int argument are ignored by the kernel; a
		// filter comparing all 64 would miss this spelling of AF_NETLINK.
		"socket-netlink-hi": func([]string) int {
			r, _, e := unix.RawSyscall(unix.SYS_SOCKET, 1<<32|unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
			if e != 0 {
				return blocked("socket(1<<32|AF_NETLINK): %s", errno(e))
			}
			unix.Close(int(r))
			return escaped("socket(1<<32|AF_NETLINK) succeeded")
		},
	} {
		attacks[name] = f
	}
}

func main() {
	// ptrace and the capability state are per thread.
	runtime.LockOSThread()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: attack NAME [ARGS...]")
		os.Exit(exitUsage)
	}
	f, ok := attacks[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "attack: unknown attack %q\n", os.Args[1])
		os.Exit(exitUsage)
	}
	os.Exit(f(os.Args[2:]))
}

func rawErr(nr uintptr, a1, a2, a3 uintptr) error {
	if _, _, e := unix.RawSyscall(nr, a1, a2, a3); e != 0 {
		return e
	}
	return nil
}

func need(args []string, n int, usage string) {
	if len(args) < n {
		fmt.Fprintln(os.Stderr, "usage: attack "+usage)
		os.Exit(exitUsage)
	}
}

func envPid(name string) int {
	pid, err := strconv.Atoi(os.Getenv(name))
	if err != nil || pid <= 0 {
		fmt.Fprintf(os.Stderr, "attack: $%s is not a pid\n", name)
		os.Exit(exitUsage)
	}
	return pid
}

// ---- helpers ----

func cmdExit(args []string) int {
	need(args, 1, "exit CODE")
	n, _ := strconv.Atoi(args[0])
	return n
}

func cmdRaise(args []string) int {
	need(args, 1, "raise SIGNUM")
	n, _ := strconv.Atoi(args[0])
	// The Go runtime ignores or catches most signals; put back the kernel's
	// default action so the signal really terminates the process.
	var act struct {
		handler, flags, restorer, mask uint64
	}
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(n), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
		fmt.Fprintln(os.Stderr, "rt_sigaction:", e)
		return exitUsage
	}
	_ = unix.Kill(os.Getpid(), unix.Signal(n))
	time.Sleep(5 * time.Second)
	return exitUsage
}

func cmdSleep(args []string) int {
	need(args, 1, "sleep SECONDS")
	d, _ := strconv.ParseFloat(args[0], 64)
	time.Sleep(time.Duration(d * float64(time.Second)))
	return 0
}

func cmdEnv([]string) int {
	for _, kv := range os.Environ() {
		fmt.Println(kv)
	}
	return 0
}

// cmdHTTPSGet fetches a URL with Go's default client, which trusts what
// SSL_CERT_FILE names (else the system bundle): the check that a Go tool in
// the sandbox accepts the certificates corral's inspection presents.
func cmdHTTPSGet(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: https-get URL")
		return exitUsage
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(args[0])
	if err != nil {
		fmt.Println("GOERR", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Println("GOSTATUS", resp.StatusCode, resp.Proto, string(body))
	return 0
}

func cmdHostname([]string) int {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitUsage
	}
	fmt.Println(unix.ByteSliceToString(u.Nodename[:]))
	return 0
}

func cmdWhoami([]string) int {
	r, e, s := unix.Getresuid()
	fmt.Printf("uid=%d euid=%d suid=%d\n", r, e, s)
	return 0
}

func cmdPlant(args []string) int {
	need(args, 2, "plant TARGET LINK")
	if err := os.Symlink(args[0], args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitUsage
	}
	fmt.Printf("PLANTED: %s -> %s\n", args[1], args[0])
	return 0
}

// cmdTrapTerm ignores SIGTERM, so only the walltime's SIGKILL can end it.
func cmdTrapTerm([]string) int {
	c := make(chan os.Signal, 4)
	signal.Notify(c, unix.SIGTERM)
	fmt.Println("READY")
	deadline := time.After(120 * time.Second)
	for {
		select {
		case <-c:
			fmt.Println("caught SIGTERM, ignoring it")
		case <-deadline:
			return 0
		}
	}
}

// cmdTermExit exits with CODE when SIGTERM arrives.
func cmdTermExit(args []string) int {
	need(args, 1, "term-exit CODE")
	code, _ := strconv.Atoi(args[0])
	c := make(chan os.Signal, 1)
	signal.Notify(c, unix.SIGTERM)
	fmt.Println("READY")
	select {
	case <-c:
		fmt.Println("caught SIGTERM")
		return code
	case <-time.After(60 * time.Second):
		fmt.Println("no SIGTERM arrived")
		return exitUsage
	}
}

// ---- files ----

func cmdRead(args []string) int {
	need(args, 1, "read PATH")
	b, err := os.ReadFile(args[0])
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return blocked("read %s: %s", args[0], errno(err))
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return escaped("read %s: %q", args[0], b)
}

func cmdWrite(args []string) int {
	need(args, 1, "write PATH [CONTENT]")
	content := "corral-e2e-pwned\n"
	if len(args) > 1 {
		content = args[1]
	}
	// No O_NOFOLLOW: following a planted symlink is the point.
	fd, err := unix.Open(args[0], unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return blocked("open %s for writing: %s", args[0], errno(err))
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(content)); err != nil {
		return blocked("write %s: %s", args[0], errno(err))
	}
	return escaped("wrote %s", args[0])
}

func cmdSymlinkWrite(args []string) int {
	need(args, 2, "symlink-write TARGET LINK")
	if err := os.Symlink(args[0], args[1]); err != nil {
		return blocked("symlink: %v", err)
	}
	return cmdWrite(args[1:2])
}

// cmdBlockdev looks for any way to reach a raw disk: well-known names and
// any block device node at all under /dev.
func cmdBlockdev([]string) int {
	for _, p := range []string{"/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda", "/dev/loop0", "/dev/zram0", "/dev/dm-0", "/dev/mmcblk0"} {
		if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			unix.Close(fd)
			return escaped("opened %s", p)
		}
	}
	var found []string
	_ = filepath.WalkDir("/dev", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeDevice != 0 && d.Type()&os.ModeCharDevice == 0 {
			found = append(found, p)
		}
		return nil
	})
	if len(found) > 0 {
		return escaped("block devices visible: %v", found)
	}
	return blocked("no block device can be opened (ENOENT) and none exists under /dev")
}

func cmdMknod([]string) int {
	dir, _ := os.MkdirTemp("", "mknod")
	errC := unix.Mknod(filepath.Join(dir, "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1)))
	errB := unix.Mknod(filepath.Join(dir, "disk"), unix.S_IFBLK|0o666, int(unix.Mkdev(254, 0)))
	if errC == nil || errB == nil {
		return escaped("mknod: char=%v block=%v", errC, errB)
	}
	return blocked("mknod char: %s, block: %s", errno(errC), errno(errB))
}

// ---- processes ----

// cmdProcs lists what the sandbox's /proc shows. Host pids passed in by the
// test must be absent and only a handful of processes may be visible.
func cmdProcs([]string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return blocked("readdir /proc: %v", err)
	}
	var pids []int
	var names []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pids = append(pids, pid)
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		names = append(names, fmt.Sprintf("%d:%s", pid, strings.TrimSpace(string(comm))))
	}
	fmt.Printf("PIDS: %s\n", strings.Join(names, " "))
	for _, v := range []string{"HOSTPID", "SUPPID"} {
		if os.Getenv(v) == "" {
			continue
		}
		host := envPid(v)
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", host)); err == nil {
			return escaped("host process %s=%d is visible in /proc", v, host)
		}
	}
	if len(pids) > 8 {
		return escaped("%d processes visible in /proc", len(pids))
	}
	return blocked("only %d processes visible, no host pid", len(pids))
}

func cmdKill(args []string) int {
	need(args, 1, "kill ENVVAR...")
	var res []string
	for _, v := range args {
		pid := envPid(v)
		if err := unix.Kill(pid, unix.SIGTERM); err == nil {
			return escaped("kill(%s=%d, SIGTERM) delivered", v, pid)
		} else {
			res = append(res, fmt.Sprintf("kill(%s): %s", v, errno(err)))
		}
	}
	return blocked("%s", strings.Join(res, ", "))
}

// cmdSignalInitAll tries every way to signal the sandbox's init (pid 1)
// or any of its threads, and to get a pidfd for it: each must fail.
func cmdSignalInitAll([]string) int {
	tids := []int{1}
	if ents, err := os.ReadDir("/proc/1/task"); err == nil {
		tids = tids[:0]
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				tids = append(tids, n)
			}
		}
	} else {
		// Hidden, the init's threads are still among the lowest numbers
		// or were made since; try every tid up to ours and some beyond.
		for tid := 2; tid < os.Getpid()+64; tid++ {
			tids = append(tids, tid)
		}
	}
	// si_code SI_QUEUE (-1), as sigqueue(3) sends: a non-negative code
	// to another process is refused whatever the filter says.
	var info [128]byte
	info[8], info[9], info[10], info[11] = 0xff, 0xff, 0xff, 0xff
	var res []string
	try := func(what string, nr uintptr, a ...uintptr) bool {
		a = append(a, 0, 0, 0, 0, 0, 0)
		_, _, e := unix.RawSyscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		if e == 0 {
			return true
		}
		res = append(res, fmt.Sprintf("%s: %s", what, errno(e)))
		return false
	}
	for _, tid := range tids {
		// Our own threads are not the init's; a signal to one of them
		// proves nothing.
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err == nil {
			continue
		}
		if try(fmt.Sprintf("tgkill(1,%d)", tid), unix.SYS_TGKILL, 1, uintptr(tid), uintptr(unix.SIGTERM)) {
			return escaped("tgkill(1, %d, SIGTERM) delivered", tid)
		}

		// A tid nobody has fails with ESRCH, which is fine; besides our
		// own, every thread in this sandbox is the init's.
		if try(fmt.Sprintf("tkill(%d)", tid), unix.SYS_TKILL, uintptr(tid), uintptr(unix.SIGTERM)) {
			return escaped("tkill(%d, SIGTERM) reached the init", tid)
		}
	}
	if try("rt_sigqueueinfo(1)", unix.SYS_RT_SIGQUEUEINFO, 1, uintptr(unix.SIGTERM), uintptr(unsafe.Pointer(&info))) {
		return escaped("rt_sigqueueinfo(1, SIGTERM) delivered")
	}
	if try("rt_tgsigqueueinfo(1,1)", unix.SYS_RT_TGSIGQUEUEINFO, 1, 1, uintptr(unix.SIGTERM), uintptr(unsafe.Pointer(&info))) {
		return escaped("rt_tgsigqueueinfo(1, 1, SIGTERM) delivered")
	}
	if try("pidfd_open(1)", unix.SYS_PIDFD_OPEN, 1, 0) {
		return escaped("pidfd_open(1) succeeded")
	}
	// A /proc/PID directory is a pidfd too, for pidfd_send_signal.
	if fd, err := unix.Open("/proc/1", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		res = append(res, fmt.Sprintf("open(/proc/1): %s", errno(err)))
	} else {
		ok := try("pidfd_send_signal(/proc/1)", unix.SYS_PIDFD_SEND_SIGNAL, uintptr(fd), uintptr(unix.SIGTERM))
		unix.Close(fd)
		if ok {
			return escaped("pidfd_send_signal on /proc/1 delivered SIGTERM")
		}
	}
	return blocked("%s", strings.Join(res, ", "))
}

// cmdKillAll signals every process it may. Inside a pid namespace there is
// nothing but the namespace's init (which kill(-1) skips), so success means a
// process outside was reached.
func cmdKillAll([]string) int {
	return verdict("kill(-1, SIGTERM)", unix.Kill(-1, unix.SIGTERM))
}

// cmdAbstractConnect connects to an abstract UNIX socket by name: with the
// host's network namespace shared (network mode allow), the host's abstract
// sockets (X11, D-Bus, agents) are in reach unless Landlock scopes them.
func cmdAbstractConnect(args []string) int {
	need(args, 1, "abstract-connect NAME")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return blocked("socket: %s", errno(err))
	}
	defer unix.Close(fd)
	return verdict("connect(@"+args[0]+")", unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + args[0]}))
}

func cmdPtrace(args []string) int {
	need(args, 1, "ptrace ENVVAR|1")
	pid := 1
	if args[0] != "1" {
		pid = envPid(args[0])
	}
	if err := unix.PtraceAttach(pid); err != nil {
		return blocked("PTRACE_ATTACH %d: %s", pid, errno(err))
	}
	_ = unix.PtraceDetach(pid)
	return escaped("PTRACE_ATTACH %d succeeded", pid)
}

func cmdPtraceSibling([]string) int {
	child := exec.Command("/proc/self/exe", "sleep", "30")
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start child:", err)
		return exitUsage
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	pid := child.Process.Pid
	if err := unix.PtraceAttach(pid); err != nil {
		return blocked("PTRACE_ATTACH sibling %d: %s", pid, errno(err))
	}
	var ws unix.WaitStatus
	_, _ = unix.Wait4(pid, &ws, unix.WALL, nil)
	_ = unix.PtraceDetach(pid)
	return escaped("PTRACE_ATTACH sibling %d succeeded", pid)
}

// cmdDescriptors looks for descriptors the workload inherited beyond its
// stdio: the init holds the seccomp listener (with which the workload could
// answer its own connects) and the cgroup's pids.max (with which it could
// lift its pids limit) until it starts the workload. Raw system calls, so
// that the Go runtime opens nothing of its own meanwhile.
func cmdDescriptors([]string) int {
	dir, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return blocked("open /proc/self/fd: %s", errno(err))
	}
	defer unix.Close(dir)
	buf := make([]byte, 4096)
	var extra []string
	for {
		n, err := unix.Getdents(dir, buf)
		if err != nil {
			return blocked("getdents: %s", errno(err))
		}
		if n == 0 {
			break
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		for _, name := range names {
			fd, err := strconv.Atoi(name)
			if err != nil || fd <= 2 || fd == dir {
				continue
			}
			target, _ := os.Readlink("/proc/self/fd/" + name)
			extra = append(extra, name+" -> "+target)
		}
	}
	if len(extra) > 0 {
		return escaped("inherited descriptors %s", strings.Join(extra, ", "))
	}
	return blocked("only stdin, stdout and stderr were inherited")
}

// cmdZombie double-forks: the middle process exits at once, so its child is
// re-parented to the sandbox's init and exits there. The init must reap it.
func cmdZombie([]string) int {
	mid := exec.Command("/proc/self/exe", "zombie-half")
	out, err := mid.Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "zombie-half:", err)
		return exitUsage
	}
	orphan := strings.TrimSpace(string(out))
	fmt.Printf("orphan pid %s\n", orphan)
	// The orphan sleeps 0.2 s; give the init time to reap it.
	time.Sleep(1500 * time.Millisecond)
	var zombies []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The state follows the parenthesised comm, which may hold spaces.
		s := string(stat)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
			zombies = append(zombies, s[:i+1])
		}
	}
	if len(zombies) > 0 {
		return escaped("zombies left: %v", zombies)
	}
	if _, err := os.Stat("/proc/" + orphan); err == nil {
		return escaped("orphan %s still exists", orphan)
	}
	return blocked("orphan %s was reaped, no zombie", orphan)
}

func cmdZombieHalf([]string) int {
	c := exec.Command("/proc/self/exe", "sleep", "0.2")
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitUsage
	}
	fmt.Println(c.Process.Pid)
	return 0 // without waiting: the child becomes an orphan
}

// cmdForkBomb forks sleepers until the kernel refuses. A pids limit must
// stop it well before MAX; reaching MAX means there is no limit.
func cmdForkBomb(args []string) int {
	need(args, 1, "fork-bomb MAX")
	max, _ := strconv.Atoi(args[0])
	var pids []int
	defer func() {
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}()
	attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
	for len(pids) < max {
		pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "60"}, attr)
		if err != nil {
			return blocked("fork refused after %d children: %s", len(pids), errno(err))
		}
		pids = append(pids, pid)
	}
	return escaped("forked %d children without hitting a limit", len(pids))
}

// cmdAlloc touches MiB of anonymous memory, so it is really charged.
func cmdAlloc(args []string) int {
	need(args, 1, "alloc MIB")
	mib, _ := strconv.Atoi(args[0])
	fmt.Println("allocating")
	for i := 0; i < mib; i++ {
		b, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return blocked("mmap after %d MiB: %s", i, errno(err))
		}
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
	}
	return escaped("allocated and touched %d MiB", mib)
}

// ---- privileges ----

// cmdSetuidExec runs a setuid-root binary (a copy of this program the test
// planted) and reports the effective uid it ended up with.
func cmdSetuidExec(args []string) int {
	need(args, 1, "setuid-exec PATH")
	var st unix.Stat_t
	if err := unix.Stat(args[0], &st); err != nil {
		fmt.Fprintln(os.Stderr, "stat:", err)
		return exitUsage
	}
	// In a user namespace the root owner shows as the overflow uid, so
	// only the setuid bit itself is required here.
	if st.Mode&unix.S_ISUID == 0 {
		fmt.Fprintf(os.Stderr, "%s is not setuid (uid %d mode %o)\n", args[0], st.Uid, st.Mode)
		return exitUsage
	}
	nnp := statusField("NoNewPrivs")
	out, err := exec.Command(args[0], "whoami").Output()
	if err != nil {
		return blocked("exec %s: %v (NoNewPrivs=%s)", args[0], err, nnp)
	}
	line := strings.TrimSpace(string(out))
	if strings.Contains(line, "euid=0") {
		return escaped("setuid binary ran with %s", line)
	}
	return blocked("setuid binary ran with %s (NoNewPrivs=%s)", line, nnp)
}

// cmdSuProbe starts a host setuid binary that blocks on a password prompt
// and reads its effective uid from /proc while it waits.
func cmdSuProbe(args []string) int {
	need(args, 1, "su-probe PATH [ARGS...]")
	c := exec.Command(args[0], args[1:]...)
	stdin, _ := c.StdinPipe()
	defer stdin.Close()
	if err := c.Start(); err != nil {
		return blocked("exec %s: %v", args[0], err)
	}
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
	nnp := statusField("NoNewPrivs")
	var uids string
	for i := 0; i < 50; i++ {
		if u := procStatusField(c.Process.Pid, "Uid"); u != "" {
			uids = u
			if f := strings.Fields(u); len(f) > 1 && f[1] == "0" {
				return escaped("%s runs with euid 0 (Uid: %s)", args[0], u)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return blocked("%s ran with Uid: %s (NoNewPrivs=%s)", args[0], uids, nnp)
}

func statusField(name string) string { return procStatusField(os.Getpid(), name) }

func procStatusField(pid int, name string) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func cmdTIOCSTI([]string) int {
	if _, err := unix.IoctlGetTermios(0, unix.TCGETS); err != nil {
		fmt.Fprintln(os.Stderr, "stdin is not a terminal:", err)
		return exitUsage
	}
	c := byte('#')
	_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	if e != 0 {
		return blocked("ioctl(0, TIOCSTI): %s", errno(e))
	}
	return escaped("ioctl(0, TIOCSTI) injected a byte")
}

// cmdIopl must never return under the default profile: the filter kills.
func cmdIopl([]string) int {
	fmt.Println("calling iopl(3)")
	return verdict("iopl(3)", rawErr(unix.SYS_IOPL, 3, 0, 0))
}

// ---- mounts and namespaces ----

func cmdOpenTree([]string) int {
	fd, err := unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return verdict("open_tree(/, OPEN_TREE_CLONE)", err)
}

func cmdFsopen([]string) int {
	fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return verdict("fsopen(tmpfs)", err)
}

// childWith creates a namespace in a fresh single-threaded child, the way
// an attacker would (unshare(CLONE_NEWUSER) always fails in a threaded
// process, which would hide whether the sandbox blocked it).
func childWith(attr *syscall.SysProcAttr, what string) int {
	c := exec.Command("/proc/self/exe", "exit", "0")
	c.SysProcAttr = attr
	return verdict(what, c.Run())
}

func cmdClone3([]string) int {
	// Flags live in memory the filter cannot read; a filter that lets
	// clone3 through cannot police namespace flags at all.
	args := struct{ flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls uint64 }{
		flags: unix.CLONE_NEWUSER, exitSignal: uint64(unix.SIGCHLD),
	}
	r, _, e := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args), 0)
	if e != 0 {
		return blocked("clone3(CLONE_NEWUSER): %s", errno(e))
	}
	if r == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	_, _ = unix.Wait4(int(r), &ws, 0, nil)
	return escaped("clone3(CLONE_NEWUSER) created child %d", r)
}

func cmdSetns([]string) int {
	fd, err := unix.Open("/proc/self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return blocked("open /proc/self/ns/uts: %s", errno(err))
	}
	defer unix.Close(fd)
	return verdict("setns(own uts ns)", unix.Setns(fd, 0))
}

// ---- kernel interfaces ----

func cmdFinitModule([]string) int {
	fd, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return blocked("open: %s", errno(err))
	}
	defer unix.Close(fd)
	return verdict("finit_module", unix.FinitModule(fd, "", 0))
}

func cmdBPF([]string) int {
	// A socket filter that returns 0: loadable unprivileged where allowed.
	insns := []uint64{
		0x00000000000000b7, // mov r0, 0
		0x0000000000000095, // exit
	}
	license := []byte("GPL\x00")
	attr := struct {
		progType, insnCnt uint32
		insns, license    uint64
		logLevel, logSize uint32
		logBuf            uint64
		kernVersion       uint32
		_                 [64]byte
	}{
		progType: unix.BPF_PROG_TYPE_SOCKET_FILTER, insnCnt: uint32(len(insns)),
		insns:   uint64(uintptr(unsafe.Pointer(&insns[0]))),
		license: uint64(uintptr(unsafe.Pointer(&license[0]))),
	}
	r, _, e := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(insns)
	runtime.KeepAlive(license)
	if e != 0 {
		return blocked("bpf(BPF_PROG_LOAD): %s", errno(e))
	}
	unix.Close(int(r))
	return escaped("bpf(BPF_PROG_LOAD) loaded a program")
}

func cmdPerfEventOpen([]string) int {
	// A user-only software counter on ourselves: allowed to any user at
	// perf_event_paranoid <= 2, so only the sandbox can refuse it.
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_TASK_CLOCK,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return verdict("perf_event_open(task clock, self)", err)
}

func cmdUserfaultfd([]string) int {
	// UFFD_USER_MODE_ONLY is allowed unprivileged even when
	// vm.unprivileged_userfaultfd is 0.
	const uffdUserModeOnly = 1
	r, _, e := unix.RawSyscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|uffdUserModeOnly, 0, 0)
	if e != 0 {
		return blocked("userfaultfd: %s", errno(e))
	}
	unix.Close(int(r))
	return escaped("userfaultfd returned fd %d", r)
}

func cmdKeyctl([]string) int {
	id, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_USER_KEYRING, 1, 0, 0)
	if err != nil {
		return blocked("keyctl(GET_KEYRING_ID, user keyring): %s", errno(err))
	}
	return escaped("keyctl returned user keyring %d", id)
}

func cmdAddKey([]string) int {
	id, err := unix.AddKey("user", "corral-e2e", []byte("secret"), unix.KEY_SPEC_PROCESS_KEYRING)
	if err != nil {
		return blocked("add_key: %s", errno(err))
	}
	return escaped("add_key created key %d", id)
}

func cmdIoUringSetup([]string) int {
	var params [120]byte // struct io_uring_params
	r, _, e := unix.RawSyscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if e != 0 {
		return blocked("io_uring_setup: %s", errno(e))
	}
	unix.Close(int(r))
	return escaped("io_uring_setup returned fd %d", r)
}

func socketAttack(name string, family, typ, proto int) int {
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
	if err == nil {
		unix.Close(fd)
	}
	return verdict("socket("+name+")", err)
}
