package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// Resources outside the limits: memory the kernel holds for the workload
// (socket buffers, tmpfs pages) and the supervisor's descriptors and memory,
// which no cgroup of the sandbox covers.

// proxyPolicy is a proxy-mode policy (so the workload has inet sockets and
// its own loopback) with the system directories and extra.
func proxyPolicy(extra string) string {
	return basePolicy("network:\n  mode: proxy\n" + extra)
}

// TestSocketMemory fills socket buffers nobody reads under a 64 MiB memory
// limit. The bytes the kernel holds for the sandbox must stay within the
// limit (or the workload be stopped); the control with no memory limit
// shows the same program does hold more than that when nothing bounds it.
func TestSocketMemory(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, kind := range []string{"tcp", "unix"} {
			t.Run(kind, func(t *testing.T) {
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{args: []string{fx.attack, "sockbuf", kind, "160", "64"},
					policy: proxyPolicy("limits:\n  memory: 64MiB\n"), timeout: 120 * time.Second})
				t.Logf("exit %d: %s", r.code, strings.TrimSpace(r.stdout))
				if len(r.find("sandbox.limits_not_enforced")) > 0 && m.rootless {
					// Without a cgroup nothing charges kernel memory to the
					// sandbox; corral must say so (TestLimits covers that).
					if !strings.Contains(r.stderr, "NOT ENFORCED") {
						t.Fatalf("socket memory unbounded without a warning\n%s", r)
					}
					t.Logf("rootless without cgroups: %s", reportLine(r.stdout))
					return
				}
				requireLimitsEnforced(t, r)
				if r.code == 137 {
					// Unix socket buffers are charged as kernel memory and
					// hit the OOM killer; TCP buffers on cgroup v1 have
					// their own counter, which corral watches.
					k := r.find("sandbox.killed")
					if len(k) != 1 || (k[0]["reason"] != "oom" && k[0]["reason"] != "socket_memory") {
						t.Fatalf("killed, but not for memory\n%s", r)
					}
					t.Logf("stopped: %v", k[0]["reason"])
					return
				}
				requireBlocked(t, r, "")
				t.Logf("%s", reportLine(r.stdout))
			})
		}
		// Controls: 32 MiB of TCP buffers under a 64 MiB limit is neither
		// refused early nor killed, and without a memory limit the same
		// program holds more than 64 MiB. (Targets stay small: TCP buffer
		// memory is also bounded host-wide by net.ipv4.tcp_mem, which
		// parallel tests share.)
		for _, c := range []struct{ name, target, limits, want string }{
			{"within-limit", "32", "limits:\n  memory: 64MiB\n", "BLOCKED: held only 3"},
			{"no-limit", "160", "", "ESCAPED: held"},
		} {
			t.Run(c.name, func(t *testing.T) {
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{args: []string{fx.attack, "sockbuf", "tcp", c.target, "64"},
					policy: proxyPolicy(c.limits), timeout: 120 * time.Second})
				if !strings.Contains(r.stdout, c.want) || (r.code != 0 && r.code != 3) {
					t.Fatalf("want %q and a normal end\n%s", c.want, r)
				}
			})
		}
	})
}

// TestConnectionLimit holds more connections than limits.connections
// allows. The ones beyond it are refused at once (each listener in its own
// protocol, with a rate-limited audit event), while the sandbox's DNS keeps
// answering; once the workload lets go, a fresh connection works again.
func TestConnectionLimit(t *testing.T) {
	requireRoot(t)
	host := netlab.Host{Name: "conns.test", Addr: netip.MustParseAddr("203.0.113.60")}
	lab := netlab.Start(t, host)
	target := fmt.Sprintf("%s:%d", host.Name, netlab.PortEcho)
	const limit, extra = 40, 20
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		pol := proxyPolicy(fmt.Sprintf("network_policies:\n  conns:\n    endpoints:\n      - host: %s\n        port: %d\nlimits:\n  connections: %d\n",
			host.Name, netlab.PortEcho, limit))
		p := startCorral(t, fx, runOpts{args: []string{fx.attack, "conns", target, strconv.Itoa(limit + extra), host.Name},
			policy: pol, timeout: 90 * time.Second,
			flags: []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W,
				"--env", "HTTP_PROXY_ADDR=" + httpProxy, "--env", "SOCKS_PROXY_ADDR=" + socksProxy}})
		waitOut(t, p, "HOLDING", 60*time.Second)
		fx.signal(t, "go")
		r := p.wait()
		t.Logf("\n%s", r.stdout)
		for _, want := range []string{
			fmt.Sprintf("CONNS ok=%d refused=%d", limit, extra),
			"DNS " + host.Name + " -> [198.18.",
			"err=<nil>\nPROXY HTTP/1.1 429 Too Many Requests",
			`"reason":"connection_limit"`,
			"SOCKS method=0 rep=1",
			"FRESH err=<nil>",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("want %q in the workload's report\n%s", want, r)
			}
		}
		denied := findEvents(r, "net.connect.denied", map[string]any{"reason": "connection_limit"})
		// 22 refusals in well under a second: the first is recorded, the
		// rest are counted in the next event, if any.
		if len(denied) == 0 || len(denied) > 3 {
			t.Errorf("want 1 to 3 rate-limited connection_limit events for %d refusals, got %d\n%s", extra+2, len(denied), r)
		}
		if got := len(r.find("net.connect.allowed")); got != limit+1 {
			t.Errorf("want %d allowed connections (the held ones and the fresh one), got %d", limit+1, got)
		}
	})
}

// TestTmpfsSize fills the sandbox's tmpfs mounts past the memory limit.
// Their pages are memory no rlimit covers, so without a cgroup (rootless
// without delegation) only the tmpfs size bounds them; /dev itself is a
// tmpfs that belongs to the workload's user in rootless mode.
func TestTmpfsSize(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, dir := range []string{"/tmp", "/dev/shm", "/dev"} {
			t.Run(strings.ReplaceAll(dir[1:], "/", "-"), func(t *testing.T) {
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{args: []string{fx.attack, "tmpfs-fill", dir, "64"},
					policy: systemPolicy("limits:\n  memory: 64MiB\n"), timeout: 60 * time.Second})
				t.Logf("exit %d: %s", r.code, reportLine(r.stdout))
				if r.code == 137 {
					r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "oom"})
					return
				}
				requireBlocked(t, r, "ENOSPC|EACCES")
			})
		}
	})
}
