//go:build linux

package procident

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childOf waits for pid's only child and returns it.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
		if f := strings.Fields(string(b)); len(f) == 1 {
			c, _ := strconv.Atoi(f[0])
			return c
		}
	}
	t.Fatalf("pid %d has no child", pid)
	return 0
}

// watchOrSkip subscribes to the proc connector for the test, or skips
// (fails on CI, where CORRAL_NO_SKIP is set).
func watchOrSkip(t *testing.T) *ExecWatch {
	t.Helper()
	w, err := WatchExecs()
	if err != nil {
		if os.Getenv("CORRAL_NO_SKIP") == "1" {
			t.Fatalf("proc connector: %v", err)
		}
		t.Skipf("proc connector unavailable (needs root): %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestExecWatchOrdersForkAndExec(t *testing.T) {
	w := watchOrSkip(t)
	for _, tc := range []struct {
		name, script string
		want         bool
	}{
		// The child is forked by the shell that then stays the shell.
		{"forked after", "sleep 5 & wait", true},
		// The child is forked, then its parent becomes another program.
		{"forked before exec", "sleep 5 & exec sleep 6", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sh", "-c", tc.script)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			parent := cmd.Process.Pid
			child := childOf(t, parent)
			if tc.want == false {
				// Let the exec happen.
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if exe, _ := os.Readlink("/proc/" + strconv.Itoa(parent) + "/exe"); strings.HasSuffix(exe, "/sleep") {
						break
					}
				}
			}
			defer func() { _ = syscall.Kill(child, syscall.SIGKILL) }()
			if got := w.startedUnder(child, parent); got != tc.want {
				t.Errorf("startedUnder(%d, %d) = %v, want %v", child, parent, got, tc.want)
			}
			if !tc.want {
				return
			}
			// An exec the kernel has not reported yet shows only as another
			// executable in /proc; stand it in by recording a different one.
			w.mu.Lock()
			rec, known := w.exe[int32(parent)]
			w.exe[int32(parent)] = fileID{rec.dev, rec.ino + 1}
			w.mu.Unlock()
			if !known {
				t.Fatalf("no executable recorded for %d at its exec", parent)
			}
			if w.startedUnder(child, parent) {
				t.Errorf("startedUnder(%d, %d) = true while the parent runs another executable than its last reported exec", child, parent)
			}
		})
	}
}

// TestExecWatchKeepsArgvFromExec: an interpreter that rewrites its own
// command line and environment after exec is still known by those it was
// started with: here, that PYTHONPATH made it load code of the
// workload's choosing before its script, and LD_PRELOAD a library.
func TestExecWatchKeepsArgvFromExec(t *testing.T) {
	w, err := WatchExecs()
	if err != nil {
		if os.Getenv("CORRAL_NO_SKIP") == "1" {
			t.Fatalf("proc connector: %v", err)
		}
		t.Skipf("proc connector unavailable: %v", err)
	}
	defer w.Close()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	rewrite := `import sys, time
stat = open("/proc/self/stat").read()
f = stat[stat.rindex(")") + 2:].split()
start, end = int(f[45]), int(f[46])
env_start, env_end = int(f[47]), int(f[48])
new = b"python3\0/usr/local/bin/trusted.py\0"
with open("/proc/self/mem", "r+b", buffering=0) as m:
    m.seek(start)
    m.write(new + b"\0" * (end - start - len(new)))
    m.seek(env_start)
    m.write(b"\0" * (env_end - env_start))
print("rewritten", flush=True)
time.sleep(30)
`
	cmd := exec.Command(py, "-c", rewrite, strings.Repeat("x", 100))
	cmd.Env = append(os.Environ(), "PYTHONPATH=/nonexistent/evil", "LD_PRELOAD=/nonexistent/evil.so")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	buf := make([]byte, 64)
	if n, _ := out.Read(buf); !strings.Contains(string(buf[:n]), "rewritten") {
		t.Fatalf("the interpreter did not rewrite its argv: %q", buf[:n])
	}
	live, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
	if !strings.Contains(string(live), "trusted.py") {
		t.Fatalf("the rewrite did not show in /proc: %q", live)
	}
	if env, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/environ"); strings.Contains(string(env), "PYTHONPATH") {
		t.Fatalf("the rewrite did not clear the environment in /proc: %q", env)
	}
	at, ok := w.atExec(cmd.Process.Pid)
	if !ok || len(at.args) < 2 || at.args[1] != "-c" {
		t.Fatalf("argv at exec = %q, %v; want the python3 -c command line", at.args, ok)
	}
	if !strings.Contains(at.loads, "PYTHONPATH") {
		t.Fatalf("loads at exec = %q; want PYTHONPATH named", at.loads)
	}
	if !strings.Contains(at.preload, "LD_PRELOAD") {
		t.Fatalf("preload at exec = %q; want LD_PRELOAD named", at.preload)
	}
}

// TestExecWatchKnowsThreadsAndPrograms: a thread is attributed to its
// process from the events alone, and the stamp of the process's program
// changes when it execs, even into the same binary; so does the time it
// runs its program since, which a connect the kernel timed is checked
// against.
func TestExecWatchKnowsThreadsAndPrograms(t *testing.T) {
	w := watchOrSkip(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is the threaded program used here")
	}
	// A thread that stays, then an exec of python3 again on the same pid
	// once told to (a line on stdin).
	cmd := exec.Command(py, "-c", `import os, sys, threading, time
t = threading.Thread(target=time.sleep, args=(60,), daemon=True); t.start()
print(t.native_id, flush=True)
sys.stdin.readline()
os.execv(sys.executable, [sys.executable, "-c", "import time; print('again', flush=True); time.sleep(60)"])`)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var tid int
	if _, err := fmt.Fscan(out, &tid); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	tgid, stamp, ok := w.caller(tid)
	if !ok || tgid != pid {
		t.Fatalf("caller(thread %d) = %d, %v; want process %d", tid, tgid, ok, pid)
	}
	if tg, st, ok := w.caller(pid); !ok || tg != pid || st != stamp {
		t.Fatalf("caller(%d) = %d, %d, %v; want itself with the thread's stamp %d", pid, tg, st, ok, stamp)
	}
	if same, known := w.runs(pid, stamp); !same || !known {
		t.Fatalf("runs before the exec = %v, %v", same, known)
	}
	connected := monotonicNow(t)
	if same, known := w.runsSince(pid, connected); !same || !known {
		t.Fatalf("runsSince before the exec = %v, %v", same, known)
	}
	if same, known := w.runsSince(pid, 1); same || !known {
		t.Fatalf("runsSince a time before its fork = %v, %v; want false, known", same, known)
	}
	fmt.Fprintln(in)
	var again string
	if _, err := fmt.Fscan(out, &again); err != nil || again != "again" {
		t.Fatalf("exec'd program said %q, %v", again, err)
	}
	if same, known := w.runs(pid, stamp); same || !known {
		t.Fatalf("runs after an exec of the same binary = %v, %v; want false, known", same, known)
	}
	if same, known := w.runsSince(pid, connected); same || !known {
		t.Fatalf("runsSince a time before an exec of the same binary = %v, %v; want false, known", same, known)
	}
	if same, known := w.runsSince(pid, monotonicNow(t)); !same || !known {
		t.Fatalf("runsSince a time after the exec = %v, %v", same, known)
	}
}

// monotonicNow is CLOCK_MONOTONIC, the clock of the kernel's process
// events and of connhook's records.
func monotonicNow(t *testing.T) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}
