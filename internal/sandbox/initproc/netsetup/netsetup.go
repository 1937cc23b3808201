// Package netsetup is how the sandbox's init makes the sandbox's network
// when it must (rootless): loopback up, and the capture whose listeners it
// hands to the supervisor. It is kept apart from the init so that the init
// program run as root, whose network the supervisor makes, links none of
// it (cmd/corral-init against cmd/corral-netinit).
package netsetup

import (
	"os"

	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/netthread"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
)

// Network is the init's network set-up.
var Network = &initproc.Network{LoopbackUp: netthread.LoopbackUp, Capture: setupCapture}

// setupCapture routes every packet of the namespace to corral's listeners
// and hands those listeners to the supervisor, which serves them from the
// host's network namespace.
func setupCapture(sup *os.File, c *plan.Capture) error {
	l, err := capture.Setup(capture.ConfigOf(c))
	if err != nil {
		return err
	}
	defer l.Close()
	var fds []int
	for _, f := range l.Files() {
		fds = append(fds, int(f.Fd()))
	}
	return initproc.SendFDs(sup, initproc.Message{Type: initproc.MsgNetwork}, fds...)
}
