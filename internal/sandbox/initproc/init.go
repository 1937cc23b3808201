package initproc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/trace"
)

// forwarded are the signals the init passes on to the workload's process
// group when the supervisor asks (MsgSignal); SIGWINCH reaches it from the
// terminal itself, and SIGKILL is the supervisor's to send the init.
var forwarded = []syscall.Signal{unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2}

// Network makes the sandbox's network from inside it, where the supervisor
// cannot (rootless, the namespace belongs to the sandbox's user namespace,
// which only the init's clone makes): loopback up and, in proxy mode, the
// capture, whose listeners it hands to the supervisor. Package
// initproc/netsetup has it. The init program run as root leaves it out,
// and with it the nftables and netlink code that every start of it would
// otherwise pay to load.
type Network struct {
	LoopbackUp func() error
	Capture    func(sup *os.File, c *plan.Capture) error
}

// forwardable is the signal m asks the init to pass on to the workload,
// and whether it is such a request for one of the signals it forwards.
func forwardable(m Message) (syscall.Signal, bool) {
	sig := syscall.Signal(m.Signal)
	return sig, m.Type == MsgSignal && slices.Contains(forwarded, sig)
}

// MakesNetwork tells whether the init of a sandbox with plan p makes its
// network itself: it has a network namespace, or a capture, that the
// supervisor did not make ready.
func MakesNetwork(p *plan.Plan, networkReady bool) bool {
	return !networkReady && (slices.Contains(p.Namespaces, "net") || p.Network.Capture != nil)
}

// errNoNetwork refuses a sandbox whose network the init would have to
// make, in an init program built without the means to.
var errNoNetwork = errors.New("this init program leaves out the network set-up, which the supervisor makes itself as root, yet this sandbox needs the init to make its network")

// InitMain is PID 1 of the sandbox. Its order is fixed: read the config,
// build the root, name the host, bring up loopback, confine itself and
// start the workload, then reap until the workload exits. It returns the
// process exit code. network is nil in an init program that never makes
// the sandbox's network.
func InitMain(network *Network) int {
	entered := trace.Now()
	// Landlock puts each thread that restricts itself in a domain of its
	// own, and a domain may signal only itself and the domains below it.
	// The workload is forked from this thread, so every signal forwarded
	// to it must leave from here: main locked the main goroutine to the
	// process's main thread before calling us, for the init's life.
	sup := os.NewFile(3, "supervisor")
	unix.CloseOnExec(3)
	msg, err := Recv(sup)
	if err != nil || msg.Config == nil {
		fmt.Fprintf(os.Stderr, "corral init: read config: %v\n", err)
		return 125
	}
	cfg := msg.Config
	tr := trace.Resume(os.Stderr, cfg.Trace)
	tr.StepAt("init: process started (clone, namespaces, exec, Go runtime)", entered)
	tr.Step("init: config received")

	fail := func(e *StepError) int {
		_ = Send(sup, Message{Type: MsgError, Step: e.Step, Error: e.Err.Error(), Code: e.Code})
		return e.Code
	}
	makesNetwork := MakesNetwork(&cfg.Plan, cfg.NetworkReady)
	if makesNetwork && network == nil {
		return fail(stepErr("set up the network", errNoNetwork))
	}
	// The directories the root needs (/run, /home, ...) must be enterable
	// by the workload's user whatever umask corral was started with (027
	// and 077 are common on hardened hosts); the workload gets that umask.
	mask := unix.Umask(0o022)
	err = buildRoot(&cfg.Plan, cfg.RootDir)
	unix.Umask(mask)
	if err != nil {
		return fail(stepErr("build root filesystem", err))
	}
	tr.Step("init: root filesystem (mounts)")
	if err := unix.Sethostname([]byte(cfg.Plan.Hostname)); err != nil {
		return fail(stepErr("set hostname", err))
	}
	// As root the supervisor made the network namespace, loopback and
	// capture included, on the thread it cloned us from.
	if makesNetwork && slices.Contains(cfg.Plan.Namespaces, "net") {
		if err := network.LoopbackUp(); err != nil {
			return fail(stepErr("bring up loopback", err))
		}
	}
	tr.Step("init: hostname, loopback")

	if c := cfg.Plan.Network.Capture; c != nil && makesNetwork {
		if err := network.Capture(sup, c); err != nil {
			return fail(stepErr("set up network capture", err))
		}
		tr.Step("init: capture rules, listeners handed to the supervisor")
	}
	stdio := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	if slices.Contains(cfg.Terminal[:], true) {
		slave, err := allocatePTY(sup, cfg.Plan.User.UID, cfg.Plan.User.GID)
		if err != nil {
			return fail(stepErr("allocate terminal", err))
		}
		for i, on := range cfg.Terminal {
			if on {
				stdio[i] = slave
			}
		}
	}

	if err := readOnlyProc(); err != nil {
		return fail(stepErr("make /proc read-only", err))
	}
	tr.Step("init: terminal, read-only /proc")
	// The init catches no signal: signal.Notify costs a round trip to the
	// runtime's signal thread per signal, which made it the init's
	// dearest step after the mounts (`corral run --trace`). The signals
	// for the workload come from the supervisor as messages (MsgSignal),
	// and the children's ends from a blocking wait. A signal asked for
	// before the workload runs is forwarded to it once it does.
	sigs := make(chan syscall.Signal, 16)
	// The reaper gets a thread of its own before the workload starts:
	// startWorkload sets the pids limit, which counts the init's threads,
	// and a Go program dies of a thread it cannot start once the workload
	// holds the rest. A new thread is dear on a small virtual machine, so
	// it is made while we wait for the supervisor.
	workload := make(chan int, 1)
	exited := make(chan unix.WaitStatus, 1)
	reaping := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(reaping)
		if pid, ok := <-workload; ok {
			reap(pid, exited)
		}
	}()
	// From here one goroutine reads the supervisor's messages: the
	// go-ahead, then signals for the workload. It starts now, so that its
	// thread, too, exists before the pids limit. The supervisor sees EOF
	// on its socket only when we exit; we see EOF when it dies, and then
	// the sandbox must die with it: the kernel kills every process of a
	// pid namespace whose init exits, whatever thread or Landlock domain
	// this goroutine runs in.
	proceed := make(chan error, 1)
	go func() {
		waiting := true
		for {
			m, err := Recv(sup)
			sig, ok := forwardable(m)
			switch {
			case err == nil && ok:
				select {
				case sigs <- sig:
				default: // as many are queued as any workload could tell apart
				}
			case err == nil && waiting:
				waiting = false
				if m.Type != MsgProceed {
					err = fmt.Errorf("unexpected %q message", m.Type)
				}
				proceed <- err
			case err != nil && !errors.Is(err, ErrUndecodable):
				_ = unix.Kill(-1, unix.SIGKILL)
				os.Exit(137)
			}
		}
	}()
	// The supervisor finishes its side (egress serving, the Java trust
	// store written) while we set up ours; the workload never starts
	// before what it reads is there.
	if err := <-proceed; err != nil {
		return fail(stepErr("wait for the supervisor", err))
	}
	tr.Step("init: supervisor ready")

	<-reaping
	pid, listener, serr := startWorkload(cfg, stdio, tr)
	if serr != nil {
		close(workload)
		return fail(serr)
	}
	workload <- pid
	if listener >= 0 {
		// Until the supervisor has it, every call the filter passes to
		// it waits; once this copy is closed, only the supervisor's
		// answers them.
		_ = SendFDs(sup, Message{Type: MsgStarted, PID: pid}, listener)
		unix.Close(listener)
	} else {
		_ = Send(sup, Message{Type: MsgStarted, PID: pid})
	}

	for {
		select {
		case s := <-sigs:
			// The workload leads its own session, so its pid is its
			// process group; a shell's jobs get the signal too. It
			// leaves from this thread, the one the workload was forked
			// from (see above).
			_ = unix.Kill(-pid, s)
		case ws := <-exited:
			code, sig := exitStatus(ws)
			tr.Step("init: workload exited")
			_ = Send(sup, Message{Type: MsgExited, Code: code, Signal: sig})
			return code
		}
	}
}

// reap collects every child that exits (orphans re-parent to us) until the
// workload does, whose status it sends on exited.
func reap(workload int, exited chan<- unix.WaitStatus) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case err == unix.EINTR:
		case err != nil:
			// ECHILD: the workload was reaped elsewhere, which nothing
			// does; end as if it had been killed.
			exited <- unix.WaitStatus(unix.SIGKILL)
			return
		case pid == workload:
			exited <- ws
			return
		}
	}
}

// exitStatus is the code corral reports for a wait status, and the signal
// that ended the workload if one did.
func exitStatus(ws unix.WaitStatus) (code, sig int) {
	switch {
	case ws.Exited():
		code = ws.ExitStatus()
	case ws.Signaled():
		sig = int(ws.Signal())
		code = 128 + sig
	}
	return code, sig
}

// allocatePTY opens a pty in the sandbox's own devpts, gives the slave to
// the workload's user and sends the master to the supervisor.
func allocatePTY(sup *os.File, uid, gid uint32) (*os.File, error) {
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	defer unix.Close(master)
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return nil, fmt.Errorf("unlock pty: %w", err)
	}
	// TIOCGPTPEER opens the slave through the master, not by a path that
	// something could have replaced.
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return nil, fmt.Errorf("open pty slave: %w", errno)
	}
	slave := os.NewFile(fd, "pty-slave")
	if err := unix.Fchown(int(fd), int(uid), int(gid)); err != nil {
		slave.Close()
		return nil, fmt.Errorf("give pty to uid %d: %w", uid, err)
	}
	if err := SendFDs(sup, Message{Type: MsgPTY}, master); err != nil {
		slave.Close()
		return nil, fmt.Errorf("send pty to supervisor: %w", err)
	}
	return slave, nil
}
