package transparent

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"strings"

	"github.com/corral-sandbox/corral/internal/egress"
)

// maxHead bounds one request head; the body that follows is not limited.
const maxHead = 64 << 10

// relayHTTP forwards a plain HTTP/1.x connection request by request and
// checks every request's Host, not only the first one's: a keep-alive
// connection to an allowed site could otherwise carry a later request for
// another site served at the same address (domain fronting). Requests are
// re-written upstream by net/http; responses flow back untouched. After a
// protocol upgrade (WebSocket) the rest is relayed as it is.
func (s *Server) relayHTTP(ctx context.Context, c *net.TCPConn, up net.Conn, opening []byte, r egress.Request) {
	defer c.Close()
	defer up.Close()
	responses := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, up)
		_ = c.CloseWrite()
		close(responses)
	}()
	head := &io.LimitedReader{R: c}
	br := bufio.NewReader(io.MultiReader(bytes.NewReader(opening), head))
	check := s.Gate.Recheck(ctx, c, r)
	for {
		head.N = maxHead
		req, err := http.ReadRequest(br)
		if err != nil {
			break // end of requests, or not HTTP any more: stop sending
		}
		head.N = math.MaxInt64
		host := req.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if err := check("http_host", strings.Trim(host, "[]"), nil); err != nil {
			// The gate has recorded the refusal; reset the client.
			reset(c)
			return
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			// net/http would otherwise add its own.
			req.Header["User-Agent"] = []string{""}
		}
		upgrade := req.Header.Get("Upgrade") != ""
		if err := req.Write(up); err != nil {
			break
		}
		if upgrade {
			_, _ = io.Copy(up, br)
			break
		}
	}
	if tc, ok := up.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	<-responses
}
