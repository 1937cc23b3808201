package e2e

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// A host a masked secret is scoped to, which reflects text the workload
// chose, must not tell the workload whether that text begins the real
// value. The scrubber once held back a tail of a response only when it
// could begin a real value, so how the reflection arrived gave it away: in
// a chunk of its own at the end of a body, late when the host paused
// after it, or, as WebSocket fragments, behind a later frame. A red team
// recovered a whole value that way, one character at a time, in seconds.
// Here each probe, a prefix of the real value, is sent beside its twin,
// the same text with the last character changed, and both must arrive
// alike.

var addrScrubOracle = netip.MustParseAddr("203.0.113.93")

// scrubOracleClient runs inside. For each text in the probe file it asks
// oracle.test to reflect it three ways, all at once, and prints what came
// back as JSON: the body's chunks at the end of a body (tail) and around
// a pause (pause), and the WebSocket frames, op and payload, when the
// text is sent as "<" and its first byte, the rest but its last byte,
// and its last byte (ws). auth is a body that ends with the credential
// the host received.
const scrubOracleClient = `import base64, json, os, socket, ssl, sys, threading, urllib.parse
host = "oracle.test"
tok = os.environ["GH_TOKEN"]
probes = json.load(open(sys.argv[1]))
ctx = ssl.create_default_context()
ctx.set_alpn_protocols(["http/1.1"])
def connect():
    return ctx.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
def request(s, path, extra=""):
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n%s\r\n" % (path, host, tok, extra)).encode())
def read_all(s):
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d
def chunks(path):
    s = connect()
    request(s, path, "Connection: close\r\n")
    body = read_all(s).partition(b"\r\n\r\n")[2]
    s.close()
    out = []
    while body:
        line, _, rest = body.partition(b"\r\n")
        n = int(line, 16)
        if n == 0:
            break
        out.append(rest[:n].decode("latin-1"))
        body = rest[n + 2:]
    return out
def frame(payload):
    m = os.urandom(4)
    return bytes([0x81, 0x80 | len(payload)]) + m + bytes(c ^ m[i % 4] for i, c in enumerate(payload))
def ws(text):
    s = connect()
    key = base64.b64encode(os.urandom(16)).decode()
    request(s, "/ws", "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n" % key)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    t = "<" + text
    s.sendall(frame(t[:2].encode()) + frame(t[2:-1].encode()) + frame(t[-1:].encode()))
    buf = buf.partition(b"\r\n\r\n")[2] + read_all(s)
    s.close()
    out = []
    while len(buf) >= 2:
        n = buf[1] & 0x7F
        out.append([buf[0] & 0x0F, buf[2:2 + n].decode("latin-1")])
        buf = buf[2 + n:]
    return out
res = {"tail": [None] * len(probes), "pause": [None] * len(probes), "ws": [None] * len(probes)}
def run(kind, i, f, arg):
    try:
        res[kind][i] = f(arg)
    except Exception as e:
        res[kind][i] = "ERR %r" % e
ths = []
for i, p in enumerate(probes):
    q = urllib.parse.quote("<" + p)
    ths += [threading.Thread(target=run, args=("tail", i, chunks, "/tail?d=" + q)),
            threading.Thread(target=run, args=("pause", i, chunks, "/pause?d=" + q)),
            threading.Thread(target=run, args=("ws", i, ws, p))]
for t in ths: t.start()
for t in ths: t.join()
res["auth"] = chunks("/tail?auth=1")
print("RESULT " + json.dumps(res))
`

// scrubOracleSite is the scoped host: it reflects what the workload asks
// it to, and the credential it received.
func scrubOracleSite(w http.ResponseWriter, r *http.Request) {
	d := r.URL.Query().Get("d")
	if r.URL.Query().Get("auth") != "" {
		d = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	flush := http.NewResponseController(w).Flush
	switch r.URL.Path {
	case "/tail":
		// A body of unknown length that ends with the text, nothing
		// after it, no pause.
		fmt.Fprint(w, "you asked for: ")
		flush()
		fmt.Fprint(w, d)
	case "/pause":
		fmt.Fprint(w, d)
		flush()
		time.Sleep(300 * time.Millisecond)
		fmt.Fprint(w, ">\n")
	case "/ws":
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			base64.StdEncoding.EncodeToString(sum[:]))
		brw.Flush()
		// Each of the client's three frames comes back as a fragment
		// of one message, then a ping, which is never held back, then
		// the credential split across two fragments, and the end.
		op := byte(1)
		for range 3 {
			var h [2]byte
			var mask [4]byte
			if _, err := io.ReadFull(brw, h[:]); err != nil {
				return
			}
			p := make([]byte, h[1]&0x7f)
			if _, err := io.ReadFull(brw, mask[:]); err != nil {
				return
			}
			if _, err := io.ReadFull(brw, p); err != nil {
				return
			}
			for i := range p {
				p[i] ^= mask[i%4]
			}
			brw.Write(wsFrame(false, op, string(p)))
			brw.Flush()
			op = 0
		}
		half := len(tok) / 2
		for _, f := range [][]byte{wsFrame(true, 9, "mark"), wsFrame(false, 0, "tok="+tok[:half]), wsFrame(false, 0, tok[half:]), wsFrame(true, 0, ">")} {
			brw.Write(f)
		}
		brw.Flush()
	}
}

func TestScrubDoesNotRevealPrefixes(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t, netlab.Host{Name: "oracle.test", Addr: addrScrubOracle})
	lab.Serve("oracle.test", http.HandlerFunc(scrubOracleSite))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		caFile := labCAFile(t, fx, lab)
		// The host answers the last probe (the value but its last byte)
		// with "tok=…" after it: a value ending in "t" would be whole
		// there, and rightly replaced.
		real := "ghp_" + randomAlnum(12)
		for real[len(real)-1] == 't' {
			real = "ghp_" + randomAlnum(12)
		}
		// Prefixes of the value past the "ghp_" the surrogate shows,
		// each followed by its twin.
		var probes []string
		for _, n := range []int{5, 10, len(real) - 1} {
			last := byte('a')
			if real[n-1] == last {
				last = 'b'
			}
			probes = append(probes, real[:n], real[:n-1]+string(last))
		}
		pj, _ := json.Marshal(probes)
		writeOwned(t, m, filepath.Join(fx.W, "probes.json"), pj, 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "oracle.py"), []byte(scrubOracleClient), 0o644)
		r := runCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/python3", filepath.Join(fx.W, "oracle.py"), filepath.Join(fx.W, "probes.json")},
			policy: basePolicy(secretHostPolicy("oracle.test", "from_env: CORRAL_TEST_GH_TOKEN")),
			flags:  []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile},
			env:    []string{"CORRAL_TEST_GH_TOKEN=" + real},
		})
		line := regexp.MustCompile(`(?m)^RESULT (.*)$`).FindStringSubmatch(r.stdout)
		if r.code != 0 || line == nil {
			t.Fatalf("the client did not complete\n%s", r)
		}
		var res struct {
			Tail, Pause [][]string
			WS          [][][2]any
			Auth        []string
		}
		if err := json.Unmarshal([]byte(line[1]), &res); err != nil {
			t.Fatalf("%v\n%s", err, r)
		}
		if forms := leakedIn(r.stdout+r.stderr, real); len(forms) > 0 {
			t.Errorf("the real value is in the run's output as %q", forms)
		}
		// Positive control: the host had the real value, and its echo,
		// at the end of a body or split across fragments, still comes
		// back as the surrogate.
		auth := strings.Join(res.Auth, "")
		sur, ok := strings.CutPrefix(auth, "you asked for: ")
		if !ok || len(sur) != len(real) || !strings.HasPrefix(sur, "ghp_") || sur == real {
			t.Fatalf("the credential the host received came back as %q", auth)
		}

		// shape is how text came: the lengths of the pieces, and the
		// opcode of each frame.
		shape := func(v any) string {
			switch v := v.(type) {
			case []string:
				var b strings.Builder
				for _, c := range v {
					fmt.Fprintf(&b, "%d ", len(c))
				}
				return b.String()
			case [][2]any:
				var b strings.Builder
				for _, f := range v {
					fmt.Fprintf(&b, "op=%v %d; ", f[0], len(f[1].(string)))
				}
				return b.String()
			}
			return fmt.Sprint(v)
		}
		for i := 0; i+1 < len(probes); i += 2 {
			for _, c := range []struct {
				kind     string
				got, alt any
			}{
				{"at the end of a body", res.Tail[i], res.Tail[i+1]},
				{"before a pause", res.Pause[i], res.Pause[i+1]},
				{"as WebSocket fragments", res.WS[i], res.WS[i+1]},
			} {
				if shape(c.got) != shape(c.alt) {
					t.Errorf("reflected %s, %q (a prefix of the real value) came as %s and %q as %s",
						c.kind, probes[i], shape(c.got), probes[i+1], shape(c.alt))
				}
			}
			var msg strings.Builder
			for _, f := range res.WS[i] {
				if f[0] != 9.0 {
					msg.WriteString(f[1].(string))
				}
			}
			if want := "<" + probes[i] + "tok=" + sur + ">"; msg.String() != want {
				t.Errorf("WebSocket message %q, want %q", msg.String(), want)
			}
		}
		if t.Failed() {
			t.Logf("real value %s\n%s", real, r)
		}
	})
}
