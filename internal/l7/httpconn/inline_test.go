package httpconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is what the handler saw of one request.
type seen struct {
	Method, URI, Host, Proto string
	Header                   http.Header
	Close                    bool
	Remote                   bool
}

// recorder answers by path with each way a handler can shape a response,
// and records the requests it saw and whether each was served inline.
type recorder struct {
	mu     sync.Mutex
	seen   []seen
	inline []bool
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.seen = append(rec.seen, seen{r.Method, r.RequestURI, r.Host, r.Proto, r.Header.Clone(), r.Close, r.RemoteAddr != ""})
	rec.inline = append(rec.inline, r.Context().Value(http.LocalAddrContextKey) == nil)
	rec.mu.Unlock()
	h := w.Header()
	h.Set("Date", "fixed") // net/http's own would differ between the two runs
	switch r.URL.Path {
	case "/big":
		w.Write(bytes.Repeat([]byte("b"), 3000))
		w.Write(bytes.Repeat([]byte("c"), 2000))
	case "/small-then-big":
		// What is sniffed is the first 512 bytes, which the zeros reach.
		w.Write(bytes.Repeat([]byte("a"), 100))
		w.Write(make([]byte, 3000))
	case "/cl":
		h.Set("Content-Length", "10")
		w.Write([]byte("0123456789"))
	case "/short":
		h.Set("Content-Length", "10")
		w.Write([]byte("01234"))
	case "/long":
		h.Set("Content-Length", "3")
		w.Write([]byte("01234"))
	case "/flush":
		w.Write([]byte("a"))
		http.NewResponseController(w).Flush()
		w.Write([]byte("b"))
	case "/trailer":
		h.Set("Trailer", "X-T, Host")
		w.Write([]byte("x"))
		h.Set("X-T", "v")
		h.Set(http.TrailerPrefix+"X-U", "u")
	case "/204":
		w.WriteHeader(http.StatusNoContent)
		w.Write([]byte("no"))
	case "/304":
		h.Set("Content-Type", "text/plain")
		h.Set("Content-Length", "4")
		w.WriteHeader(http.StatusNotModified)
	case "/103":
		h.Set("Link", "</s.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("Link")
		w.Write([]byte("ok"))
	case "/close":
		h.Set("Connection", "close")
		w.Write([]byte("bye"))
	case "/identity":
		h.Set("Transfer-Encoding", "identity")
		w.Write([]byte("until close"))
	case "/abort":
		w.Write(bytes.Repeat([]byte("a"), 3000))
		panic(http.ErrAbortHandler)
	case "/empty":
	case "/type":
		h.Set("Content-Encoding", "gzip")
		w.Write([]byte("<html>"))
	case "/status":
		w.WriteHeader(299)
	default:
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("<html>hello</html>"))
	}
}

// exchange sends raw to a server on a loopback connection, half-closes,
// and returns all it answered.
func exchange(t testing.TB, raw string, serve func(net.Conn, *recorder)) ([]byte, *recorder) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rec := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		serve(c, rec)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		c.Write([]byte(raw))
		c.(*net.TCPConn).CloseWrite()
	}()
	out, _ := io.ReadAll(c)
	c.Close()
	<-done
	return out, rec
}

func serveNetHTTP(c net.Conn, rec *recorder) {
	Serve(context.Background(), c, rec, time.Second, slog.New(slog.DiscardHandler))
}

func serveInline(c net.Conn, rec *recorder) {
	ServeInline(context.Background(), c, rec, time.Second, slog.New(slog.DiscardHandler))
}

// answer is one response as a client reads it.
type answer struct {
	Status   int
	Header   http.Header
	Body     string
	Trailer  http.Header
	BodyErr  string
	ReadErr  string
	ClosedOK bool
}

// answers reads the responses in out, one per method in turn (a 1xx
// takes none), as a client would.
func answers(out []byte, methods []string) []answer {
	br := bufio.NewReader(bytes.NewReader(out))
	var got []answer
	for len(methods) > 0 {
		req := &http.Request{Method: methods[0]}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			if err != io.EOF {
				got = append(got, answer{ReadErr: err.Error()})
			}
			return got
		}
		a := answer{Status: resp.StatusCode, Header: resp.Header}
		body, err := io.ReadAll(resp.Body)
		a.Body = string(body)
		if err != nil {
			a.BodyErr = err.Error()
		}
		a.Trailer = resp.Trailer
		a.ClosedOK = resp.Close
		got = append(got, a)
		if resp.StatusCode >= 200 {
			methods = methods[1:]
		}
		if err != nil {
			return got
		}
	}
	if rest, _ := io.ReadAll(br); len(rest) > 0 {
		got = append(got, answer{ReadErr: fmt.Sprintf("%d bytes after the last response: %q", len(rest), rest)})
	}
	return got
}

// methods lists the methods of the requests in raw, in order, as far as
// they can be read.
func methods(raw string) []string {
	var m []string
	br := bufio.NewReader(strings.NewReader(raw))
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			if len(m) == 0 || err != io.EOF {
				m = append(m, http.MethodGet) // for the error answer, if any
			}
			return m
		}
		m = append(m, req.Method)
		io.Copy(io.Discard, req.Body)
	}
}

// matchNetHTTP sends raw to ServeInline and to net/http's server behind
// Serve, reports any difference in the requests the handler saw or the
// responses the client read, and returns which requests were served
// inline.
func matchNetHTTP(t testing.TB, raw string) []bool {
	t.Helper()
	want, wantRec := exchange(t, raw, serveNetHTTP)
	got, gotRec := exchange(t, raw, serveInline)
	if !reflect.DeepEqual(gotRec.seen, wantRec.seen) {
		t.Errorf("the handler saw\n%+v\nwith net/http's server\n%+v", gotRec.seen, wantRec.seen)
	}
	m := methods(raw)
	if ga, wa := answers(got, m), answers(want, m); !reflect.DeepEqual(ga, wa) {
		t.Errorf("the client read\n%+v\n(%q)\nwith net/http's server\n%+v\n(%q)", ga, got, wa, want)
	}
	return gotRec.inline
}

const get = "GET %s HTTP/1.1\r\nHost: api.test\r\n\r\n"

func gets(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, get, p)
	}
	return b.String()
}

// TestInlineMatchesNetHTTP sends the same bytes to ServeInline and to
// net/http's server behind Serve: the handler must see the same requests
// and the client the same responses, and the simple requests must have
// been served inline.
func TestInlineMatchesNetHTTP(t *testing.T) {
	post := "POST /post HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\nhello"
	cases := []struct {
		name string
		raw  string
		// inline is how the handler's requests must have been served.
		inline []bool
	}{
		{"one GET", gets("/"), []bool{true}},
		{"pipelined", gets("/", "/cl", "/big", "/small-then-big", "/flush", "/trailer", "/204", "/304", "/103", "/empty", "/type", "/status", "/long"), slices.Repeat([]bool{true}, 13)},
		{"HEAD and OPTIONS", "HEAD /cl HTTP/1.1\r\nHost: api.test\r\n\r\nHEAD / HTTP/1.1\r\nHost: a\r\n\r\nHEAD /big HTTP/1.1\r\nHost: a\r\n\r\nOPTIONS /x HTTP/1.1\r\nHost: a\r\n\r\n", []bool{true, true, true, true}},
		{"GET then POST then GET", gets("/") + post + gets("/"), []bool{true, false, false}},
		{"short body closes", gets("/short", "/"), []bool{true}},
		{"handler closes", gets("/close", "/"), []bool{true}},
		{"client closes", "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" + gets("/"), []bool{true}},
		{"identity", gets("/identity", "/"), []bool{true}},
		{"abort", gets("/abort", "/"), []bool{true}},
		{"bare LF", "GET /cl HTTP/1.1\nHost: a\n\n" + gets("/"), []bool{true, true}},
		{"Content-Length 0", "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", []bool{true}},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", nil},
		{"no Host", "GET / HTTP/1.1\r\n\r\n" + gets("/"), nil},
		{"bad Host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", nil},
		{"bad header value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n", nil},
		{"bad header name", "GET / HTTP/1.1\r\nHost: a\r\nX Y: z\r\n\r\n", nil},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: a\r\n\r\n", []bool{false}},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n" + gets("/"), []bool{false}},
		{"absolute form", "GET http://api.test/ HTTP/1.1\r\nHost: other\r\n\r\n", []bool{false}},
		{"chunked GET", "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + gets("/"), []bool{false, false}},
		{"CL and TE", "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", []bool{false}},
		{"Expect", "GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n", []bool{false}},
		{"Upgrade", "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", []bool{false}},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", []bool{true}},
		{"h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", []bool{false}},
		{"garbage", "\x16\x03\x01hello\r\n\r\n", nil},
		{"leading CRLF", "\r\n" + gets("/"), nil},
		{"long head", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("x", 20<<10) + "\r\n\r\n" + gets("/"), []bool{false, false}},
		{"unfinished head", "GET / HTTP/1.1\r\nHost: a\r\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if inline := matchNetHTTP(t, tc.raw); !slices.Equal(inline, tc.inline) {
				t.Errorf("served inline: %v, want %v", inline, tc.inline)
			}
		})
	}
}

// A request still running when its client hangs up is cancelled, as
// net/http's server does, so an abandoned stream lets go of its upstream.
func TestInlineNoticesClientGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first line\n"))
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(10 * time.Second):
			ended <- errors.New("the request was not cancelled")
		}
	})
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err == nil {
			ServeInline(context.Background(), c, h, time.Minute, slog.New(slog.DiscardHandler))
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, get, "/stream")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("read %q, %v", line, err)
	}
	time.Sleep(2 * watchAfter)
	c.Close()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	<-served
}

// FuzzInlineMatchesNetHTTP: for any bytes a client sends, the handler
// sees the same requests, and the client reads the same responses, as
// with net/http's server.
func FuzzInlineMatchesNetHTTP(f *testing.F) {
	for _, s := range []string{
		gets("/", "/cl", "/big"), gets("/trailer", "/103", "/304"),
		"HEAD /cl HTTP/1.1\r\nHost: a\r\n\r\n", "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\n\n", "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\nPOST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if len(raw) > 4<<10 {
			return
		}
		matchNetHTTP(t, raw)
	})
}
