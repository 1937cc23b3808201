package initproc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/landlock"
	"github.com/corral-sandbox/corral/internal/linux/seccomp"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/trace"
)

// ExecMain becomes the workload. Each step narrows what the next can do, so
// the order is fixed: resolve the command while the filesystem is still
// fully readable to us, drop capabilities and ids, set no_new_privs, apply
// Landlock, install seccomp as late as possible, mark every inherited fd
// close-on-exec, exec. On failure it reports over fd 3 and exits.
func ExecMain() int {
	entered := trace.Now()
	// Capabilities and the bounding set are per thread; everything below
	// and the final execve must happen on this one.
	runtime.LockOSThread()
	sock := os.NewFile(3, "init")
	var msg Message
	if err := readMessage(bufio.NewReader(sock), &msg); err != nil || msg.Config == nil {
		fmt.Fprintf(os.Stderr, "corral exec: read config: %v\n", err)
		return 125
	}
	cfg := msg.Config
	tr := trace.Resume(os.Stderr, cfg.Trace)
	tr.StepAt("exec: process started", entered)
	tr.Step("exec: config received")
	err := becomeWorkload(cfg, tr)
	var se *StepError
	if !errors.As(err, &se) {
		se = stepErr("exec", err)
	}
	_ = Send(sock, Message{Type: MsgError, Step: se.Step, Error: se.Err.Error(), Code: se.Code})
	return se.Code
}

func becomeWorkload(cfg *Config, tr *trace.Tracer) error {
	p := &cfg.Plan
	// Relative commands (./tool) and relative PATH entries are relative to
	// the workdir, as in the shell the user typed the command in.
	if err := unix.Chdir(p.Workdir); err != nil {
		return stepErr("enter workdir "+p.Workdir, err)
	}
	path, err := lookPath(cfg.Argv[0], envValue(cfg.Env, "PATH"), p)
	if err != nil {
		return err
	}
	tr.Step("exec: command found")
	if err := dropPrivileges(p); err != nil {
		return stepErr("drop privileges", err)
	}
	if err := verifyDropped(p.User); err != nil {
		return stepErr("verify privileges dropped", err)
	}
	tr.Step("exec: privileges dropped and verified")
	if _, err := landlock.Apply(landlock.Config{
		ReadOnly: p.Landlock.ReadOnly, ReadWrite: p.Landlock.ReadWrite, ListOnly: p.Landlock.ListOnly,
		Compat: landlock.Compatibility(p.Landlock.Compatibility),
	}); err != nil {
		return stepErr("apply landlock", err)
	}
	tr.Step("exec: landlock")
	if err := seccomp.Install(seccomp.Profile(p.Seccomp.Profile), seccomp.NetMode(p.Seccomp.NetMode)); err != nil {
		return stepErr("install seccomp filter", err)
	}
	tr.Step("exec: seccomp")
	// Only fds 0-2 may reach the workload; fd 3 (our report channel) closes
	// on a successful exec, which is how the init learns it succeeded.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return stepErr("close inherited descriptors", err)
	}
	err = unix.Exec(path, cfg.Argv, cfg.Env)
	code := 126
	if errors.Is(err, unix.ENOENT) {
		code = 127
	}
	return &StepError{Step: "execute " + cfg.Argv[0], Code: code, Err: err}
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

// dropPrivileges clears ambient and bounding capabilities while we still
// hold CAP_SETPCAP, switches ids, clears the remaining capability sets and
// sets no_new_privs so no setuid binary or file capability can regain them.
func dropPrivileges(p *plan.Plan) error {
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
	u := p.User
	if !p.Rootless {
		groups := make([]int, len(u.Groups))
		for i, g := range u.Groups {
			groups[i] = int(g)
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("setgroups %v: %w", u.Groups, err)
		}
	}
	if err := syscall.Setresgid(int(u.GID), int(u.GID), int(u.GID)); err != nil {
		return fmt.Errorf("setresgid %d: %w", u.GID, err)
	}
	if err := syscall.Setresuid(int(u.UID), int(u.UID), int(u.UID)); err != nil {
		return fmt.Errorf("setresuid %d: %w", u.UID, err)
	}
	// A uid change from 0 clears the sets, but rootless we never were 0 and
	// hold capabilities in our user namespace: clear them explicitly.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return nil
}

// verifyDropped checks the post-conditions instead of trusting the calls.
func verifyDropped(u plan.User) error {
	if _, _, errno := unix.RawSyscall(unix.SYS_SETUID, 0, 0, 0); errno == 0 {
		return errors.New("setuid(0) succeeded after dropping privileges")
	}
	r, e, s := unix.Getresuid()
	if r != int(u.UID) || e != int(u.UID) || s != int(u.UID) {
		return fmt.Errorf("uids are %d/%d/%d, want %d", r, e, s, u.UID)
	}
	r, e, s = unix.Getresgid()
	if r != int(u.GID) || e != int(u.GID) || s != int(u.GID) {
		return fmt.Errorf("gids are %d/%d/%d, want %d", r, e, s, u.GID)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective != 0 || d.Permitted != 0 || d.Inheritable != 0 {
			return fmt.Errorf("capabilities remain: %+v", data)
		}
	}
	if v, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, 0, 0, 0, 0); err != nil || v != 0 {
		return errors.New("bounding set still holds CAP_CHOWN")
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || v != 1 {
		return errors.New("no_new_privs is not set")
	}
	return nil
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
