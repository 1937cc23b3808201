package sniff

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata ClientHellos captured from crypto/tls")

// captureClientHello returns the first flight crypto/tls sends for cfg.
func captureClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		_ = tls.Client(client, cfg).Handshake()
		client.Close()
	}()
	var out []byte
	hdr := make([]byte, recordHeaderLen)
	if _, err := io.ReadFull(server, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(server, body); err != nil {
		t.Fatal(err)
	}
	return append(append(out, hdr...), body...)
}

func testdataHello(t testing.TB, file string, cfg *tls.Config) []byte {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, captureClientHello(t, cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with -update)", err)
	}
	return b
}

func TestClientHelloSNI(t *testing.T) {
	tests := []struct {
		name string
		cfg  *tls.Config
		want string
	}{
		{"named", &tls.Config{ServerName: "Example.COM"}, "example.com"},
		{"tls12 only", &tls.Config{ServerName: "api.github.com", MaxVersion: tls.VersionTLS12}, "api.github.com"},
		{"ip literal sends no sni", &tls.Config{ServerName: "192.0.2.1"}, ""},
		{"no name", &tls.Config{InsecureSkipVerify: true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hello := captureClientHello(t, tt.cfg)
			sni, complete, err := ClientHelloSNI(hello)
			if err != nil || !complete || sni != tt.want {
				t.Fatalf("got %q %v %v, want %q", sni, complete, err, tt.want)
			}
			// No prefix may be mistaken for a finished or broken hello:
			// Peek relies on "incomplete" to keep reading.
			for i := range hello {
				if _, c, err := ClientHelloSNI(hello[:i]); c || err != nil {
					t.Fatalf("prefix %d: complete=%v err=%v", i, c, err)
				}
			}
		})
	}
}

func TestClientHelloTestdata(t *testing.T) {
	hello := testdataHello(t, "clienthello-example.com.bin", &tls.Config{ServerName: "example.com"})
	if sni, complete, err := ClientHelloSNI(hello); sni != "example.com" || !complete || err != nil {
		t.Fatalf("got %q %v %v", sni, complete, err)
	}
}

// splitRecords re-frames a single-record hello as two records, which TLS
// allows and an evasive client would use.
func splitRecords(hello []byte, at int) []byte {
	body := hello[recordHeaderLen:]
	rec := func(p []byte) []byte {
		return append([]byte{recordTypeHandshake, 3, 1, byte(len(p) >> 8), byte(len(p))}, p...)
	}
	return append(rec(body[:at]), rec(body[at:])...)
}

func TestClientHelloSplitAcrossRecords(t *testing.T) {
	hello := captureClientHello(t, &tls.Config{ServerName: "split.example"})
	for _, at := range []int{1, 3, 4, 40, len(hello) - recordHeaderLen - 1} {
		sni, complete, err := ClientHelloSNI(splitRecords(hello, at))
		if sni != "split.example" || !complete || err != nil {
			t.Errorf("split at %d: %q %v %v", at, sni, complete, err)
		}
	}
}

// hello builds a minimal ClientHello carrying exts.
func hello(exts ...[]byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)
	body = append(body, 0)                // session id
	body = append(body, 0, 2, 0x13, 0x01) // one suite
	body = append(body, 1, 0)             // null compression
	var all []byte
	for _, e := range exts {
		all = append(all, e...)
	}
	body = append(body, byte(len(all)>>8), byte(len(all)))
	body = append(body, all...)
	hs := append([]byte{1, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

func sniExt(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0, byte(len(n)>>8), byte(len(n)))
		list = append(list, n...)
	}
	data := append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
	return append([]byte{0, 0, byte(len(data) >> 8), byte(len(data))}, data...)
}

func TestClientHelloMalformed(t *testing.T) {
	good := hello(sniExt("a.example"))
	if sni, c, err := ClientHelloSNI(good); sni != "a.example" || !c || err != nil {
		t.Fatalf("baseline: %q %v %v", sni, c, err)
	}
	truncatedExt := hello(sniExt("a.example"))
	truncatedExt[len(truncatedExt)-13] = 0xff // low byte of the server_name list length
	tests := map[string][]byte{
		"two server_name extensions": hello(sniExt("a.example"), sniExt("b.example")),
		"two host_names":             hello(sniExt("a.example", "b.example")),
		"bad characters":             hello(sniExt("a example")),
		"empty host_name":            hello(sniExt("")),
		"list overruns extension":    truncatedExt,
		"not a ClientHello":          append([]byte{0x16, 3, 1, 0, 4}, 2, 0, 0, 0),
		"zero-length record":         {0x16, 3, 1, 0, 0},
		"oversized record":           {0x16, 3, 1, 0x48, 0},
		"alert inside hello":         append(splitRecords(good, 10)[:15], 0x15, 3, 1, 0, 1, 0),
	}
	for name, b := range tests {
		if _, _, err := ClientHelloSNI(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	for name, b := range map[string][]byte{"http": []byte("GET /"), "ssh": []byte("SSH-2.0-"), "sslv3 minor ok but major 2": {0x16, 2}} {
		if _, _, err := ClientHelloSNI(b); !errors.Is(err, ErrNotTLS) {
			t.Errorf("%s: err = %v, want ErrNotTLS", name, err)
		}
	}
}

func TestHTTPHost(t *testing.T) {
	tests := []struct {
		name, head, want string
	}{
		{"plain", "GET / HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\n", "example.com"},
		{"bare LF", "GET / HTTP/1.1\nHost: example.com\n\n", "example.com"},
		{"ipv6", "GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", "2001:db8::1"},
		{"absolute agrees", "GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n", "example.com"},
		{"absolute alone", "GET HTTP://example.com:81?q HTTP/1.0\r\n\r\n", "example.com"},
		{"connect", "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n", "example.com"},
		{"unknown method with http shape", "BREW /pot HTTP/1.1\r\nHost: tea.example\r\n\r\n", "tea.example"},
		{"trailing dot", "GET / HTTP/1.1\r\nHost: example.com.\r\n\r\n", "example.com."},
		// Servers take any token for a method, however long.
		{"long unknown method", "ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1\r\nHost: tea.example\r\n\r\n", "tea.example"},
	}
	for _, tt := range tests {
		host, complete, err := HTTPHost([]byte(tt.head))
		if host != tt.want || !complete || err != nil {
			t.Errorf("%s: got %q %v %v, want %q", tt.name, host, complete, err, tt.want)
		}
		for i := range len(tt.head) {
			if _, c, err := HTTPHost([]byte(tt.head[:i])); c || err != nil {
				t.Errorf("%s: prefix %d: complete=%v err=%v", tt.name, i, c, err)
			}
		}
	}
}

func TestHTTPHostRejects(t *testing.T) {
	malformedHeads := map[string]string{
		"duplicate host":       "GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
		"absolute disagrees":   "GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n",
		"connect disagrees":    "CONNECT a.example:443 HTTP/1.1\r\nHost: b.example\r\n\r\n",
		"no host":              "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
		"folded header":        "GET / HTTP/1.1\r\nHost: a.example\r\n b.example\r\n\r\n",
		"space before colon":   "GET / HTTP/1.1\r\nHost : b.example\r\n\r\n",
		"double space":         "GET  / HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"http/0.9":             "GET /\r\n\r\n",
		"http/2 preface":       "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"userinfo":             "GET / HTTP/1.1\r\nHost: a.example@b.example\r\n\r\n",
		"percent":              "GET / HTTP/1.1\r\nHost: b%2eexample\r\n\r\n",
		"empty host":           "GET / HTTP/1.1\r\nHost:\r\n\r\n",
		"bare CR in header":    "GET / HTTP/1.1\r\nX: a\rHost: b.example\r\nHost: a.example\r\n\r\n",
		"ipv6 zone":            "GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n",
		"port not digits":      "GET / HTTP/1.1\r\nHost: a.example:https\r\n\r\n",
		"two colons unbracket": "GET / HTTP/1.1\r\nHost: 2001:db8::1\r\n\r\n",
		// Lines some server takes for a request, which must then parse.
		"empty line first":           "\r\nGET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"bare LF first":              "\nFOO / HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"high byte, unknown method":  "FOO /\x80 HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"tabs":                       "GET\t/\tHTTP/1.1\r\nHost: a.example\r\n\r\n",
		"tab after unknown method":   "FOO\t/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"lower-case version":         "FOO / http/1.1\r\nHost: a.example\r\n\r\n",
		"text after version":         "FOO / HTTP/1.1 x\r\nHost: a.example\r\n\r\n",
		"control byte, known method": "GET /\x01 HTTP/1.1\r\nHost: a.example\r\n\r\n",
	}
	for name, head := range malformedHeads {
		if _, _, err := HTTPHost([]byte(head)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	notHTTP := map[string]string{
		"ssh":      "SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n",
		"ssh bare": "SSH-2.0-Go\r\n",
		"redis":    "*1\r\n$4\r\nPING\r\n",
		"postgres": "\x00\x00\x00\x08\x04\xd2\x16\x2f",
		"memcache": "get foo\r\n",
		"unknown":  "HELLO world again\r\n",
		"git":      "003bgit-upload-pack /project.git\x00host=a.example\x00",
		// A protocol buffer's usual first byte is a line feed.
		"protobuf": "\n\x05hello",
	}
	for name, head := range notHTTP {
		if _, _, err := HTTPHost([]byte(head)); !errors.Is(err, ErrNotHTTP) {
			t.Errorf("%s: err = %v, want ErrNotHTTP", name, err)
		}
	}
}

// pipe returns a connected TCP pair on loopback; net.Pipe would do, but
// real sockets exercise the deadlines Peek depends on.
func pipe(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestPeek(t *testing.T) {
	tlsHello := captureClientHello(t, &tls.Config{ServerName: "peek.example"})
	tests := []struct {
		name     string
		writes   []string
		kind     string
		host     string
		malformd bool
		eof      bool
	}{
		{"server speaks first", nil, "", "", false, false},
		{"tls", []string{string(tlsHello[:7]), string(tlsHello[7:])}, KindTLS, "peek.example", false, false},
		{"http in pieces", []string{"GET / HT", "TP/1.1\r\nHost: web.example\r\n\r\nbody"}, KindHTTP, "web.example", false, false},
		{"raw binary", []string{"\x00\x00\x00\x08\x04\xd2\x16\x2f"}, "", "", false, false},
		{"ssh banner", []string{"SSH-2.0-OpenSSH_9.6\r\n"}, "", "", false, false},
		{"stops mid-head", []string{"GET / HTTP/1.1\r\nHost: web.example\r\n"}, KindHTTP, "", true, false},
		{"one byte then quiet", []string{"G"}, KindHTTP, "", true, false},
		{"no first line before EOF", []string{"hello world"}, "", "", false, true},
		{"head cut by EOF", []string{"GET / HTTP/1.1\r\nHost: web.example\r\n"}, KindHTTP, "", true, true},
		{"partial hello before EOF", []string{string(tlsHello[:100])}, "", "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := pipe(t)
			want := ""
			for _, w := range tt.writes {
				want += w
				if _, err := io.WriteString(client, w); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if tt.eof {
				client.(*net.TCPConn).CloseWrite()
			}
			kind, host, buf, err := Peek(server, 0, 100*time.Millisecond)
			if kind != tt.kind || host != tt.host || errors.Is(err, ErrMalformed) != tt.malformd {
				t.Fatalf("got %q %q %v", kind, host, err)
			}
			if !tt.malformd && err != nil {
				t.Fatal(err)
			}
			if string(buf) != want {
				t.Fatalf("buffered %q, want %q", buf, want)
			}
		})
	}
}

func TestPeekLimit(t *testing.T) {
	client, server := pipe(t)
	go io.WriteString(client, "GET / HTTP/1.1\r\nX-Pad: "+string(bytes.Repeat([]byte("a"), 4096)))
	kind, _, buf, err := Peek(server, 1024, time.Second)
	if kind != KindHTTP || !errors.Is(err, ErrMalformed) || len(buf) != 1024 {
		t.Fatalf("got %q %d %v", kind, len(buf), err)
	}
}

func TestGuard(t *testing.T) {
	client, server := pipe(t)
	var gotKind, gotName string
	g := Guard(server, []byte("GET / HTTP/1.1\r\n"), 0, 100*time.Millisecond, func(kind, name string, err error) error {
		gotKind, gotName = kind, name
		if err != nil {
			return err
		}
		if name != "ok.example" {
			return errors.New("refused")
		}
		return nil
	})
	go io.WriteString(client, "Host: ok.example\r\n\r\n")
	got := make([]byte, 100)
	n, err := io.ReadAtLeast(g, got, len("GET / HTTP/1.1\r\nHost: ok.example\r\n\r\n"))
	if err != nil || string(got[:n]) != "GET / HTTP/1.1\r\nHost: ok.example\r\n\r\n" {
		t.Fatalf("read %q %v", got[:n], err)
	}
	if gotKind != KindHTTP || gotName != "ok.example" {
		t.Fatalf("check saw %q %q", gotKind, gotName)
	}

	client2, server2 := pipe(t)
	refused := Guard(server2, nil, 0, 100*time.Millisecond, func(kind, name string, err error) error {
		if name != "ok.example" {
			return errors.New("refused")
		}
		return nil
	})
	go func() {
		time.Sleep(200 * time.Millisecond) // longer than any Peek timeout
		io.WriteString(client2, "GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	}()
	if n, err := refused.Read(got); err == nil || n != 0 {
		t.Fatalf("late fronted request passed: %q %v", got[:n], err)
	}
	if _, err := refused.Read(got); err == nil {
		t.Fatal("second read after refusal succeeded")
	}
}

func TestHostname(t *testing.T) {
	if h, err := Hostname("API.GitHub.com."); h != "api.github.com" || err != nil {
		t.Fatalf("got %q %v", h, err)
	}
	for _, bad := range []string{"", ".", "a..b", "a b", "a/b", "a@b", string(bytes.Repeat([]byte("a"), 64)) + ".com"} {
		if _, err := Hostname(bad); err == nil {
			t.Errorf("Hostname(%q) accepted", bad)
		}
	}
}

// After an HTTP opening the guard hands on each request whole (bodies of
// either framing included), checks each one's Host, and after a WebSocket
// upgrade the server accepted passes the rest through untouched.
func TestGuardHTTPRequests(t *testing.T) {
	client, proxy := pipe(t)
	var hosts []string
	g := Guard(proxy, nil, DefaultMax, time.Second, func(kind, name string, err error) error {
		hosts = append(hosts, kind+" "+name)
		if name == "evil.test" {
			return errors.New("fronted")
		}
		return nil
	})
	go func() {
		io.WriteString(client, "POST /a HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 5\r\n\r\nhello")
		io.WriteString(client, "POST /b HTTP/1.1\r\nHost: ok.test:80\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
		io.WriteString(client, "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nRAW-FRAMES")
		// Half-close: the responses below must still reach the client.
		client.(*net.TCPConn).CloseWrite()
	}()
	br := bufio.NewReader(g)
	for _, want := range []string{"hello", "abc"} {
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(req.Body)
		if string(body) != want {
			t.Errorf("%s body %q, want %q", req.URL.Path, body, want)
		}
	}
	req, err := http.ReadRequest(br)
	if err != nil || req.Header.Get("Upgrade") != "websocket" {
		t.Fatalf("upgrade request: %v %v", req, err)
	}
	io.WriteString(g, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	io.WriteString(g, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	io.WriteString(g, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	if rest, _ := io.ReadAll(br); string(rest) != "RAW-FRAMES" {
		t.Errorf("after the upgrade: %q", rest)
	}
	if want := []string{"http_host ok.test", "http_host ok.test", "http_host ok.test", "http_host ok.test"}; !slices.Equal(hosts, want) {
		t.Errorf("checked %q, want %q", hosts, want)
	}

	// A later request for another host ends the stream with the refusal.
	client2, proxy2 := net.Pipe()
	defer client2.Close()
	g2 := Guard(proxy2, nil, DefaultMax, time.Second, func(kind, name string, err error) error {
		if name == "evil.test" {
			return errors.New("fronted")
		}
		return nil
	})
	go io.WriteString(client2, "GET /1 HTTP/1.1\r\nHost: ok.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	got, err := io.ReadAll(g2)
	if err == nil || !strings.Contains(err.Error(), "fronted") {
		t.Errorf("fronted request: err %v", err)
	}
	if strings.Contains(string(got), "/2") || !strings.Contains(string(got), "GET /1") {
		t.Errorf("forwarded %q", got)
	}
}
