package initproc

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/landlock"
	"github.com/corral-sandbox/corral/internal/linux/seccomp/filter"
	"github.com/corral-sandbox/corral/internal/linux/timerslack"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/trace"
)

// startWorkload confines the init itself with everything the workload
// inherits, checks that, and forks the workload with the credentials it
// runs as. Confining the init first is what lets one process do both jobs:
// the bounding, inheritable and ambient capability sets, no_new_privs,
// Landlock and seccomp pass to a child and cannot be widened by it, so the
// workload starts with exactly what the init verified, and the only code
// between fork and exec is the runtime's own (ids, session, terminal). The
// order is fixed: resolve the command while the filesystem is still fully
// readable, clear the capability sets, Landlock, seccomp as late as
// possible. The init keeps its effective capabilities (it needs CAP_SETUID
// to fork the workload as its user) but, being non-dumpable and filtered,
// lends the workload nothing it could reach through it.
//
// It returns the workload's pid and the seccomp filter's listener, or -1
// when the filter has none.
func startWorkload(cfg *Config, stdio []*os.File, tr *trace.Tracer) (int, int, *StepError) {
	// The capability calls below are per thread; the fork comes from the
	// thread that was checked, the one InitMain locked.
	p := &cfg.Plan
	// Relative commands (./tool) and relative PATH entries are relative to
	// the workdir, as in the shell the user typed the command in; the
	// workload inherits this directory.
	if err := unix.Chdir(p.Workdir); err != nil {
		return 0, -1, stepErr("enter workdir "+p.Workdir, err)
	}
	path, err := lookPath(cfg.Argv[0], envValue(cfg.Env, "PATH"), p)
	if err != nil {
		return 0, -1, asStepErr("find command", err)
	}
	tr.Step("init: command found")
	// The workload is forked from this thread and inherits its slack; the
	// init's own is corral's wider one. Set before the seccomp filter,
	// which need not allow it.
	if cfg.TimerSlack > 0 {
		if err := timerslack.Set(cfg.TimerSlack); err != nil {
			return 0, -1, stepErr("give the workload corral's timer slack", err)
		}
	}
	if err := narrowInherited(); err != nil {
		return 0, -1, stepErr("drop privileges", err)
	}
	tr.Step("init: capabilities")
	if _, err := landlock.Apply(landlock.Config{
		ReadOnly: p.Landlock.ReadOnly, ReadWrite: p.Landlock.ReadWrite, ListOnly: p.Landlock.ListOnly,
		Compat: landlock.Compatibility(p.Landlock.Compatibility),
	}); err != nil {
		return 0, -1, stepErr("apply landlock", err)
	}
	tr.Step("init: landlock")
	if n := p.Limits.NprocMax; n > 0 {
		if err := limitTasks(uint64(n)); err != nil {
			return 0, -1, stepErr("limit the sandbox's tasks (RLIMIT_NPROC)", err)
		}
	}
	listener, err := filter.Install(cfg.Seccomp, cfg.SeccompListener)
	if err != nil {
		return 0, -1, stepErr("install seccomp filter", err)
	}
	fail := func(pid int, serr *StepError) (int, int, *StepError) {
		if listener >= 0 {
			unix.Close(listener)
		}
		return pid, -1, serr
	}
	if err := verifyInherited(); err != nil {
		return fail(0, stepErr("verify privileges dropped", err))
	}
	tr.Step("init: seccomp, verified")
	// Only fds 0-2 may reach the workload; the listener above all, with
	// which it could take its own connects from the supervisor.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fail(0, stepErr("close inherited descriptors", err))
	}
	if cfg.PidsMax {
		if err := writePidsMax(p.Limits.Pids); err != nil {
			return fail(0, stepErr("set the sandbox's pids limit", err))
		}
	}
	u := p.User
	// Ctty names a descriptor of the child; the first one on the pty will do.
	ctty := slices.Index(cfg.Terminal[:], true)
	attr := &syscall.ProcAttr{
		Env:   cfg.Env,
		Files: []uintptr{stdio[0].Fd(), stdio[1].Fd(), stdio[2].Fd()},
		Sys: &syscall.SysProcAttr{
			Setsid: true, Setctty: ctty >= 0, Ctty: max(ctty, 0),
			Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups, NoSetGroups: p.Rootless},
		},
	}
	pid, err := syscall.ForkExec(path, cfg.Argv, attr)
	if err != nil {
		code := 126
		if errors.Is(err, unix.ENOENT) {
			code = 127
		}
		if errors.Is(err, unix.EAGAIN) && p.Limits.Pids > 0 {
			err = fmt.Errorf("%w: limits.pids is %d, and the sandbox's init already runs %s threads, which count against it; raise limits.pids", err, p.Limits.Pids, ownThreads())
		}
		return fail(0, &StepError{Step: "execute " + cfg.Argv[0], Code: code, Err: err})
	}
	// What the kernel made of the ids and capabilities, read back from the
	// running workload: it is killed before it is reported started if any
	// of it is not what was asked for.
	if err := awaitVerified(pid, u); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, fs.ErrNotExist) && unix.Access(path, unix.R_OK) != nil {
			// A binary its user cannot read makes a process the kernel
			// shows only to those privileged over the binary's owner;
			// rootless, an owner outside the sandbox's user namespace.
			err = fmt.Errorf("%w: %s is execute-only for the sandbox's user, so the kernel hides the process from the init, which cannot verify it; make the file readable (chmod a+r), or run corral as root", err, path)
		}
		return fail(0, stepErr("verify the workload's privileges", err))
	}
	tr.Step("init: workload exec'd and verified")
	return pid, listener, nil
}

func asStepErr(step string, err error) *StepError {
	var se *StepError
	if errors.As(err, &se) {
		return se
	}
	return stepErr(step, err)
}

// lookPath finds the command the way a shell would, inside the new root.
func lookPath(name, pathEnv string, p *plan.Plan) (string, error) {
	notFound := func(err error) error {
		return &StepError{Step: "find command " + name, Code: 127, Err: err}
	}
	check := func(p string) error {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.IsDir() {
			return fmt.Errorf("%s is a directory", p)
		}
		return nil
	}
	if strings.Contains(name, "/") {
		if err := check(name); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return "", notFound(fmt.Errorf("%s does not exist inside the sandbox — %s", name, missingHint(name, p)))
			}
			return "", &StepError{Step: "execute " + name, Code: 126, Err: err}
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if check(p) == nil && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", notFound(fmt.Errorf("%s not found in PATH inside the sandbox (PATH=%s) — if it is installed on the host, list its directory in filesystem_policy.read_only", name, pathEnv))
}

// missingHint says why a path the command names is missing inside the
// sandbox and which policy field brings it in: the mount it would be
// under, or, with none, the host directory to add.
func missingHint(name string, p *plan.Plan) string {
	if !filepath.IsAbs(name) {
		return "the path is relative to the workdir " + p.Workdir
	}
	name = filepath.Clean(name)
	under := func(dir string) bool { return name == dir || strings.HasPrefix(name, strings.TrimSuffix(dir, "/")+"/") }
	for _, s := range p.Skipped {
		if under(s.Path) {
			return fmt.Sprintf("the policy lists %s, but it was left out: %s", s.Path, s.Reason)
		}
	}
	var in *plan.Mount
	for i, m := range p.Mounts {
		if under(m.Target) && (in == nil || len(m.Target) > len(in.Target)) {
			in = &p.Mounts[i]
		}
	}
	top, _, _ := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	top = "/" + top
	switch {
	case in == nil:
		return fmt.Sprintf("nothing of the host's %s is mounted; add it to the policy: filesystem_policy.read_only: [%s] (or leave filesystem_policy out to get the built-in default's system directories)", top, top)
	case in.Kind == plan.KindBind:
		return fmt.Sprintf("%s is the host's %s (%s), so the host has no such file either", in.Target, in.Source, in.Why)
	}
	return fmt.Sprintf("%s is the sandbox's own %s (%s), not the host's; put the command in the workdir or list its host directory in filesystem_policy.read_only", in.Target, in.Kind, in.Why)
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// pidsMaxFD is the sandbox cgroup's pids.max, when Config.PidsMax says
// the supervisor passed it.
const pidsMaxFD = 4

// writePidsMax writes n to the cgroup's pids.max and closes the file.
func writePidsMax(n int64) error {
	v := strconv.FormatInt(n, 10)
	m, err := unix.Write(pidsMaxFD, []byte(v))
	unix.Close(pidsMaxFD)
	if err == nil && m != len(v) {
		err = fmt.Errorf("wrote %d of %d bytes", m, len(v))
	}
	return err
}

// ownThreads is the init's thread count as /proc/self/status gives it, or
// "several".
func ownThreads() string {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		if n := statusField(string(b), "Threads"); n != "" {
			return n
		}
	}
	return "several"
}

// limitTasks sets RLIMIT_NPROC, soft and hard, on the init, for the
// workload to inherit: the planner asks for it only where the kernel
// counts the tasks of the sandbox's uid in its own user namespace, so this
// bounds the sandbox as a pids cgroup would (the init's threads count, as
// they would there). Nothing inside may raise it again. The value is read
// back rather than trusted.
func limitTasks(n uint64) error {
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return err
	}
	var got unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &got); err != nil {
		return err
	}
	if got.Cur != n || got.Max != n {
		return fmt.Errorf("RLIMIT_NPROC is %d/%d after setting %d", got.Cur, got.Max, n)
	}
	return nil
}

// narrowInherited empties the capability sets a child's exec computes its
// own from (ambient, inheritable, bounding) on this thread, the one that
// forks: they are per thread and only the forking thread's pass on. With
// all three empty an exec yields no capability whatever the uid, including
// 0 and file capabilities. no_new_privs keeps a setuid binary from raising
// ids (Landlock and seccomp's TSYNC extend it to every thread). The init is
// made non-dumpable so a workload running as the same uid cannot ptrace it
// or read its memory.
func narrowInherited() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d from bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the init non-dumpable: %w", err)
	}
	return nil
}

// verifyInherited checks, on the thread that forks, what the workload will
// inherit, instead of trusting the calls that set it.
func verifyInherited() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if v, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || v != 0 {
			return fmt.Errorf("bounding set still holds capability %d", c)
		}
		if v, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0); err != nil || v != 0 {
			return fmt.Errorf("ambient set still holds capability %d", c)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if data[0].Inheritable != 0 || data[1].Inheritable != 0 {
		return fmt.Errorf("inheritable capabilities remain: %+v", data)
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || v != 1 {
		return errors.New("no_new_privs is not set")
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil || v != 2 {
		return errors.New("no seccomp filter is installed")
	}
	return nil
}

// errExecUncommitted is a check that saw the credentials the workload
// forked with: ForkExec returns once the exec closed the close-on-exec
// descriptors, and the kernel commits the new program's credentials a
// moment later. Rootless, where the workload keeps the init's uid, they
// are the init's capabilities until then.
var errExecUncommitted = errors.New("the exec has not committed the workload's credentials yet")

// awaitVerified checks the workload's credentials, again while they are
// still exactly the ones it forked with, for at most a second: a workload
// whose exec left it the init's credentials still fails then.
func awaitVerified(pid int, u plan.User) error {
	deadline := time.Now().Add(time.Second)
	for {
		err := verifyWorkload(pid, u)
		if !errors.Is(err, errExecUncommitted) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// verifyWorkload reads the workload's credentials as the kernel holds them:
// every uid and gid the user's, every capability set empty, no_new_privs
// and a seccomp filter. A workload that already exited is still a zombie
// here (the init has not reaped it), so its status is readable; one its
// filter killed shows seccomp mode 3 (dead), which only a filter sets.
//
// A workload quick enough to make a user namespace of its own (`unshare
// --user`, allowed by a relaxed seccomp profile) before it is read holds
// every capability in that namespace, and its status shows those. It can
// only have made it by running, after its exec committed; the namespace
// is its own, below the sandbox's, since entering any other takes
// capabilities there; and what it holds in it gives it nothing over the
// sandbox. Its capabilities are then not compared, while its ids (shown
// as the init sees them), no_new_privs and seccomp still are. The
// namespace is read before and after the status, and a status read while
// it changed is read again.
func verifyWorkload(pid int, u plan.User) error {
	own, err := userNS("/proc/thread-self/ns/user")
	if err != nil {
		return err
	}
	nsPath := fmt.Sprintf("/proc/%d/ns/user", pid)
	before, err := userNS(nsPath)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		// An exec makes the process undumpable for a moment, and its
		// namespaces unreadable to us with it.
		return fmt.Errorf("%w: %w", errExecUncommitted, err)
	}
	if err != nil {
		return err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return fmt.Errorf("read the workload's status: %w", err)
	}
	after, err := userNS(nsPath)
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("%w: the workload made a user namespace while its status was read", errExecUncommitted)
	}
	uid, gid := strconv.Itoa(int(u.UID)), strconv.Itoa(int(u.GID))
	none := []string{"0000000000000000"}
	want := map[string][]string{
		"Uid":        {strings.Join([]string{uid, uid, uid, uid}, "\t")},
		"Gid":        {strings.Join([]string{gid, gid, gid, gid}, "\t")},
		"CapInh":     none,
		"CapPrm":     none,
		"CapEff":     none,
		"CapBnd":     none,
		"CapAmb":     none,
		"NoNewPrivs": {"1"},
		"Seccomp":    {"2", "3"},
	}
	if before != own {
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			delete(want, k)
		}
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
		w, checked := want[k]
		if !ok || !checked {
			continue
		}
		if got := strings.TrimSpace(v); !slices.Contains(w, got) {
			err := fmt.Errorf("%s is %q, want %q", k, got, w[0])
			// Read only now, as start-up rarely gets here: what this
			// thread holds, which the workload's fork started from.
			if own, rerr := os.ReadFile("/proc/thread-self/status"); rerr == nil && statusField(string(own), k) == got {
				err = fmt.Errorf("%w: %w", errExecUncommitted, err)
			}
			return err
		}
		delete(want, k)
	}
	if len(want) > 0 {
		return fmt.Errorf("the workload's status lacks %v", slices.Sorted(maps.Keys(want)))
	}
	return nil
}

// userNS returns the inode of the user namespace at path (a /proc ns link).
func userNS(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("the workload's user namespace: %w", err)
	}
	return st.Ino, nil
}

// statusField is the value of field k in a /proc status file.
func statusField(status, k string) string {
	for line := range strings.Lines(status) {
		if name, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), ":"); ok && name == k {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("parse cap_last_cap: %w", err)
	}
	return n, nil
}
