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
	if err := cmd.Start(); err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		o.Audit.Emit(audit.SandboxSetupError, "step", "execute "+o.Argv[0], "error", err.Error(), "code", code)
		o.Audit.Emit(audit.SandboxExit, "code", code, "duration_ms", time.Since(start).Milliseconds())
		return code, err
	}
	o.Audit.Emit(audit.SandboxStartUncaged, "reason", o.UncagedReason, "policy_sha256", o.PolicySHA,
		"pid", cmd.Process.Pid, "argv", o.Argv, "workdir", o.Plan.Workdir)

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
		o.Audit.Emit(audit.SandboxKilled, "reason", ReasonWalltime)
	} else if ws.Signaled() {
		o.Audit.Emit(audit.SandboxKilled, "reason", ReasonSignal, "signal", unix.SignalName(ws.Signal()))
	}
	o.Audit.Emit(audit.SandboxExit, "code", code, "duration_ms", time.Since(start).Milliseconds())
	return code, nil
}
