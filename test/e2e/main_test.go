// Package e2e attacks a real `corral run` from the inside and asserts that
// every attack fails, together with the audit event that records it. The
// attack payloads live in ./attack; this file builds corral and the payload
// once and provides the harness the tests share.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/corral-sandbox/corral/internal/linux/timerslack"
)

var (
	// baseDir holds everything the suite creates on the host. It is 0755
	// (not the 0700 of t.TempDir) because rootless corral and the workloads
	// run as other uids and must reach the binaries and workdirs below it.
	baseDir   string
	corralBin string
	// selfInitBin is corral built without the init program it carries
	// (tag corral_selfinit): it re-executes itself as the init.
	selfInitBin string
	attackBin   string
)

// workloadUID owns root-mode workdirs: corral (as root) then runs the
// workload as this uid rather than as nobody, so the workdir is writable.
const workloadUID = 1000

// nobody is the uid rootless corral runs as when the suite has root.
const nobody = 65534

func TestMain(m *testing.M) {
	flag.Parse()
	// Most of the suite's time is spent waiting on sleeping sandboxes
	// (walltime, grace periods), not on the CPU, so run more than GOMAXPROCS
	// tests at once unless the caller chose a number.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "8")
	}
	code, err := setupAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	os.Exit(code)
}

func setupAndRun(m *testing.M) (int, error) {
	var err error
	if baseDir, err = os.MkdirTemp("", "corral-e2e-"); err != nil {
		return 1, err
	}
	defer os.RemoveAll(baseDir)
	if err := os.Chmod(baseDir, 0o755); err != nil {
		return 1, err
	}
	bin := filepath.Join(baseDir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		return 1, err
	}
	corralBin = filepath.Join(bin, "corral")
	attackBin = filepath.Join(bin, "attack")
	root, err := moduleRoot()
	if err != nil {
		return 1, err
	}
	selfInitBin = filepath.Join(bin, "corral-selfinit")
	// corral carries the init and the full program built from these
	// sources (generating the full program generates the init first), and
	// one corral is built without the init, re-executing itself as it.
	builds := [][]string{
		{"generate", "./internal/fullbin"},
		{"build", "-o", corralBin, "./cmd/corral"},
		{"build", "-tags", "corral_selfinit", "-o", selfInitBin, "./cmd/corral"},
		{"build", "-o", attackBin, "./test/e2e/attack"},
		{"build", "-o", filepath.Join(bin, "corral-gateway"), "./cmd/corral-gateway"},
	}
	for _, args := range builds {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	return m.Run(), nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the corral module")
	}
	return filepath.Dir(mod), nil
}

// noSkip is set on CI, where a skipped security test is a failed one.
func noSkip() bool { return os.Getenv("CORRAL_NO_SKIP") == "1" }

func requireFeature(t *testing.T, reason string) {
	t.Helper()
	if noSkip() {
		t.Fatalf("CORRAL_NO_SKIP=1 but this test cannot run: %s", reason)
	}
	t.Skip(reason)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		requireFeature(t, "needs root")
	}
}

// mode is how corral itself is started.
type mode struct {
	name     string
	rootless bool
	// uid and gid of the workload: in root mode the workdir's owner, in
	// rootless mode the user corral runs as.
	uid, gid int
	// asUser is set when the suite must switch to uid to start corral.
	asUser bool
	home   string // rootless: HOME and XDG_STATE_HOME/.. of corral
	// unavailable says why this host cannot run the mode.
	unavailable string
}

var (
	modeOnce     sync.Once
	rootMode     *mode
	rootlessMode *mode
	modeErr      error
)

func initModes() {
	rootMode = &mode{name: "root", uid: workloadUID, gid: workloadUID}
	if os.Geteuid() != 0 {
		rootMode.unavailable = "root mode needs root"
	}
	rl := &mode{name: "rootless", rootless: true, uid: os.Getuid(), gid: os.Getgid()}
	if os.Geteuid() == 0 {
		rl.uid, rl.gid, rl.asUser = nobody, nobody, true
	}
	rl.home = filepath.Join(baseDir, "rootless-home")
	if modeErr = os.MkdirAll(rl.home, 0o755); modeErr != nil {
		return
	}
	if modeErr = chownTree(rl.home, rl.uid, rl.gid); modeErr != nil {
		return
	}
	// Rootless corral needs an unprivileged user namespace; some hosts
	// forbid them (sysctl, AppArmor).
	cmd := exec.Command(attackBin, "unshare-user")
	if rl.asUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(rl.uid), Gid: uint32(rl.gid), Groups: []uint32{}}}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		rl.unavailable = fmt.Sprintf("unprivileged user namespaces are not available to uid %d: %s", rl.uid, bytes.TrimSpace(out))
	}
	rootlessMode = rl
}

func getMode(t *testing.T, m **mode) *mode {
	t.Helper()
	modeOnce.Do(initModes)
	if modeErr != nil {
		t.Fatal(modeErr)
	}
	if (*m).unavailable != "" {
		requireFeature(t, (*m).unavailable)
	}
	return *m
}

func getRootMode(t *testing.T) *mode { return getMode(t, &rootMode) }

// forEachMode runs f as a subtest per mode: corral started as root, and
// corral started as an unprivileged user (rootless).
func forEachMode(t *testing.T, parallel bool, f func(t *testing.T, m *mode)) {
	t.Helper()
	for _, mp := range []**mode{&rootMode, &rootlessMode} {
		name := "root"
		if mp == &rootlessMode {
			name = "rootless"
		}
		t.Run(name, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			f(t, getMode(t, mp))
		})
	}
}

func chownTree(dir string, uid, gid int) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// newDir makes a directory under baseDir owned by the mode's uid.
func newDir(t *testing.T, m *mode, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp(baseDir, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := chownTree(d, m.uid, m.gid); err != nil {
		t.Fatal(err)
	}
	return d
}

// fixture is one test's workdir (with the attack binary in it) and the
// directory holding its policy, audit logs and state.
type fixture struct {
	m   *mode
	W   string // workdir
	aux string
	// state is the fixture's own --state-dir. Tests do not share one: runs
	// starting at the same moment in one state dir can sweep each other's
	// half-created run directory (TestConcurrentStartsShareStateDir).
	state  string
	attack string // absolute path of the attack binary inside W
	vars   map[string]string
	runs   int
	// check, when a setup sets it, runs after the sandboxed attack.
	check func(t *testing.T, r *result)
}

func newFixture(t *testing.T, m *mode) *fixture {
	t.Helper()
	fx := &fixture{m: m, W: newDir(t, m, "wd-"), aux: newDir(t, m, "aux-")}
	fx.attack = filepath.Join(fx.W, "attack")
	fx.state = filepath.Join(fx.aux, "state")
	copyFile(t, attackBin, fx.attack, 0o755)
	fx.vars = map[string]string{"W": fx.W, "HOSTPID": strconv.Itoa(os.Getpid())}
	return fx
}

func copyFile(t *testing.T, src, dst string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, perm); err != nil {
		t.Fatal(err)
	}
}

// expand replaces {NAME} with the fixture's variables.
func (fx *fixture) expand(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range fx.vars {
			a = strings.ReplaceAll(a, "{"+k+"}", v)
		}
		out[i] = a
	}
	return out
}

// signal creates the file name in the workdir: scripts in the sandbox
// wait for such files to move to their next step.
func (fx *fixture) signal(t *testing.T, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(fx.W, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writePolicy stores a policy file readable by the mode's user.
func (fx *fixture) writePolicy(t *testing.T, yaml string) string {
	t.Helper()
	fx.runs++
	p := filepath.Join(fx.aux, fmt.Sprintf("policy-%d.yaml", fx.runs))
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// systemPolicy is a policy with the system directories of the default
// policy read-only (enough for /bin/sh, sleep and bash) plus extra.
func systemPolicy(extra string) string {
	return `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt]
network:
  mode: block
` + extra
}

type runOpts struct {
	args    []string // the command after --
	policy  string   // policy YAML; empty means the built-in default
	flags   []string // extra corral run flags
	env     []string // extra environment for corral itself
	state   string   // override the mode's state dir
	timeout time.Duration
	pty     bool // run corral on a pseudo-terminal
	// bin is the corral to run; empty is corralBin.
	bin string
	// stdio, when set, are corral's fds 0–2 instead of /dev/null and the
	// result's buffers.
	stdio []*os.File
	// umask, when set, is corral's umask (e.g. "077").
	umask string
	// timerSlack, when set, is the timer slack corral starts with.
	timerSlack uint64
}

type result struct {
	code    int
	stdout  string
	stderr  string
	events  []map[string]any
	elapsed time.Duration
	cmdline string
}

func (r *result) String() string {
	return fmt.Sprintf("exit %d after %v\n$ %s\n--- stdout:\n%s--- stderr:\n%s--- audit:\n%s",
		r.code, r.elapsed.Round(time.Millisecond), r.cmdline, r.stdout, r.stderr, r.eventsText())
}

func (r *result) eventsText() string {
	var b strings.Builder
	for _, e := range r.events {
		j, _ := json.Marshal(e)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// find returns the events named name.
func (r *result) find(name string) []map[string]any {
	var out []map[string]any
	for _, e := range r.events {
		if e["event"] == name {
			out = append(out, e)
		}
	}
	return out
}

// requireEvent fails unless an event name has every field in want.
func (r *result) requireEvent(t *testing.T, name string, want map[string]any) map[string]any {
	t.Helper()
	if e := findEvent(r, name, want); e != nil {
		return e
	}
	t.Fatalf("no audit event %s with %v\n%s", name, want, r)
	return nil
}

func (r *result) sandboxID(t *testing.T) string {
	t.Helper()
	for _, e := range r.events {
		if e["event"] == "sandbox.start" || e["event"] == "sandbox.start.uncaged" {
			return fmt.Sprint(e["sandbox_id"])
		}
	}
	t.Fatalf("no sandbox.start event\n%s", r)
	return ""
}

// syncBuffer is written by the process pipes and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a corral process the test is still watching.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	fx      *fixture
	stdout  *syncBuffer
	stderr  *syncBuffer
	ptm     *os.File // pty master when started on a pty
	ptyDone chan struct{}
	start   time.Time
	cancel  context.CancelFunc
	cmdline string
	audit   string
	done    chan struct{} // closed when the process has been waited for
	waitErr error
}

// startCorral starts `corral run` for the fixture. It is started through
// `sh -c 'exec corral ...'` so the supervisor's own pid can be handed to the
// workload (SUPPID) as an attack target: the shell's $$ becomes corral's pid.
func startCorral(t *testing.T, fx *fixture, o runOpts) *proc {
	t.Helper()
	m := fx.m
	state := fx.state
	if o.state != "" {
		state = o.state
	}
	fx.runs++
	audit := filepath.Join(fx.aux, fmt.Sprintf("audit-%d.log", fx.runs))
	args := []string{"--workdir", fx.W, "--state-dir", state, "--audit-log", audit,
		"--env", "HOSTPID=" + strconv.Itoa(os.Getpid())}
	if o.policy != "" {
		args = append(args, "--policy", fx.writePolicy(t, o.policy))
	}
	args = append(args, o.flags...)
	args = append(args, "--")
	args = append(args, o.args...)

	timeout := o.timeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	bin := corralBin
	if o.bin != "" {
		bin = o.bin
	}
	script := `exec "$0" run --env "SUPPID=$$" "$@"`
	if o.umask != "" {
		script = "umask " + o.umask + " && " + script
	}
	shArgs := append([]string{"-c", script, bin}, args...)
	cmd := exec.CommandContext(ctx, "/bin/sh", shArgs...)
	cmd.Dir = fx.W
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	if m.rootless {
		cmd.Env = append(cmd.Env, "HOME="+m.home, "XDG_STATE_HOME="+filepath.Join(m.home, "state"))
	} else {
		home, _ := os.UserHomeDir()
		cmd.Env = append(cmd.Env, "HOME="+home)
	}
	cmd.Env = append(cmd.Env, o.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if m.asUser {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(m.uid), Gid: uint32(m.gid), Groups: []uint32{}}
	}
	p := &proc{t: t, cmd: cmd, fx: fx, stdout: &syncBuffer{}, stderr: &syncBuffer{}, cancel: cancel, audit: audit,
		cmdline: fmt.Sprintf("%s run %s", bin, strings.Join(args, " "))}
	if o.pty {
		cmd.Env = append(cmd.Env, "TERM=xterm")
		ptm, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 160})
		if err != nil {
			cancel()
			t.Fatalf("start corral on a pty: %v", err)
		}
		p.ptm, p.ptyDone = ptm, make(chan struct{})
		go func() {
			// EIO once every slave is closed is the pty's EOF.
			_, _ = io.Copy(p.stdout, ptm)
			close(p.ptyDone)
		}()
	} else {
		cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
		if o.stdio != nil {
			cmd.Stdin, cmd.Stdout, cmd.Stderr = o.stdio[0], o.stdio[1], o.stdio[2]
		}
		if err := timerslack.StartWith(o.timerSlack, cmd.Start); err != nil {
			cancel()
			t.Fatalf("start corral: %v", err)
		}
	}
	p.start = time.Now()
	p.done = make(chan struct{})
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		cancel()
	})
	p.waitStarted(10 * time.Second)
	return p
}

// waitStarted returns once the run has locked its run directory, which it
// has when it reports its start (or its failure) in the audit log.
func (p *proc) waitStarted(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return
		default:
		}
		if b, err := os.ReadFile(p.audit); err == nil {
			for _, ev := range []string{`"sandbox.start"`, `"sandbox.start.uncaged"`, `"sandbox.setup_error"`, `"sandbox.compile_error"`} {
				if bytes.Contains(b, []byte(`"event":`+ev)) {
					return
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitOutput waits until stdout contains s.
func (p *proc) waitOutput(s string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.stdout.String(), s) {
		if time.Now().After(deadline) {
			p.t.Fatalf("%q did not appear on stdout within %v\nstdout:\n%s\nstderr:\n%s", s, timeout, p.stdout, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) wait() *result {
	p.t.Helper()
	<-p.done
	err := p.waitErr
	elapsed := time.Since(p.start)
	p.cancel()
	if p.ptm != nil {
		select {
		case <-p.ptyDone:
		case <-time.After(5 * time.Second):
		}
		p.ptm.Close()
	}
	r := &result{code: p.cmd.ProcessState.ExitCode(), stdout: p.stdout.String(), stderr: p.stderr.String(),
		elapsed: elapsed, cmdline: p.cmdline}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		p.t.Fatalf("wait for corral: %v", err)
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		r.code = 128 + int(ws.Signal())
	}
	r.events = readEvents(p.t, p.audit)
	return r
}

func runCorral(t *testing.T, fx *fixture, o runOpts) *result {
	t.Helper()
	return startCorral(t, fx, o).wait()
}

func readEvents(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log %s: line is not JSON: %q", path, sc.Text())
		}
		for _, k := range []string{"event", "sandbox_id", "session", "time"} {
			if _, ok := e[k]; !ok {
				t.Fatalf("audit event without %q: %s", k, sc.Text())
			}
		}
		out = append(out, e)
	}
	return out
}

// requireBlocked asserts the attack ran and was refused, with errnoName in
// its report when given.
func requireBlocked(t *testing.T, r *result, errnoName string) {
	t.Helper()
	line := reportLine(r.stdout)
	if r.code != 3 || !strings.HasPrefix(line, "BLOCKED:") {
		t.Fatalf("attack was not blocked (want exit 3 and BLOCKED)\n%s", r)
	}
	if errnoName != "" && !regexp.MustCompile(`\b(`+errnoName+`)\b`).MatchString(line) {
		t.Fatalf("attack blocked with the wrong error: want %s in %q\n%s", errnoName, line, r)
	}
	if len(r.find("sandbox.start")) != 1 {
		t.Fatalf("want exactly one sandbox.start event\n%s", r)
	}
	r.requireEvent(t, "sandbox.exit", map[string]any{"code": 3})
}

// reportLine is the attack's ESCAPED/BLOCKED line.
func reportLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "BLOCKED:") || strings.HasPrefix(l, "ESCAPED:") {
			return l
		}
	}
	return ""
}

// runOnHost runs the attack binary directly (no sandbox) as uid:gid, to
// prove an attack is real: it must succeed where corral is absent.
func runOnHost(t *testing.T, uid, gid int, dir string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(attackBin, args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOSTPID=" + strconv.Itoa(os.Getpid())}
	if os.Geteuid() == 0 && uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run attack on host: %v", err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// startSleeper starts corral with o running `/bin/sleep N`, N a number
// of about a million seconds no other test uses, and returns it with N and
// the workload's host pid once that process is the one of its kind in
// host /proc (within 10 s; else corral is killed and the test fails).
func startSleeper(t *testing.T, fx *fixture, o runOpts) (p *proc, n string, pid int) {
	t.Helper()
	n = strconv.Itoa(800000 + rand.IntN(199999))
	o.args = []string{"/bin/sleep", n}
	p = startCorral(t, fx, o)
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) == 0 && time.Now().Before(deadline); {
		pids = hostProcs("/bin/sleep", n)
		time.Sleep(20 * time.Millisecond)
	}
	if len(pids) != 1 {
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("want one workload `sleep %s` in host /proc, found %v\nstderr: %s", n, pids, p.stderr)
	}
	return p, n, pids[0]
}

// hostProcs returns the pids of host processes whose argv equals argv.
func hostProcs(argv ...string) []int {
	want := strings.Join(argv, "\x00") + "\x00"
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupDirs are the places corral's cgroup for id may live.
func cgroupDirs(id string) []string {
	var out []string
	for _, c := range []string{"memory", "pids", "cpu", "cpu,cpuacct"} {
		out = append(out, filepath.Join("/sys/fs/cgroup", c, "corral", id))
	}
	return append(out, filepath.Join("/sys/fs/cgroup/corral", id), filepath.Join("/sys/fs/cgroup/unified/corral", id))
}

func existing(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}
