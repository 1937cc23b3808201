package sandbox

import (
	"io"
	"os"
	"time"

	"github.com/creack/pty"
	"golang.org/x/term"
)

// terminal connects the user's terminal to a pseudo-terminal that the
// sandbox's init allocated from the sandbox's own devpts. Handing the
// workload the user's terminal instead would let it push keystrokes into the
// user's shell (TIOCSTI) and make job control impossible, because that
// terminal already belongs to another session; a pty from the host's devpts
// would not exist at its path inside, so ttyname() would fail.
type terminal struct {
	host   *os.File
	master *os.File
	state  *term.State
	// drained closes when the workload's last output has been copied.
	drained chan struct{}
}

// newTerminal returns nil when stdin is not a terminal.
func newTerminal(stdin *os.File) *terminal {
	if stdin == nil || !term.IsTerminal(int(stdin.Fd())) {
		return nil
	}
	return &terminal{host: stdin}
}

// attach puts the user's terminal in raw mode (the sandbox's line
// discipline does the cooking) and copies between it and master.
func (t *terminal) attach(master *os.File) error {
	t.master = master
	t.resize()
	st, err := term.MakeRaw(int(t.host.Fd()))
	if err != nil {
		return err
	}
	t.state = st
	go func() { _, _ = io.Copy(master, t.host) }()
	t.drained = make(chan struct{})
	go func() {
		_, _ = io.Copy(os.Stdout, master)
		close(t.drained)
	}()
	return nil
}

func (t *terminal) resize() {
	if t != nil && t.master != nil {
		_ = pty.InheritSize(t.host, t.master)
	}
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
	if t.state != nil {
		_ = term.Restore(int(t.host.Fd()), t.state)
	}
	if t.master != nil {
		t.master.Close()
	}
}
