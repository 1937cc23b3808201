package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// userTerminal is a pseudo-terminal standing in for the user's: the test
// holds the master (it "types" into it and reads the screen) and hands the
// slave to corral.
type userTerminal struct {
	master, slave *os.File
	screen        *syncBuffer
	closed        chan struct{}
}

func newUserTerminal(t *testing.T) *userTerminal {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatalf("open a pty for the user's terminal: %v", err)
	}
	if err := pty.Setsize(master, &pty.Winsize{Rows: 40, Cols: 160}); err != nil {
		t.Fatal(err)
	}
	u := &userTerminal{master: master, slave: slave, screen: &syncBuffer{}, closed: make(chan struct{})}
	go func() {
		_, _ = io.Copy(u.screen, master)
		close(u.closed)
	}()
	t.Cleanup(func() {
		slave.Close()
		master.Close()
		<-u.closed
	})
	return u
}

func (u *userTerminal) termios(t *testing.T) unix.Termios {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(u.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatalf("read the user's terminal settings: %v", err)
	}
	return *tio
}

// changed says how the user's terminal settings differ from before, or
// returns "" when corral left them as they were.
func (u *userTerminal) changed(t *testing.T, before unix.Termios) string {
	t.Helper()
	after := u.termios(t)
	if after == before {
		return ""
	}
	return fmt.Sprintf("the user's terminal settings changed (echo %v→%v, canonical %v→%v):\nbefore %+v\nafter  %+v",
		before.Lflag&unix.ECHO != 0, after.Lflag&unix.ECHO != 0, before.Lflag&unix.ICANON != 0, after.Lflag&unix.ICANON != 0,
		before, after)
}

// pending returns what is waiting to be read on the user's terminal: what
// the user typed that nobody consumed.
func (u *userTerminal) pending(t *testing.T) string {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(u.slave.Fd()), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 500); err != nil || n == 0 {
		return ""
	}
	buf := make([]byte, 4096)
	n, err := unix.Read(int(u.slave.Fd()), buf)
	if err != nil {
		t.Fatalf("read the user's terminal: %v", err)
	}
	return string(buf[:max(n, 0)])
}

// descendants lists the processes below pid, the sandbox's init and
// workload among them.
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, dir := range procs {
		b, err := os.ReadFile(dir + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		child, _ := strconv.Atoi(filepath.Base(dir))
		if len(f) > 1 {
			parent[child], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for child := range parent {
		for p, i := child, 0; i < 64 && p > 1; i++ {
			if p = parent[p]; p == pid {
				out = append(out, child)
				break
			}
		}
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// holders lists the descendants of pid that have the user's terminal open
// (the same inode on the same devpts, whatever path it shows there).
func (u *userTerminal) holders(t *testing.T, pid int) []string {
	t.Helper()
	var tty unix.Stat_t
	if err := unix.Fstat(int(u.slave.Fd()), &tty); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, child := range descendants(t, pid) {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", child))
		for _, fd := range fds {
			var st unix.Stat_t
			if unix.Stat(fd, &st) == nil && st.Dev == tty.Dev && st.Ino == tty.Ino {
				out = append(out, fmt.Sprintf("%s (pid %d, %s)", fd, child, comm(child)))
			}
		}
	}
	return out
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTerminalNotHandedToWorkload runs `echo task | corral run -- attack`
// with stdout and/or stderr on the user's terminal. The workload tries to
// read what the user types through its output descriptors, to switch the
// terminal's echo off and to push input with TIOCSTI. It must see its own
// pseudo-terminal instead: output still reaches the user, stdin is still
// the pipe, nothing typed reaches the workload, and the user's settings are
// untouched afterwards. The control runs with stdin on the terminal and
// output piped: there what the user types must reach the workload, through
// its pty, and its output must stay in the pipe.
func TestTerminalNotHandedToWorkload(t *testing.T) {
	t.Parallel()
	const secret = "typed-by-the-user-3141"
	cases := []struct {
		name string
		term [3]bool // which of corral's fds 0–2 are the user's terminal; the others are pipes
	}{
		{"stdout-and-stderr", [3]bool{false, true, true}},
		{"stderr-only", [3]bool{false, false, true}},
		{"control-stdin-only", [3]bool{true, false, false}},
	}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				fx := newFixture(t, m)
				u := newUserTerminal(t)
				before := u.termios(t)
				interactive := tc.term[0]

				stdio := []*os.File{u.slave, u.slave, u.slave}
				if !interactive {
					inR, inW, err := os.Pipe()
					if err != nil {
						t.Fatal(err)
					}
					defer inR.Close()
					if _, err := inW.WriteString("task\n"); err != nil {
						t.Fatal(err)
					}
					inW.Close()
					stdio[0] = inR
				}
				// fds 1 and 2 that are not the terminal share one pipe.
				piped := &syncBuffer{}
				pipeDone := make(chan struct{})
				outR, outW, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					_, _ = io.Copy(piped, outR)
					outR.Close()
					close(pipeDone)
				}()
				for fd := 1; fd <= 2; fd++ {
					if !tc.term[fd] {
						stdio[fd] = outW
					}
				}
				p := startCorral(t, fx, runOpts{args: []string{fx.attack, "tty-steal", secret, "3"}, stdio: stdio})
				outW.Close() // corral holds its own copy; EOF comes when it exits
				output := func() string { return u.screen.String() + piped.String() }
				waitFor(t, "the workload's READY", 20*time.Second, func() bool { return strings.Contains(output(), "READY") })
				held := u.holders(t, p.cmd.Process.Pid)
				if _, err := u.master.WriteString(secret + "\n"); err != nil {
					t.Fatal(err)
				}
				r := p.wait()
				select {
				case <-pipeDone:
				case <-time.After(5 * time.Second):
				}
				time.Sleep(100 * time.Millisecond) // the screen copy may trail the exit
				r.stdout = output()

				var problems []string
				fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
				line := reportLine(r.stdout)
				switch {
				case interactive && !strings.HasPrefix(line, "ESCAPED:"):
					fail("control: what the user typed on stdin's terminal should reach the workload (report %q)", line)
				case !interactive && !strings.HasPrefix(line, "BLOCKED:"):
					fail("the workload read what the user typed (report %q)", line)
				}
				if len(held) > 0 {
					fail("processes of the sandbox held the user's terminal: %v", held)
				}
				if d := u.changed(t, before); d != "" {
					fail("%s", d)
				}
				if got := u.pending(t); !interactive && !strings.Contains(got, secret) {
					fail("what the user typed was consumed: %q is waiting on the terminal", got)
				}

				// The workload saw a terminal exactly where the user has
				// one, its output went where it was sent, and piped stdin
				// still reached it.
				if !interactive && !strings.Contains(r.stdout, `stdin="task\n"`) {
					fail("the workload did not get the piped stdin")
				}
				for fd, isTerm := range tc.term {
					want, where := fmt.Sprintf("fd%d: not a terminal", fd), piped
					if isTerm {
						want, where = fmt.Sprintf("fd%d: terminal", fd), u.screen
					}
					if !strings.Contains(r.stdout, want) {
						fail("the workload should see %q", want)
					}
					if hello := fmt.Sprintf("fd%d-hello", fd); fd > 0 && !strings.Contains(where.String(), hello) {
						fail("%s should have reached the %s", hello, map[bool]string{true: "user's terminal", false: "pipe"}[isTerm])
					}
				}
				if len(problems) > 0 {
					t.Errorf("%s\n%s", strings.Join(problems, "\n"), r)
				}
			})
		}
	})
}

// TestTerminalRestored runs interactively (stdin on the user's terminal, so
// corral puts it in raw mode) and ends the run every way it can end early;
// the user's terminal must get its settings back each time.
func TestTerminalRestored(t *testing.T) {
	t.Parallel()
	sleep := func(fx *fixture) []string { return []string{fx.attack, "sleep", "30"} }
	cases := []struct {
		name  string
		args  func(fx *fixture) []string
		flags []string
		sig   syscall.Signal // sent to corral once raw mode is on
		kill  bool           // SIGKILL the workload from outside instead
		quick bool           // ends before raw mode can be seen
		code  int
	}{
		{name: "sigterm", args: sleep, sig: unix.SIGTERM, code: 128 + int(unix.SIGTERM)},
		{name: "sigint", args: sleep, sig: unix.SIGINT, code: 128 + int(unix.SIGINT)},
		{name: "sighup", args: sleep, sig: unix.SIGHUP, code: 128 + int(unix.SIGHUP)},
		{name: "workload-killed", args: sleep, kill: true, code: 128 + int(unix.SIGKILL)},
		{name: "walltime", args: sleep, flags: []string{"--timeout", "2s"}, code: 124},
		{name: "command-not-found", args: func(*fixture) []string { return []string{"/no/such/command"} }, quick: true, code: 127},
	}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				fx := newFixture(t, m)
				u := newUserTerminal(t)
				before := u.termios(t)
				p := startCorral(t, fx, runOpts{args: tc.args(fx), flags: tc.flags, timeout: 30 * time.Second,
					stdio: []*os.File{u.slave, u.slave, u.slave}})
				if !tc.quick {
					// Raw mode is the state to undo; without it this
					// would test nothing.
					waitFor(t, "corral to put the terminal in raw mode", 10*time.Second, func() bool {
						return u.termios(t).Lflag&unix.ICANON == 0
					})
				}
				if tc.sig != 0 {
					if err := p.cmd.Process.Signal(tc.sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
						t.Fatal(err)
					}
				}
				if tc.kill {
					var workload int
					waitFor(t, "the workload to start", 10*time.Second, func() bool {
						for _, pid := range descendants(t, p.cmd.Process.Pid) {
							if comm(pid) == "attack" {
								workload = pid
							}
						}
						return workload != 0
					})
					if err := unix.Kill(workload, unix.SIGKILL); err != nil {
						t.Fatal(err)
					}
				}
				r := p.wait()
				r.stdout = u.screen.String()
				if r.code != tc.code {
					t.Errorf("exit code %d, want %d\n%s", r.code, tc.code, r)
				}
				if d := u.changed(t, before); d != "" {
					t.Errorf("%s\n%s", d, r)
				}
			})
		}
	})
}
