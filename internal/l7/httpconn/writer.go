package httpconn

import (
	"bufio"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// chunkingAfter is how much body a response may buffer before it is sent
// chunked: a handler that ends within it gets a Content-Length, as with
// net/http's server.
const chunkingAfter = 2048

// writer is the http.ResponseWriter of a request served inline. It frames
// an HTTP/1.1 response the way net/http's server does (Content-Length or
// chunked, trailers, 1xx, HEAD and bodiless statuses, Date, a sniffed
// Content-Type), and never writes more body than a declared length, so
// nothing a handler writes can be read by the client as a further
// response. It cannot hijack: inline requests carry no upgrade.
type writer struct {
	bw  *bufio.Writer
	req *http.Request

	header http.Header
	// head is the header as it was when the status was set; what the
	// handler adds later goes only to trailers.
	head     http.Header
	status   int
	sent     bool
	chunked  bool
	clen     int64 // declared Content-Length, -1 if none
	written  int64
	pending  []byte
	trailers []string
	// closeAfter ends the connection after this response: the client
	// asked, the handler did, or the body's framing ended short.
	closeAfter bool
	err        error
}

func (w *writer) reset(req *http.Request) {
	*w = writer{bw: w.bw, req: req, header: make(http.Header), clen: -1, pending: w.pending[:0]}
}

func (w *writer) Header() http.Header { return w.header }

func (w *writer) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.status != 0 {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.writeStatus(code)
		w.header.WriteSubset(w.bw, noBodyHeaders)
		w.bw.WriteString("\r\n")
		w.flush()
		return
	}
	w.status = code
	w.head = w.header.Clone()
	if cl := w.head.Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			w.clen = v
		} else {
			w.head.Del("Content-Length")
		}
	}
}

var noBodyHeaders = map[string]bool{"Content-Length": true, "Transfer-Encoding": true}

func (w *writer) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(len(p))
	if w.clen != -1 && w.written > w.clen {
		return 0, http.ErrContentLength
	}
	if w.err != nil {
		return 0, w.err
	}
	if !w.sent {
		if len(w.pending)+len(p) <= chunkingAfter {
			w.pending = append(w.pending, p...)
			return len(p), w.err
		}
		// As net/http's 2 KiB buffer does: topped up from p and sent as
		// the first chunk, or p itself when nothing is buffered; the head
		// is chosen by those first bytes. A large p is never copied, so
		// no connection keeps a buffer the size of its largest write.
		if len(w.pending) > 0 {
			k := chunkingAfter - len(w.pending)
			w.pending = append(w.pending, p[:k]...)
			w.sendHead(false, w.pending)
			w.body(p[k:])
			return len(p), w.err
		}
		w.sendHead(false, p)
	}
	w.body(p)
	return len(p), w.err
}

// FlushError sends what is buffered; the body goes chunked if its length
// is not known yet.
func (w *writer) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sent {
		w.sendHead(false, w.pending)
	}
	w.flush()
	return w.err
}

// finish ends the response once the handler has returned, and reports
// whether the connection must close after it.
func (w *writer) finish() bool {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sent {
		w.sendHead(true, w.pending)
	}
	if w.chunked {
		w.bw.WriteString("0\r\n")
		if t := w.finalTrailers(); t != nil {
			t.Write(w.bw)
		}
		w.bw.WriteString("\r\n")
	}
	if w.clen != -1 && w.req.Method != http.MethodHead && bodyAllowed(w.status) && w.written != w.clen {
		w.closeAfter = true
	}
	w.flush()
	return w.closeAfter || w.err != nil
}

// sendHead writes the status line and header, choosing the framing as
// net/http's server does from first, the body's first bytes, then the
// body buffered so far.
func (w *writer) sendHead(done bool, first []byte) {
	w.sent = true
	h := w.head
	isHead := w.req.Method == http.MethodHead
	var exclude map[string]bool
	hasTrailers := len(h["Trailer"]) > 0
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			if exclude == nil {
				exclude = map[string]bool{}
			}
			exclude[k] = true
			hasTrailers = true
		}
	}
	for _, v := range h["Trailer"] {
		for k := range strings.SplitSeq(v, ",") {
			k = textproto.CanonicalMIMEHeaderKey(textproto.TrimString(k))
			if k != "" && httpguts.ValidTrailerHeader(k) {
				w.trailers = append(w.trailers, k)
			}
		}
	}
	te := h.Get("Transfer-Encoding")
	if done && !hasTrailers && te == "" && bodyAllowed(w.status) && h.Get("Content-Length") == "" && (!isHead || len(first) > 0) {
		w.clen = int64(len(first))
		h.Set("Content-Length", strconv.Itoa(len(first)))
	}
	if w.req.Close || httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		w.closeAfter = true
	}
	if bodyAllowed(w.status) {
		_, haveType := h["Content-Type"]
		if !haveType && h.Get("Content-Encoding") == "" && te == "" && len(first) > 0 {
			h.Set("Content-Type", http.DetectContentType(first))
		}
	} else {
		h.Del("Content-Length")
		h.Del("Transfer-Encoding")
		if w.status == http.StatusNotModified {
			h.Del("Content-Type")
		}
	}
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	if w.clen != -1 && te != "" && te != "identity" {
		h.Del("Content-Length")
		w.clen = -1
	}
	switch {
	case isHead || !bodyAllowed(w.status) || w.status == http.StatusNoContent:
		h.Del("Transfer-Encoding")
	case w.clen != -1:
		h.Del("Transfer-Encoding")
	case te == "identity":
		w.closeAfter = true
		h.Del("Transfer-Encoding")
	default:
		w.chunked = true
		h.Set("Transfer-Encoding", "chunked")
		h.Del("Content-Length")
	}
	if w.closeAfter && !httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		h.Set("Connection", "close")
	}
	w.writeStatus(w.status)
	h.WriteSubset(w.bw, exclude)
	w.bw.WriteString("\r\n")
	w.body(w.pending)
	w.pending = w.pending[:0]
}

func (w *writer) writeStatus(code int) {
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	w.bw.WriteString("HTTP/1.1 ")
	w.bw.WriteString(strconv.Itoa(code))
	w.bw.WriteString(" ")
	w.bw.WriteString(text)
	w.bw.WriteString("\r\n")
}

// body writes p as the response's body, as a chunk if chunked; a HEAD
// response's body is counted, never sent.
func (w *writer) body(p []byte) {
	if len(p) == 0 || w.req.Method == http.MethodHead || w.err != nil {
		return
	}
	if w.chunked {
		w.bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
		w.bw.WriteString("\r\n")
		w.bw.Write(p)
		_, w.err = w.bw.WriteString("\r\n")
		return
	}
	_, w.err = w.bw.Write(p)
}

func (w *writer) flush() {
	if err := w.bw.Flush(); err != nil && w.err == nil {
		w.err = err
	}
}

// finalTrailers are the declared trailers' values and those the handler
// set under http.TrailerPrefix, read when the body has ended.
func (w *writer) finalTrailers() http.Header {
	var t http.Header
	for k, vv := range w.header {
		if kk, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			if t == nil {
				t = make(http.Header)
			}
			t[kk] = vv
		}
	}
	for _, k := range w.trailers {
		for _, v := range w.header[k] {
			if t == nil {
				t = make(http.Header)
			}
			t.Add(k, v)
		}
	}
	return t
}

func bodyAllowed(status int) bool {
	return (status < 100 || status > 199) && status != http.StatusNoContent && status != http.StatusNotModified
}
