package initproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/plan"
)

// A command missing inside the sandbox is answered with the policy field
// that would bring it in, or with why that would not help.
func TestMissingHint(t *testing.T) {
	p := &plan.Plan{
		Workdir: "/home/ada/proj",
		Mounts: []plan.Mount{
			{Kind: plan.KindDev, Target: "/dev", Why: "minimal devices"},
			{Kind: plan.KindTmpfs, Target: "/tmp", Why: "private /tmp"},
			{Kind: plan.KindBind, Source: "/etc", Target: "/etc", ReadOnly: true, Why: "filesystem_policy.read_only"},
			{Kind: plan.KindBind, Source: "/home/ada/proj", Target: "/home/ada/proj", Why: "workdir"},
		},
		Skipped: []plan.Skipped{{Path: "/opt", Reason: "does not exist on this host"}},
	}
	tests := []struct{ name, want string }{
		// The README's network-only policy before sections were inherited.
		{"/usr/bin/git", "nothing of the host's /usr is mounted; add it to the policy: filesystem_policy.read_only: [/usr]"},
		{"/bin/sh", "filesystem_policy.read_only: [/bin]"},
		{"/etc/nope", "/etc is the host's /etc (filesystem_policy.read_only), so the host has no such file either"},
		{"/tmp/tool", "/tmp is the sandbox's own tmpfs (private /tmp), not the host's"},
		{"/opt/tool/bin/x", "the policy lists /opt, but it was left out: does not exist on this host"},
		{"./tool", "relative to the workdir /home/ada/proj"},
	}
	for _, tt := range tests {
		if got := missingHint(tt.name, p); !strings.Contains(got, tt.want) {
			t.Errorf("missingHint(%s) = %q, want it to contain %q", tt.name, got, tt.want)
		}
	}
}

// A workload whose credentials are still exactly the forking thread's has
// not had its exec committed yet: the error says so, which is what the
// retry waits on. The test process stands in for such a workload.
func TestVerifyWorkloadSeesUncommittedExec(t *testing.T) {
	err := verifyWorkload(os.Getpid(), plan.User{UID: 54321, GID: 54321})
	if !errors.Is(err, errExecUncommitted) {
		t.Fatalf("got %v, want errExecUncommitted", err)
	}
	if !strings.Contains(err.Error(), "Uid is") {
		t.Errorf("the error does not name the field: %v", err)
	}
}

// A workload that made a user namespace of its own holds every
// capability there: the read-back does not count those against it, but
// still holds it to no_new_privs and seccomp; one in the init's own
// namespace is held to its capabilities too. Real processes stand in for
// the workload: unshare(1) makes the namespace before it execs sleep.
func TestVerifyWorkloadInItsOwnUserNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CORRAL_NO_SKIP") != "" {
			t.Fatal("needs root (a user namespace for a process of uid 0); CORRAL_NO_SKIP is set")
		}
		t.Skip("needs root (a user namespace for a process of uid 0)")
	}
	for _, tc := range []struct {
		name      string
		argv      []string
		want, not string
	}{
		// Without seccomp: what the read-back reports is the filter, not
		// the namespace's capabilities.
		{"own namespace", []string{"/usr/bin/setpriv", "--no-new-privs", "/usr/bin/unshare", "--user", "/bin/sleep", "30"}, "Seccomp is", "Cap"},
		{"init's namespace", []string{"/usr/bin/setpriv", "--no-new-privs", "/bin/sleep", "30"}, "CapPrm is", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			comm := fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if b, _ := os.ReadFile(comm); strings.TrimSpace(string(b)) == "sleep" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the stand-in never exec'd sleep")
				}
			}
			err := verifyWorkload(cmd.Process.Pid, plan.User{UID: 0, GID: 0})
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.not != "" && strings.Contains(err.Error(), tc.not)) {
				t.Fatalf("got %v, want an error naming %q and not %q", err, tc.want, tc.not)
			}
		})
	}
}
