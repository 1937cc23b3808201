package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// npm asks for a scoped package as /@scope%2fname. The tests install one
// from a registry on the lab, through an inspected endpoint, with npm
// itself.

var addrRegistry = netip.MustParseAddr("203.0.113.40")

// npmRegistry serves one package, @corral/hello 1.0.0, the way the npm
// registry does: its document at /@corral%2fhello and its tarball.
func npmRegistry(t *testing.T) http.Handler {
	t.Helper()
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	for name, body := range map[string]string{
		"package/package.json": `{"name": "@corral/hello", "version": "1.0.0", "main": "index.js"}`,
		"package/index.js":     `module.exports = "hello from a scoped package";`,
	} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	sum1, sum512 := sha1.Sum(tgz.Bytes()), sha512.Sum512(tgz.Bytes())
	doc, err := json.Marshal(map[string]any{
		"name":      "@corral/hello",
		"dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{
			"name": "@corral/hello", "version": "1.0.0", "main": "index.js",
			"dist": map[string]string{
				"tarball":   "https://registry.test/@corral/hello/-/hello-1.0.0.tgz",
				"shasum":    hex.EncodeToString(sum1[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sum512[:]),
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.EscapedPath() {
		case "/@corral%2fhello", "/@corral%2Fhello":
			w.Header().Set("Content-Type", "application/json")
			w.Write(doc)
		case "/@corral/hello/-/hello-1.0.0.tgz":
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(tgz.Bytes())
		default:
			http.NotFound(w, r)
		}
	})
}

const npmScript = `#!/bin/bash
cd "$W" && mkdir -p app && cd app || exit 99
echo '{"name": "app", "version": "1.0.0"}' > package.json
start=$(date +%s%N)
npm install --registry https://registry.test/ --no-audit --no-fund --no-update-notifier @corral/hello 2>&1 | tail -5
echo "NPM_MS=$(( ($(date +%s%N) - start) / 1000000 ))"
node -e 'console.log("REQUIRE", require("@corral/hello"))'
# A path rule is another matter: there %2F could move a request past it.
curl -sS --max-time 10 https://rules.test/@corral%2fhello; echo
`

// npmOnHost times the same npm install without corral: straight to the
// registry's address (its certificate names it too), with npm told to
// fetch tarballs from there as well, and a fresh home like the sandbox's.
func npmOnHost(t *testing.T, lab *netlab.Lab) time.Duration {
	t.Helper()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, lab.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name": "app", "version": "1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("npm", "install", "--registry", "https://"+addrRegistry.String()+"/", "--replace-registry-host=always",
		"--cafile", ca, "--fetch-retries=0", "--no-audit", "--no-fund", "--no-update-notifier", "@corral/hello")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "NODE_EXTRA_CA_CERTS="+ca, "npm_config_cache="+filepath.Join(dir, "cache"))
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("npm install on the host: %v\n%s", err, out)
	}
	return time.Since(start).Round(time.Millisecond)
}

func TestNPMScopedPackage(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"npm", "node", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			requireFeature(t, tool+" is not installed")
		}
	}
	lab := netlab.Start(t, netlab.Host{Name: "registry.test", Addr: addrRegistry}, netlab.Host{Name: "rules.test", Addr: addrRegistry})
	lab.Serve("registry.test", npmRegistry(t))
	lab.Serve("rules.test", npmRegistry(t))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "npm.sh"), []byte(npmScript), 0o755)
		caFile := labCAFile(t, fx, lab)
		r := runCorral(t, fx, runOpts{
			args: []string{"/usr/bin/bash", filepath.Join(fx.W, "npm.sh")},
			policy: basePolicy(`network_policies:
  registry:
    endpoints:
      - {host: registry.test, port: 443, protocol: rest, access: read-only}
  rules:
    endpoints:
      - host: rules.test
        port: 443
        protocol: rest
        rules:
          - allow: {method: GET, path: "/@corral/**"}
`),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile, "--env", "W=" + fx.W},
			timeout: 2 * time.Minute,
		})
		// `go test -v -run TestNPMScopedPackage ./test/e2e/` reports the
		// time of the npm install itself, inside and outside corral.
		if ms := regexp.MustCompile(`NPM_MS=(\d+)`).FindStringSubmatch(r.stdout); ms != nil {
			t.Logf("%s: npm install of one scoped package took %s ms inside corral (the whole run, start to exit: %v); on the host: %v",
				m.name, ms[1], r.elapsed.Round(time.Millisecond), npmOnHost(t, lab))
		}
		if !strings.Contains(r.stdout, "REQUIRE hello from a scoped package") {
			t.Fatalf("npm did not install the scoped package\n%s", r)
		}
		deny := r.requireEvent(t, "http.request", map[string]any{"host": "rules.test", "decision": "deny", "reason": "l7_ambiguous_path"})
		if deny["policy"] != "rules" || deny["rule"] != "network_policies.rules.endpoints[0].rules[0] (path /@corral/**)" {
			t.Errorf("the refusal does not name the policy and the rule %%2F could slip past: %v", deny)
		}
		if !strings.Contains(r.stdout, "allow_encoded_slash") {
			t.Errorf("the 403 does not say which setting accepts the path\n%s", r.stdout)
		}
	})
}
