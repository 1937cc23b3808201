package inspect_test

import (
	"crypto/tls"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/corral-sandbox/corral/internal/policy"
)

// dialWS opens a WebSocket through the inspector. websocket.DialConfig
// cannot be pointed at an address other than the URL's host, so the
// connection is built here and handed to NewClient.
func (h *harness) dialWS(t *testing.T, path string) (*websocket.Conn, error) {
	t.Helper()
	cfg, err := websocket.NewConfig("wss://"+h.host+path, "https://"+h.host)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: ioTimeout}, "tcp", h.addr, &tls.Config{
		RootCAs: h.sbPool, ServerName: h.host, NextProtos: []string{"http/1.1"},
	})
	if err != nil {
		t.Fatalf("dial inspector: %v", err)
	}
	conn.SetDeadline(time.Now().Add(ioTimeout))
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ws, nil
}

func TestWebSocketRelayedWhenAllowed(t *testing.T) {
	for name, mod := range map[string]func(*policy.Endpoint){
		"rule": func(ep *policy.Endpoint) {
			ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: "/ws"}}}
		},
		"access": func(ep *policy.Endpoint) { ep.Access = policy.AccessFull },
	} {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t)
			h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, mod))})
			ws, err := h.dialWS(t, "/ws")
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			for _, msg := range []string{"hello", "again"} {
				if err := websocket.Message.Send(ws, msg); err != nil {
					t.Fatalf("send: %v", err)
				}
				var got string
				if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
					t.Fatalf("echo %q, %v; want %q", got, err, msg)
				}
			}
			ws.Close()
			if got := up.uris(); !slices.Equal(got, []string{"GET /ws"}) {
				t.Errorf("upstream saw %q", got)
			}
			// The relay must end with the client, or the tunnel leaks.
			h.settle(t)
			ev := eventFor(t, h.httpEvents(t), "GET", "/ws")
			requireFields(t, ev)
			if ev["decision"] != "allow" {
				t.Errorf("event %v, want allow", ev)
			}
		})
	}
}

func TestWebSocketDeniedByRules(t *testing.T) {
	up := newUpstream(t)
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
		ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: "/other"}}}
	}))})
	if ws, err := h.dialWS(t, "/ws"); err == nil {
		ws.Close()
		t.Fatal("WebSocket handshake to a path no rule allows succeeded")
	}
	r := h.raw(t, "GET", "/ws", apiHost,
		"Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
	if body := denial(t, r); body["path"] != "/ws" {
		t.Errorf("denial body %v", body)
	}
	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream saw %q", up.uris())
	}
}
