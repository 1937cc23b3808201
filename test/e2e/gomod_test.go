package e2e

import (
	"archive/zip"
	"bytes"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// The go command fetches a module a program imports from a module proxy on
// the lab (the GOPROXY protocol) through an inspected endpoint, trusting the
// sandbox CA through SSL_CERT_FILE.

var addrGoProxy = netip.MustParseAddr("203.0.113.54")

const (
	goModPath = "hello.test/greet"
	goModVer  = "v1.0.0"
	goModFile = "module " + goModPath + "\n\ngo 1.21\n"
)

// moduleZip is goModPath@goModVer as the proxy protocol serves it: every
// file under "path@version/".
func moduleZip(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range map[string]string{
		"go.mod":   goModFile,
		"greet.go": "package greet\n\n// Hello is what the module says.\nfunc Hello() string { return \"hello from a module\" }\n",
	} {
		w, err := zw.Create(goModPath + "@" + goModVer + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// moduleProxy serves one module version the way a GOPROXY does.
func moduleProxy(zipped []byte) http.Handler {
	base := "/" + goModPath + "/@v/"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case base + "list":
			fmt.Fprintln(w, goModVer)
		case base + goModVer + ".info":
			fmt.Fprintf(w, `{"Version": %q, "Time": "2026-01-02T03:04:05Z"}`, goModVer)
		case base + goModVer + ".mod":
			w.Write([]byte(goModFile))
		case base + goModVer + ".zip":
			w.Write(zipped)
		default:
			http.NotFound(w, r)
		}
	})
}

const goScript = `#!/bin/bash
cd "$W" && mkdir -p app && cd app || exit 99
cat > go.mod <<'EOF2'
module example.test/app

go 1.21

require hello.test/greet v1.0.0
EOF2
cat > main.go <<'EOF2'
package main

import "hello.test/greet"

func main() { println(greet.Hello()) }
EOF2
export GOPROXY=https://goproxy.test GOSUMDB=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
# Resolving the import downloads the module; listing its files needs no
# compiler run, which a fresh build cache would make take a minute.
dir=$(go list -f '{{.Dir}}' hello.test/greet) || echo LIST_ERR
grep -h '"hello from a module"' "$dir/greet.go" >/dev/null && echo "FETCHED hello.test/greet"
`

func TestGoModuleProxy(t *testing.T) {
	requireRoot(t)
	// The go that runs these tests, wherever it is installed; the policy
	// makes its tree visible inside.
	out, err := exec.Command("go", "env", "GOROOT").Output()
	goroot := strings.TrimSpace(string(out))
	if err != nil || goroot == "" {
		requireFeature(t, "no go command on PATH")
	}
	goBin := filepath.Join(goroot, "bin", "go")
	lab := netlab.Start(t, netlab.Host{Name: "goproxy.test", Addr: addrGoProxy})
	lab.Serve("goproxy.test", moduleProxy(moduleZip(t)))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "go.sh"), []byte(goScript), 0o755)
		r := runCorral(t, fx, runOpts{
			args: []string{"/usr/bin/bash", filepath.Join(fx.W, "go.sh")},
			policy: `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc, ` + goroot + `]
network_policies:
  goproxy:
    endpoints:
      - {host: goproxy.test, port: 443, protocol: rest, access: read-only}
    binaries: [{path: ` + goBin + `}]
`,
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", labCAFile(t, fx, lab), "--env", "W=" + fx.W, "--env", "PATH=" + filepath.Dir(goBin) + ":/usr/bin:/bin"},
			timeout: 3 * time.Minute,
		})
		if !strings.Contains(r.stdout, "FETCHED hello.test/greet") {
			t.Fatalf("go did not fetch the module from the lab's proxy\n%s", r)
		}
		r.requireEvent(t, "http.request", map[string]any{"host": "goproxy.test", "method": "GET", "path": "/" + goModPath + "/@v/" + goModVer + ".zip", "decision": "allow", "binary": goBin})
	})
}
