package sandbox

import (
	"io"
	"os"

	"github.com/creack/pty"
	"golang.org/x/term"
)

// terminal gives an interactive workload its own pseudo-terminal. Handing
// it the user's terminal instead would let it push keystrokes into the
// user's shell (TIOCSTI) and would make job control impossible, because the
// user's terminal already belongs to another session.
type terminal struct {
	host   *os.File
	master *os.File
	slave  *os.File
	state  *term.State
}

// newTerminal returns nil when stdin is not a terminal.
func newTerminal(stdin *os.File) (*terminal, error) {
	if stdin == nil || !term.IsTerminal(int(stdin.Fd())) {
		return nil, nil
	}
	master, slave, err := pty.Open()
	if err != nil {
		return nil, err
	}
	t := &terminal{host: stdin, master: master, slave: slave}
	t.resize()
	if t.state, err = term.MakeRaw(int(stdin.Fd())); err != nil {
		master.Close()
		slave.Close()
		return nil, err
	}
	return t, nil
}

// pump copies between the user's terminal and the sandbox's.
func (t *terminal) pump() {
	go func() { _, _ = io.Copy(t.master, t.host) }()
	go func() { _, _ = io.Copy(os.Stdout, t.master) }()
}

func (t *terminal) resize() {
	if t != nil {
		_ = pty.InheritSize(t.host, t.master)
	}
}

func (t *terminal) restore() {
	if t == nil {
		return
	}
	_ = term.Restore(int(t.host.Fd()), t.state)
	t.master.Close()
}
