package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// terminal connects the user's terminal to a pseudo-terminal that the
// sandbox's init allocated from the sandbox's own devpts. No process in the
// sandbox ever holds a descriptor of the user's terminal, not even one
// meant only for output: any such descriptor is the whole terminal, so the
// workload could read what the user types, switch echo off for good, or
// push keystrokes into the user's shell (TIOCSTI). Job control would fail
// too, because that terminal already belongs to another session, and a pty
// from the host's devpts would not exist at its path inside, so ttyname()
// would fail. So each of fds 0–2 that is a terminal becomes the sandbox's
// pty for the workload, and the others keep their redirections.
type terminal struct {
	stdio [3]*os.File // corral's own fds 0–2
	tty   [3]bool     // which of them are terminals
	// out is where the workload's terminal output goes: stdout if it is a
	// terminal, else stderr, else stdin (a terminal is usually open for
	// both reading and writing, and echo must show somewhere).
	out    *os.File
	master *os.File
	// state holds the user's settings while raw mode is on.
	state *term.State
	// drained closes when the workload's last output has been copied.
	drained  chan struct{}
	restored sync.Once
}

// newTerminal returns nil when none of stdio is a terminal.
func newTerminal(stdio [3]*os.File) *terminal {
	t := &terminal{stdio: stdio}
	for i, f := range stdio {
		t.tty[i] = f != nil && term.IsTerminal(int(f.Fd()))
	}
	for _, i := range []int{1, 2, 0} {
		if t.tty[i] {
			t.out = stdio[i]
			return t
		}
	}
	return nil
}

// fds says which of the workload's fds 0–2 are the sandbox's pty.
func (t *terminal) fds() [3]bool {
	if t == nil {
		return [3]bool{}
	}
	return t.tty
}

// wireInit gives the init corral's fds 0–2 (stdio), except that each
// terminal among them is replaced by /dev/null (what exec.Cmd opens for
// nil). t may be nil.
func wireInit(cmd *exec.Cmd, stdio [3]*os.File, t *terminal) {
	keep := func(i int) bool { return stdio[i] != nil && (t == nil || !t.tty[i]) }
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
	if keep(0) {
		cmd.Stdin = stdio[0]
	}
	if keep(1) {
		cmd.Stdout = stdio[1]
	}
	if keep(2) {
		cmd.Stderr = stdio[2]
	}
}

// attach starts copying between the user's terminal and master. Only when
// the user types into the workload (stdin is a terminal) does the user's
// terminal go into raw mode, so that the sandbox's line discipline does the
// cooking; otherwise nothing the user types reaches the sandbox, and the
// user's settings are never touched.
func (t *terminal) attach(master *os.File) error {
	t.master = master
	t.resize()
	if t.tty[0] {
		st, err := term.MakeRaw(int(t.stdio[0].Fd()))
		if err != nil {
			return fmt.Errorf("put the user's terminal in raw mode: %w", err)
		}
		t.state = st
		go t.copyIn()
	} else if err := cookOnce(master); err != nil {
		return err
	}
	t.drained = make(chan struct{})
	go t.copyOut()
	return nil
}

// cookOnce turns output processing off on the sandbox's pty when the
// user's terminal stays cooked: that terminal already turns "\n" into
// "\r\n", and doing it twice leaves "\r\r\n" in logs and recordings.
// Termios requests on a pty master act on its slave.
func cookOnce(master *os.File) error {
	tio, err := unix.IoctlGetTermios(int(master.Fd()), unix.TCGETS)
	if err != nil {
		return fmt.Errorf("read sandbox terminal settings: %w", err)
	}
	tio.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(int(master.Fd()), unix.TCSETS, tio); err != nil {
		return fmt.Errorf("set sandbox terminal settings: %w", err)
	}
	return nil
}

func (t *terminal) copyIn() {
	defer t.restoreOnPanic()
	buf := make([]byte, 32<<10)
	for {
		n, err := t.stdio[0].Read(buf)
		if n > 0 {
			if _, werr := t.master.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// copyOut keeps draining the pty after the user's terminal refuses a write
// (a hang-up, a stdin open only for reading): a full pty would block the
// workload.
func (t *terminal) copyOut() {
	defer close(t.drained)
	defer t.restoreOnPanic()
	buf := make([]byte, 32<<10)
	out := t.out
	for {
		n, err := t.master.Read(buf)
		if n > 0 && out != nil {
			if _, werr := out.Write(buf[:n]); werr != nil {
				out = nil
			}
		}
		if err != nil {
			return
		}
	}
}

// restoreOnPanic gives the user's settings back before a panic in a
// goroutine ends corral, which skips the deferred restore in run.
func (t *terminal) restoreOnPanic() {
	if r := recover(); r != nil {
		t.restoreSettings()
		panic(r)
	}
}

func (t *terminal) resize() {
	if t != nil && t.master != nil {
		_ = pty.InheritSize(t.out, t.master)
	}
}

func (t *terminal) restoreSettings() {
	t.restored.Do(func() {
		if t.state != nil {
			_ = term.Restore(int(t.stdio[0].Fd()), t.state)
		}
	})
}

func (t *terminal) restore() {
	if t == nil {
		return
	}
	if t.drained != nil {
		// The copy ends with EIO once every slave fd is closed; a stray
		// process holding one must not hang corral.
		select {
		case <-t.drained:
		case <-time.After(time.Second):
		}
	}
	t.restoreSettings()
	if t.master != nil {
		t.master.Close()
	}
}
