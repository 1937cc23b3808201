package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// Plain HTTP connections allowed for one name carry more than one request,
// and the front end at the address routes each by its Host. A request that
// announces an upgrade must not end the host checks unless the server
// accepted a WebSocket with 101: the attack asks for an upgrade the server
// does not grant, then for another name served at the same address, through
// the transparent listener, CONNECT and SOCKS5, with the project's raw
// client, curl (an h2c upgrade) and python3's http.client. curl also sends
// request targets that parse as opaque URLs naming the other host.

// guardScript runs in the sandbox; every case prints its output under a
// "=== name" line.
const guardScript = `#!/bin/bash
A=$W/attack
for via in direct connect socks; do
  echo "=== upgrade-$via"; $A upgrade-front $via front.test hidden.test; echo "exit=$?"
  echo "=== ws-$via"; $A ws-echo $via front.test; echo "exit=$?"
done
for via in direct connect socks; do
  case $via in
    direct) proxy=(--noproxy '*') ;;
    connect) proxy=(-p -x "http://$HTTP_PROXY_ADDR") ;;
    socks) proxy=(-x "socks5h://$SOCKS_PROXY_ADDR") ;;
  esac
  echo "=== curl-$via"
  curl -sS -m 5 -w '\n' "${proxy[@]}" --http2 http://front.test/curl-upgrade \
    --next -sS -m 5 -w '\n' "${proxy[@]}" -H 'Host: hidden.test' http://front.test/curl-hidden 2>&1
  echo "exit=$?"
  # A body this large is spliced past the guard, which must still know
  # where the next response starts and check the next request.
  echo "=== bigcurl-$via"
  curl -sS -m 30 -o /dev/null -w 'big %{http_code} %{size_download}\n' "${proxy[@]}" 'http://front.test/big?n=4194304' \
    --next -sS -m 5 -w '\n' "${proxy[@]}" -H 'Host: hidden.test' http://front.test/curl-hidden-after-big 2>&1
  echo "exit=$?"
  # A target that parses as an opaque URL ("x:http://hidden.test/…") is
  # checked by its Host header, and must never be written on as a target
  # the server reads as naming hidden.test; first on a connection, and
  # after an allowed request.
  echo "=== opaque-$via"
  curl -sS -m 5 -w ' %{http_code}\n' "${proxy[@]}" --request-target 'x:http://hidden.test/opaque-first' http://front.test/ 2>&1
  curl -sS -m 5 -w '\n' "${proxy[@]}" http://front.test/opaque-control \
    --next -sS -m 5 -w ' %{http_code}\n' "${proxy[@]}" --request-target 'x:http://hidden.test/opaque-second' http://front.test/ 2>&1
  echo "exit=$?"
  # Openings an HTTP server reads as a request though they stray from
  # the usual shape (here a method of 26 letters) are checked like any
  # other, and so is every request after them.
  echo "=== longmethod-$via"
  curl -sS -m 5 -w ' %{http_code}\n' "${proxy[@]}" -X ABCDEFGHIJKLMNOPQRSTUVWXYZ http://front.test/long-first \
    --next -sS -m 5 -w ' %{http_code}\n' "${proxy[@]}" -H 'Host: hidden.test' http://front.test/long-then-hidden 2>&1
  echo "exit=$?"
done
echo "=== stray-openings"; python3 $W/stray.py 2>&1
for via in direct connect; do
  echo "=== python-$via"; python3 $W/guard.py $via front.test hidden.test 2>&1; echo "exit=$?"
done
echo "=== end"
`

// strayPy opens with an empty line (which servers skip, RFC 9112 section
// 2.2) or with an unknown method and a byte above 0x7e in the target, then
// asks for hidden.test on the same connection.
const strayPy = `import socket
for name, first in [("crlf", b"\r\nGET /crlf-first HTTP/1.1\r\nHost: front.test\r\n\r\n"),
                    ("highbyte", b"FOO /\x80 HTTP/1.1\r\nHost: hidden.test\r\n\r\n")]:
    s = socket.create_connection(("front.test", 80), timeout=5)
    try:
        s.sendall(first)
        got = s.recv(4096)
        if got:
            s.sendall(b"GET /" + name.encode() + b"-then-hidden HTTP/1.1\r\nHost: hidden.test\r\n\r\n")
            got += s.recv(4096)
        print(name, "ANSWERED" if got else "REFUSED", got.decode("latin-1"))
    except OSError as e:
        print(name, "REFUSED", type(e).__name__)
`

// guardPy asks for an h2c upgrade, which the lab's HTTP/1.1 server ignores,
// then for the hidden name on the same connection.
const guardPy = `import http.client, os, sys
via, front, hidden = sys.argv[1:4]
if via == "direct":
    c = http.client.HTTPConnection(front, 80, timeout=5)
else:
    host, port = os.environ["HTTP_PROXY_ADDR"].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=5)
    c.set_tunnel(front, 80)
c.request("GET", "/py-upgrade", headers={"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"})
r = c.getresponse()
print("FIRST", r.status, r.read().decode())
try:
    c.request("GET", "/py-hidden", headers={"Host": hidden})
    r = c.getresponse()
    print("SECOND", r.status, r.read().decode())
except Exception as e:
    print("SECOND-ERR", type(e).__name__, e)
`

func TestUpgradeKeepsHostChecks(t *testing.T) {
	requireRoot(t)
	addr := netip.MustParseAddr("203.0.113.80")
	lab := netlab.Start(t, netlab.Host{Name: "front.test", Addr: addr}, netlab.Host{Name: "hidden.test", Addr: addr})
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "guard.sh"), []byte(guardScript), 0o755)
		writeOwned(t, m, filepath.Join(fx.W, "guard.py"), []byte(guardPy), 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "stray.py"), []byte(strayPy), 0o644)
		pol := proxyPolicy(fmt.Sprintf("network_policies:\n  front:\n    endpoints:\n      - host: front.test\n        port: %d\n", netlab.PortHTTP))
		r := runCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "guard.sh")},
			policy: pol, timeout: 120 * time.Second,
			flags: []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W,
				"--env", "HTTP_PROXY_ADDR=" + httpProxy, "--env", "SOCKS_PROXY_ADDR=" + socksProxy}})
		n := &netRun{t: t, r: r, sec: sections(r.stdout)}
		if r.code != 0 || n.sec["end"] == "" {
			t.Fatalf("the script did not complete\n%s", r)
		}
		for _, via := range []string{"direct", "connect", "socks"} {
			up := "upgrade-" + via
			n.has(up, `CONTROL ok`)
			n.has(up, `BLOCKED: every request for hidden.test`)
			n.hasNot(up, `escaped`)
			// Positive control: a WebSocket the server accepts is relayed.
			n.has("ws-"+via, `WS echo ok via `+via+`\nexit=0`)
			// curl's h2c upgrade is answered over HTTP/1.1 and the
			// connection is reused for the second URL.
			// (curl's stderr may come before its -w newline.)
			n.has("curl-"+via, `hello from front\.test GET /curl-upgrade`)
			n.hasNot("curl-"+via, `hello from hidden.test`)
			n.has("bigcurl-"+via, `big 200 4194304\n`)
			n.hasNot("bigcurl-"+via, `hello from hidden.test`)
			n.has("opaque-"+via, `hello from front\.test GET /opaque-control`)
			n.hasNot("opaque-"+via, `hello from hidden.test`)
			n.has("longmethod-"+via, `hello from front\.test ABCDEFGHIJKLMNOPQRSTUVWXYZ /long-first`)
			n.hasNot("longmethod-"+via, `hello from hidden.test`)
		}
		n.has("stray-openings", `crlf REFUSED`)
		n.has("stray-openings", `highbyte REFUSED`)
		for _, via := range []string{"direct", "connect"} {
			n.has("python-"+via, `FIRST 200 hello from front.test GET /py-upgrade\n`)
			n.has("python-"+via, `SECOND-ERR`)
		}
		// Each refused request is recorded with the name it asked for.
		for _, via := range []string{"transparent", "http_connect", "socks5"} {
			denied := findEvents(r, "net.connect.denied", map[string]any{"via": via, "host": "front.test", "reason": "host_mismatch"})
			hidden := 0
			for _, e := range denied {
				if strings.Contains(fmt.Sprint(e["detail"]), "hidden.test") {
					hidden++
				}
			}
			if hidden == 0 {
				t.Errorf("no host_mismatch denial naming hidden.test via %s; network events:\n%s", via, netEvents(r))
			}
		}
		for _, s := range lab.HTTPRequests() {
			if strings.EqualFold(s.Host, "hidden.test") {
				t.Errorf("the lab served a request for hidden.test: %s %s", s.Method, s.Path)
			}
		}
	})
}
