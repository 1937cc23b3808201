package e2e

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLimits exhausts pids and memory. The two attacks run one after the
// other (never against each other), each confined to its own cgroup.
func TestLimits(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		if m.rootless && !rootlessLimits(t, m) {
			// No delegated cgroup: RLIMIT_NPROC in the sandbox's own
			// user namespace still holds the pids limit; nothing holds
			// memory.
			t.Run("fork-bomb", func(t *testing.T) { forkBomb(t, m) })
			threadBombs(t, m)
			t.Run("too-few-pids", func(t *testing.T) { tooFewPids(t, m) })
			limitsNotEnforced(t, m)
			return
		}
		t.Run("fork-bomb", func(t *testing.T) { forkBomb(t, m) })
		threadBombs(t, m)
		t.Run("too-few-pids", func(t *testing.T) { tooFewPids(t, m) })
		t.Run("memory", func(t *testing.T) { memoryHog(t, m) })
	})
}

// rootlessLimits reports whether this host lets an unprivileged corral
// enforce limits (a delegated cgroup v2 subtree).
func rootlessLimits(t *testing.T, m *mode) bool {
	fx := newFixture(t, m)
	r := runCorral(t, fx, runOpts{args: []string{fx.attack, "exit", "0"}, policy: systemPolicy("limits:\n  pids: 64\n")})
	start := r.find("sandbox.start")
	if r.code != 0 || len(start) != 1 {
		t.Fatalf("probe run failed\n%s", r)
	}
	return start[0]["limits_enforced"] == true
}

func requireLimitsEnforced(t *testing.T, r *result) {
	t.Helper()
	if ev := r.find("sandbox.limits_not_enforced"); len(ev) > 0 {
		requireFeature(t, "cgroup limits cannot be enforced on this host: "+r.eventsText())
	}
}

func forkBomb(t *testing.T, m *mode) {
	fx := newFixture(t, m)
	start := time.Now()
	r := runCorral(t, fx, runOpts{args: []string{fx.attack, "fork-bomb", "5000"},
		policy: systemPolicy("limits:\n  pids: 64\n"), timeout: 90 * time.Second})
	requireLimitsEnforced(t, r)
	requireBlocked(t, r, "EAGAIN")
	match := regexp.MustCompile(`after (\d+) children`).FindStringSubmatch(r.stdout)
	if match == nil {
		t.Fatalf("no child count in the report\n%s", r)
	}
	if n, _ := strconv.Atoi(match[1]); n >= 64 {
		t.Fatalf("%d children started under pids: 64\n%s", n, r)
	}
	if time.Since(start) > 30*time.Second {
		t.Fatalf("the contained fork bomb took %v to end", time.Since(start))
	}
	// The host can still start processes.
	if err := exec.Command("/bin/true").Run(); err != nil {
		t.Fatalf("host cannot fork after the fork bomb: %v", err)
	}
}

// threadBomb: threads count against the pids limit as processes do (a
// pids cgroup counts tasks, and so does RLIMIT_NPROC), here from a real
// interpreter, which reports the refusal as its own error. It first tries
// to lift RLIMIT_NPROC, which the limit must survive; prefix runs it some
// other way (in a user namespace of its own).
func threadBomb(t *testing.T, m *mode, extra string, prefix ...string) {
	const script = `import resource, threading
try:
    resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("RLIMIT_NPROC lifted")
except (ValueError, OSError) as e:
    print("RLIMIT_NPROC kept: %s" % e)
ev = threading.Event()
n = 0
try:
    for _ in range(5000):
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
    print("ESCAPED: started %d threads" % n)
except RuntimeError as e:
    print("BLOCKED after %d threads: %s" % (n, e))
ev.set()
`
	fx := newFixture(t, m)
	r := runCorral(t, fx, runOpts{args: append(prefix, "/usr/bin/python3", "-c", script),
		policy: systemPolicy("limits:\n  pids: 64\n" + extra), timeout: 90 * time.Second})
	requireLimitsEnforced(t, r)
	match := regexp.MustCompile(`BLOCKED after (\d+) threads`).FindStringSubmatch(r.stdout)
	if match == nil || r.code != 0 {
		t.Fatalf("want the threads refused under pids: 64\n%s", r)
	}
	if n, _ := strconv.Atoi(match[1]); n >= 64 {
		t.Fatalf("%d threads started under pids: 64\n%s", n, r)
	}
}

// threadBombs runs the thread bomb as the workload, and again from a user
// namespace the workload makes (the relaxed seccomp profile lets it):
// rootless, where RLIMIT_NPROC holds the limit, the kernel must count that
// namespace's tasks in the sandbox's too.
func threadBombs(t *testing.T, m *mode) {
	t.Run("thread-bomb", func(t *testing.T) { threadBomb(t, m, "") })
	t.Run("thread-bomb-in-userns", func(t *testing.T) { threadBomb(t, m, "seccomp: relaxed\n", "/usr/bin/unshare", "--user") })
}

// tooFewPids: a pids limit the sandbox's init uses up by itself (its
// threads count, as in any pids cgroup) leaves no room for the command,
// which fails to start with an error naming the limit; the init, a Go
// program that cannot survive a thread it fails to start, is not starved
// during its own set-up.
func tooFewPids(t *testing.T, m *mode) {
	fx := newFixture(t, m)
	r := runCorral(t, fx, runOpts{args: []string{fx.attack, "exit", "0"}, policy: systemPolicy("limits:\n  pids: 4\n")})
	requireLimitsEnforced(t, r)
	if r.code != 126 || !strings.Contains(r.stderr, "limits.pids is 4") || strings.Contains(r.stderr, "fatal error") {
		t.Fatalf("want exit 126 naming limits.pids, and no crash\n%s", r)
	}
}

func memoryHog(t *testing.T, m *mode) {
	fx := newFixture(t, m)
	r := runCorral(t, fx, runOpts{args: []string{fx.attack, "alloc", "256"},
		policy: systemPolicy("limits:\n  memory: 32MiB\n"), timeout: 90 * time.Second})
	requireLimitsEnforced(t, r)
	if !strings.Contains(r.stdout, "allocating") || strings.Contains(r.stdout, "ESCAPED") || r.code != 137 {
		t.Fatalf("want the 256 MiB allocation killed under memory: 32MiB (exit 137)\n%s", r)
	}
	r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "oom"})
	r.requireEvent(t, "sandbox.exit", map[string]any{"code": 137})
}

// limitsNotEnforced: rootless without a delegated cgroup the memory limit
// cannot be applied, and corral must say so rather than run silently
// without it.
func limitsNotEnforced(t *testing.T, m *mode) {
	for _, c := range []struct{ name, limits, want string }{
		{"memory", "limits:\n  memory: 32MiB\n", "memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fx := newFixture(t, m)
			r := runCorral(t, fx, runOpts{args: []string{fx.attack, "exit", "0"}, policy: systemPolicy(c.limits)})
			if r.code != 0 {
				t.Fatalf("run failed\n%s", r)
			}
			if len(r.find("sandbox.limits_not_enforced")) == 0 {
				t.Fatalf("rootless run without cgroup delegation emitted no sandbox.limits_not_enforced\n%s", r)
			}
			if !strings.Contains(r.eventsText(), c.want) {
				t.Fatalf("sandbox.limits_not_enforced does not name the %s limit\n%s", c.want, r)
			}
			if !strings.Contains(r.stderr, "NOT ENFORCED") {
				t.Fatalf("no warning on stderr about the unenforced limit\n%s", r)
			}
		})
	}
}
