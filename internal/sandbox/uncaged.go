package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/linux/timerslack"
)

// runUncaged runs the command with no isolation at all. It still enforces
// the walltime and still audits, so an uncaged run is never invisible.
func runUncaged(ctx context.Context, o Options, sigs <-chan os.Signal) (int, error) {
	start := time.Now()
	o.Log.Warn("RUNNING WITHOUT A SANDBOX: the command has the full access of this user to files, network and processes",
		"reason", o.UncagedReason)
	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	cmd.Env = o.Env
	cmd.Dir = o.Plan.Workdir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Stdin, o.Stdout, o.Stderr
	// Its own process group, so the walltime kills everything it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := timerslack.StartWith(o.TimerSlack, cmd.Start); err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		o.Audit.Log(audit.SandboxSetupErrorEvent{Step: "execute " + o.Argv[0], Error: err.Error(), Code: code})
		o.Audit.Log(audit.SandboxExitEvent{Code: code, DurationMS: time.Since(start).Milliseconds()})
		return code, err
	}
	if o.Running != nil {
		o.Running()
	}
	o.Audit.Log(audit.SandboxStartUncagedEvent{Reason: o.UncagedReason, PolicySHA256: o.PolicySHA,
		PID: cmd.Process.Pid, Argv: o.Argv, Workdir: o.Plan.Workdir})

	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	pgid := -cmd.Process.Pid
	timedOut := watchdog{
		sigs:     sigs,
		signal:   func(sig syscall.Signal) { _ = unix.Kill(pgid, sig) },
		walltime: o.Walltime,
		start:    start,
		log:      o.Log,
	}.run(ctx, done)

	code := cmd.ProcessState.ExitCode()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	if timedOut {
		code = ExitWalltime
		o.Audit.Log(audit.SandboxKilledEvent{Reason: ReasonWalltime})
	} else if ws.Signaled() {
		o.Audit.Log(audit.SandboxKilledEvent{Reason: ReasonSignal, Signal: unix.SignalName(ws.Signal())})
	}
	o.Audit.Log(audit.SandboxExitEvent{Code: code, DurationMS: time.Since(start).Milliseconds()})
	return code, nil
}
