package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// The audit-flood attacks: a workload floods refusals — connections to a
// host no policy names, on many ports, and inspected requests with 60 KB
// paths — to fill the host's disk through the audit log or stall the proxy
// behind it. The log must stay small, say what it left out, and corral must
// still serve an allowed request afterwards.

var (
	addrFlood       = netip.MustParseAddr("203.0.113.70")
	addrFloodDenied = netip.MustParseAddr("203.0.113.71")
)

const floodPolicy = `network_policies:
  flood:
    endpoints:
      - host: flood.test
        port: 80
        protocol: rest
        rules:
          - allow: {method: GET, path: "/ok/**"}
`

const floodScript = `#!/bin/bash
cd "$W" || exit 99
echo "=== connect"
./attack flood-connect ` + "203.0.113.71" + ` 80 500 3
echo "=== http"
./attack flood-http http://flood.test/deny 60000 3
echo "=== after"
curl -sS --max-time 15 --noproxy '*' http://flood.test/ok/after; echo " rc=$?"
echo "=== end"
`

// floodLogCap is far above what the limits let through in six seconds
// (a few hundred lines of at most a few KB) and far below what the flood
// wrote before them (hundreds of MB).
const floodLogCap = 5 << 20

func TestAuditFlood(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "flood.test", Addr: addrFlood},
		netlab.Host{Name: "flood-denied.test", Addr: addrFloodDenied},
	)
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "flood.sh"), []byte(floodScript), 0o755)
		r := runCorral(t, fx, runOpts{
			args:    []string{"/usr/bin/bash", filepath.Join(fx.W, "flood.sh")},
			policy:  basePolicy(floodPolicy),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W, "--log-level", "error"},
			timeout: 90 * time.Second,
		})
		n := &netRun{t: t, r: r, sec: sections(r.stdout)}
		if r.code != 0 || n.sec["end"] == "" {
			t.Fatalf("the script did not complete\n%s", short(r))
		}

		// The flood happened and was refused.
		attempts := atoi(n.has("connect", `FLOOD connect attempts=(\d+) answered=0`))
		if attempts < 100 {
			t.Fatalf("only %d connection attempts; the flood did not run\n%s", attempts, short(r))
		}
		requests := atoi(n.has("http", `FLOOD http requests=\d+ status403=(\d+) status200=0`))
		if requests < 50 {
			t.Fatalf("only %d refused requests; the flood did not run\n%s", requests, short(r))
		}
		for _, s := range lab.HTTPRequests() {
			if strings.HasPrefix(s.Path, "/deny") {
				t.Fatalf("the upstream received a refused request: %.80s", s.Path)
			}
		}

		// The log stays small, rotated files included.
		var size int64
		logs, _ := filepath.Glob(filepath.Join(fx.aux, "audit-*.log*"))
		for _, p := range logs {
			if st, err := os.Stat(p); err == nil {
				size += st.Size()
			}
		}
		if size > floodLogCap {
			t.Fatalf("the flood wrote %d bytes of audit log (cap %d) in %v", size, floodLogCap, r.elapsed)
		}
		t.Logf("audit log: %d bytes for %d connections and %d requests", size, attempts, requests)

		// What was left out is counted, per key, without the path.
		for _, c := range []struct {
			event string
			made  int
		}{{"net.connect.denied", attempts}, {"http.request", requests}} {
			logged, counted := 0, 0
			for _, e := range r.events {
				switch {
				case e["event"] == c.event && e["decision"] != "allow":
					logged++
				case e["event"] == "audit.suppressed" && e["suppressed_event"] == c.event:
					counted += int(e["count"].(float64))
				}
			}
			if counted == 0 {
				t.Errorf("no audit.suppressed counts for %s (%d logged)", c.event, logged)
			}
			// Each attempt is one decision; the proxy may see a few more
			// (a retry) but never fewer than the workload made.
			if logged+counted < c.made {
				t.Errorf("%s: %d logged + %d suppressed < %d made", c.event, logged, counted, c.made)
			}
			t.Logf("%s: %d made, %d logged, %d suppressed", c.event, c.made, logged, counted)
		}
		for _, e := range r.find("http.request") {
			if p, _ := e["path"].(string); len(p) > 1100 || len(p) > 1024 && !regexp.MustCompile(`…\[truncated \d+ bytes\]$`).MatchString(p) {
				t.Errorf("a logged path is %d bytes: %q", len(p), p[len(p)-40:])
			}
		}
		for _, e := range r.find("audit.suppressed") {
			if _, ok := e["path"]; ok {
				t.Errorf("audit.suppressed carries the attacker's path: %.200v", e)
			}
		}

		// Corral still works: the allowed request went through and is
		// recorded, and the sandbox's lifecycle is complete.
		n.has("after", `hello from flood\.test GET /ok/after rc=0`)
		n.event("http.request", map[string]any{"host": "flood.test", "path": "/ok/after", "decision": "allow", "status": 200})
		r.requireEvent(t, "sandbox.exit", map[string]any{"code": 0})
	})
}

// short is r without the audit log, which a failed flood makes huge.
func short(r *result) string {
	c := *r
	c.events = nil
	if len(c.stderr) > 4000 {
		c.stderr = c.stderr[:4000] + "…"
	}
	return c.String()
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
