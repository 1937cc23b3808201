package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSupervisorRaceFree runs proxy-mode sandboxes with a corral built by
// the race detector: one whose workload makes a connection corral refuses,
// and one whose egress cannot be built, which corral undoes after the init
// started. The supervisor's goroutines (the egress built alongside the
// set-up, the connect hook, the socket-memory watcher, the cleanup) must
// share nothing unsynchronised. The race detector needs cgo, which the
// other builds leave out.
func TestSupervisorRaceFree(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		requireFeature(t, "the race detector needs a C compiler (apt-get install gcc)")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(baseDir, "bin", "corral-race")
	build := exec.Command("go", "build", "-race", "-o", bin, "./cmd/corral")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -race: %v\n%s", err, out)
	}
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		bad := filepath.Join(fx.W, "no-certificate.pem")
		writeOwned(t, m, bad, []byte("not a certificate\n"), 0o644)
		for _, run := range []struct {
			opts runOpts
			code int
		}{
			{runOpts{args: []string{"/bin/sh", "-c", "curl -sS -m 3 http://example.com/ >/dev/null 2>&1; exit 0"}}, 0},
			{runOpts{args: []string{"/bin/true"}, flags: []string{"--upstream-ca", bad}}, 125},
		} {
			run.opts.bin, run.opts.policy = bin, proxyPolicy("")
			r := runCorral(t, fx, run.opts)
			if r.code != run.code || strings.Contains(r.stderr, "DATA RACE") {
				t.Errorf("want exit %d and no data race\n%s", run.code, r)
			}
		}
	})
}
