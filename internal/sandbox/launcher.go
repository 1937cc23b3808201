package sandbox

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"slices"

	vns "github.com/vishvananda/netns"

	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/netthread"
	"github.com/corral-sandbox/corral/internal/linux/timerslack"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/trace"
)

// launcher is the OS thread the sandbox's init is cloned from. It stays
// locked until the init has exited, because the init's parent-death signal
// follows the thread that cloned it, not the process, and it is never the
// process's main thread (netthread.Go).
//
// As root it first makes the sandbox's network namespace on that thread
// and brings up its loopback; a second thread joins the namespace and sets
// up the capture there (proxy mode) while the init is cloned into it and
// starts, and while the supervisor goes on with the rest of its set-up.
// The init then skips both steps, which had kept it from building the
// root's mounts meanwhile. Rootless, the namespace must belong to the
// sandbox's user namespace, which only the init's own clone makes, so the
// init sets it up itself.
type launcher struct {
	// prepares says the thread makes the network namespace, with the
	// capture when capture is set.
	prepares bool
	capture  *capture.Config
	// nsDone is closed once the namespace exists with loopback up, or
	// has failed (nsErr); then ns is a handle to it, which stop closes.
	nsDone chan struct{}
	nsErr  error
	ns     vns.NsHandle
	// netDone is closed after nsDone, once the capture is set up or has
	// failed (netErr); in proxy mode listeners are then its sockets,
	// until the supervisor takes them.
	netDone   chan struct{}
	netErr    error
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
		cfg := capture.ConfigOf(pc)
		c = &cfg
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
		ns:       vns.None(),
		nsDone:   make(chan struct{}),
		netDone:  make(chan struct{}),
		launch:   make(chan launchRequest),
		quit:     make(chan struct{}),
	}
	tr = tr.Fork()
	netthread.Go(func() { l.run(tr) })
	return l
}

func (l *launcher) run(tr *trace.Tracer) {
	if l.prepares {
		l.prepareNamespace(tr)
	} else {
		close(l.nsDone)
		close(l.netDone)
	}
	if l.nsErr != nil {
		return
	}
	select {
	case r := <-l.launch:
		// The init inherits this thread's slack; rootless, nothing else
		// could have widened it (timerslack.WidenProcess).
		_ = timerslack.Set(timerslack.Wide)
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

// prepareNamespace moves the calling thread into a new network namespace
// with loopback up, and has another thread join it to set up the capture.
// Failures are the init's set-up steps of the same names.
func (l *launcher) prepareNamespace(tr *trace.Tracer) {
	step := "create network namespace"
	l.ns, l.nsErr = netthread.EnterNew()
	if l.nsErr == nil {
		step, l.nsErr = "bring up loopback", netthread.LoopbackUp()
	}
	if l.nsErr != nil {
		l.nsErr = &initproc.StepError{Step: step, Code: ExitSetupFailed, Err: l.nsErr}
		l.netErr = l.nsErr
	}
	tr.Step("network namespace, loopback (supervisor's init thread)")
	close(l.nsDone)
	if l.nsErr != nil || l.capture == nil {
		close(l.netDone)
		return
	}
	netthread.Go(func() {
		defer close(l.netDone)
		err := netthread.Join(l.ns)
		if err == nil {
			l.listeners, err = capture.Setup(*l.capture)
		}
		if err != nil {
			l.netErr = &initproc.StepError{Step: "set up network capture", Code: ExitSetupFailed, Err: err}
			return
		}
		tr.Step("capture rules, listeners (supervisor's capture thread)")
	})
}

// network waits for the namespace and its capture and returns the
// capture's listeners (proxy mode), which the caller then owns.
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
func (l *launcher) start(cmd *exec.Cmd, log *slog.Logger, done chan struct{}) error {
	<-l.nsDone
	if l.nsErr != nil {
		return l.nsErr
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
	if !netthread.In(l.ns, cmd.Process.Pid) {
		_ = cmd.Process.Kill()
		<-done
		return errors.New("the sandbox init is not in the network namespace prepared for it, or its namespace cannot be read")
	}
	return nil
}

// stop ends the thread if no init was started from it and, once the
// capture is done, closes listeners nobody took and the namespace's
// handle. It may be called more than once.
func (l *launcher) stop() {
	if l.stopped {
		return
	}
	l.stopped = true
	if !l.ended {
		close(l.quit)
	}
	<-l.netDone
	if !l.taken && l.listeners != nil {
		l.listeners.Close()
	}
	if l.ns.IsOpen() {
		l.ns.Close()
	}
}
