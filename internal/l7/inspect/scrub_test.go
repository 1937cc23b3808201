package inspect_test

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/policy"
)

const echoReal = "ghp_R3alT0kenValue0123456789abcdefghijk"

// newEchoUpstream is a scoped host that quotes the credential it received
// back in every way a server might print it, and compresses whether asked
// to or not.
func newEchoUpstream(t *testing.T) *upstreamServer {
	t.Helper()
	upCA, err := ca.New("upstream", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := upCA.Leaf(apiHost)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstreamServer{pool: mustPool(t, upCA.CertPEM()), release: make(chan struct{})}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.reqs = append(u.reqs, seen{Method: r.Method, RequestURI: r.RequestURI, Path: r.URL.Path, Host: r.Host, Proto: r.Proto, Header: r.Header.Clone()})
		u.mu.Unlock()
		echo(w, r)
	}))
	u.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	u.srv.EnableHTTP2 = true
	u.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"h2", "http/1.1"}}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	return u
}

func mustPool(t *testing.T, pem []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatal("upstream CA PEM not accepted")
	}
	return p
}

// echo answers each path with the Authorization header it received.
func echo(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	tok := strings.TrimPrefix(auth, "Bearer ")
	if user, pass, ok := r.BasicAuth(); ok {
		tok = user + ":" + pass
	}
	compressed := func(coding string, wr func(io.Writer) io.WriteCloser) {
		w.Header().Set("Content-Encoding", coding)
		z := wr(w)
		fmt.Fprintf(z, "you sent %s", auth)
		z.Close()
	}
	switch r.URL.Path {
	case "/basic":
		fmt.Fprintf(w, "you sent %s", auth)
	case "/hex":
		fmt.Fprintf(w, "%s %X", hex.EncodeToString([]byte(tok)), tok)
	case "/base64":
		for _, pre := range []string{"", "a", "ab"} {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
				fmt.Fprintf(w, "%s\n", enc.EncodeToString([]byte(pre+tok)))
			}
		}
	case "/escaped":
		var pct, js strings.Builder
		for _, c := range []byte(tok) {
			fmt.Fprintf(&pct, "%%%02X", c)
			fmt.Fprintf(&js, "\\u%04x", c)
		}
		fmt.Fprintf(w, "%s\n%s\n{\"auth\": \"%s\"}\n", url.QueryEscape(auth), pct.String(), js.String())
	case "/gzip":
		compressed("gzip", func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) })
	case "/deflate":
		compressed("deflate", func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) })
	case "/raw-deflate":
		compressed("deflate", func(w io.Writer) io.WriteCloser { z, _ := flate.NewWriter(w, 5); return z })
	case "/gzip-twice":
		w.Header().Set("Content-Encoding", "gzip, gzip")
		var inner bytes.Buffer
		z := gzip.NewWriter(&inner)
		fmt.Fprintf(z, "you sent %s", auth)
		z.Close()
		z = gzip.NewWriter(w)
		z.Write(inner.Bytes())
		z.Close()
	case "/br":
		// Not brotli at all: whatever the bytes, the workload must not
		// get them.
		w.Header().Set("Content-Encoding", "br")
		fmt.Fprintf(w, "you sent %s", auth)
	case "/corrupt":
		w.Header().Set("Content-Encoding", "gzip")
		fmt.Fprintf(w, "you sent %s", auth)
	case "/corrupt-late":
		// A good start, then raw bytes in the middle of the stream.
		w.Header().Set("Content-Encoding", "gzip")
		var b bytes.Buffer
		z := gzip.NewWriter(&b)
		z.Write(bytes.Repeat([]byte("padding "), 8<<10))
		z.Flush()
		w.Write(b.Bytes())
		fmt.Fprintf(w, "you sent %s", auth)
	case "/trailer":
		w.Header().Set("Trailer", "X-Echo")
		io.WriteString(w, "ok")
		w.Header().Set("X-Echo", auth)
	case "/early":
		w.Header().Set("Link", "</x>; rel=preload; token="+tok)
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		io.WriteString(w, "ok")
	case "/ws", "/ws-ext":
		serveEchoWS(w, r, tok)
	case "/ws-probe":
		serveProbeWS(w, r)
	}
}

// upgradeWS hijacks r's connection and accepts the WebSocket, with
// extension ext if not "".
func upgradeWS(w http.ResponseWriter, r *http.Request, ext string) (net.Conn, *bufio.ReadWriter) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil
	}
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n%s\r\n",
		base64.StdEncoding.EncodeToString(sum[:]), ext)
	return conn, brw
}

// serveEchoWS accepts a WebSocket and sends the token back: split across
// the fragments of one text message, whole in a binary message as hex, in
// a ping and in the close reason.
func serveEchoWS(w http.ResponseWriter, r *http.Request, tok string) {
	ext := ""
	if r.URL.Path == "/ws-ext" {
		ext = "Sec-WebSocket-Extensions: permessage-deflate\r\n"
	}
	conn, brw := upgradeWS(w, r, ext)
	if conn == nil {
		return
	}
	defer conn.Close()
	msg := "token=" + tok
	half := len(msg) - len(tok)/2
	brw.Write(wsFrameBytes(false, 0x1, msg[:half-3]))
	brw.Write(wsFrameBytes(false, 0x0, msg[half-3:half]))
	brw.Write(wsFrameBytes(true, 0x9, tok)) // a ping between fragments
	brw.Write(wsFrameBytes(true, 0x0, msg[half:]))
	brw.Write(wsFrameBytes(true, 0x2, hex.EncodeToString([]byte(tok))))
	brw.Write(wsFrameBytes(true, 0x1, strings.Repeat("x", 70000)+tok))
	brw.Write(wsFrameBytes(true, 0x8, "\x03\xe8"+tok))
	brw.Flush()
}

// serveProbeWS reflects text the client chose: each "f" query value as a
// fragment of one text message, then a ping, then the message's last
// fragment.
func serveProbeWS(w http.ResponseWriter, r *http.Request) {
	conn, brw := upgradeWS(w, r, "")
	if conn == nil {
		return
	}
	defer conn.Close()
	op := byte(0x1)
	for _, f := range r.URL.Query()["f"] {
		brw.Write(wsFrameBytes(false, op, f))
		op = 0x0
	}
	brw.Write(wsFrameBytes(true, 0x9, "mark"))
	brw.Write(wsFrameBytes(true, 0x0, ">"))
	brw.Flush()
}

func wsFrameBytes(fin bool, op byte, payload string) []byte {
	b := []byte{op, 0}
	if fin {
		b[0] |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b[1] = byte(n)
	case n < 1<<16:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}

func echoHarness(t *testing.T) (*harness, *upstreamServer, string) {
	t.Helper()
	set, err := loadSecrets(map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "REAL", Hosts: []string{apiHost}},
	}, func(string) string { return echoReal })
	if err != nil {
		t.Fatal(err)
	}
	sur := strings.TrimPrefix(set.Env()[0], "GH_TOKEN=")
	up := newEchoUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) { ep.Access = policy.AccessFull })), secrets: set})
	return h, up, sur
}

// leaked reports whether text holds the real value in a form the echo
// server writes it.
func leaked(text string) bool {
	if strings.Contains(text, echoReal) || strings.Contains(strings.ToLower(text), hex.EncodeToString([]byte(echoReal))) {
		return true
	}
	// Every base64 line the echo wrote, decoded.
	for line := range strings.SplitSeq(text, "\n") {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if dec, err := enc.DecodeString(strings.TrimPrefix(line, "you sent Basic ")); err == nil && strings.Contains(string(dec), echoReal) {
				return true
			}
		}
		if dec, err := url.QueryUnescape(line); err == nil && strings.Contains(dec, echoReal) {
			return true
		}
		var js struct{ Auth string }
		if json.Unmarshal([]byte(line), &js) == nil && strings.Contains(js.Auth, echoReal) {
			return true
		}
	}
	return false
}

// A scoped host that echoes the credential gets the real value; the
// workload gets the surrogate back, in whatever form and coding the host
// chose, over HTTP/1.1 and h2.
func TestEchoedSecretScrubbedInEveryForm(t *testing.T) {
	h, up, sur := echoHarness(t)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+sur))
	for _, h2 := range []bool{false, true} {
		for _, path := range []string{"/basic", "/hex", "/base64", "/escaped", "/gzip", "/deflate", "/raw-deflate", "/gzip-twice"} {
			for _, auth := range []string{basic, "Bearer " + sur} {
				r := do(t, h.client(h2), "GET", h.url(path), http.Header{"Authorization": {auth}}, "")
				got := up.seen()[len(up.seen())-1].Header.Get("Authorization")
				if !strings.Contains(got, base64.StdEncoding.EncodeToString([]byte("x:"+echoReal))) && got != "Bearer "+echoReal {
					t.Fatalf("%s: the upstream got %q, not the real value", path, got)
				}
				if r.StatusCode != http.StatusOK || leaked(r.body) {
					t.Errorf("h2=%v %s %.6s: status %d, the real value came back: %q", h2, path, auth, r.StatusCode, r.body)
				}
				if enc := r.Header.Get("Content-Encoding"); enc != "" {
					t.Errorf("h2=%v %s: decoded body still labelled %q", h2, path, enc)
				}
				if path == "/basic" && r.body != "you sent "+auth {
					t.Errorf("h2=%v: the echo is %q, want the surrogate's own encoding %q", h2, r.body, "you sent "+auth)
				}
			}
		}
	}
}

// A coding that cannot be undone is a 502 that names why, and none of the
// upstream's bytes reach the workload.
func TestUndecodableResponseWithheld(t *testing.T) {
	h, _, sur := echoHarness(t)
	for _, path := range []string{"/br", "/corrupt"} {
		r := do(t, h.client(false), "GET", h.url(path), http.Header{"Authorization": {"Bearer " + sur}}, "")
		if r.StatusCode != http.StatusBadGateway || !strings.Contains(r.body, "response_not_scrubbable") || strings.Contains(r.body, "you sent") {
			t.Errorf("%s: %d %q, want a 502 with reason response_not_scrubbable", path, r.StatusCode, r.body)
		}
	}
	// Corruption after the start: the response is cut, and what came
	// before is decoded text only.
	req, _ := http.NewRequest("GET", h.url("/corrupt-late"), nil)
	req.Header.Set("Authorization", "Bearer "+sur)
	resp, err := h.client(false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("a response corrupt mid-stream ended cleanly")
	}
	if strings.Contains(string(body), "you sent") || strings.Trim(string(body), "adgnip ") != "" {
		t.Errorf("undecoded bytes reached the client: %q", body[max(0, len(body)-80):])
	}
}

// Trailers come after the body, and are scrubbed when they do. (Only h2
// clients are checked for the surrogate: the relay to an HTTP/1.1 client
// drops trailers, scoped host or not.)
func TestTrailersScrubbed(t *testing.T) {
	h, _, sur := echoHarness(t)
	for _, h2 := range []bool{false, true} {
		r := do(t, h.client(h2), "GET", h.url("/trailer"), http.Header{"Authorization": {"Bearer " + sur}}, "")
		got := r.Trailer.Get("X-Echo")
		if strings.Contains(got, echoReal) || h2 && got != "Bearer "+sur {
			t.Errorf("h2=%v: trailer %q, want the surrogate", h2, got)
		}
	}
}

// Interim responses are relayed before the final one: their headers are
// scrubbed too.
func TestEarlyHintsScrubbed(t *testing.T) {
	h, _, sur := echoHarness(t)
	for _, h2 := range []bool{false, true} {
		var hints []string
		req, _ := http.NewRequest("GET", h.url("/early"), nil)
		req.Header.Set("Authorization", "Bearer "+sur)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(_ int, hdr textproto.MIMEHeader) error {
				hints = append(hints, hdr.Values("Link")...)
				return nil
			},
		}))
		doReq(t, h.client(h2), req)
		if len(hints) == 0 {
			t.Fatalf("h2=%v: no early hints relayed", h2)
		}
		for _, l := range hints {
			if strings.Contains(l, echoReal) || !strings.Contains(l, sur) {
				t.Errorf("h2=%v: hint %q, want the surrogate", h2, l)
			}
		}
	}
}

// WebSocket frames from a scoped host are scrubbed, with the token split
// across fragments, hex in a binary frame, in a ping, after a long frame
// and in the close reason; extensions are not offered, and a server that
// answers with one anyway gets no relay.
func TestWebSocketFromScopedHostScrubbed(t *testing.T) {
	h, up, sur := echoHarness(t)
	conn := h.dialRaw(t)
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Extensions: permessage-deflate\r\nAuthorization: Bearer %s\r\n\r\n", apiHost, sur)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	stream, _ := io.ReadAll(br)
	if bytes.Contains(stream, []byte(echoReal)) || bytes.Contains(stream, []byte(hex.EncodeToString([]byte(echoReal)))) ||
		bytes.Contains(stream, []byte(echoReal[:len(echoReal)/2])) {
		t.Errorf("the frames carried the real value: %q", stream[:min(len(stream), 200)])
	}
	payload := readFrames(t, stream)
	// The ping overtakes the fragments held back around the split.
	want := sur + "token=" + sur + hex.EncodeToString([]byte(sur)) + strings.Repeat("x", 70000) + sur + "\x03\xe8" + sur
	if payload != want {
		t.Errorf("payloads %q..., want %q...", payload[:min(len(payload), 120)], want[:120])
	}
	last := up.seen()[len(up.seen())-1]
	if last.Header.Get("Authorization") != "Bearer "+echoReal {
		t.Fatalf("the upstream got %q, not the real value", last.Header.Get("Authorization"))
	}
	if ext := last.Header.Get("Sec-WebSocket-Extensions"); ext != "" {
		t.Errorf("the scoped host was offered extension %q", ext)
	}

	r := h.raw(t, "GET", "/ws-ext", apiHost, "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Authorization: Bearer "+sur)
	if r.StatusCode != http.StatusBadGateway || !strings.Contains(r.body, "response_not_scrubbable") {
		t.Errorf("a WebSocket with an extension that was not offered: %d %q, want 502", r.StatusCode, r.body)
	}
}

// A host that echoes chosen text as WebSocket fragments must not tell the
// workload whether that text begins a real value: which fragments come
// before a control frame sent after them is the same for every prefix of
// the value (raw, hex, base64) as for a twin of it that begins none.
// (Withholding exactly the fragments whose tail could begin a value told
// the two apart.)
func TestWebSocketReleaseIgnoresValues(t *testing.T) {
	h, _, sur := echoHarness(t)
	// probe has the upstream send pieces as fragments of one message,
	// a ping, then the last fragment, ">"; it returns the frames that
	// came, described, and the message.
	probe := func(pieces ...string) (frames, msg string) {
		conn := h.dialRaw(t)
		defer conn.Close()
		fmt.Fprintf(conn, "GET /ws-probe?%s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", url.Values{"f": pieces}.Encode(), apiHost)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		stream, _ := io.ReadAll(br)
		var desc, data strings.Builder
		for len(stream) >= 2 {
			n := min(len(stream)-2, int(stream[1]&0x7f)) // the probes are short
			fmt.Fprintf(&desc, "op=%d fin=%d %d bytes; ", stream[0]&0x0f, stream[0]>>7, n)
			if stream[0]&0x0f < 0x8 {
				data.Write(stream[2 : 2+n])
			}
			stream = stream[2+n:]
		}
		return desc.String(), data.String()
	}
	forms := map[string]string{
		"raw":    echoReal,
		"hex":    hex.EncodeToString([]byte(echoReal)),
		"base64": base64.RawURLEncoding.EncodeToString([]byte("x:" + echoReal)),
	}
	for name, form := range forms {
		for k := 2; k < len(form); k += 3 {
			// "<" and the first byte, the rest but the last, the
			// last: as the red team's client sent its guesses.
			text := "<" + form[:k]
			last := byte('1')
			if text[k] == last {
				last = '0'
			}
			other := text[:k] + string(last)
			got, _ := probe(text[:2], text[2:k], text[k:])
			if want, _ := probe(other[:2], other[2:k], other[k:]); got != want {
				t.Errorf("%s, %d bytes: the frames differ\nbeginning the value: %s\nnot beginning it:    %s", name, k, got, want)
			}
		}
	}
	// The whole value, split across fragments, still comes back as the
	// surrogate.
	if _, msg := probe("<", echoReal[:9], echoReal[9:]); msg != "<"+sur+">" {
		t.Errorf("the message with the real value split in it came back as %q", msg)
	}
	// A fragment that ends in a line break, which no value holds, is not
	// held back for the next.
	if got, _ := probe("first\n", "second\n"); !strings.HasPrefix(got, "op=1 fin=0 6 bytes; op=0 fin=0 7 bytes; op=9 ") {
		t.Errorf("fragments ending in a line break came as %s", got)
	}
}

// readFrames parses server frames and returns their payloads joined.
func readFrames(t *testing.T, b []byte) string {
	t.Helper()
	var out strings.Builder
	for len(b) >= 2 {
		n, hl := uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			n, hl = uint64(binary.BigEndian.Uint16(b[2:4])), 4
		case 127:
			n, hl = binary.BigEndian.Uint64(b[2:10]), 10
		}
		if uint64(len(b)) < uint64(hl)+n {
			t.Fatalf("truncated frame")
		}
		out.Write(b[hl : uint64(hl)+n])
		b = b[uint64(hl)+n:]
	}
	return out.String()
}
