package sandbox

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// openPTY returns a pseudo-terminal pair closed when the test ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() {
		slave.Close()
		master.Close()
	})
	return master, slave
}

func openPipe(t *testing.T) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		w.Close()
	})
	return w
}

func termios(t *testing.T, f *os.File) unix.Termios {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	return *tio
}

// TestTerminalWiring: every terminal among fds 0–2, and only those, is
// replaced by the sandbox's pty for the workload and by /dev/null for the
// init; the workload's terminal output goes to stdout, stderr or stdin,
// the first that is a terminal.
func TestTerminalWiring(t *testing.T) {
	_, tty := openPTY(t)
	pipe := openPipe(t)
	cases := []struct {
		name  string
		stdio [3]*os.File
		want  [3]bool
		out   int // index into stdio; -1: no terminal at all
	}{
		{"none", [3]*os.File{pipe, pipe, pipe}, [3]bool{}, -1},
		{"nil stdio", [3]*os.File{}, [3]bool{}, -1},
		{"interactive", [3]*os.File{tty, tty, tty}, [3]bool{true, true, true}, 1},
		{"piped stdin", [3]*os.File{pipe, tty, tty}, [3]bool{false, true, true}, 1},
		{"stderr only", [3]*os.File{pipe, pipe, tty}, [3]bool{false, false, true}, 2},
		{"output to a file", [3]*os.File{tty, pipe, pipe}, [3]bool{true, false, false}, 0},
		{"stdout only", [3]*os.File{nil, tty, pipe}, [3]bool{false, true, false}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			term := newTerminal(tc.stdio)
			if (term == nil) != (tc.out < 0) {
				t.Fatalf("newTerminal = %v, want a terminal: %v", term, tc.out >= 0)
			}
			if got := term.fds(); got != tc.want {
				t.Errorf("pty on fds %v, want %v", got, tc.want)
			}
			if term != nil && term.out != tc.stdio[tc.out] {
				t.Errorf("output goes to fd %v, want fd %d", term.out, tc.out)
			}
			cmd := exec.Command("true")
			wireInit(cmd, tc.stdio, term)
			got := [3]any{cmd.Stdin, cmd.Stdout, cmd.Stderr}
			for i, f := range tc.stdio {
				if f == nil || tc.want[i] {
					if got[i] != nil {
						t.Errorf("init fd %d = %v, want /dev/null (nil)", i, got[i])
					}
				} else if got[i] != any(f) {
					t.Errorf("init fd %d = %v, want corral's own", i, got[i])
				}
			}
		})
	}
}

// TestTerminalRawOnlyForInput: with stdin piped, the user's terminal keeps
// its settings while output flows to it; with stdin a terminal it is raw
// while attached and restored afterwards.
func TestTerminalRawOnlyForInput(t *testing.T) {
	for _, interactive := range []bool{false, true} {
		name := map[bool]string{false: "piped stdin", true: "interactive"}[interactive]
		t.Run(name, func(t *testing.T) {
			userMaster, user := openPTY(t)
			sandboxMaster, sandboxSlave := openPTY(t)
			stdin := openPipe(t)
			if interactive {
				stdin = user
			}
			before := termios(t, user)
			term := newTerminal([3]*os.File{stdin, user, user})
			if err := term.attach(sandboxMaster); err != nil {
				t.Fatal(err)
			}
			raw := termios(t, user).Lflag&unix.ICANON == 0
			if raw != interactive {
				t.Errorf("user's terminal raw = %v while attached, want %v", raw, interactive)
			}
			if _, err := sandboxSlave.WriteString("from the workload\n"); err != nil {
				t.Fatal(err)
			}
			screen := make(chan string, 1)
			go func() {
				var got []byte
				b := make([]byte, 256)
				for !strings.Contains(string(got), "\n") {
					n, err := userMaster.Read(b)
					got = append(got, b[:max(n, 0)]...)
					if err != nil {
						break
					}
				}
				screen <- string(got)
			}()
			select {
			case s := <-screen:
				// One terminal, whichever, turns the newline into CR LF.
				if s != "from the workload\r\n" {
					t.Errorf("user's terminal shows %q, want %q", s, "from the workload\r\n")
				}
			case <-time.After(5 * time.Second):
				t.Error("the workload's output did not reach the user's terminal")
			}
			sandboxSlave.Close()
			term.restore()
			if after := termios(t, user); after != before {
				t.Errorf("user's terminal settings not restored:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}

// TestTerminalRestoredOnPanic: a panic in a copying goroutine ends corral
// without the deferred restore; the goroutine restores first.
func TestTerminalRestoredOnPanic(t *testing.T) {
	_, user := openPTY(t)
	sandboxMaster, _ := openPTY(t)
	before := termios(t, user)
	term := newTerminal([3]*os.File{user, user, user})
	if err := term.attach(sandboxMaster); err != nil {
		t.Fatal(err)
	}
	if termios(t, user).Lflag&unix.ICANON != 0 {
		t.Fatal("attach did not put the user's terminal in raw mode")
	}
	repanicked := func() (r any) {
		defer func() { r = recover() }()
		defer term.restoreOnPanic()
		panic("copy failed")
	}()
	if repanicked != "copy failed" {
		t.Errorf("restoreOnPanic swallowed the panic: recovered %v", repanicked)
	}
	if after := termios(t, user); after != before {
		t.Errorf("user's terminal settings not restored:\nbefore %+v\nafter  %+v", before, after)
	}
}
