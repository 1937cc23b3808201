// Package sandbox is the supervisor side of one sandbox: it starts the
// in-namespace init, puts it in its cgroup, forwards signals, enforces the
// walltime, reports how the workload ended, and removes every piece of host
// state it made, whatever happens.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/advisor/service"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/egress/assemble"
	"github.com/corral-sandbox/corral/internal/linux/cgroup"
	"github.com/corral-sandbox/corral/internal/linux/connhook"
	"github.com/corral-sandbox/corral/internal/linux/procident"
	"github.com/corral-sandbox/corral/internal/linux/seccomp"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/reload"
	"github.com/corral-sandbox/corral/internal/sandbox/initbin"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/statedir"
	"github.com/corral-sandbox/corral/internal/trace"
)

// Exit codes corral itself reports.
const (
	ExitWalltime    = 124
	ExitSetupFailed = 125
)

// Grace is how long the workload has between SIGTERM and SIGKILL.
const Grace = 5 * time.Second

// Kill reasons in sandbox.killed events.
const (
	ReasonWalltime = "walltime_exceeded"
	ReasonOOM      = "oom"
	// ReasonSocketMemory: the workload's TCP socket buffers went too far
	// past their cgroup v1 limit (see watchSocketMemory).
	ReasonSocketMemory = "socket_memory"
	ReasonSeccomp      = "seccomp"
	ReasonSignal       = "signal"
)

// Options describe one run.
type Options struct {
	ID, Session string
	Plan        *plan.Plan
	Argv, Env   []string
	StateDir    string
	Cgroups     cgroup.Facts
	Walltime    time.Duration
	// Policy holds the policy in force, starting with the one the plan
	// was built from; control's policy set reloads it. In proxy mode Run
	// takes it from Egress instead.
	Policy    *reload.Reloader
	Audit     *audit.Logger
	Log       *slog.Logger
	PolicySHA string
	// PolicyCommit is the commit a git:REF:PATH policy was read from.
	PolicyCommit string
	// Egress is set in proxy mode. It yields the egress to serve on the
	// listeners the init opens, and Run takes Policy from it. Run calls
	// it once the init is cloned, so that a caller building the egress
	// on another goroutine (corral run) overlaps that work with the run
	// directory, the cgroup and the clone; an error it returns ends the
	// run as an *EgressError, with nothing logged for it.
	Egress func() (*assemble.Egress, error)
	// UncagedReason is set when the command runs without a sandbox.
	UncagedReason string
	Stdin         *os.File
	Stdout        *os.File
	Stderr        *os.File
	// Trace, when set, prints each start-up step (corral run --trace).
	Trace *trace.Tracer
	// TrustedCIDRs are the private networks the policy advisor may
	// propose whole (--trusted-cidr) instead of one address at a time.
	TrustedCIDRs []netip.Prefix
	// AdvisorProbe lets the advisor resolve refused names outside learn
	// mode (--advisor-probe).
	AdvisorProbe bool
	// Running, when set, is called once the workload runs, set-up over.
	Running func()
	// Launcher, when set, was started ahead of the run (StartLauncher);
	// Run stops it whatever happens.
	Launcher *Launcher
	// TimerSlack is the timer slack corral was started with, which the
	// workload gets back from the wider one corral's own threads and the
	// init run with (timerslack); 0 leaves it what it inherits.
	TimerSlack uint64
	// NotifyConnects has the seccomp filter hand every connect to the
	// supervisor even where the kernel could record them (connhook):
	// the path rootless runs take, chosen as root to test and measure it.
	NotifyConnects bool
}

// Run runs the workload and returns the exit code corral should exit with.
// An error means corral failed before the workload ran (code 125) or the
// workload could not be executed (126/127); it has been audited already,
// but for an *EgressError, which the caller reports.
func Run(ctx context.Context, o Options) (int, error) {
	defer o.Launcher.Stop()
	if o.UncagedReason != "" {
		sigs, stop := catchSignals()
		defer stop()
		return runUncaged(ctx, o, sigs)
	}
	s := &supervisor{Options: o, start: time.Now(), pid: os.Getpid()}
	var stop func()
	s.sigs, stop = catchSignals()
	defer stop()
	return s.run(ctx)
}

type supervisor struct {
	Options
	start time.Time
	pid   int
	run_  *runDir
	cg    *cgroup.Cgroup
	cmd   *exec.Cmd
	// adv is the policy advisor while it runs (proxy mode).
	adv  atomic.Pointer[service.Service]
	sigs <-chan os.Signal
	// socketKill holds the bytes over the limit when watchSocketMemory
	// killed the sandbox; 0 otherwise.
	socketKill atomic.Int64
	// execs follows forks and execs, so an ancestor's binding goes only to
	// what it started as that binary; nil where that cannot be watched.
	execs *procident.ExecWatch
	// connects records who connects each socket, from the seccomp
	// filter's listener the init sends with MsgStarted.
	connects *procident.ConnectLog
	// egress is what Options.Egress yielded.
	egress *assemble.Egress
	// socketWatch is closed once watchSocketMemory has returned.
	socketWatch chan struct{}
}

// EgressError is an error of Options.Egress: the run ended before the
// sandbox was set up, and Run logged nothing for it, so that the caller
// reports it as the bad input it usually is (an inference route, a
// --policy-rules file).
type EgressError struct{ Err error }

func (e *EgressError) Error() string { return e.Err.Error() }
func (e *EgressError) Unwrap() error { return e.Err }

func (s *supervisor) run(ctx context.Context) (code int, retErr error) {
	defer func() {
		// One cleanup path for every outcome, so nothing is left behind
		// whether set-up failed half-way or the workload ran.
		if s.cg != nil {
			if s.socketWatch != nil {
				// It reads the group's directories, which Delete
				// changes; it returns once the init has exited.
				<-s.socketWatch
			}
			if err := s.cg.Kill(); err != nil {
				s.Log.Warn("kill sandbox cgroup", "err", err)
			}
			if err := s.cg.Delete(); err != nil {
				s.Log.Warn("remove sandbox cgroup", "err", err)
			}
		}
		if s.run_ != nil {
			if err := s.run_.remove(); err != nil {
				s.Log.Warn("remove run directory", "err", err)
			}
		}
		s.phase("cleaned up")
		s.Trace.Step("cleaned up (cgroup, run directory)")
		if retErr != nil && !errors.As(retErr, new(*EgressError)) {
			var se *initproc.StepError
			step := "start sandbox"
			if errors.As(retErr, &se) {
				step = se.Step
			}
			s.Audit.Log(audit.SandboxSetupErrorEvent{Step: step, Error: retErr.Error(), Code: code})
			// Every run ends with sandbox.exit, so consumers can pair it
			// with the start of the run whatever happened in between.
			s.Audit.Log(audit.SandboxExitEvent{Code: code, DurationMS: time.Since(s.start).Milliseconds()})
		}
	}()

	var err error
	// trustWritten, set in proxy mode, waits for the Java trust store,
	// which is written while the init sets up; the init starts the
	// workload only when told to, after it.
	trustWritten := func() error { return nil }
	ln := s.launcherFor(s.Launcher)
	defer ln.stop()
	if s.run_, err = newRunDir(s.StateDir, s.ID); err != nil {
		return ExitSetupFailed, err
	}
	s.Trace.Step("run directory")
	for _, d := range planDegradations(s.Plan) {
		s.degraded(d)
	}
	if err := s.createCgroup(); err != nil {
		return ExitSetupFailed, err
	}
	s.phase("cgroup ready")
	s.Trace.Step("cgroup")
	hook := s.attachConnectHook()
	defer func() {
		if h := hook(); h != nil {
			h.Close()
		}
	}()

	stdio := [3]*os.File{s.Stdin, s.Stdout, s.Stderr}
	term := newTerminal(stdio)
	defer term.restore()

	sup, initSock, err := socketPair()
	if err != nil {
		return ExitSetupFailed, err
	}
	defer sup.Close()

	initProg, err := initbin.Path(s.StateDir, initproc.MakesNetwork(s.Plan, ln.prepares))
	if err != nil {
		return ExitSetupFailed, fmt.Errorf("sandbox init program: %w", err)
	}
	if initProg == "" {
		initProg = "/proc/self/exe"
	}
	s.cmd = exec.Command(initProg, initproc.InitArg)
	s.cmd.Args[0] = "corral-init"
	s.cmd.Env = []string{}
	s.cmd.ExtraFiles = []*os.File{initSock}
	// The init's own threads count against the pids limit, and a Go
	// program dies of a thread it cannot start: the init writes the limit
	// itself, through this file, just before it starts the workload.
	pidsMax, err := s.pidsMaxFile()
	if err != nil {
		return ExitSetupFailed, err
	}
	if pidsMax != nil {
		defer pidsMax.Close()
		s.cmd.ExtraFiles = append(s.cmd.ExtraFiles, pidsMax)
	}
	s.cmd.SysProcAttr = s.sysProcAttr(ln.prepares)
	wireInit(s.cmd, stdio, term)

	if s.Plan.Network.Capture != nil {
		// Watching starts before the init exists, so every fork inside
		// the sandbox is seen.
		if w, err := procident.WatchExecs(); err == nil {
			w.Lost = func() {
				s.Log.Warn("the kernel dropped process events; from now on no ancestor lends its binary's binding to a descendant")
			}
			s.execs = w
			defer w.Close()
		} else {
			s.Log.Warn("cannot follow forks and execs; a child forked before its parent exec'd an allowed binary inherits that binary's binding", "err", err)
			s.degraded(degradation{degradedExecTracking, fmt.Sprintf("cannot follow forks and execs (%v): a child forked before its parent exec'd an allowed binary inherits that binary's binding", err)})
		}
	}
	if s.Plan.Network.Capture != nil {
		s.connects = &procident.ConnectLog{Execs: s.execs}
	}
	s.Trace.Step("terminal, exec watch")
	done := make(chan struct{})
	clock := s.Trace.Child()
	if err := ln.start(s.cmd, s.Log, done); err != nil {
		initSock.Close()
		return ExitSetupFailed, fmt.Errorf("start sandbox init: %w", err)
	}
	initSock.Close()
	if pidsMax != nil {
		pidsMax.Close()
	}
	defer func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
			<-done
		}
	}()

	if s.cg != nil {
		if err := s.cg.AddProc(s.cmd.Process.Pid); err != nil {
			return ExitSetupFailed, fmt.Errorf("move sandbox into its cgroup: %w", err)
		}
		s.socketWatch = make(chan struct{})
		go func() {
			defer close(s.socketWatch)
			s.watchSocketMemory(done)
		}()
	}
	s.Trace.Step("init started (clone with namespaces), moved into its cgroup")
	if h := hook(); h != nil && s.connects != nil && s.execs != nil {
		s.connects.Kernel = func(cookie uint64) (int, uint64, bool) {
			r, ok := h.Lookup(cookie)
			return r.TGID, r.At, ok
		}
	}
	if s.Plan.Network.Capture != nil {
		if s.Egress == nil {
			return ExitSetupFailed, errors.New("the plan captures the network, but no egress was given to serve it")
		}
		if s.egress, err = s.Egress(); err != nil {
			return ExitSetupFailed, &EgressError{err}
		}
		s.Policy = s.egress.Policy()
		s.Trace.Step("egress ready")
		if trustWritten, err = s.writeCA(); err != nil {
			return ExitSetupFailed, err
		}
		s.Trace.Step("CA files written")
	}
	// The init reads none of these before its config arrives: they are
	// written while its runtime starts.
	if err := s.prepareScratch(); err != nil {
		return ExitSetupFailed, err
	}
	if err := s.writeEtcFiles(); err != nil {
		return ExitSetupFailed, err
	}
	s.Trace.Step("scratch, resolv.conf, hosts")
	// The control socket is up before the workload runs, so a policy
	// update or a ps never finds a running sandbox without one.
	ctlCtx, stopCtl := context.WithCancel(ctx)
	defer stopCtl()
	if l, err := control.Listen(statedir.Control(s.StateDir, s.ID)); err != nil {
		// The sandbox is fully confined without it; only live reloads and
		// ps are lost, so this degrades instead of killing the workload.
		s.Log.Warn("control socket unavailable: corral ps and policy set will not see this sandbox", "err", err)
	} else {
		go func() {
			if err := control.Serve(ctlCtx, l, s, s.allowControl, s.Log); err != nil {
				s.Log.Warn("control socket stopped: corral ps and policy set no longer see this sandbox", "err", err)
			}
		}()
	}
	s.Trace.Step("control socket")
	mode := seccomp.NetMode(s.Plan.Seccomp.NetMode)
	if mode == seccomp.NetProxy && s.connects != nil && s.connects.Kernel != nil {
		mode = seccomp.NetProxyHooked
	}
	filter, err := seccomp.Program(seccomp.Profile(s.Plan.Seccomp.Profile), mode)
	if err != nil {
		return ExitSetupFailed, err
	}
	listen := seccomp.Notifies(mode)
	if listen && s.connects == nil {
		return ExitSetupFailed, errors.New("the seccomp filter hands connects to the supervisor, but this sandbox has no network capture to record them for")
	}
	cfg := &initproc.Config{Plan: s.Plan.ForInit(), Argv: s.Argv, Env: s.Env, Terminal: term.fds(), RootDir: s.run_.root(),
		Seccomp: filter, SeccompListener: listen, PidsMax: pidsMax != nil, NetworkReady: ln.prepares, Trace: clock,
		TimerSlack: s.TimerSlack}
	if err := initproc.Send(sup, initproc.Message{Type: initproc.MsgConfig, Config: cfg}); err != nil {
		return ExitSetupFailed, fmt.Errorf("send config to sandbox init: %w", err)
	}
	s.Trace.Step("seccomp filter built, config sent")

	// The init sends its descriptors in this order: network listeners,
	// then the terminal.
	egressCtx, stopEgress := context.WithCancel(ctx)
	defer stopEgress()
	if s.Plan.Network.Capture != nil {
		if err := s.startEgress(egressCtx, sup, ln); err != nil {
			return exitCode(err), err
		}
		s.Trace.Step("listeners received, egress serving")
	}
	if term != nil {
		if err := s.attachTerminal(sup, term); err != nil {
			return exitCode(err), err
		}
	}
	if err := trustWritten(); err != nil {
		return ExitSetupFailed, err
	}
	// An init that cannot take this has failed or exited; the message
	// read next says which.
	_ = initproc.Send(sup, initproc.Message{Type: initproc.MsgProceed})
	first, files, err := initproc.RecvFDs(sup)
	msgs := make(chan initproc.Message, 4)
	go readMessages(sup, msgs)

	s.phase("init started")
	switch {
	case err != nil:
		<-done
		if s.cg != nil && s.oomKilled() {
			// A workload that fills its memory at once (a tmpfs, say) can
			// have the kernel pick the init before it reported the
			// workload running: that is the memory limit at work.
			code := 128 + int(unix.SIGKILL)
			s.Audit.Log(audit.SandboxKilledEvent{Reason: ReasonOOM, Signal: unix.SignalName(unix.SIGKILL)})
			s.Log.Warn("sandbox killed", "reason", ReasonOOM)
			s.Audit.Log(audit.SandboxExitEvent{Code: code, DurationMS: time.Since(s.start).Milliseconds()})
			return code, nil
		}
		return ExitSetupFailed, fmt.Errorf("sandbox init exited during set-up (%s)", s.cmd.ProcessState)
	case first.Type == initproc.MsgError:
		<-done
		return first.Code, &initproc.StepError{Step: first.Step, Code: first.Code, Err: errors.New(first.Error)}
	case first.Type != initproc.MsgStarted:
		closeAll(files)
		return ExitSetupFailed, fmt.Errorf("unexpected %q message from sandbox init", first.Type)
	}
	if err := s.serveConnects(ctx, files, listen); err != nil {
		return ExitSetupFailed, err
	}
	if err := s.checkPidsMax(pidsMax != nil); err != nil {
		return ExitSetupFailed, err
	}
	s.phase("workload running")
	s.Trace.Step("workload running")
	if s.Running != nil {
		s.Running()
	}
	s.Audit.Log(audit.SandboxStartEvent{
		Summary:        s.Plan.Summary(s.ID),
		PolicySHA256:   s.PolicySHA,
		PolicyCommit:   s.PolicyCommit,
		PID:            s.cmd.Process.Pid,
		Argv:           s.Argv,
		Workdir:        s.Plan.Workdir,
		UID:            s.Plan.User.UID,
		GID:            s.Plan.User.GID,
		Rootless:       s.Plan.Rootless,
		LandlockABI:    s.Plan.Landlock.ABI,
		Seccomp:        s.Plan.Seccomp.Profile,
		Network:        s.Plan.Network.Mode,
		LimitsEnforced: s.cg != nil,
		Connects:       s.connectsRecorder(),
	})
	return s.wait(ctx, term, sup, msgs, done), nil
}

// serveConnects records the workload's connects from the seccomp
// listener files holds, when the filter has one (listen): until then every
// connect of the sandbox waits. A missing listener is fatal, since without
// it no connection could be attributed.
func (s *supervisor) serveConnects(ctx context.Context, files []*os.File, listen bool) error {
	if !listen {
		closeAll(files)
		return nil
	}
	if len(files) != 1 {
		closeAll(files)
		return fmt.Errorf("sandbox init sent %d descriptors with the workload's start, want its seccomp listener", len(files))
	}
	// Serve owns the descriptor from here.
	fd, err := unix.FcntlInt(files[0].Fd(), unix.F_DUPFD_CLOEXEC, 0)
	files[0].Close()
	if err != nil {
		return fmt.Errorf("seccomp listener: %w", err)
	}
	go func() {
		if err := s.connects.Serve(fd, ctx.Done()); err != nil {
			s.Log.Error("no longer recording the sandbox's connects; its connections are refused from now on", "err", err)
		}
	}()
	return nil
}

// attachConnectHook starts opening the hook with which the kernel records
// who connects each of the sandbox's sockets (connhook), where it can: as
// root, with the sandbox in a cgroup2 group. The hook sits on the group
// above every sandbox's, where the first sandbox attaches it and later
// ones find it. It runs while the rest of the set-up goes on; the
// returned func waits for it, nil if there is none. Once the connect log
// uses it (which also needs the exec watch), the seccomp filter leaves
// connect(2) alone; otherwise it hands each connect to the supervisor,
// which records the same thing at the price of two context switches a
// connect.
func (s *supervisor) attachConnectHook() func() *connhook.Hook {
	if s.Plan.Network.Capture == nil || s.cg == nil || s.cg.Unified() == "" || s.NotifyConnects {
		return func() *connhook.Hook { return nil }
	}
	var h *connhook.Hook
	attached := make(chan struct{})
	go func() {
		var err error
		if h, err = connhook.Open(filepath.Dir(s.cg.Unified()), s.cg.Unified()); err != nil {
			s.Log.Debug("the seccomp filter hands connects to the supervisor: the cgroup connect hook is unavailable", "err", err)
		}
		close(attached)
	}()
	return func() *connhook.Hook {
		<-attached
		return h
	}
}

// connectsRecorder names, for sandbox.start, what records who connects
// each socket; "" where connections are not identified.
func (s *supervisor) connectsRecorder() string {
	switch {
	case s.connects == nil:
		return ""
	case s.connects.Kernel != nil:
		return "kernel"
	}
	return "seccomp"
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// phase logs set-up progress with the time since start, for --log-level debug.
func (s *supervisor) phase(what string) {
	s.Log.Debug(what, "elapsed", time.Since(s.start))
}

// attachTerminal receives the master side of the pty the init allocated.
func (s *supervisor) attachTerminal(sup *os.File, term *terminal) error {
	m, files, err := initproc.RecvFDs(sup)
	if err != nil {
		return fmt.Errorf("receive terminal from sandbox init: %w", err)
	}
	if m.Type == initproc.MsgError {
		return &initproc.StepError{Step: m.Step, Code: m.Code, Err: errors.New(m.Error)}
	}
	if m.Type != initproc.MsgPTY || len(files) != 1 {
		for _, f := range files {
			f.Close()
		}
		return fmt.Errorf("sandbox init sent %q instead of a terminal", m.Type)
	}
	if err := term.attach(files[0]); err != nil {
		return fmt.Errorf("connect terminal: %w", err)
	}
	return nil
}

// exitCode is the code a set-up error maps to.
func exitCode(err error) int {
	var se *initproc.StepError
	if errors.As(err, &se) {
		return se.Code
	}
	return ExitSetupFailed
}

// awaitExit returns once the child pid has exited, leaving it to be
// reaped. It waits in Go's network poller on a pidfd, not in wait4: a
// thread blocked in a system call keeps its scheduler slot (P), so the
// goroutine it has just woken (the supervisor going on with set-up) sat
// behind it until the runtime's monitor took the slot back, which sleeps
// up to 10 ms between looks (`corral run --trace` showed the init running
// milliseconds before the supervisor noticed it had started). Parked in
// the poller, the thread gives the slot up at once. An error means the
// poller cannot wait on it here; the caller's wait4 still does.
func awaitExit(pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	// A pidfd is readable once its process has exited; the poll covers
	// an exit before the poller first looked.
	return rc.Read(func(fd uintptr) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return n > 0 || (err != nil && err != unix.EINTR)
	})
}

var cloneFlags = map[string]uintptr{
	"user": unix.CLONE_NEWUSER, "mount": unix.CLONE_NEWNS, "pid": unix.CLONE_NEWPID, "ipc": unix.CLONE_NEWIPC,
	"uts": unix.CLONE_NEWUTS, "cgroup": unix.CLONE_NEWCGROUP, "net": unix.CLONE_NEWNET,
}

// sysProcAttr is how the init is cloned; netReady leaves out the network
// namespace, which the launcher's thread has made already.
func (s *supervisor) sysProcAttr(netReady bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
	// The plan names the namespaces; network mode allow shares the host's.
	for _, ns := range s.Plan.Namespaces {
		if ns == "net" && netReady {
			continue
		}
		attr.Cloneflags |= cloneFlags[ns]
	}
	if s.Plan.Rootless {
		u := s.Plan.User
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: int(u.UID), HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: int(u.GID), HostID: os.Getgid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		// The init runs as the invoking user inside its namespace and needs
		// these to build the root; it clears them all before forking the workload.
		// NET_BIND_SERVICE lets the capture's DNS listener take port 53.
		// SYS_PTRACE lets it read the workload's /proc status, which
		// hidepid=invisible hides from a process of the same uid without it
		// while the workload is not dumpable: for a moment at every exec,
		// and for good when its binary is execute-only (as the init as root
		// has it too).
		attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_NET_BIND_SERVICE, unix.CAP_SETPCAP, unix.CAP_SYS_PTRACE}
	}
	return attr
}

// wait lets the workload run to its end and turns that end into corral's
// exit code and audit events.
func (s *supervisor) wait(ctx context.Context, term *terminal, sup *os.File, msgs <-chan initproc.Message, done <-chan struct{}) int {
	final := make(chan *initproc.Message, 1)
	go func() {
		var exited *initproc.Message
		for m := range msgs {
			if m.Type == initproc.MsgExited {
				exited = &m
			}
		}
		final <- exited
	}()
	pid := s.cmd.Process.Pid
	timedOut := watchdog{
		sigs: s.sigs,
		// The init forwards a signal it is sent as a message: it
		// catches none, since signal.Notify was one of its dearest
		// start-up steps. SIGKILL ends the init itself, and with it
		// every process of the sandbox.
		signal: func(sig syscall.Signal) {
			if sig == unix.SIGKILL {
				_ = unix.Kill(pid, sig)
				return
			}
			_ = initproc.Send(sup, initproc.Message{Type: initproc.MsgSignal, Signal: int(sig)})
		},
		resize:   term.resize,
		walltime: s.Walltime,
		start:    s.start,
		log:      s.Log,
	}.run(ctx, done)
	// The socket reaches EOF once the init is gone, so this cannot block.
	s.phase("workload exited")
	s.Trace.Step("init exited, namespaces torn down")
	return s.finish(<-final, timedOut)
}

func (s *supervisor) finish(exited *initproc.Message, timedOut bool) int {
	code, sig := 0, 0
	if exited != nil {
		code, sig = exited.Code, exited.Signal
	} else if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig = int(ws.Signal())
		code = 128 + sig
	} else {
		code = s.cmd.ProcessState.ExitCode()
	}
	reason := ""
	switch {
	case timedOut:
		reason, code = ReasonWalltime, ExitWalltime
	case s.socketKill.Load() > 0:
		reason = ReasonSocketMemory
	case s.cg != nil && s.oomKilled():
		reason = ReasonOOM
	case sig == int(unix.SIGSYS):
		reason = ReasonSeccomp
	case sig != 0:
		reason = ReasonSignal
	}
	if exited == nil && reason == "" {
		// No reason above explains it (a walltime, memory, a signal
		// that killed it): the init was sent a signal directly, which
		// it does not catch, and exited.
		s.Log.Warn("the sandbox's init ended before reporting the command's end; every process of the sandbox ended with it", "init", s.cmd.ProcessState.String())
	}
	if reason != "" {
		ev := audit.SandboxKilledEvent{Reason: reason}
		if sig != 0 {
			ev.Signal = unix.SignalName(syscall.Signal(sig))
		}
		s.Audit.Log(ev)
		s.Log.Warn("sandbox killed", "reason", ev.Reason, "signal", ev.Signal)
	}
	// Drafts that expired since the advisor last looked are audited
	// before the run's last event.
	if svc := s.adv.Load(); svc != nil {
		svc.Expire()
	}
	s.Audit.Log(audit.SandboxExitEvent{Code: code, DurationMS: time.Since(s.start).Milliseconds()})
	return code
}

// socketPoll is how often watchSocketMemory looks; loopback fills buffers
// at a few GiB/s, so this bounds the overshoot to a few hundred MiB at most
// and usually far less.
const socketPoll = 50 * time.Millisecond

// watchSocketMemory kills the sandbox when its TCP buffers exceed their
// cgroup v1 limit by more than a quarter of it. The kernel overdraws the
// limit by one buffer per socket (up to 64 KiB on loopback), which a normal
// program under pressure does a little, and a workload with thousands of
// unread connections does without bound; v1 has no OOM killer for it.
func (s *supervisor) watchSocketMemory(done <-chan struct{}) {
	tolerance := s.Plan.Limits.MemoryBytes / 4
	if tolerance == 0 {
		return
	}
	t := time.NewTicker(socketPoll)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		over, err := s.cg.TCPOverLimit()
		if err != nil {
			s.Log.Warn("read socket memory of sandbox cgroup", "err", err)
			return
		}
		if over <= tolerance {
			continue
		}
		s.socketKill.Store(over)
		s.Log.Warn("sandbox killed: TCP socket buffers over the memory limit", "over_bytes", over, "limit_bytes", s.Plan.Limits.MemoryBytes)
		if err := s.cg.Kill(); err != nil {
			s.Log.Warn("kill sandbox cgroup", "err", err)
		}
		return
	}
}

func (s *supervisor) oomKilled() bool {
	oom, err := s.cg.OOMKilled()
	if err != nil {
		s.Log.Warn("read OOM state of sandbox cgroup", "err", err)
	}
	return oom
}

// pidsMaxFile is the sandbox cgroup's pids.max for the init to write, or
// nil when no cgroup holds a pids limit.
func (s *supervisor) pidsMaxFile() (*os.File, error) {
	if s.cg == nil || s.Plan.Limits.Pids <= 0 {
		return nil, nil
	}
	f, err := s.cg.PidsMaxFile()
	if err != nil {
		return nil, fmt.Errorf("open the sandbox cgroup's pids limit: %w", err)
	}
	return f, nil
}

// checkPidsMax reads back the pids limit the init wrote before starting
// the workload.
func (s *supervisor) checkPidsMax(written bool) error {
	if !written {
		return nil
	}
	got, err := s.cg.PidsMax()
	if want := strconv.FormatInt(s.Plan.Limits.Pids, 10); err != nil || got != want {
		return fmt.Errorf("the sandbox cgroup's pids.max is %q (%v) once the workload started, want %s", got, err, want)
	}
	return nil
}

func (s *supervisor) createCgroup() error {
	l := s.Plan.Limits
	if len(l.NotEnforced) > 0 {
		// Never silent: the plan's warnings were logged, and every run
		// records which limits it ran without.
		s.Audit.Log(audit.SandboxLimitsNotEnforcedEvent{Reason: s.Cgroups.Reason, Limits: l.NotEnforced})
	}
	if !l.Enforced {
		return nil
	}
	cg, err := cgroup.Create(s.Cgroups, s.ID, cgroup.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUCores: l.CPUCores})
	if err != nil {
		return fmt.Errorf("create cgroup for limits: %w", err)
	}
	s.cg = cg
	return nil
}

// prepareScratch creates the host side of /scratch: fresh under the run
// directory for ephemeral state, under the session for persistent scratch.
func (s *supervisor) prepareScratch() error {
	if s.Plan.State.HostDir == "" {
		return nil
	}
	if err := os.MkdirAll(s.Plan.State.HostDir, 0o700); err != nil {
		return fmt.Errorf("create scratch directory: %w", err)
	}
	return os.Lchown(s.Plan.State.HostDir, int(s.Plan.User.UID), int(s.Plan.User.GID))
}

func socketPair() (*os.File, *os.File, error) {
	// SEQPACKET keeps message boundaries, so a message carrying a file
	// descriptor is never merged with the next one.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("create init socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "init-sup"), os.NewFile(uintptr(fds[1]), "init-child"), nil
}

func readMessages(f *os.File, out chan<- initproc.Message) {
	defer close(out)
	for {
		m, err := initproc.Recv(f)
		switch {
		case err == nil:
			out <- m
		case !errors.Is(err, initproc.ErrUndecodable):
			return
		}
	}
}

// Sweep removes host state left by sandboxes whose supervisor was killed:
// run directories and their cgroups. Only sandboxes of this state directory
// are touched: cgroups are host-wide, and another corral with another state
// directory may be running right now. It returns the ids it removed.
func Sweep(stateDir string, facts cgroup.Facts) ([]string, error) {
	swept, err := sweepRunDirs(stateDir)
	if len(swept) == 0 || !facts.Writable {
		return swept, err
	}
	stale := make(map[string]bool, len(swept))
	for _, id := range swept {
		stale[id] = true
	}
	_, cgErr := cgroup.Sweep(facts, func(id string) bool { return !stale[id] })
	return swept, errors.Join(err, cgErr)
}
