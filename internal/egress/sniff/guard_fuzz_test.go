package sniff

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzGuardRequests drives the keep-alive request reframer with whatever
// a client may send on a connection to ok.test whose opening is HTTP:
// every request that reaches the server names ok.test, and nothing after a
// refused request gets through. The server answers each request
// with 200, so no WebSocket is ever accepted and parsing never stops.
func FuzzGuardRequests(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: ok.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: ok.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: ok.test\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 44\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\nGET / HTTP/1.1\r\nHost: ok.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nCONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: ok.test\r\n\r\nGET http://evil.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n",
		"GET / HTTP/1.0\r\nHost: ok.test\r\n\r\nGET / HTTP/1.1\r\nHost: ok.test\r\n Host: evil.test\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		client, proxy := net.Pipe()
		defer client.Close()
		var (
			mu      sync.Mutex
			opening string
			// approvals counts the requests approved before the first
			// refusal: each request forwarded needed one of them.
			approvals int
			refused   bool
			served    int
		)
		check := func(kind, name string, err error) error {
			mu.Lock()
			defer mu.Unlock()
			if opening == "" {
				opening = kind + "?"
			}
			// As the gate does for a connection to ok.test: any other
			// name is fronting.
			if err != nil || !strings.EqualFold(name, "ok.test") {
				refused = true
				return errors.New("refused")
			}
			if !refused {
				approvals++
			}
			return nil
		}
		g := Guard(proxy, nil, 16<<10, 200*time.Millisecond, check)
		defer g.Close()
		_ = proxy.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			// The client sends everything, then hangs up.
			_, _ = client.Write(in)
			client.Close()
		}()
		go func() { _, _ = io.Copy(io.Discard, client) }()

		br := bufio.NewReader(g)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			mu.Lock()
			isHTTP := opening == KindHTTP+"?"
			host := strings.ToLower(req.Host)
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
			host = strings.Trim(host, "[]")
			served++
			n, limit := served, approvals
			mu.Unlock()
			if !isHTTP {
				return // an opaque stream is decided by its destination alone
			}
			if host != "ok.test" {
				t.Fatalf("request for %q reached the server", req.Host)
			}
			if n > limit {
				t.Fatalf("%d requests reached the server, but only %d were approved before a refusal", n, limit)
			}
			if req.Method == http.MethodConnect {
				t.Fatalf("CONNECT reached the server")
			}
			if up := req.Header.Get("Upgrade"); up != "" && !strings.EqualFold(up, "websocket") {
				t.Fatalf("Upgrade %q reached the server", up)
			}
			_, _ = io.Copy(io.Discard, req.Body)
			resp := "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(0) + "\r\n\r\n"
			if _, err := g.Write([]byte(resp)); err != nil {
				return
			}
		}
	})
}
