package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// pip installs a package from a package index on the lab (PEP 503's
// simple API) over an inspected endpoint, trusting the sandbox CA without
// being told to.

var addrPyPI = netip.MustParseAddr("203.0.113.53")

const wheelName = "corral_hello-1.0-py3-none-any.whl"

// wheel is a pure-Python wheel of corral-hello 1.0, RECORD and all.
func wheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{"corral_hello/__init__.py", "MSG = 'hello from a wheel'\n"},
		{"corral_hello-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: corral-hello\nVersion: 1.0\n"},
		{"corral_hello-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: corral-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("corral_hello-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("corral_hello-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// packageIndex serves one project the way PyPI's simple API does.
func packageIndex(whl []byte) http.Handler {
	sum := sha256.Sum256(whl)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/corral-hello/":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%s">%s</a></body></html>`, wheelName, hex.EncodeToString(sum[:]), wheelName)
		case "/files/" + wheelName:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(whl)
		default:
			http.NotFound(w, r)
		}
	})
}

const pipScript = `#!/bin/bash
cd "$W" || exit 99
python3 -m pip install --no-cache-dir --disable-pip-version-check --no-input --progress-bar off \
  --index-url https://pypi.test/simple/ --target "$W/lib" corral-hello 2>&1 | tail -5
echo "PIP_RC=${PIPESTATUS[0]}"
PYTHONPATH="$W/lib" python3 -c 'import corral_hello; print("IMPORT", corral_hello.MSG)'
`

func TestPipInstall(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/usr/lib/python3/dist-packages/pip"); err != nil {
		requireFeature(t, "pip is not installed for the system's python3 (Debian's python3-pip)")
	}
	lab := netlab.Start(t, netlab.Host{Name: "pypi.test", Addr: addrPyPI})
	lab.Serve("pypi.test", packageIndex(wheel(t)))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "pip.sh"), []byte(pipScript), 0o755)
		caFile := labCAFile(t, fx, lab)
		r := runCorral(t, fx, runOpts{
			args: []string{"/usr/bin/bash", filepath.Join(fx.W, "pip.sh")},
			policy: basePolicy(`network_policies:
  pypi:
    endpoints:
      - {host: pypi.test, port: 443, protocol: rest, access: read-only}
`),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile, "--env", "W=" + fx.W},
			timeout: 2 * time.Minute,
		})
		if !strings.Contains(r.stdout, "PIP_RC=0") || !strings.Contains(r.stdout, "IMPORT hello from a wheel") {
			t.Fatalf("pip did not install the package from the lab's index\n%s", r)
		}
		r.requireEvent(t, "http.request", map[string]any{"host": "pypi.test", "method": "GET", "path": "/files/" + wheelName, "decision": "allow"})
	})
}
