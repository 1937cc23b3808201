package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// A host a masked secret is scoped to receives the real value. If it
// echoes what it received, the echo must reach the workload with the
// surrogate in it, however the host writes it: the attack that found
// this used a Basic credential whose base64 is not aligned to the value,
// a gzip'd answer to a request that asked for none, hex, and WebSocket
// frames after a 101.

var addrEcho = netip.MustParseAddr("203.0.113.90")

// secretHostPolicy allows host over inspected HTTPS and masks GH_TOKEN,
// taken from source (a from_env or from_file line), for it alone.
func secretHostPolicy(host, source string) string {
	return fmt.Sprintf(`network_policies:
  h:
    endpoints:
      - {host: %s, port: 443, protocol: rest, access: full}
secrets:
  GH_TOKEN:
    %s
    hosts: [%s]
`, host, source, host)
}

// echoWS is run by python3 inside: a WebSocket client that prints every
// frame it is sent until the server closes.
const echoWS = `import base64, os, socket, ssl, sys
host, token = sys.argv[1], sys.argv[2]
s = ssl.create_default_context().wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
           "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\nAuthorization: Bearer %s\r\n\r\n" % (host, key, token)).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    d = s.recv(4096)
    if not d:
        break
    buf += d
head, _, buf = buf.partition(b"\r\n\r\n")
print("WS_STATUS", head.split(b"\r\n")[0].decode())
while True:
    d = s.recv(65536)
    if not d:
        break
    buf += d
while len(buf) >= 2:
    n, hl = buf[1] & 0x7F, 2
    if n == 126:
        n, hl = int.from_bytes(buf[2:4], "big"), 4
    elif n == 127:
        n, hl = int.from_bytes(buf[2:10], "big"), 10
    print("WS_FRAME op=%d fin=%d %s" % (buf[0] & 0x0F, buf[0] >> 7, buf[hl:hl + n].decode("latin-1")))
    buf = buf[hl + n:]
`

const echoScript = `#!/bin/bash
cd "$W" || exit 99
C="curl -sS --max-time 15"
sec() { echo; echo "=== $1"; }
for p in basic hex base64 escaped; do
  sec "basic_$p"
  $C -u "x:$GH_TOKEN" https://echo.test/$p; echo
  sec "bearer_$p"
  $C -H "Authorization: Bearer $GH_TOKEN" https://echo.test/$p; echo
done
# --compressed makes curl decode whatever coding comes back, so an echo
# that was compressed and not scrubbed shows here; without it, curl
# prints what it got, which must be decoded text.
sec gzip
$C --compressed -u "x:$GH_TOKEN" https://echo.test/gzip; echo
sec gzip_unasked
$C -u "x:$GH_TOKEN" https://echo.test/gzip-unasked; echo
sec br
$C -w ' STATUS %{http_code}' -H "Authorization: Bearer $GH_TOKEN" https://echo.test/br; echo
sec ws
python3 ws.py echo.test "$GH_TOKEN"
sec env
echo "TOKEN=$GH_TOKEN"
echo
echo "=== end"
`

// echoSite is the scoped host: it quotes the Authorization header it got
// back in many forms.
func echoSite(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	tok := strings.TrimPrefix(auth, "Bearer ")
	if user, pass, ok := r.BasicAuth(); ok {
		tok = user + ":" + pass
	}
	switch strings.TrimPrefix(r.URL.Path, "/") {
	case "basic":
		fmt.Fprintf(w, "you sent %s", auth)
	case "hex":
		fmt.Fprintf(w, "%x\n%X", tok, tok)
	case "base64":
		for _, pre := range []string{"", "a", "ab"} {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
				fmt.Fprintf(w, "%s\n", enc.EncodeToString([]byte(pre+tok)))
			}
		}
	case "escaped":
		var pct, js strings.Builder
		for _, c := range []byte(tok) {
			fmt.Fprintf(&pct, "%%%02X", c)
			fmt.Fprintf(&js, `\u%04x`, c)
		}
		fmt.Fprintf(w, "%s\n%s\n{\"auth\": \"%s\"}", url.QueryEscape(auth), pct.String(), js.String())
	case "gzip", "gzip-unasked":
		w.Header().Set("Content-Encoding", "gzip")
		z := gzip.NewWriter(w)
		fmt.Fprintf(z, "you sent %s", auth)
		z.Close()
	case "br":
		w.Header().Set("Content-Encoding", "br")
		fmt.Fprintf(w, "you sent %s", auth)
	case "ws":
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			base64.StdEncoding.EncodeToString(sum[:]))
		// The token whole, split across fragments, and as hex.
		half := len(tok) / 2
		brw.Write(wsFrame(true, 1, "whole="+tok))
		brw.Write(wsFrame(false, 1, "split="+tok[:half]))
		brw.Write(wsFrame(true, 0, tok[half:]))
		brw.Write(wsFrame(true, 2, hex.EncodeToString([]byte(tok))))
		brw.Write(wsFrame(true, 8, "\x03\xe8"+tok))
		brw.Flush()
	}
}

func wsFrame(fin bool, op byte, payload string) []byte {
	b := []byte{op, byte(len(payload))}
	if fin {
		b[0] |= 0x80
	}
	if len(payload) >= 126 {
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	}
	return append(b, payload...)
}

// leakedIn returns the forms of real found in out: raw, hex, and the
// decoding of every base64, percent-encoded or JSON word in it.
func leakedIn(out, real string) []string {
	var found []string
	if strings.Contains(out, real) {
		found = append(found, "raw")
	}
	if strings.Contains(strings.ToLower(out), hex.EncodeToString([]byte(real))) {
		found = append(found, "hex")
	}
	for _, word := range regexp.MustCompile(`[^\s"=]+`).FindAllString(out, -1) {
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			if dec, err := enc.DecodeString(strings.TrimRight(word, "=")); err == nil && bytes.Contains(dec, []byte(real)) {
				found = append(found, "base64 "+word)
			}
		}
		if dec, err := url.QueryUnescape(word); err == nil && strings.Contains(dec, real) {
			found = append(found, "percent "+word)
		}
		var s string
		if json.Unmarshal([]byte(`"`+word+`"`), &s) == nil && strings.Contains(s, real) {
			found = append(found, "json "+word)
		}
	}
	return found
}

func TestSecretsEchoedBack(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t, netlab.Host{Name: "echo.test", Addr: addrEcho})
	lab.Serve("echo.test", http.HandlerFunc(echoSite))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "ws.py"), []byte(echoWS), 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "echo.sh"), []byte(echoScript), 0o755)
		caFile := labCAFile(t, fx, lab)
		real := "ghp_" + randomAlnum(36)
		r := runCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "echo.sh")},
			policy: basePolicy(secretHostPolicy("echo.test", "from_env: CORRAL_TEST_GH_TOKEN")),
			flags:  []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile, "--env", "W=" + fx.W},
			env:    []string{"CORRAL_TEST_GH_TOKEN=" + real},
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
		sur := n.has("env", `TOKEN=(ghp_[A-Za-z0-9]{36})\n`)
		if sur == "" || sur == real {
			t.Fatalf("the workload's GH_TOKEN is %q", sur)
		}

		// Positive control: the echo host really got the real value,
		// so it had it to send back.
		basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+real))
		got := map[string]bool{}
		for _, s := range lab.HTTPRequests() {
			got[s.Path+" "+s.Header.Get("Authorization")] = true
		}
		for _, want := range []string{"/basic " + basic, "/hex Bearer " + real, "/gzip " + basic, "/ws Bearer " + real} {
			if !got[want] {
				t.Errorf("the echo host did not receive %q", want)
			}
		}
		for _, s := range lab.HTTPRequests() {
			if s.Path == "/ws" && s.Header.Get("Sec-WebSocket-Extensions") != "" {
				t.Errorf("the scoped host was offered WebSocket extension %q", s.Header.Get("Sec-WebSocket-Extensions"))
			}
		}

		for name, out := range n.sec {
			if forms := leakedIn(out, real); len(forms) > 0 {
				t.Errorf("%s: the real value came back inside as %q", name, forms)
			}
		}
		if forms := leakedIn(r.stdout+r.stderr, real); len(forms) > 0 {
			t.Errorf("the real value is in the run's output as %q", forms)
		}

		// The echoes carry the surrogate, in the form the host chose.
		n.has("basic_basic", regexp.QuoteMeta("you sent Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+sur))))
		n.has("bearer_hex", `(?i)`+hex.EncodeToString([]byte(sur)))
		n.has("basic_base64", regexp.QuoteMeta(base64.RawURLEncoding.EncodeToString([]byte("abx:"+sur))))
		n.has("gzip", regexp.QuoteMeta("you sent Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+sur))))
		n.has("gzip_unasked", regexp.QuoteMeta("you sent Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+sur))))
		n.has("br", `"reason":"response_not_scrubbable".* STATUS 502`)
		n.hasNot("br", `you sent`)
		n.has("ws", `WS_STATUS HTTP/1\.1 101`)
		n.has("ws", `WS_FRAME op=1 fin=1 whole=`+regexp.QuoteMeta(sur))
		n.has("ws", `WS_FRAME op=1 fin=0 split=`+regexp.QuoteMeta(sur[:len(sur)/2])+`\n`)
		n.has("ws", `WS_FRAME op=2 fin=1 `+hex.EncodeToString([]byte(sur)))
	})
}
