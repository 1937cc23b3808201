package e2e

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestProtectionDegraded: a run that goes without a protection its policy
// asks for, because the host cannot give it, says so in the audit trail
// with sandbox.protection_degraded, and a run that has everything does not.
func TestProtectionDegraded(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		t.Run("exec-tracking", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			r := runInOwnNetns(t, fx, fx.attack, "exit", "0")
			if r.code != 0 {
				t.Fatalf("want exit 0\n%s", r)
			}
			e := r.requireEvent(t, "sandbox.protection_degraded", map[string]any{"what": "exec_tracking"})
			if reason, _ := e["reason"].(string); !strings.Contains(reason, "proc connector") || !strings.Contains(reason, "inherits that binary's binding") {
				t.Errorf("the reason does not say what failed and what it costs: %q", reason)
			}
			if len(r.find("sandbox.start")) != 1 {
				t.Fatalf("want the sandbox started anyway\n%s", r)
			}
		})
		t.Run("fully-confined", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			r := runCorral(t, fx, runOpts{args: []string{fx.attack, "exit", "0"}})
			start := r.find("sandbox.start")
			if r.code != 0 || len(start) != 1 {
				t.Fatalf("want exit 0 and one sandbox.start\n%s", r)
			}
			degraded := r.find("sandbox.protection_degraded")
			if start[0]["landlock_abi"] == float64(0) {
				// A kernel without Landlock: best_effort runs without it,
				// and must say so.
				if len(degraded) != 1 || degraded[0]["what"] != "landlock" {
					t.Fatalf("a run without Landlock does not report exactly that\n%s", r)
				}
				return
			}
			if len(degraded) != 0 {
				t.Fatalf("a fully confined run reports a degraded protection\n%s", r)
			}
		})
	})
}

// runInOwnNetns runs corral as runCorral does, but in a fresh network
// namespace of its own. The kernel's proc connector exists only in the
// first network namespace, so corral cannot follow forks and execs there;
// nothing else about the sandbox changes.
func runInOwnNetns(t *testing.T, fx *fixture, args ...string) *result {
	t.Helper()
	m := fx.m
	audit := filepath.Join(fx.aux, "audit-netns.log")
	cargs := append([]string{"run", "--workdir", fx.W, "--state-dir", fx.state, "--audit-log", audit, "--"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, corralBin, cargs...)
	cmd.Dir = fx.W
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	if m.rootless {
		cmd.Env = append(cmd.Env, "HOME="+m.home, "XDG_STATE_HOME="+filepath.Join(m.home, "state"))
	}
	// The namespace is made while the child is still root, then it drops
	// to the rootless user.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if m.asUser {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(m.uid), Gid: uint32(m.gid), Groups: []uint32{}}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		if errors.Is(err, syscall.EPERM) {
			requireFeature(t, "a network namespace for corral: "+err.Error())
		}
		t.Fatalf("run corral in a network namespace of its own: %v", err)
	}
	return &result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(),
		elapsed: time.Since(start), cmdline: corralBin + " " + strings.Join(cargs, " "),
		events: readEvents(t, audit)}
}
