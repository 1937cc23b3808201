package initproc

import (
	"errors"
	"os"
	"strings"
	"testing"

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
