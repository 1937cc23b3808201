package e2e

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// A real headless Chromium inside the sandbox, driven through the DevTools
// protocol by chromedp (test/e2e/browse, run in the sandbox too): pages
// over HTTP and over inspected HTTPS, a page's own fetch() under the
// endpoint's method rules, a WebSocket over inspected TLS, and a host no
// policy allows.

var addrWeb = netip.MustParseAddr("203.0.113.52")

var (
	browseOnce sync.Once
	browseBin  string
	browseErr  error
)

// buildBrowse builds test/e2e/browse once per test binary; only this test
// needs it, so the suite does not pay for it on every run.
func buildBrowse(t *testing.T) string {
	t.Helper()
	browseOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			browseErr = err
			return
		}
		out := filepath.Join(baseDir, "bin", "browse")
		cmd := exec.Command("go", "build", "-o", out, "./test/e2e/browse")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			browseErr = &buildError{err, b}
			return
		}
		browseBin = out
	})
	if browseErr != nil {
		t.Fatalf("build test/e2e/browse: %v", browseErr)
	}
	return browseBin
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

func TestHeadlessChromium(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/usr/lib/chromium/chromium"); err != nil {
		requireFeature(t, "Chromium is not installed (Debian's chromium)")
	}
	browse := buildBrowse(t)
	lab := netlab.Start(t, netlab.Host{Name: "web.test", Addr: addrWeb}, netlab.Host{Name: "insp.test", Addr: addrWeb},
		netlab.Host{Name: "denied.test", Addr: addrWeb})

	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		copyFile(t, browse, filepath.Join(fx.W, "browse"), 0o755)
		caFile := labCAFile(t, fx, lab)
		r := runCorral(t, fx, runOpts{
			args: []string{filepath.Join(fx.W, "browse"),
				"-fetch", "https://insp.test/from-script",
				"-fetch", "POST https://insp.test/from-script",
				"-ws", "wss://insp.test/ws",
				"http://web.test/page", "http://denied.test/page", "https://insp.test/page"},
			policy: basePolicy(`network_policies:
  web:
    endpoints:
      - {host: web.test, port: 80}
      - {host: insp.test, port: 443, protocol: rest, access: read-only}
    binaries: [{path: /usr/lib/chromium/chromium}]
`),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile},
			timeout: 2 * time.Minute,
		})
		for _, want := range []string{
			"PAGE http://web.test/page hello from web.test GET /page",
			"PAGE https://insp.test/page hello from insp.test GET /page",
			"FETCH GET https://insp.test/from-script 200 hello from insp.test GET /from-script",
			"FETCH POST https://insp.test/from-script 403",
			// A WebSocket upgrade the rules allow (a GET) is relayed.
			"WS wss://insp.test/ws ECHO ping from chromium",
		} {
			if !strings.Contains(r.stdout, want+"\n") && !strings.Contains(r.stdout, want+" ") {
				t.Errorf("want %q in the browser's output\n%s", want, r)
			}
		}
		if strings.Contains(r.stdout, "hello from denied.test") {
			t.Errorf("a page of a host no policy allows was loaded\n%s", r)
		}
		r.requireEvent(t, "http.request", map[string]any{"host": "insp.test", "method": "GET", "path": "/page", "decision": "allow", "binary": "/usr/lib/chromium/chromium"})
		r.requireEvent(t, "http.request", map[string]any{"host": "insp.test", "method": "POST", "path": "/from-script", "decision": "deny"})
		if findEvent(r, "net.connect.denied", map[string]any{"host": "denied.test"}) == nil && findEvent(r, "http.request", map[string]any{"host": "denied.test", "decision": "deny"}) == nil {
			t.Errorf("no refusal of denied.test in the audit log\n%s", r)
		}
		for _, s := range lab.HTTPRequests() {
			if s.Host == "denied.test" || s.Method == "POST" {
				t.Errorf("the lab received %s %s%s", s.Method, s.Host, s.Path)
			}
		}
	})
}
