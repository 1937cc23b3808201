package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// The L7 tests run real clients (curl over HTTP/1.1 and h2, python3, node,
// a Go program) in proxy-mode sandboxes whose endpoints ask for HTTP
// inspection, against the lab's HTTP and HTTPS servers. The lab's CA is
// given to corral with --upstream-ca; the clients inside trust only what
// the sandbox gives them.

var (
	addrAPI   = netip.MustParseAddr("203.0.113.20")
	addrRO    = netip.MustParseAddr("203.0.113.21")
	addrAudit = netip.MustParseAddr("203.0.113.22")
	addrPlain = netip.MustParseAddr("203.0.113.23")
)

// l7Policy: api.test has explicit rules and a masked secret; ro.test the
// read-only preset; audit.test read-only in audit mode; plain.test is an
// L4 endpoint (TLS passes through, secrets are not swapped).
const l7Policy = `network_policies:
  api:
    endpoints:
      - host: api.test
        ports: [443, 80]
        protocol: rest
        rules:
          - allow: {method: GET, path: "/repos/**"}
          - allow: {method: POST, path: /graphql}
          - allow: {method: GET, path: "/public/**"}
          - allow: {method: GET, path: "/stream/*"}
          - allow: {method: GET, path: /ws}
          - allow: {method: GET, path: /search, query: {q: "repo:*"}}
        deny_rules:
          - {method: "*", path: "/repos/*/secrets/**"}
          - {method: GET, path: "/public/admin/**"}
  ro:
    endpoints:
      - {host: ro.test, port: 443, protocol: rest, tls: terminate, access: read-only}
  audited:
    endpoints:
      - {host: audit.test, port: 443, protocol: rest, access: read-only, enforcement: audit}
  plain:
    endpoints:
      - {host: plain.test, port: 443}
secrets:
  GH_TOKEN:
    from_env: CORRAL_TEST_GH_TOKEN
    hosts: [api.test]
`

// l7Tool is run by python3 for what curl cannot do.
const l7Tool = `import base64, os, socket, ssl, sys, time, urllib.request

def ws(host, path, msg):
    ctx = ssl.create_default_context()
    s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, host, key)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        d = s.recv(4096)
        if not d:
            break
        data += d
    head, _, buf = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].decode()
    print("WS_STATUS", status)
    if " 101 " not in status + " ":
        return
    payload = msg.encode()
    mask = os.urandom(4)
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    while len(buf) < 2:
        buf += s.recv(4096)
    n = buf[1] & 0x7F
    while len(buf) < 2 + n:
        buf += s.recv(4096)
    print("WS_ECHO", buf[2:2 + n].decode())

def stream(url, flag):
    start = time.time()
    r = urllib.request.urlopen(url, timeout=40)
    first = r.readline().decode().strip()
    print("STREAM_FIRST %s after %.1fs" % (first, time.time() - start), flush=True)
    open(flag, "w").close()
    rest = r.read().decode().strip()
    print("STREAM_REST", rest)

def get(url):
    try:
        r = urllib.request.urlopen(url, timeout=10)
        print("PYSTATUS", r.status, r.read().decode())
    except Exception as e:
        print("PYERR", type(e).__name__, e)

globals()[sys.argv[1]](*sys.argv[2:])
`

const l7Script = `#!/bin/bash
cd "$W" || exit 99
C="curl -sS --max-time 15"
sec() { echo; echo "=== $1"; }

sec env_ca
echo "SSL_CERT_FILE=$SSL_CERT_FILE NODE_EXTRA_CA_CERTS=$NODE_EXTRA_CA_CERTS"

sec ro_get
$C https://ro.test$P/ro-get; echo " rc=$?"
sec ro_post
$C -i -X POST --data x https://ro.test$P/ro-post; echo " rc=$?"
sec ro_delete_transparent
$C --noproxy '*' -i -X DELETE https://ro.test$P/ro-delete; echo " rc=$?"
sec ro_post_socks
$C -x socks5h://` + socksProxy + ` -i -X POST --data x https://ro.test$P/ro-socks; echo " rc=$?"

sec rules_get
$C --noproxy '*' https://api.test/repos/a/b$P; echo " rc=$?"
sec rules_graphql
$C --noproxy '*' -X POST --data '{}' https://api.test/graphql; echo " rc=$?"
sec rules_post_repos
$C --noproxy '*' -o /dev/null -w '%{http_code}' -X POST --data x https://api.test/repos/a$P; echo " rc=$?"
sec rules_deny_wins
$C --noproxy '*' -i https://api.test/repos/a/secrets/x$P; echo " rc=$?"
sec rules_query_ok
$C --noproxy '*' -o /dev/null -w '%{http_code}' 'https://api.test/search?q=repo:corral'; echo " rc=$?"
sec rules_query_bad
$C --noproxy '*' -o /dev/null -w '%{http_code}' 'https://api.test/search?q=repo:corral&q=user:x'; echo " rc=$?"

sec audit_post
$C -X POST --data x https://audit.test$P/audit-post; echo " rc=$?"

for p in '/public/admin/x' '/public/x/../admin/x' '/public//admin/x' '/public/%2e%2e/public/admin/x' \
         '/public/x/%2E%2E/admin/x' '/public/admin%2fx' '/public/..;/public/admin/x' '/public/%252e%252e/admin' \
         '/public/./admin/x' '/public/admin;x/y' '/public;p/admin/x'; do
  sec "norm $p"
  $C --noproxy '*' --path-as-is -o /dev/null -w '%{http_code}' "https://api.test$p"; echo " rc=$?"
done
sec norm_allowed
$C --noproxy '*' --path-as-is "https://api.test/public/a/../b$P"; echo " rc=$?"

sec h2
$C --noproxy '*' --http2 -w ' VER %{http_version}\n' https://api.test/repos/h2a$P --next --noproxy '*' --http2 -sS --max-time 15 -o /dev/null -w 'DENIED %{http_code} VER %{http_version}\n' -X POST --data x https://api.test/repos/h2b$P; echo " rc=$?"

sec plain_http
$C --noproxy '*' http://api.test/repos/plain$P; echo " rc=$?"
sec plain_http_delete
$C --noproxy '*' -o /dev/null -w '%{http_code}' -X DELETE http://api.test/repos/plain-delete$P; echo " rc=$?"
sec plain_http_proxy_delete
$C -o /dev/null -w '%{http_code}' -X DELETE http://api.test/repos/proxy-delete$P; echo " rc=$?"

sec stream
python3 l7.py stream "https://api.test/stream/s-${P#/}" "$W/stream-go"

sec ws
python3 l7.py ws api.test /ws hello-ws

sec client_python
python3 l7.py get https://ro.test$P/client-python
sec client_go
./attack https-get https://ro.test$P/client-go
sec client_node
if command -v node >/dev/null; then
  node -e 'require("https").get(process.argv[1], r => { let b = ""; r.on("data", d => b += d); r.on("end", () => console.log("NODESTATUS", r.statusCode, b)); }).on("error", e => console.log("NODEERR", e.message))' https://ro.test$P/client-node
else
  echo "NO_NODE"
fi
sec client_no_vars
env -u SSL_CERT_FILE -u CURL_CA_BUNDLE -u REQUESTS_CA_BUNDLE $C --noproxy '*' https://ro.test$P/client-no-vars; echo " rc=$?"

sec secret_env
echo "TOKEN=$GH_TOKEN"
sec secret_bearer
$C --noproxy '*' -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $GH_TOKEN" https://api.test/repos/secret-bearer$P; echo " rc=$?"
sec secret_basic
$C --noproxy '*' -o /dev/null -w '%{http_code}' -u "x-access-token:$GH_TOKEN" https://api.test/repos/secret-basic$P; echo " rc=$?"
sec secret_other_host
$C --noproxy '*' --cacert ca.pem -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $GH_TOKEN" https://plain.test/secret-other$P; echo " rc=$?"
sec secret_plain_http
$C --noproxy '*' -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $GH_TOKEN" http://api.test/repos/secret-plain$P; echo " rc=$?"
sec secret_visible
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f" 2>/dev/null; done
env
cat /run/corral/ca.pem >/dev/null && echo "CA_READABLE"

sec ca_key
grep -l "PRIVATE KEY" /run/corral/* /etc/ssl/certs/ca-certificates.crt 2>/dev/null; echo "KEYFILES_DONE"
for f in /run/corral/ca-bundle.pem /run/corral/ca.pem /etc/ssl/certs/ca-certificates.crt; do
  if echo "-----BEGIN CERTIFICATE-----" >> "$f" 2>/dev/null; then echo "TAMPERED $f"; fi
done
if touch /run/corral/evil.pem 2>/dev/null; then echo "TAMPERED /run/corral"; fi

echo
echo "=== end"
`

func TestL7Inspection(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "api.test", Addr: addrAPI},
		netlab.Host{Name: "ro.test", Addr: addrRO},
		netlab.Host{Name: "audit.test", Addr: addrAudit},
		netlab.Host{Name: "plain.test", Addr: addrPlain},
	)
	forEachMode(t, false, func(t *testing.T, m *mode) {
		P := "/" + m.name
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "ca.pem"), lab.CAPEM, 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "l7.py"), []byte(l7Tool), 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "l7.sh"), []byte(l7Script), 0o755)
		caFile := labCAFile(t, fx, lab)
		real := "ghp_" + randomAlnum(36)

		// The stream's upstream holds its last event until the client
		// inside has read the first one.
		streamID := "s-" + m.name
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if _, err := os.Stat(filepath.Join(fx.W, "stream-go")); err == nil {
					lab.Release(streamID)
					return
				}
			}
		}()

		r := runCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "l7.sh")},
			policy: basePolicy(l7Policy),
			flags: []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile, "--env", "W=" + fx.W, "--env", "P=" + P,
				// Ways a real value could be handed in by mistake.
				"--pass-env", "CORRAL_TEST_GH_TOKEN", "--env", "LEAK=x" + real},
			env: []string{"CORRAL_TEST_GH_TOKEN=" + real},
		})
		n := &netRun{t: t, r: r, sec: sections(r.stdout)}
		if r.code != 0 || n.sec["end"] == "" {
			t.Fatalf("the script did not complete\n%s", r)
		}
		defer func() {
			if t.Failed() {
				t.Logf("full run:\n%s", r)
			}
		}()
		seen := func(path string) []netlab.Seen {
			var out []netlab.Seen
			for _, s := range lab.HTTPRequests() {
				if s.Path == path {
					out = append(out, s)
				}
			}
			return out
		}
		httpEvent := func(want map[string]any) map[string]any {
			t.Helper()
			return n.event("http.request", want)
		}

		n.has("env_ca", `SSL_CERT_FILE=/run/corral/ca-bundle\.pem NODE_EXTRA_CA_CERTS=/run/corral/ca-bundle\.pem`)

		// read-only: GET through, POST and DELETE refused with the agent's
		// 403 on every way in (CONNECT, transparent, SOCKS5).
		n.has("ro_get", `hello from ro\.test GET `+regexp.QuoteMeta(P)+`/ro-get rc=0`)
		httpEvent(map[string]any{"host": "ro.test", "method": "GET", "path": P + "/ro-get", "decision": "allow", "rule": "access: read-only", "status": 200, "via": "http_connect"})
		for _, c := range []struct{ sec, path, method, via string }{
			{"ro_post", "/ro-post", "POST", "http_connect"},
			{"ro_delete_transparent", "/ro-delete", "DELETE", "transparent"},
			{"ro_post_socks", "/ro-socks", "POST", "socks5"},
		} {
			n.has(c.sec, `(?i)HTTP/[0-9.]+ 403`)
			n.has(c.sec, `(?i)x-corral-policy: deny; reason=l7_no_matching_rule`)
			body := n.denyBody(c.sec, `(\{"error".*\})`, "error", "reason", "policy", "rule", "method", "path", "next_steps")
			requireFields(t, c.sec, body, map[string]any{"reason": "l7_no_matching_rule", "policy": "ro", "method": c.method, "path": P + c.path, "host": "ro.test"})
			httpEvent(map[string]any{"host": "ro.test", "method": c.method, "path": P + c.path, "decision": "deny", "status": 403, "via": c.via})
			if s := seen(P + c.path); len(s) != 0 {
				t.Errorf("%s: the upstream received the refused request: %+v", c.sec, s)
			}
		}

		// Rules allow exactly what they say; deny_rules win.
		n.has("rules_get", `hello from api\.test GET /repos/a/b`+regexp.QuoteMeta(P)+` rc=0`)
		n.has("rules_graphql", `hello from api\.test POST /graphql rc=0`)
		n.has("rules_post_repos", `^403 rc=0`)
		n.has("rules_deny_wins", `(?i)x-corral-policy: deny; reason=l7_deny_rule`)
		httpEvent(map[string]any{"host": "api.test", "path": "/repos/a/secrets/x" + P, "decision": "deny", "rule": "deny_rules[0]"})
		n.has("rules_query_ok", `^200 rc=0`)
		n.has("rules_query_bad", `^403 rc=0`)

		// Audit mode forwards and records a would-deny.
		n.has("audit_post", `hello from audit\.test POST `+regexp.QuoteMeta(P)+`/audit-post rc=0`)
		httpEvent(map[string]any{"host": "audit.test", "method": "POST", "path": P + "/audit-post", "decision": "audit", "would_deny": true, "reason": "l7_no_matching_rule", "status": 200})

		// Every way of spelling a denied path is refused, and the
		// upstream never hears of it.
		for name, out := range n.sec {
			if strings.HasPrefix(name, "norm /") && !strings.Contains(out, "403 rc=0") {
				t.Errorf("case %s: want 403, got %q", name, out)
			}
		}
		for _, s := range lab.HTTPRequests() {
			if strings.Contains(s.Path, "admin") || strings.Contains(s.Path, "..") {
				t.Errorf("the upstream received a path the policy denies: %q", s.Path)
			}
		}
		n.has("norm_allowed", `hello from api\.test GET /public/b`+regexp.QuoteMeta(P)+` rc=0`)

		// h2 end to end, each stream decided on its own.
		n.has("h2", `hello from api\.test GET /repos/h2a`+regexp.QuoteMeta(P)+` VER 2`)
		n.has("h2", `DENIED 403 VER 2`)
		httpEvent(map[string]any{"path": "/repos/h2a" + P, "proto": "HTTP/2.0", "decision": "allow"})
		httpEvent(map[string]any{"path": "/repos/h2b" + P, "proto": "HTTP/2.0", "decision": "deny"})
		if s := seen("/repos/h2a" + P); len(s) != 1 || s[0].Proto != "HTTP/2.0" {
			t.Errorf("h2: the upstream saw %+v, want one HTTP/2.0 request", s)
		}

		// Plain HTTP is inspected the same way, transparent or proxied.
		n.has("plain_http", `hello from api\.test GET /repos/plain`+regexp.QuoteMeta(P)+` rc=0`)
		httpEvent(map[string]any{"path": "/repos/plain" + P, "scheme": "http", "decision": "allow", "via": "transparent"})
		n.has("plain_http_delete", `^403 rc=0`)
		n.has("plain_http_proxy_delete", `^403 rc=0`)
		httpEvent(map[string]any{"path": "/repos/proxy-delete" + P, "scheme": "http", "decision": "deny", "via": "http_forward"})

		// A streamed response arrives as the upstream sends it.
		if at := n.has("stream", `STREAM_FIRST data: first after ([0-9.]+)s`); at != "" {
			if secs, _ := time.ParseDuration(at + "s"); secs > 10*time.Second {
				t.Errorf("stream: the first event took %s; the upstream sent it at once", at)
			}
		}
		n.has("stream", `STREAM_REST data: last`)

		// WebSocket through an allowed upgrade.
		n.has("ws", `WS_STATUS HTTP/1\.1 101`)
		n.has("ws", `WS_ECHO hello-ws`)

		// Clients trust the certificates inspection presents, through
		// the variables and through the replaced system bundle.
		n.has("client_python", `PYSTATUS 200 hello from ro\.test GET `+regexp.QuoteMeta(P)+`/client-python`)
		n.has("client_go", `GOSTATUS 200 HTTP/[0-9.]+ hello from ro\.test GET `+regexp.QuoteMeta(P)+`/client-go`)
		if !strings.Contains(n.sec["client_node"], "NO_NODE") {
			n.has("client_node", `NODESTATUS 200 hello from ro\.test GET `+regexp.QuoteMeta(P)+`/client-node`)
		} else {
			t.Log("node is not installed; its client check did not run")
		}
		n.has("client_no_vars", `hello from ro\.test GET `+regexp.QuoteMeta(P)+`/client-no-vars rc=0`)

		// Masked secrets: a surrogate inside, the real value only on the
		// wire to the scoped host, over TLS.
		sur := n.has("secret_env", `TOKEN=(ghp_[A-Za-z0-9]{36})\n`)
		if sur == real || sur == "" {
			t.Fatalf("the workload's GH_TOKEN is %q", sur)
		}
		checkAuth := func(path, want string) {
			t.Helper()
			s := seen(path)
			if len(s) != 1 {
				t.Errorf("%s: the upstream saw %d requests", path, len(s))
				return
			}
			if got := s[0].Header.Get("Authorization"); got != want {
				t.Errorf("%s: the upstream got Authorization %q, want %q", path, got, want)
			}
		}
		checkAuth("/repos/secret-bearer"+P, "Bearer "+real)
		checkAuth("/repos/secret-basic"+P, "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:"+real)))
		checkAuth("/secret-other"+P, "Bearer "+sur)
		checkAuth("/repos/secret-plain"+P, "Bearer "+sur)
		httpEvent(map[string]any{"path": "/repos/secret-bearer" + P, "masked": 1})
		n.has("secret_visible", `(?m)^LEAK=x`+regexp.QuoteMeta(sur)+`$`)

		// The CA's key is in no file the sandbox sees, nor in corral's
		// state on the host, and the trust the workload is given cannot
		// be extended from inside.
		n.has("ca_key", `^KEYFILES_DONE\n\s*$`)
		n.hasNot("ca_key", `TAMPERED`)
		filepath.WalkDir(fx.state, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte("PRIVATE KEY")) {
					t.Errorf("a private key is on disk in corral's state: %s", path)
				}
			}
			return nil
		})
		n.hasNot("secret_visible", `(?m)^CORRAL_TEST_GH_TOKEN=`)
		n.has("secret_visible", `CA_READABLE`)

		// The real value is nowhere the workload or a log reader looks.
		b64 := base64.StdEncoding.EncodeToString([]byte(real))
		for what, text := range map[string]string{
			"the workload's output": r.stdout, "corral's stderr": r.stderr, "the audit log": r.eventsText(),
		} {
			if strings.Contains(text, real) || strings.Contains(text, b64) {
				t.Errorf("the real secret appears in %s", what)
			}
		}
		// One event per request, with the fields consumers rely on.
		if e := httpEvent(map[string]any{"path": P + "/ro-get"}); e != nil {
			for _, k := range []string{"decision", "rule", "status", "bytes", "bytes_out", "duration_ms", "method", "binary", "policy"} {
				if _, ok := e[k]; !ok {
					t.Errorf("http.request event lacks %q: %v", k, e)
				}
			}
		}
		if got := len(findEvents(r, "http.request", map[string]any{"path": P + "/ro-get"})); got != 1 {
			t.Errorf("GET /ro-get produced %d http.request events, want 1", got)
		}
	})
}

func randomAlnum(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// Without corral's proxy (uncaged, or network mode allow) nothing can swap
// a surrogate, yet the workload must still never see the real value: it
// gets the surrogate, and the user is told it will not work.
func TestSecretsWithoutProxy(t *testing.T) {
	real := "ghp_" + randomAlnum(36)
	secret := "secrets:\n  GH_TOKEN: {from_env: CORRAL_TEST_GH_TOKEN, hosts: [api.test]}\n"
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, c := range []struct {
			name   string
			policy string
			flags  []string
		}{
			{"uncaged", basePolicy("network_policies:\n  api:\n    endpoints: [{host: api.test, port: 443, protocol: rest, access: full}]\n" + secret), []string{"--no-sandbox"}},
			{"allow-mode", basePolicy("network: {mode: allow}\n" + secret), nil},
		} {
			t.Run(c.name, func(t *testing.T) {
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{
					args:   []string{fx.attack, "env"},
					policy: c.policy,
					flags:  c.flags,
					env:    []string{"CORRAL_TEST_GH_TOKEN=" + real},
				})
				if r.code != 0 {
					t.Fatalf("run failed\n%s", r)
				}
				if strings.Contains(r.stdout, real) {
					t.Errorf("the real secret reached the workload\n%s", r)
				}
				if !regexp.MustCompile(`(?m)^GH_TOKEN=ghp_[A-Za-z0-9]{36}$`).MatchString(r.stdout) {
					t.Errorf("the workload has no surrogate GH_TOKEN\n%s", r)
				}
				if !strings.Contains(r.stderr, "will fail") {
					t.Errorf("no warning that the surrogates will not work\n%s", r)
				}
			})
		}
	})
}

// l7LeakScript opens many inspected connections at once, each with
// allowed and refused requests on keep-alive, plus streams the client
// abandons half-way, then closes everything.
const l7LeakScript = `import http.client, os, ssl, sys, threading, time

def wait_for(f):
    end = time.time() + 60
    while not os.path.exists(f):
        if time.time() > end:
            sys.exit("timeout waiting for " + f)
        time.sleep(0.02)

ctx = ssl.create_default_context()
print("READY", flush=True)
wait_for("go-open")
ok, bad = [0], [0]
lock = threading.Lock()

def worker(i):
    try:
        c = http.client.HTTPSConnection("ro.test", 443, context=ctx, timeout=20)
        for j, method in enumerate(["GET", "POST", "GET"]):
            c.request(method, "/leak/%d/%d" % (i, j), body=b"x" if method == "POST" else None)
            r = c.getresponse()
            r.read()
            want = 403 if method == "POST" else 200
            with lock:
                if r.status == want:
                    ok[0] += 1
                else:
                    bad[0] += 1
        c.close()
    except Exception as e:
        with lock:
            bad[0] += 1
        print("ERR", e, flush=True)

def abandon(i):
    try:
        c = http.client.HTTPSConnection("ro.test", 443, context=ctx, timeout=20)
        c.request("GET", "/stream/abandoned-%s-%d" % (sys.argv[1], i))
        r = c.getresponse()
        r.readline()
        c.sock.close()
    except Exception as e:
        print("ERR", e, flush=True)

ts = [threading.Thread(target=worker, args=(i,)) for i in range(100)]
ts += [threading.Thread(target=abandon, args=(i,)) for i in range(20)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("DONE ok=%d bad=%d" % (ok[0], bad[0]), flush=True)
wait_for("go-exit")
`

func TestL7NoLeaks(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t, netlab.Host{Name: "ro.test", Addr: addrRO})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "leak.py"), []byte(l7LeakScript), 0o644)
		caFile := labCAFile(t, fx, lab)
		p := startCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/python3", filepath.Join(fx.W, "leak.py"), m.name},
			policy: basePolicy("network_policies:\n  ro:\n    endpoints: [{host: ro.test, port: 443, protocol: rest, access: read-only}]\n"),
			flags:  []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile},
		})
		waitOut(t, p, "READY", 15*time.Second)
		pid := p.cmd.Process.Pid
		time.Sleep(100 * time.Millisecond)
		base := countFDs(pid)
		fx.signal(t, "go-open")
		waitOut(t, p, "DONE ", 60*time.Second)
		after := settledFDs(pid, base)
		kinds := fdKinds(pid)
		fx.signal(t, "go-exit")
		r := p.wait()
		if !strings.Contains(r.stdout, "DONE ok=300 bad=0") || r.code != 0 {
			t.Fatalf("the requests did not all get their answer\n%s", r)
		}
		t.Logf("supervisor fds: before %d, after %d", base, after)
		if after > base+fdSlack {
			t.Errorf("supervisor fd leak after 120 inspected connections: %d before, %d after (%v)", base, after, kinds)
		}
	})
}

// l7ReloadScript makes the same requests before and after the test reloads
// the policy.
const l7ReloadScript = `#!/bin/bash
cd "$W" || exit 99
wait_for() { for _ in $(seq 300); do [ -e "$1" ] && return 0; sleep 0.1; done; echo "TIMEOUT $1"; exit 1; }
C="curl -sS --max-time 15 -o /dev/null -w %{http_code}"
for phase in before after; do
  [ $phase = after ] && wait_for go-after
  echo "$phase ro=$($C -H "Authorization: Bearer $GH_TOKEN" https://ro.test/reload-$phase$P) post=$($C -X POST --data x https://api.test/reload-$phase$P)"
done
`

// A hot reload moves L7 rules and a secret's scope in a running sandbox;
// the surrogate in the workload stays what it was.
func TestL7Reload(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "api.test", Addr: addrAPI},
		netlab.Host{Name: "ro.test", Addr: addrRO},
	)
	policyWith := func(apiAccess, scope string) string {
		return basePolicy(fmt.Sprintf(`network_policies:
  l7:
    endpoints:
      - {host: api.test, port: 443, protocol: rest, access: %s}
      - {host: ro.test, port: 443, protocol: rest, access: read-only}
secrets:
  GH_TOKEN: {from_env: CORRAL_TEST_GH_TOKEN, hosts: [%s]}
`, apiAccess, scope))
	}
	forEachMode(t, false, func(t *testing.T, m *mode) {
		P := "/" + m.name
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "reload.sh"), []byte(l7ReloadScript), 0o755)
		caFile := labCAFile(t, fx, lab)
		real := "ghp_" + randomAlnum(36)
		p := startCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "reload.sh")},
			policy: policyWith("read-only", "api.test"),
			flags:  []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile, "--env", "W=" + fx.W, "--env", "P=" + P},
			env:    []string{"CORRAL_TEST_GH_TOKEN=" + real},
		})
		waitOut(t, p, "before ", 20*time.Second)
		id := ""
		for _, e := range readEvents(t, p.audit) {
			if e["event"] == "sandbox.start" {
				id = fmt.Sprint(e["sandbox_id"])
			}
		}
		next := fx.writePolicy(t, policyWith("full", "ro.test"))
		if code, out := corralCLI(t, m, "policy", "set", "--state-dir", fx.state, "--sandbox", id, next); code != 0 {
			t.Fatalf("reload failed (exit %d):\n%s", code, out)
		}
		fx.signal(t, "go-after")
		r := p.wait()
		if r.code != 0 {
			t.Fatalf("the script failed\n%s", r)
		}
		if !strings.Contains(r.stdout, "before ro=200 post=403") || !strings.Contains(r.stdout, "after ro=200 post=200") {
			t.Errorf("want the POST refused before the reload and allowed after:\n%s", r.stdout)
		}
		auth := map[string]string{}
		for _, s := range lab.HTTPRequests() {
			if strings.HasPrefix(s.Path, "/reload-") && strings.HasSuffix(s.Path, P) && s.Host == "ro.test" {
				auth[strings.TrimSuffix(s.Path, P)] = s.Header.Get("Authorization")
			}
		}
		if got := auth["/reload-before"]; got == "Bearer "+real || !strings.HasPrefix(got, "Bearer ghp_") {
			t.Errorf("before the reload ro.test got %q, want the surrogate", got)
		}
		if got := auth["/reload-after"]; got != "Bearer "+real {
			t.Errorf("after moving the scope to ro.test it got %q, want the real value", got)
		}
	})
}
