package sandbox

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"

	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/netns"
	"github.com/corral-sandbox/corral/internal/policy"
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
	// prepares says the thread makes the network namespace, with the
	// capture when capture is set.
	prepares bool
	capture  *capture.Config
	// netDone is closed once the namespace is set up or has failed
	// (netErr); then ino is its inode and, in proxy mode, listeners are
	// the capture's sockets until the supervisor takes them.
	netDone   chan struct{}
	netErr    error
	ino       uint64
	listeners *capture.Listeners
	taken     bool

	launch  chan launchRequest
	quit    chan struct{}
	ended   bool
	stopped bool
}

type launchRequest struct {
	cmd     *exec.Cmd
	log     *slog.Logger
	started chan<- error
	// done is closed once the init has exited and been reaped.
	done chan<- struct{}
}

// Launcher is a sandbox's launcher started ahead of the run, so that as
// root its network namespace is made while corral still builds the plan.
type Launcher struct{ l *launcher }

// StartLauncher starts the launcher of a sandbox whose policy's network
// mode is mode, as early as that is known; Run takes it through
// Options.Launcher if its plan asks for what it prepared and makes
// another otherwise. It is nil where there is nothing to start early
// (rootless, or the host's network), and Stop ends it if the run never
// does.
func StartLauncher(mode string, tr *trace.Tracer) *Launcher {
	if os.Geteuid() != 0 || mode == policy.ModeAllow {
		return nil
	}
	var c *capture.Config
	if mode == policy.ModeProxy {
		c = &capture.DefaultConfig
	}
	return &Launcher{startLauncher(true, c, tr)}
}

// Stop ends the launcher if no init was started from it; nil is a no-op.
func (l *Launcher) Stop() {
	if l != nil {
		l.l.stop()
	}
}

// launcherFor returns the launcher the plan needs: the early one if it
// prepared just that, else a new one (stopping the early one).
func (s *supervisor) launcherFor(early *Launcher) *launcher {
	prepares := !s.Plan.Rootless && slices.Contains(s.Plan.Namespaces, "net")
	var c *capture.Config
	if pc := s.Plan.Network.Capture; pc != nil && prepares {
		c = &capture.Config{DNSPort: pc.DNSPort, TransparentPort: pc.TransparentPort,
			HTTPProxyPort: pc.HTTPProxyPort, SOCKSPort: pc.SOCKSPort}
	}
	if early != nil {
		l := early.l
		if l.prepares == prepares && (l.capture == nil) == (c == nil) && (c == nil || *l.capture == *c) {
			return l
		}
		l.stop()
	}
	return startLauncher(prepares, c, s.Trace)
}

func startLauncher(prepares bool, c *capture.Config, tr *trace.Tracer) *launcher {
	l := &launcher{
		prepares: prepares,
		capture:  c,
		netDone:  make(chan struct{}),
		launch:   make(chan launchRequest),
		quit:     make(chan struct{}),
	}
	tr = tr.Fork()
	netns.Go(func() { l.run(tr) })
	return l
}

func (l *launcher) run(tr *trace.Tracer) {
	if l.prepares {
		l.ino, l.listeners, l.netErr = prepareNetwork(l.capture, tr)
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
			r.log.Debug("wait for the sandbox init in the poller", "err", err)
		}
		_ = r.cmd.Wait()
		close(r.done)
	case <-l.quit:
	}
}

// prepareNetwork moves the calling thread into a new network namespace
// with loopback up and, given c, the capture's routes, rules and
// listeners. Failures are the init's set-up steps of the same names.
func prepareNetwork(c *capture.Config, tr *trace.Tracer) (uint64, *capture.Listeners, error) {
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
	ls, err := capture.Setup(*c)
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
func (l *launcher) start(cmd *exec.Cmd, log *slog.Logger, done chan<- struct{}) error {
	<-l.netDone
	if l.netErr != nil {
		return l.netErr
	}
	started := make(chan error, 1)
	l.launch <- launchRequest{cmd: cmd, log: log, started: started, done: done}
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
// listeners nobody took. It may be called more than once.
func (l *launcher) stop() {
	if l.stopped {
		return
	}
	l.stopped = true
	if !l.ended {
		close(l.quit)
		<-l.netDone
	}
	if !l.taken && l.listeners != nil {
		l.listeners.Close()
	}
}
