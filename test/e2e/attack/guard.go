package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/websocket"
)

// Attacks on the per-request host checks of a plain HTTP connection: the
// connection was allowed for FRONT, and HIDDEN is another name served at
// the same address. Announcing a protocol switch must not make the
// supervisor stop reading requests unless the server really switched (to
// WebSocket); otherwise the next request on the connection names HIDDEN and
// the shared front end routes it there.

func init() {
	attacks["upgrade-front"] = cmdUpgradeFront
	attacks["ws-echo"] = cmdWSEcho
}

// wsHeaders make a request a well-formed WebSocket handshake (RFC 6455
// §4.1) apart from the method, version and path each case picks.
const wsHeaders = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"

// upgradeCases are first requests that announce an upgrade the server does
// not accept: it answers them as ordinary requests and keeps reading.
var upgradeCases = []struct {
	name      string
	line      string // request line
	headers   string
	pipelined bool // the request for HIDDEN goes in the same write
}{
	{"upgrade-foo", "GET / HTTP/1.1", "Upgrade: foo\r\nConnection: Upgrade\r\n", false},
	{"upgrade-alone", "GET / HTTP/1.1", "Upgrade: websocket\r\n", false},
	{"h2c", "GET / HTTP/1.1", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n", false},
	{"header-case", "GET / HTTP/1.1", "uPGRADE:\twebsocket \r\nconnection: keep-alive, UPGRADE\r\n", false},
	{"ws-answered-200", "GET / HTTP/1.1", wsHeaders, false},
	{"ws-answered-426", "GET /status/426 HTTP/1.1", wsHeaders, false},
	{"ws-http10", "GET / HTTP/1.0", "Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n", false},
	{"ws-post", "POST / HTTP/1.1", wsHeaders + "Content-Length: 0\r\n", false},
	{"pipelined", "GET / HTTP/1.1", "Upgrade: foo\r\nConnection: Upgrade\r\n", true},
	{"ws-pipelined", "GET / HTTP/1.1", wsHeaders, true},
}

// cmdUpgradeFront: upgrade-front VIA FRONT HIDDEN. VIA is "direct" (the
// transparent listener), "connect" or "socks" (the proxies named by
// $HTTP_PROXY_ADDR and $SOCKS_PROXY_ADDR). Each case opens a connection to
// FRONT:80, sends a request carrying Upgrade, reads the answer, then asks
// for HIDDEN on the same connection. A control first checks that two plain
// requests to FRONT work on one connection, so a refusal is not a broken
// path.
func cmdUpgradeFront(args []string) int {
	need(args, 3, "upgrade-front direct|connect|socks FRONT HIDDEN")
	via, front, hidden := args[0], args[1], args[2]
	target := net.JoinHostPort(front, "80")
	if err := keepAliveControl(via, target, front); err != nil {
		fmt.Printf("CONTROL failed: %v\n", err)
		return 1
	}
	fmt.Println("CONTROL ok: two requests to", front, "on one connection")
	var escapes []string
	for _, tc := range upgradeCases {
		first := fmt.Sprintf("%s\r\nHost: %s\r\n%s\r\n", tc.line, front, tc.headers)
		detail, err := frontThenHidden(via, target, front, hidden, first, tc.pipelined)
		switch {
		case err != nil:
			fmt.Printf("CASE %s blocked: %v\n", tc.name, err)
		case strings.Contains(detail, "hello from "+hidden):
			fmt.Printf("CASE %s escaped: %s\n", tc.name, detail)
			escapes = append(escapes, tc.name)
		default:
			fmt.Printf("CASE %s blocked: %s\n", tc.name, detail)
		}
	}
	if len(escapes) > 0 {
		return escaped("reached %s through a connection allowed for %s: %s", hidden, front, strings.Join(escapes, " "))
	}
	return blocked("every request for %s on a connection allowed for %s was refused", hidden, front)
}

// frontThenHidden sends first, reads its response, then asks for hidden on
// the same connection and returns what came back.
func frontThenHidden(via, target, front, hidden, first string, pipelined bool) (string, error) {
	c, err := dialVia(via, target)
	if err != nil {
		return "", fmt.Errorf("dial: %s", errno(err))
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	second := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hidden)
	out := first
	if pipelined {
		out += second
	}
	if _, err := io.WriteString(c, out); err != nil {
		return "", fmt.Errorf("write: %s", errno(err))
	}
	br := bufio.NewReader(c)
	method, _, _ := strings.Cut(first, " ")
	status, body, err := readResponse(br, method)
	if err != nil {
		return "", fmt.Errorf("response to the upgrade request: %s", errno(err))
	}
	if status == http.StatusSwitchingProtocols {
		return "", fmt.Errorf("the server switched protocols (%d)", status)
	}
	if !strings.Contains(body, "hello from "+front) && !strings.HasPrefix(body, "status ") {
		return "", fmt.Errorf("unexpected first answer %d %q", status, body)
	}
	if !pipelined {
		if _, err := io.WriteString(c, second); err != nil {
			return "", fmt.Errorf("write second request: %s", errno(err))
		}
	}
	status, body, err = readResponse(br, "GET")
	if err != nil {
		return "", fmt.Errorf("response to the request for %s: %s", hidden, errno(err))
	}
	return fmt.Sprintf("%d %q", status, body), nil
}

func readResponse(br *bufio.Reader, method string) (int, string, error) {
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), err
}

// keepAliveControl sends two plain requests for front on one connection.
func keepAliveControl(via, target, front string) error {
	c, err := dialVia(via, target)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for i := range 2 {
		fmt.Fprintf(c, "GET /control%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, front)
		_, body, err := readResponse(br, "GET")
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if !strings.Contains(body, "hello from "+front) {
			return fmt.Errorf("request %d answered %q", i, body)
		}
	}
	return nil
}

// cmdWSEcho: ws-echo VIA HOST. Opens a WebSocket to ws://HOST/ws through
// VIA with x/net/websocket's client and checks the echo: the upgrade the
// host checks must keep working.
func cmdWSEcho(args []string) int {
	need(args, 2, "ws-echo direct|connect|socks HOST")
	via, host := args[0], args[1]
	c, err := dialVia(via, net.JoinHostPort(host, "80"))
	if err != nil {
		fmt.Println("WS dial:", errno(err))
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	cfg, err := websocket.NewConfig("ws://"+host+"/ws", "http://"+host)
	if err != nil {
		fmt.Println("WS config:", err)
		return 1
	}
	ws, err := websocket.NewClient(cfg, c)
	if err != nil {
		fmt.Println("WS handshake:", err)
		return 1
	}
	for i := range 3 {
		msg := "ping " + strconv.Itoa(i)
		var got string
		if err := websocket.Message.Send(ws, msg); err != nil {
			fmt.Println("WS send:", err)
			return 1
		}
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			fmt.Printf("WS receive: %q %v\n", got, err)
			return 1
		}
	}
	fmt.Println("WS echo ok via", via)
	return 0
}

// dialVia connects to target (host:port) directly, through the HTTP proxy
// with CONNECT, or through the SOCKS5 proxy, and returns the connection
// once the proxy has agreed.
func dialVia(via, target string) (net.Conn, error) {
	var proxy string
	switch via {
	case "direct":
		return net.DialTimeout("tcp", target, 5*time.Second)
	case "connect":
		proxy = os.Getenv("HTTP_PROXY_ADDR")
	case "socks":
		proxy = os.Getenv("SOCKS_PROXY_ADDR")
	default:
		return nil, fmt.Errorf("unknown way %q", via)
	}
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if via == "connect" {
		err = connectHandshake(c, target)
	} else {
		err = socksHandshake(c, target)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

func connectHandshake(c net.Conn, target string) error {
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	// Byte by byte, so nothing after the proxy's answer is taken from
	// the tunnel.
	var head []byte
	b := make([]byte, 1)
	for !strings.HasSuffix(string(head), "\r\n\r\n") {
		if _, err := c.Read(b); err != nil {
			return fmt.Errorf("CONNECT answer: %w", err)
		}
		head = append(head, b[0])
	}
	if !strings.HasPrefix(string(head), "HTTP/1.1 200") {
		return fmt.Errorf("CONNECT refused: %q", strings.SplitN(string(head), "\r\n", 2)[0])
	}
	return nil
}

func socksHandshake(c net.Conn, target string) error {
	host, port, _ := net.SplitHostPort(target)
	p, _ := strconv.Atoi(port)
	req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}, host...)
	req = append(req, byte(p>>8), byte(p))
	if _, err := c.Write(req); err != nil {
		return err
	}
	// Method choice (2 bytes) and an IPv4 reply (10 bytes).
	var rep [12]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		return fmt.Errorf("SOCKS answer: %w", err)
	}
	if rep[1] != 0 || rep[3] != 0 {
		return fmt.Errorf("SOCKS refused: method %d reply %d", rep[1], rep[3])
	}
	return nil
}
