package sandbox

import (
	"fmt"
	"os/exec"
	"slices"

	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/netns"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/trace"
)

// launcher is the OS thread the sandbox's init is cloned from. It stays
// locked until the init has exited, because the init's parent-death signal
// follows the thread that cloned it, not the process, and it is never the
// process's main thread (netns.Go).
//
// As root it first makes the sandbox's network namespace on that thread
// and sets it up, loopback and (in proxy mode) the capture, while the
// supervisor goes on with the rest of its set-up on the other core; the
// init is then cloned into that namespace ready and skips both steps,
// which had kept it from building the root's mounts concurrently.
// Rootless, the namespace must belong to the sandbox's user namespace,
// which only the init's own clone makes, so the init sets it up itself.
type launcher struct {
	// prepares says the thread makes the network namespace.
	prepares bool
	// netDone is closed once the namespace is set up or has failed
	// (netErr); then ino is its inode and, in proxy mode, listeners are
	// the capture's sockets until the supervisor takes them.
	netDone   chan struct{}
	netErr    error
	ino       uint64
	listeners *capture.Listeners
	taken     bool

	launch chan launchRequest
	quit   chan struct{}
	ended  bool
}

type launchRequest struct {
	cmd     *exec.Cmd
	started chan<- error
	// done is closed once the init has exited and been reaped.
	done chan<- struct{}
}

// newLauncher starts the thread; stop must be called whatever happens.
func (s *supervisor) newLauncher() *launcher {
	l := &launcher{
		prepares: !s.Plan.Rootless && slices.Contains(s.Plan.Namespaces, "net"),
		netDone:  make(chan struct{}),
		launch:   make(chan launchRequest),
		quit:     make(chan struct{}),
	}
	c, tr := s.Plan.Network.Capture, s.Trace.Fork()
	netns.Go(func() { l.run(s, c, tr) })
	return l
}

func (l *launcher) run(s *supervisor, c *plan.Capture, tr *trace.Tracer) {
	if l.prepares {
		l.ino, l.listeners, l.netErr = prepareNetwork(c, tr)
	}
	close(l.netDone)
	if l.netErr != nil {
		return
	}
	select {
	case r := <-l.launch:
		if err := r.cmd.Start(); err != nil {
			r.started <- err
			return
		}
		r.started <- nil
		if err := awaitExit(r.cmd.Process.Pid); err != nil {
			s.Log.Debug("wait for the sandbox init in the poller", "err", err)
		}
		_ = r.cmd.Wait()
		close(r.done)
	case <-l.quit:
	}
}

// prepareNetwork moves the calling thread into a new network namespace
// with loopback up and, given c, the capture's routes, rules and
// listeners. Failures are the init's set-up steps of the same names.
func prepareNetwork(c *plan.Capture, tr *trace.Tracer) (uint64, *capture.Listeners, error) {
	ino, err := netns.EnterNew()
	if err == nil {
		err = netns.LoopbackUp()
	}
	if err != nil {
		return 0, nil, &initproc.StepError{Step: "bring up loopback", Code: ExitSetupFailed, Err: err}
	}
	tr.Step("network namespace, loopback (supervisor's init thread)")
	if c == nil {
		return ino, nil, nil
	}
	ls, err := capture.Setup(capture.Config{DNSPort: c.DNSPort, TransparentPort: c.TransparentPort,
		HTTPProxyPort: c.HTTPProxyPort, SOCKSPort: c.SOCKSPort})
	if err != nil {
		return 0, nil, &initproc.StepError{Step: "set up network capture", Code: ExitSetupFailed, Err: err}
	}
	tr.Step("capture rules, listeners (supervisor's init thread)")
	return ino, ls, nil
}

// network waits for the namespace and returns its listeners (proxy
// mode), which the caller then owns.
func (l *launcher) network() (*capture.Listeners, error) {
	<-l.netDone
	if l.netErr != nil {
		return nil, l.netErr
	}
	l.taken = true
	return l.listeners, nil
}

// start clones cmd from the thread, into the prepared namespace if there
// is one, and checks that the init is in it; done is closed once the init
// has exited.
func (l *launcher) start(cmd *exec.Cmd, done chan<- struct{}) error {
	<-l.netDone
	if l.netErr != nil {
		return l.netErr
	}
	started := make(chan error, 1)
	l.launch <- launchRequest{cmd: cmd, started: started, done: done}
	l.ended = true
	if err := <-started; err != nil {
		return err
	}
	if !l.prepares {
		return nil
	}
	// The clone left out CLONE_NEWNET: had the thread not been in the
	// prepared namespace, the init would share another's.
	ino, err := netns.Of(cmd.Process.Pid)
	if err != nil {
		return err
	}
	if ino != l.ino {
		return fmt.Errorf("the sandbox init is not in the network namespace prepared for it (%d, not %d)", ino, l.ino)
	}
	return nil
}

// stop ends the thread if no init was started from it, and closes
// listeners nobody took.
func (l *launcher) stop() {
	if !l.ended {
		close(l.quit)
		<-l.netDone
	}
	if !l.taken && l.listeners != nil {
		l.listeners.Close()
	}
}
