// Package local runs sandboxes' supervisors as detached processes on the
// gateway's own host: each is `corral run --gateway ...` in a session of
// its own, so it outlives a gateway restart, and the restarted gateway
// finds it again by the pid and start time kept in its reference.
package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// Name is the driver's name in store.Sandbox.Driver.
const Name = "local"

// DefaultGrace is how long Delete waits after SIGTERM before SIGKILL.
const DefaultGrace = 5 * time.Second

// Files in each sandbox's directory, DATA/sandboxes/ID.
const (
	TokenFile = "token"
	LogFile   = "supervisor.log"
	// EnvFile holds the environment the sandbox was created with.
	EnvFile = "env"
	// WorkDir is the workload's working directory when the sandbox names
	// none: never the sandbox's directory, which holds its credential.
	WorkDir = "work"
)

// Driver starts supervisors on this host.
type Driver struct {
	bin, data string
	// Grace is how long Delete waits for a supervisor to end after
	// SIGTERM before it kills it.
	Grace time.Duration
	// Workdirs are the host directories a sandbox may name as its working
	// directory, or be under: its supervisor runs as root and mounts it
	// read-write, so anything else would hand every gateway user the
	// host's files. None by default: a sandbox naming no workdir gets one
	// of its own.
	Workdirs []string
	// StateDir is the state directory of the supervisors (corral run
	// --state-dir): audit log, run directories, carried programs, each
	// link's saved credential. "" leaves corral's default.
	StateDir string

	mu sync.Mutex
	// exited holds how each supervisor this driver started and reaped
	// ended, by reference.
	exited map[string]syscall.WaitStatus

	fullMu sync.Mutex
	// full is corral's full program, as bin last named it.
	full string
}

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Checker = (*Driver)(nil)
)

// Check refuses a working directory outside d.Workdirs, symbolic links
// resolved, so a link cannot lead out of an allowed directory.
func (d *Driver) Check(sb store.Sandbox) error {
	if err := envLines(sb.Env); err != nil {
		return err
	}
	_, err := d.workdir(sb.Workdir)
	return err
}

// envLines refuses what the environment file cannot carry: a value with a
// line break.
func envLines(env []string) error {
	for _, kv := range env {
		if strings.ContainsAny(kv, "\r\n") {
			k, _, _ := strings.Cut(kv, "=")
			return fmt.Errorf("environment variable %q: a value with a line break cannot be passed to the sandbox", k)
		}
	}
	return nil
}

// workdir resolves a sandbox's requested working directory, "" keeping
// the driver's own default.
func (d *Driver) workdir(want string) (string, error) {
	if want == "" {
		return "", nil
	}
	if !filepath.IsAbs(want) {
		return "", fmt.Errorf("workdir %q: not an absolute path", want)
	}
	resolved, err := filepath.EvalSymlinks(want)
	if err != nil {
		return "", fmt.Errorf("workdir %s: %w", want, err)
	}
	for _, root := range d.Workdirs {
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if resolved == r || strings.HasPrefix(resolved, strings.TrimSuffix(r, "/")+"/") {
			return resolved, nil
		}
	}
	return "", fmt.Errorf("workdir %s is outside the directories this gateway lets sandboxes use (corral gateway --allow-workdir DIR); leave it out and the sandbox gets a directory of its own", want)
}

// New returns a driver starting corralBin with its files under dataDir.
func New(corralBin, dataDir string) *Driver {
	return &Driver{bin: corralBin, data: dataDir, Grace: DefaultGrace, exited: map[string]syscall.WaitStatus{}}
}

// program is what supervisors start as. corral run --gateway needs
// corral's full program (the gateway client is not in the corral users
// run), and started as corral it would exec that program itself, paying
// for corral's start first; so the driver asks corral where the program is
// (corral version --full-program, which writes it there) and starts it
// directly, asking again when it has gone (a corral of another build
// removes programs of other builds). Anything that cannot say, an older
// corral for one, is started as it is.
func (d *Driver) program() string {
	d.fullMu.Lock()
	defer d.fullMu.Unlock()
	if d.full != "" {
		if fi, err := os.Stat(d.full); err == nil && fi.Mode().IsRegular() {
			return d.full
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ask := exec.CommandContext(ctx, d.bin, append([]string{"version", "--full-program"}, d.stateArgs()...)...)
	ask.Dir = d.data
	ask.Env = supervisorEnv(os.Environ())
	out, err := ask.Output()
	if p := strings.TrimSpace(string(out)); err == nil && filepath.IsAbs(p) {
		d.full = p
		return p
	}
	return d.bin
}

func (d *Driver) stateArgs() []string {
	if d.StateDir == "" {
		return nil
	}
	return []string{"--state-dir", d.StateDir}
}

// sandboxID is what may name a directory under DATA/sandboxes (up to 128
// bytes, checked apart from the pattern).
var sandboxID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

func (d *Driver) dir(id string) (string, error) {
	if len(id) > 128 || !sandboxID.MatchString(id) {
		return "", fmt.Errorf("sandbox id %q: not a name for a directory", id)
	}
	return filepath.Join(d.data, "sandboxes", id), nil
}

// Create starts the sandbox's supervisor and returns "pid:PID:START",
// START being the process's start time in clock ticks since boot, so that
// a pid the kernel gave to another process since is never taken for it.
func (d *Driver) Create(_ context.Context, sb store.Sandbox, link driver.Link) (ref string, retErr error) {
	if len(sb.Command) == 0 {
		return "", errors.New("local driver: the sandbox has no command")
	}
	dir, err := d.dir(sb.ID)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("local driver: create sandbox directory: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	// chmod as well: MkdirAll keeps the mode of a directory that exists.
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("local driver: %w", err)
	}
	token := filepath.Join(dir, TokenFile)
	if err := os.WriteFile(token, []byte(link.Token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("local driver: write token: %w", err)
	}
	// Checked again here, and the resolved path is what runs: Check ran
	// before the sandbox was recorded.
	work, err := d.workdir(sb.Workdir)
	if err != nil {
		return "", fmt.Errorf("local driver: %w", err)
	}
	if work == "" {
		work = filepath.Join(dir, WorkDir)
		if err := os.MkdirAll(work, 0o755); err != nil {
			return "", fmt.Errorf("local driver: create work directory: %w", err)
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", fmt.Errorf("local driver: open supervisor log: %w", err)
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return "", fmt.Errorf("local driver: %w", err)
	}
	defer null.Close()

	// Gateway users are trusted on this host as a corral user is (they
	// choose the paths a policy mounts), so its keys may come from here.
	args := append([]string{"run", "--gateway", link.URL, "--gateway-ca", link.CAFile, "--gateway-token-file", token, "--gateway-host-keys", "--workdir", work}, d.stateArgs()...)
	if len(sb.Env) > 0 {
		// In a 0600 file like the token: a command line is readable by
		// every user of the host for the whole run.
		envFile := filepath.Join(dir, EnvFile)
		if err := writeEnvFile(envFile, sb.Env); err != nil {
			return "", fmt.Errorf("local driver: %w", err)
		}
		args = append(args, "--env-file", envFile)
	}
	args = append(args, "--")
	args = append(args, sb.Command...)
	// Not CommandContext: the supervisor outlives the request, and the
	// gateway too.
	cmd := exec.Command(d.program(), args...)
	cmd.Dir = work
	cmd.Env = supervisorEnv(os.Environ())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, logf, logf
	// A session of its own: no signal for the gateway's process group or
	// terminal reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("local driver: start supervisor: %w", err)
	}
	pid := cmd.Process.Pid
	// Read before the reaper runs: until it is reaped, even an exited
	// child keeps its /proc entry.
	start, _, err := procStat(pid)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "", fmt.Errorf("local driver: read supervisor start time: %w", err)
	}
	ref = fmt.Sprintf("pid:%d:%d", pid, start)
	go func() {
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			d.mu.Lock()
			d.exited[ref] = ws
			d.mu.Unlock()
		}
	}()
	return ref, nil
}

// writeEnvFile writes the sandbox's environment as corral run --env-file
// reads it, one NAME=VALUE per line, so a value cannot hold a newline.
func writeEnvFile(path string, env []string) error {
	if err := envLines(env); err != nil {
		return err
	}
	var b strings.Builder
	for _, kv := range env {
		b.WriteString(kv + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write environment: %w", err)
	}
	return nil
}

// supervisorEnv is what the supervisor gets of the gateway's environment:
// enough to run, none of the gateway's own settings and credentials.
func supervisorEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "LANG", k == "TZ", strings.HasPrefix(k, "LC_"):
			out = append(out, kv)
		}
	}
	return out
}

// Inspect tells whether the supervisor of ref still runs: the pid must be
// alive and have the start time recorded at creation.
func (d *Driver) Inspect(_ context.Context, sb store.Sandbox) (driver.Status, error) {
	if ws, ok := d.reaped(sb.DriverRef); ok {
		return exitStatus(ws), nil
	}
	pid, start, err := parseRef(sb.DriverRef)
	if err != nil {
		return driver.Status{}, err
	}
	return running(pid, start), nil
}

func (d *Driver) reaped(ref string) (syscall.WaitStatus, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ws, ok := d.exited[ref]
	return ws, ok
}

func exitStatus(ws syscall.WaitStatus) driver.Status {
	if ws.Signaled() {
		code := 128 + int(ws.Signal())
		return driver.Status{ExitCode: &code, Reason: "supervisor killed by " + unix.SignalName(ws.Signal())}
	}
	code := ws.ExitStatus()
	return driver.Status{ExitCode: &code}
}

func running(pid int, start uint64) driver.Status {
	got, state, err := procStat(pid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return driver.Status{Reason: "supervisor process gone"}
	case err != nil:
		return driver.Status{Reason: "cannot read supervisor process: " + err.Error()}
	case got != start:
		return driver.Status{Reason: "supervisor process gone (its pid is another process's now)"}
	case state == "Z" || state == "X":
		return driver.Status{Reason: "supervisor process exited"}
	}
	return driver.Status{Running: true}
}

// Delete stops the supervisor (SIGTERM: it ends the workload and reports;
// SIGKILL after Grace) and removes the sandbox's directory.
func (d *Driver) Delete(ctx context.Context, sb store.Sandbox) error {
	dir, err := d.dir(sb.ID)
	if err != nil {
		return err
	}
	if sb.DriverRef != "" {
		pid, start, err := parseRef(sb.DriverRef)
		if err != nil {
			return err
		}
		if err := d.stop(ctx, sb.DriverRef, pid, start); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("local driver: remove sandbox directory: %w", err)
	}
	d.mu.Lock()
	delete(d.exited, sb.DriverRef)
	d.mu.Unlock()
	return nil
}

func (d *Driver) stop(ctx context.Context, ref string, pid int, start uint64) error {
	alive := func() bool {
		if _, ok := d.reaped(ref); ok {
			return false
		}
		return running(pid, start).Running
	}
	// Each signal goes out only after the check that pid is still the
	// supervisor; the window between the two is the kernel's to reuse a
	// pid in, which it does only after the process is reaped.
	if !alive() {
		return nil
	}
	if err := unix.Kill(pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("local driver: stop supervisor %d: %w", pid, err)
	}
	if waitGone(ctx, alive, d.Grace) {
		return nil
	}
	if !alive() {
		return nil
	}
	// The supervisor leads its own process group (its session): the
	// sandbox's init goes with it.
	if err := unix.Kill(-pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("local driver: kill supervisor %d: %w", pid, err)
	}
	if !waitGone(ctx, alive, 5*time.Second) {
		return fmt.Errorf("local driver: supervisor %d still runs after SIGKILL", pid)
	}
	return nil
}

func waitGone(ctx context.Context, alive func() bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !alive() {
			return true
		}
		select {
		case <-ctx.Done():
			return !alive()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return !alive()
}

func parseRef(ref string) (pid int, start uint64, err error) {
	rest, ok := strings.CutPrefix(ref, "pid:")
	p, s, ok2 := strings.Cut(rest, ":")
	if ok && ok2 {
		pid, err = strconv.Atoi(p)
		if err == nil && pid > 0 {
			if start, err = strconv.ParseUint(s, 10, 64); err == nil {
				return pid, start, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("local driver: reference %q: want pid:PID:START", ref)
}

// procStat returns the start time (field 22 of /proc/PID/stat, clock
// ticks after boot) and the state of pid.
func procStat(pid int) (start uint64, state string, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields that follow start after the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return start, f[0], nil
}
