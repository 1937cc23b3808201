package netlab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/websocket"
	"golang.org/x/sys/unix"
)

var (
	apiHost = Host{Name: "api.test.example", Addr: netip.MustParseAddr("203.0.113.10")}
	gitHost = Host{Name: "Git.Test.Example.", Addr: netip.MustParseAddr("203.0.113.11")}
)

func TestLabServices(t *testing.T) {
	l := Start(t, apiHost, gitHost)
	l.AddRecord("internal.test.example", netip.MustParseAddr("127.0.0.1"))

	t.Run("dns", func(t *testing.T) {
		for _, network := range []string{"udp", "tcp"} {
			c := &dns.Client{Net: network, Timeout: 2 * time.Second}
			ask := func(name string, qtype uint16) *dns.Msg {
				t.Helper()
				m := new(dns.Msg)
				m.SetQuestion(dns.Fqdn(name), qtype)
				r, _, err := c.Exchange(m, l.DNS.String())
				if err != nil {
					t.Fatalf("%s %s: %v", network, name, err)
				}
				if !r.Authoritative {
					t.Errorf("%s %s: answer not authoritative", network, name)
				}
				return r
			}
			r := ask("API.test.example", dns.TypeA)
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
				t.Fatalf("%s: A api: %v", network, r)
			}
			if a := r.Answer[0].(*dns.A); !a.A.Equal(apiHost.Addr.AsSlice()) || a.Hdr.Ttl != 60 {
				t.Errorf("%s: A api = %v", network, a)
			}
			if r := ask("git.test.example", dns.TypeA); len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(gitHost.Addr.AsSlice()) {
				t.Errorf("%s: A git: %v", network, r)
			}
			if r := ask("internal.test.example", dns.TypeA); len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(net.IPv4(127, 0, 0, 1)) {
				t.Errorf("%s: A internal: %v", network, r)
			}
			if r := ask("api.test.example", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
				t.Errorf("%s: AAAA api: want NOERROR empty, got %v", network, r)
			}
			if r := ask("nope.test.example", dns.TypeA); r.Rcode != dns.RcodeNameError {
				t.Errorf("%s: A nope: want NXDOMAIN, got %v", network, r)
			}
		}
		q := l.DNSQueries()
		for _, want := range []string{"api.test.example", "git.test.example", "internal.test.example", "nope.test.example"} {
			if !slices.Contains(q, want) {
				t.Errorf("DNSQueries %v lacks %s", q, want)
			}
		}
	})

	t.Run("http", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://203.0.113.10/some/path?x=1", nil)
		req.Header.Set("X-Probe", "plain")
		body, proto := do(t, l.HTTPClient(), req)
		if body != "hello from api.test.example GET /some/path" || proto != "HTTP/1.1" {
			t.Errorf("got %q over %s", body, proto)
		}
		s := findSeen(t, l, "plain")
		if s.Host != "203.0.113.10" || s.Path != "/some/path" || s.Query != "x=1" || s.TLS ||
			s.LocalAddr != "203.0.113.10:80" || !strings.HasPrefix(s.RemoteAddr, "198.51.100.1:") {
			t.Errorf("seen %+v", s)
		}
	})

	t.Run("https", func(t *testing.T) {
		for _, tc := range []struct {
			proto string
			tr    *http.Transport
		}{
			{"HTTP/2.0", &http.Transport{ForceAttemptHTTP2: true}},
			// A non-nil empty TLSNextProto map turns HTTP/2 off.
			{"HTTP/1.1", &http.Transport{TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}},
		} {
			tc.tr.Proxy = nil
			tc.tr.TLSClientConfig = &tls.Config{RootCAs: l.CertPool(), ServerName: "git.test.example"}
			c := &http.Client{Transport: tc.tr, Timeout: 5 * time.Second}
			req, _ := http.NewRequest("POST", "https://203.0.113.11/upload", strings.NewReader("payload"))
			req.Host = "git.test.example"
			req.Header.Set("X-Probe", tc.proto)
			body, proto := do(t, c, req)
			if body != "hello from git.test.example POST /upload" || proto != tc.proto {
				t.Errorf("got %q over %s, want %s", body, proto, tc.proto)
			}
			tc.tr.CloseIdleConnections()
			s := findSeen(t, l, tc.proto)
			if !s.TLS || s.ServerName != "git.test.example" || string(s.Body) != "payload" || s.Proto != tc.proto {
				t.Errorf("seen %+v", s)
			}
		}
		// Without the lab CA the certificate must not validate: the lab is
		// only useful if verification is real.
		tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "api.test.example"}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest("GET", "https://203.0.113.10/", nil)
		if resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("TLS without the lab CA succeeded")
		}
	})

	t.Run("echo_and_banner", func(t *testing.T) {
		for _, tc := range []struct {
			port   string
			banner string
		}{{"7000", ""}, {"2222", Banner}} {
			c, err := l.Dial("tcp", net.JoinHostPort("203.0.113.10", tc.port))
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			if tc.banner != "" {
				got, err := br.ReadString('\n')
				if err != nil || got != tc.banner {
					t.Errorf("banner %q, %v", got, err)
				}
			}
			for _, line := range []string{"ping\n", "second line\n"} {
				if _, err := io.WriteString(c, line); err != nil {
					t.Fatal(err)
				}
				got, err := br.ReadString('\n')
				if err != nil || got != line {
					t.Errorf("port %s: echo %q, %v", tc.port, got, err)
				}
			}
			c.Close()
		}
		if n := len(l.TCPConns()); n < 2 {
			t.Errorf("TCPConns: %d entries", n)
		}
	})
}

// TestLabSpecialPaths checks the HTTP paths that behave unlike "hello".
func TestLabSpecialPaths(t *testing.T) {
	l := Start(t, apiHost, gitHost)
	client := l.HTTPClient()
	t.Cleanup(client.CloseIdleConnections)

	t.Run("stream", func(t *testing.T) {
		for _, tc := range []struct {
			id, url, proto string
		}{
			{"t1", "https://203.0.113.10/stream/t1", "HTTP/2.0"},
			{"t1-h1", "http://203.0.113.10/stream/t1-h1", "HTTP/1.1"},
		} {
			if l.StreamStarted(tc.id) {
				t.Errorf("%s: started before any request", tc.id)
			}
			req := mustReq(t, tc.url)
			req.Header.Set("X-Probe", "stream-"+tc.id)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", tc.url, err)
			}
			if resp.Proto != tc.proto || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Errorf("%s: %s, Content-Type %q", tc.url, resp.Proto, resp.Header.Get("Content-Type"))
			}
			br := bufio.NewReader(resp.Body)
			first, err := br.ReadString('\n')
			if err == nil {
				_, err = br.ReadString('\n')
			}
			if err != nil || first != "data: first\n" {
				t.Fatalf("%s: first event %q, %v", tc.url, first, err)
			}
			if !l.StreamStarted(tc.id) {
				t.Errorf("%s: StreamStarted false after the first event", tc.id)
			}
			rest := make(chan string, 1)
			go func() {
				b, _ := io.ReadAll(br)
				rest <- string(b)
			}()
			// A short look only: the stream must still be open, which a
			// longer wait could only confirm more slowly.
			select {
			case got := <-rest:
				t.Fatalf("%s: stream ended before Release with %q", tc.url, got)
			case <-time.After(200 * time.Millisecond):
			}
			l.Release(tc.id)
			if got := <-rest; got != "data: last\n\n" {
				t.Errorf("%s: after Release got %q", tc.url, got)
			}
			resp.Body.Close()
			if s := findSeen(t, l, "stream-"+tc.id); s.Path != "/stream/"+tc.id || s.Proto != tc.proto {
				t.Errorf("seen %+v", s)
			}
		}
		if l.StreamStarted("never") {
			t.Errorf("StreamStarted for an id never requested")
		}

		// Released before the request arrives: no wait after the first event.
		l.Release("early")
		body, _ := do(t, client, mustReq(t, "http://203.0.113.10/stream/early"))
		if body != "data: first\n\ndata: last\n\n" {
			t.Errorf("early release: %q", body)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		for _, tc := range []struct {
			url string
			tls bool
		}{
			{"ws://203.0.113.10/ws", false},
			{"wss://203.0.113.11/ws", true},
		} {
			cfg, err := websocket.NewConfig(tc.url, "http://client.test.example/")
			if err != nil {
				t.Fatal(err)
			}
			cfg.Dialer = &net.Dialer{Timeout: 5 * time.Second}
			cfg.TlsConfig = &tls.Config{RootCAs: l.CertPool(), ServerName: "git.test.example"}
			cfg.Header.Set("X-Probe", tc.url)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ws, err := cfg.DialContext(ctx)
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", tc.url, err)
			}
			_ = ws.SetDeadline(time.Now().Add(5 * time.Second))
			for _, m := range []wsMessage{
				{[]byte("hello"), websocket.TextFrame},
				{[]byte{0, 1, 2, 0xff}, websocket.BinaryFrame},
				{bytes.Repeat([]byte("y"), 100000), websocket.TextFrame},
			} {
				if err := wsCodec.Send(ws, &m); err != nil {
					t.Fatalf("%s: send: %v", tc.url, err)
				}
				var got wsMessage
				if err := wsCodec.Receive(ws, &got); err != nil {
					t.Fatalf("%s: receive: %v", tc.url, err)
				}
				if !bytes.Equal(got.data, m.data) || got.typ != m.typ {
					t.Errorf("%s: sent %d bytes of type %d, got %d bytes of type %d", tc.url, len(m.data), m.typ, len(got.data), got.typ)
				}
			}
			ws.Close()
			s := findSeen(t, l, tc.url)
			if s.Path != "/ws" || s.TLS != tc.tls || !strings.EqualFold(s.Header.Get("Upgrade"), "websocket") {
				t.Errorf("seen %+v", s)
			}
		}

		// HTTP/2 cannot carry x/net/websocket; the answer must say so rather
		// than break the connection.
		resp, err := client.Do(mustReq(t, "https://203.0.113.10/ws"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Proto != "HTTP/2.0" || resp.StatusCode != http.StatusHTTPVersionNotSupported {
			t.Errorf("/ws over %s: status %d", resp.Proto, resp.StatusCode)
		}
	})

	t.Run("echo_headers", func(t *testing.T) {
		req := mustReq(t, "https://203.0.113.10/echo-headers")
		req.Header.Add("X-Custom", "one")
		req.Header.Add("X-Custom", "two")
		body, _ := do(t, client, req)
		var got map[string][]string
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if !slices.Equal(got["X-Custom"], []string{"one", "two"}) {
			t.Errorf("X-Custom %q in %s", got["X-Custom"], body)
		}
	})

	t.Run("big", func(t *testing.T) {
		for _, tc := range []struct {
			query string
			n     int
		}{{"", 1 << 20}, {"?n=0", 0}, {"?n=3000001", 3000001}} {
			resp, err := client.Do(mustReq(t, "http://203.0.113.10/big"+tc.query))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || resp.ContentLength != int64(tc.n) || len(b) != tc.n ||
				bytes.Count(b, []byte("x")) != tc.n {
				t.Errorf("/big%s: status %d, Content-Length %d, %d bytes, %v", tc.query, resp.StatusCode, resp.ContentLength, len(b), err)
			}
		}
		resp, err := client.Do(mustReq(t, "http://203.0.113.10/big?n=67108865"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("/big over the limit: status %d", resp.StatusCode)
		}
	})

	t.Run("status", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			code int
			body string
		}{
			{"/status/418", 418, "status 418"},
			{"/status/503", 503, "status 503"},
			{"/status/101", 400, ""},
			{"/status/teapot", 400, ""},
		} {
			resp, err := client.Do(mustReq(t, "https://203.0.113.10"+tc.path))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || (tc.body != "" && string(b) != tc.body) {
				t.Errorf("%s: status %d, body %q", tc.path, resp.StatusCode, b)
			}
		}
	})

	// The default answer is unchanged next to the special paths.
	body, _ := do(t, client, mustReq(t, "http://203.0.113.10/streams"))
	if body != "hello from api.test.example GET /streams" {
		t.Errorf("got %q", body)
	}
}

// TestLabCleanup checks that a crashed run's link is removed, that everything
// a lab adds to the host is gone after its test, and that a second lab can
// then be started.
func TestLabCleanup(t *testing.T) {
	requireRoot(t)
	// No process can have this pid (it equals the kernel's largest
	// pid_max), so the pair looks like a leftover of a dead run. A veth
	// pair, because the lab needs veth anyway while dummy may be missing.
	const stale = linkPrefix + "4194304h"
	veth := netlink.NewVeth(netlink.LinkAttrs{Name: stale})
	veth.PeerName = linkPrefix + "4194304n"
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add stale veth: %v", err)
	}
	t.Cleanup(func() {
		if lk, err := netlink.LinkByName(stale); err == nil {
			_ = netlink.LinkDel(lk)
		}
	})

	t.Run("first", func(t *testing.T) {
		l := Start(t, apiHost)
		if _, err := netlink.LinkByName(stale); err == nil {
			t.Errorf("stale link %s survived Start", stale)
		}
		c, err := l.Dial("tcp", "203.0.113.10:7000")
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	if t.Failed() {
		return
	}
	assertHostClean(t)

	t.Run("second", func(t *testing.T) {
		l := Start(t, Host{Name: "other.test.example", Addr: netip.MustParseAddr("203.0.113.20")})
		body, _ := do(t, l.HTTPClient(), mustReq(t, "http://203.0.113.20/again"))
		if body != "hello from other.test.example GET /again" {
			t.Errorf("got %q", body)
		}
	})
	assertHostClean(t)
}

func assertHostClean(t *testing.T) {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, lk := range links {
		if strings.HasPrefix(lk.Attrs().Name, linkPrefix) {
			t.Errorf("link %s left behind", lk.Attrs().Name)
		}
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if reason := rangesInUse(h); reason != "" {
		t.Errorf("after cleanup: %s", reason)
	}
}

func do(t *testing.T, c *http.Client, req *http.Request) (body, proto string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s %s: status %d, %v", req.Method, req.URL, resp.StatusCode, err)
	}
	return string(b), resp.Proto
}

func mustReq(t *testing.T, url string) *http.Request {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func findSeen(t *testing.T, l *Lab, probe string) Seen {
	t.Helper()
	for _, s := range l.HTTPRequests() {
		if s.Header.Get("X-Probe") == probe {
			return s
		}
	}
	t.Fatalf("no request with X-Probe %q in %+v", probe, l.HTTPRequests())
	return Seen{}
}
