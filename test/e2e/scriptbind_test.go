package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// A policy bound to an interpreted script (npm-cli.js, pydoc3) must not be
// satisfied by code the workload has the interpreter load into the same
// process before the script: node's -r/--require on the command line or
// in NODE_OPTIONS, a sitecustomize.py found through PYTHONPATH, and, with
// no option or variable at all, a usercustomize.py in the user
// site-packages of the sandbox's writable home.
const scriptBindScript = `#!/bin/bash
mkdir -p /tmp/pyevil
cat > /tmp/evil.js <<'JS'
const http = require("http");
http.get({host: "bound.test", path: "/evil-js-" + process.env.TAG, timeout: 5000}, r => { let d = ""; r.on("data", c => d += c); r.on("end", () => { console.log("EVILJS " + d); process.exit(0); }); }).on("error", e => { console.log("EVILJS-ERR " + e.message); process.exit(0); });
JS
cat > /tmp/pyevil/sitecustomize.py <<'PY'
import urllib.request, os, sys
try:
    print("EVILPY", urllib.request.urlopen("http://bound.test/evil-sitecustomize", timeout=5).read().decode(), flush=True)
except Exception as e:
    print("EVILPY-ERR", e, flush=True)
os._exit(0)
PY
echo "=== node-plain"; TAG=plain timeout 10 node /tmp/evil.js 2>&1
echo "=== node-r"; TAG=dash-r timeout 10 node -r /tmp/evil.js /usr/lib/node_modules/npm/bin/npm-cli.js --version 2>&1 | grep EVIL
echo "=== node-options"; TAG=node-options NODE_OPTIONS="--require /tmp/evil.js" timeout 10 npm --version 2>&1 | grep EVIL
echo "=== py-plain"; timeout 10 python3 -c 'import urllib.request; print(urllib.request.urlopen("http://bound.test/py-plain", timeout=5).read())' 2>&1 | tail -1
echo "=== py-sitecustomize"; PYTHONPATH=/tmp/pyevil timeout 10 python3 /usr/bin/pydoc3 -k xyz 2>&1
# No option, no variable: python loads usercustomize from the user
# site-packages in the sandbox's writable home before the bound script.
sp=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$sp"
cat > "$sp/usercustomize.py" <<'PY'
import sys, os
if any("pydoc" in a for a in sys.argv):
    import urllib.request
    try:
        print("USERCUSTOMIZE", urllib.request.urlopen("http://bound.test/evil-usercustomize", timeout=5).read().decode(), flush=True)
    except Exception as e:
        print("USERCUSTOMIZE-ERR", e, flush=True)
    os._exit(0)
PY
echo "=== py-usercustomize"; timeout 10 /usr/bin/pydoc3 -k xyz 2>&1 | head -3
echo "=== end"
`

func TestScriptBindingRefusesInjectedCode(t *testing.T) {
	requireRoot(t)
	for _, p := range []string{"/usr/lib/node_modules/npm/bin/npm-cli.js", "/usr/bin/pydoc3", "/usr/bin/node"} {
		if _, err := os.Stat(p); err != nil {
			requireFeature(t, "needs "+p+" (apt-get install nodejs npm python3)")
		}
	}
	lab := netlab.Start(t, netlab.Host{Name: "bound.test", Addr: netip.MustParseAddr("203.0.113.13")})
	m := getRootMode(t)
	fx := newFixture(t, m)
	writeOwned(t, m, filepath.Join(fx.W, "bind.sh"), []byte(scriptBindScript), 0o755)
	pol := proxyPolicy(`network_policies:
  bound:
    endpoints:
      - {host: bound.test, port: 80}
    binaries: [{path: /usr/lib/node_modules/npm/bin/npm-cli.js}, {path: /usr/bin/pydoc3}]
`)
	r := runCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "bind.sh")},
		policy: pol, timeout: 120 * time.Second, flags: []string{"--upstream-dns", lab.DNS.String()}})
	n := &netRun{t: t, r: r, sec: sections(r.stdout)}
	if n.sec["end"] == "" {
		t.Fatalf("the script did not complete\n%s", r)
	}
	n.hasNot("node-plain", `hello from`)
	n.hasNot("py-plain", `hello from`)
	for _, s := range lab.HTTPRequests() {
		if strings.HasPrefix(s.Path, "/evil") {
			t.Errorf("code from /tmp reached bound.test under a script binding: %s\nsandbox output:\n%s\nnetwork events:\n%s", s.Path, r.stdout, netEvents(r))
		}
	}
}
