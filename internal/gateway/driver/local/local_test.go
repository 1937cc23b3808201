package local

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// fakeCorral writes a script standing in for corral: it records its
// arguments in its working directory, then runs body. Like a corral that
// predates corral version --full-program, it fails that.
func fakeCorral(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "corral")
	script := "#!/bin/sh\n[ \"$1\" = version ] && exit 2\nprintf '%s\\n' \"$@\" > args.txt\n" + body + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

var testLink = driver.Link{URL: "https://127.0.0.1:7443", CAFile: "/gw/ca.pem", Token: "cgw_s_secret"}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func refPID(t *testing.T, ref string) int {
	pid, _, err := parseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestCreateInspectDelete(t *testing.T) {
	data := t.TempDir()
	d := New(fakeCorral(t, "exec sleep 60"), data)
	sb := store.Sandbox{ID: "sb1", Command: []string{"echo", "hi there"}, Env: []string{"A=1", "API_KEY=sk-secret value"}}
	ref, err := d.Create(context.Background(), sb, testLink)
	if err != nil {
		t.Fatal(err)
	}
	sb.DriverRef = ref
	pid := refPID(t, ref)
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) })

	st, err := d.Inspect(context.Background(), sb)
	if err != nil || !st.Running {
		t.Fatalf("Inspect = %+v, %v; want running", st, err)
	}
	dir := filepath.Join(data, "sandboxes", "sb1")
	tok, err := os.ReadFile(filepath.Join(dir, TokenFile))
	if err != nil || strings.TrimSpace(string(tok)) != testLink.Token {
		t.Fatalf("token file = %q, %v", tok, err)
	}
	if env, err := os.ReadFile(filepath.Join(dir, EnvFile)); err != nil || string(env) != "A=1\nAPI_KEY=sk-secret value\n" {
		t.Errorf("environment file = %q, %v", env, err)
	}
	for _, name := range []string{TokenFile, LogFile, EnvFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", name, fi.Mode(), err)
		}
	}
	work := filepath.Join(dir, WorkDir)
	var args []string
	waitFor(t, "the recorded arguments", func() bool {
		data, err := os.ReadFile(filepath.Join(work, "args.txt"))
		args = strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		return err == nil && len(args) > 1
	})
	want := []string{"run", "--gateway", testLink.URL, "--gateway-ca", testLink.CAFile, "--gateway-token-file", filepath.Join(dir, TokenFile),
		"--gateway-host-keys", "--workdir", work, "--env-file", filepath.Join(dir, EnvFile), "--", "echo", "hi there"}
	if !slices.Equal(args, want) {
		t.Errorf("supervisor arguments\n got %q\nwant %q", args, want)
	}

	// The values stay off the command line, which every host user reads.
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || strings.Contains(string(cmdline), "sk-secret") {
		t.Errorf("supervisor command line %q (%v) holds an environment value", cmdline, err)
	}
	if err := d.Check(store.Sandbox{Env: []string{"A=line\nbreak"}}); err == nil || !strings.Contains(err.Error(), "line break") {
		t.Errorf("Check of a value with a line break = %v, want a refusal", err)
	}

	// Detached: a session and process group of its own, no terminal, and
	// stdin from /dev/null.
	if sid, _ := unix.Getsid(pid); sid != pid {
		t.Errorf("supervisor session %d, want its own (%d)", sid, pid)
	}
	if pgid, _ := unix.Getpgid(pid); pgid == unix.Getpgrp() {
		t.Errorf("supervisor is in the gateway's process group %d", pgid)
	}
	if in, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", pid)); in != os.DevNull {
		t.Errorf("supervisor stdin = %s, want /dev/null", in)
	}

	if err := d.Delete(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if st, _ := d.Inspect(context.Background(), sb); st.Running {
		t.Error("running after Delete")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox directory left after Delete: %v", err)
	}
	// Reaped: no zombie left. Delete returns once the supervisor is dead;
	// the driver's reaper collects it a moment later.
	waitFor(t, fmt.Sprintf("supervisor %d to leave /proc after Delete (a zombie?)", pid), func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err)
	})
	if err := d.Delete(context.Background(), sb); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func TestExitCodeOfAReapedSupervisor(t *testing.T) {
	d := New(fakeCorral(t, "exit 3"), t.TempDir())
	sb := store.Sandbox{ID: "sb2", Command: []string{"true"}}
	ref, err := d.Create(context.Background(), sb, testLink)
	if err != nil {
		t.Fatal(err)
	}
	sb.DriverRef = ref
	var st driver.Status
	waitFor(t, "the exit", func() bool {
		st, err = d.Inspect(context.Background(), sb)
		return err == nil && st.ExitCode != nil
	})
	if st.Running || *st.ExitCode != 3 {
		t.Errorf("status = %+v (code %d), want exited 3", st, *st.ExitCode)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", refPID(t, ref))); !os.IsNotExist(err) {
		t.Errorf("exited supervisor not reaped: %v", err)
	}
}

func TestDeleteKillsASupervisorIgnoringSIGTERM(t *testing.T) {
	d := New(fakeCorral(t, "trap '' TERM\nexec sleep 60"), t.TempDir())
	d.Grace = 200 * time.Millisecond
	sb := store.Sandbox{ID: "sb3", Command: []string{"true"}}
	ref, err := d.Create(context.Background(), sb, testLink)
	if err != nil {
		t.Fatal(err)
	}
	sb.DriverRef = ref
	t.Cleanup(func() { _ = unix.Kill(refPID(t, ref), unix.SIGKILL) })
	time.Sleep(100 * time.Millisecond) // the trap is set
	begin := time.Now()
	if err := d.Delete(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	st, _ := d.Inspect(context.Background(), sb)
	if st.Running || time.Since(begin) < d.Grace {
		t.Errorf("after Delete: %+v in %s; want killed after the grace", st, time.Since(begin))
	}
}

// A reference whose pid now belongs to another process (the start time
// differs) is not that process: Inspect says gone, and Delete leaves the
// process alone.
func TestStartTimeGuardsAgainstPidReuse(t *testing.T) {
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	start, _, err := procStat(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	d := New("/nonexistent", t.TempDir())
	sb := store.Sandbox{ID: "sb4", DriverRef: fmt.Sprintf("pid:%d:%d", other.Process.Pid, start+1)}
	st, err := d.Inspect(context.Background(), sb)
	if err != nil || st.Running {
		t.Fatalf("Inspect of a reused pid = %+v, %v; want not running", st, err)
	}
	if err := d.Delete(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(other.Process.Pid, 0); err != nil {
		t.Fatalf("Delete signalled the process that reuses the pid: %v", err)
	}
	// The right start time does identify it.
	sb.DriverRef = fmt.Sprintf("pid:%d:%d", other.Process.Pid, start)
	if st, _ := d.Inspect(context.Background(), sb); !st.Running {
		t.Errorf("Inspect with the right start time = %+v, want running", st)
	}

	for _, bad := range []string{"", "pid:x:1", "pid:12", "k8s:pod"} {
		sb.DriverRef = bad
		if _, err := d.Inspect(context.Background(), sb); err == nil {
			t.Errorf("Inspect(%q): want an error", bad)
		}
	}
	if _, err := d.Create(context.Background(), store.Sandbox{ID: "../x", Command: []string{"true"}}, testLink); err == nil {
		t.Error("Create with id ../x: want an error")
	}
}

// gatewayHelper is the test binary standing in for a gateway: it creates
// one sandbox, prints its reference and waits to be killed.
const gatewayHelper = "CORRAL_TEST_LOCAL_GATEWAY"

func TestMain(m *testing.M) {
	if spec := os.Getenv(gatewayHelper); spec != "" {
		bin, data, _ := strings.Cut(spec, ":")
		ref, err := New(bin, data).Create(context.Background(), store.Sandbox{ID: "survivor", Command: []string{"true"}}, testLink)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(ref)
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The gateway's process group is killed (a restart, systemd stopping the
// service): the supervisors it started live on, and a new driver finds
// and deletes them.
func TestSupervisorSurvivesGatewayRestart(t *testing.T) {
	data := t.TempDir()
	gw := exec.Command(os.Args[0], "-test.run=^$")
	gw.Env = append(os.Environ(), gatewayHelper+"="+fakeCorral(t, "exec sleep 60")+":"+data)
	gw.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := gw.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "pid:") {
		t.Fatalf("gateway helper said %q, %v", line, err)
	}
	sb := store.Sandbox{ID: "survivor", DriverRef: strings.TrimSpace(line)}
	pid := refPID(t, sb.DriverRef)
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) })

	if err := unix.Kill(-gw.Process.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = gw.Wait()
	time.Sleep(100 * time.Millisecond)

	d := New("/nonexistent", data)
	st, err := d.Inspect(context.Background(), sb)
	if err != nil || !st.Running {
		t.Fatalf("after the gateway's process group was killed: %+v, %v; want the supervisor running", st, err)
	}
	if err := d.Delete(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if st, _ := d.Inspect(context.Background(), sb); st.Running {
		t.Error("running after Delete by the restarted gateway's driver")
	}
}

// A sandbox's working directory must lie in a directory the gateway lets
// sandboxes use, symbolic links resolved: the supervisor runs as root and
// mounts it read-write.
func TestWorkdirConfined(t *testing.T) {
	root := t.TempDir()
	allowed := filepath.Join(root, "projects")
	inside := filepath.Join(allowed, "a")
	outside := filepath.Join(root, "secret")
	for _, d := range []string{inside, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	escape := filepath.Join(allowed, "escape")
	if err := os.Symlink(outside, escape); err != nil {
		t.Fatal(err)
	}
	d := New("/nonexistent/corral", t.TempDir())
	check := func(workdir string) error { return d.Check(store.Sandbox{ID: "x", Workdir: workdir}) }
	if err := check(""); err != nil {
		t.Errorf("no workdir (the driver's own): %v", err)
	}
	if err := check(inside); err == nil {
		t.Error("with no --allow-workdir, a host directory was accepted")
	}
	d.Workdirs = []string{allowed}
	for _, ok := range []string{allowed, inside} {
		if err := check(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{outside, escape, "/", "/root", "relative/dir", allowed + "x"} {
		if err := check(bad); err == nil {
			t.Errorf("%s was accepted", bad)
		}
	}
	if _, err := d.Create(context.Background(), store.Sandbox{ID: "x", Command: []string{"true"}, Workdir: escape}, driver.Link{}); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("Create with a workdir leading outside: %v", err)
	}
}

// The driver starts supervisors as corral's full program, which corral
// names, rather than as corral, which would exec it after its own start;
// and asks again once that program is gone (a corral of another build
// removed it).
func TestStartsTheFullProgram(t *testing.T) {
	names := filepath.Join(t.TempDir(), "full-path")
	lean := fakeCorral(t, "")
	script := "#!/bin/sh\n[ \"$1 $2\" = 'version --full-program' ] && cat " + names + " && exit 0\necho lean > ran-as\nexec sleep 60\n"
	if err := os.WriteFile(lean, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := New(lean, t.TempDir())
	var previous string
	for _, id := range []string{"one", "two"} {
		if previous != "" {
			if err := os.Remove(previous); err != nil {
				t.Fatal(err)
			}
		}
		full := fakeCorral(t, "echo "+id+" > ran-as\nexec sleep 60")
		if err := os.WriteFile(names, []byte(full+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		previous = full
		ref, err := d.Create(context.Background(), store.Sandbox{ID: id, Command: []string{"true"}}, testLink)
		if err != nil {
			t.Fatal(err)
		}
		pid := refPID(t, ref)
		t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) })
		marker := filepath.Join(d.data, "sandboxes", id, WorkDir, "ran-as")
		var got []byte
		waitFor(t, "the supervisor", func() bool { got, err = os.ReadFile(marker); return err == nil && len(got) > 0 })
		if strings.TrimSpace(string(got)) != id {
			t.Fatalf("supervisor %s ran as %q, want the full program corral named then", id, got)
		}
	}
}

// TestStateDirPassedOn: a driver given a state directory has corral write
// its full program there and runs every supervisor on it.
func TestStateDirPassedOn(t *testing.T) {
	state := t.TempDir()
	full := fakeCorral(t, "exec sleep 60")
	lean := fakeCorral(t, "")
	script := "#!/bin/sh\n[ \"$*\" = 'version --full-program --state-dir " + state + "' ] && echo " + full + " && exit 0\nexit 2\n"
	if err := os.WriteFile(lean, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := New(lean, t.TempDir())
	d.StateDir = state
	ref, err := d.Create(context.Background(), store.Sandbox{ID: "sb", Command: []string{"true"}}, testLink)
	if err != nil {
		t.Fatal(err)
	}
	pid := refPID(t, ref)
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) })
	var args []string
	waitFor(t, "the full program's arguments", func() bool {
		data, err := os.ReadFile(filepath.Join(d.data, "sandboxes", "sb", WorkDir, "args.txt"))
		args = strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		return err == nil && len(args) > 1
	})
	if i := slices.Index(args, "--state-dir"); i < 0 || i+1 >= len(args) || args[i+1] != state || slices.Index(args, "--") < i {
		t.Errorf("supervisor arguments %q lack --state-dir %s before the command", args, state)
	}
}
