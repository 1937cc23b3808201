package sniff

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// responses follows the server's side of a checked HTTP/1 connection. It
// frames the stream of responses as RFC 9112 §6.3 does and matches each to
// the request it answers, so the guard learns how the server answered a
// WebSocket upgrade: only a 101 that accepts it may end the per-request host
// checks. It watches and never changes a byte.
//
// Anything it cannot follow for certain (malformed or ambiguous framing, a
// response or a protocol switch nobody asked for) stops the watching for
// good. That grants no upgrade, so the checks go on until the connection
// ends: being stricter than a real client costs at most a WebSocket on an
// odd connection, being laxer could mistake body bytes for a 101.
type responses struct {
	// pending are the requests sent whose final response has not begun,
	// oldest first.
	pending []exchange
	// outcome is told, exactly once for each WebSocket request expected,
	// whether the server switched to WebSocket.
	outcome func(accepted bool)

	state respState
	line  []byte // the unfinished line
	head  int    // bytes of the current head or trailer section so far
	// remain counts what is left of a Content-Length body or a chunk.
	remain int64
	cur    headFacts

	err      error // why the stream can no longer be followed
	switched bool  // the server accepted a WebSocket upgrade
}

// exchange is what framing a response needs to know of its request.
type exchange struct {
	method    string
	websocket bool
}

type respState int

const (
	stStatus     respState = iota // awaiting a status line
	stFields                      // in a head's header fields
	stBody                        // in a Content-Length body
	stChunkSize                   // awaiting a chunk-size line
	stChunkData                   // in a chunk's data
	stChunkEnd                    // awaiting the CRLF after chunk data
	stTrailer                     // in the trailer section
	stUntilClose                  // in a body that ends with the connection
)

// headFacts are the parts of a response head that decide framing and
// whether it accepts a WebSocket.
type headFacts struct {
	status  int
	http10  bool
	length  int64  // -1 when there is no Content-Length
	lengths string // the Content-Length as sent, which repeats must match
	chunked bool
	// upgrades counts Upgrade fields; only a single "websocket" accepts.
	upgrades    int
	upgradeWS   bool
	connUpgrade bool // Connection lists "upgrade"
}

// maxChunkLine bounds a chunk-size line with its extensions (net/http's
// limit too).
const maxChunkLine = 4096

var errSwitchedUnasked = errors.New("101 Switching Protocols for a request that did not ask for WebSocket")

// expect records a request about to be sent upstream. It must be called
// before the request's bytes can reach the server, or its response could
// be taken for one nobody asked for.
func (r *responses) expect(ex exchange) {
	if r.err != nil || r.switched {
		r.tell(ex, false)
		return
	}
	r.pending = append(r.pending, ex)
}

// end marks the server's side as finished: requests still waiting will
// get no answer.
func (r *responses) end() {
	if r.err == nil && !r.switched {
		r.fail(errors.New("the server ended the connection"))
	}
}

// feed takes the next bytes the server sent.
func (r *responses) feed(p []byte) {
	for len(p) > 0 && r.err == nil && !r.switched {
		switch r.state {
		case stUntilClose:
			return
		case stBody, stChunkData:
			n := min(int64(len(p)), r.remain)
			p = p[n:]
			r.skip(n)
		default:
			chunk, rest, found := bytes.Cut(p, []byte{'\n'})
			p = rest
			limit, counted := maxChunkLine, false
			if r.state == stStatus || r.state == stFields || r.state == stTrailer {
				limit, counted = maxHead-r.head, true
			}
			if len(r.line)+len(chunk) >= limit {
				r.fail(fmt.Errorf("a response line or head exceeds %d bytes", limit))
				return
			}
			if counted {
				r.head += len(chunk) + 1
			}
			if !found {
				r.line = append(r.line, chunk...)
				return
			}
			line := chunk
			if len(r.line) > 0 {
				r.line = append(r.line, chunk...)
				line = r.line
			}
			r.onLine(line)
			r.line = r.line[:0]
		}
	}
}

// unwatched is how many of the server's next bytes need not be looked at:
// what is left of a body or chunk whose length the framing gave, or, once
// nothing is followed any more (the stream could not be followed, a
// WebSocket was accepted, a body runs until the connection ends), all of
// them, shown as -1. 0 means the next bytes must be fed.
func (r *responses) unwatched() int64 {
	switch {
	case r.err != nil, r.switched, r.state == stUntilClose:
		return -1
	case r.state == stBody, r.state == stChunkData:
		return r.remain
	}
	return 0
}

// skip takes n body bytes, at most unwatched(), as feed would have.
func (r *responses) skip(n int64) {
	if r.state != stBody && r.state != stChunkData {
		return
	}
	r.remain -= n
	if r.remain > 0 {
		return
	}
	if r.state == stBody {
		r.state = stStatus
	} else {
		r.state = stChunkEnd
	}
}

// onLine handles one line (without its LF) in a line-oriented state.
func (r *responses) onLine(raw []byte) {
	switch r.state {
	case stChunkEnd:
		if string(raw) != "\r" {
			r.fail(errors.New("chunk data not followed by CRLF"))
			return
		}
		r.state = stChunkSize
		return
	case stChunkSize:
		r.chunkSize(raw)
		return
	}
	// Head and trailer lines may end in a bare LF (RFC 9112 §2.2); a CR
	// anywhere else, or another control byte, is refused.
	line := trimCR(raw)
	for _, c := range line {
		if c < ' ' && c != '\t' || c == 0x7f {
			r.fail(fmt.Errorf("control byte in response line %q", truncate(line)))
			return
		}
	}
	switch r.state {
	case stStatus:
		r.statusLine(line)
	case stFields:
		if len(line) == 0 {
			r.endHead()
			return
		}
		r.field(line)
	case stTrailer:
		if len(line) == 0 {
			r.head = 0
			r.state = stStatus
			return
		}
		if _, _, ok := fieldLine(line); !ok {
			r.fail(fmt.Errorf("trailer line %q", truncate(line)))
		}
	}
}

func (r *responses) statusLine(line []byte) {
	proto, rest, _ := bytes.Cut(line, []byte{' '})
	if string(proto) != "HTTP/1.1" && string(proto) != "HTTP/1.0" {
		r.fail(fmt.Errorf("status line %q", truncate(line)))
		return
	}
	// The reason phrase after the code means nothing.
	code, _, _ := bytes.Cut(rest, []byte{' '})
	status, err := strconv.Atoi(string(code))
	if len(code) != 3 || err != nil || code[0] < '1' || code[0] > '9' {
		r.fail(fmt.Errorf("status line %q", truncate(line)))
		return
	}
	r.cur = headFacts{status: status, http10: string(proto) == "HTTP/1.0", length: -1}
	r.state = stFields
}

// fieldLine splits "name: value", checking the name is a token with the
// colon right after it (whitespace there is a smuggling classic).
func fieldLine(line []byte) (name, value string, ok bool) {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || !allTchar(line[:colon]) {
		return "", "", false
	}
	return string(line[:colon]), strings.Trim(string(line[colon+1:]), " \t"), true
}

func (r *responses) field(line []byte) {
	if line[0] == ' ' || line[0] == '\t' {
		r.fail(errors.New("folded response header line"))
		return
	}
	name, value, ok := fieldLine(line)
	if !ok {
		r.fail(fmt.Errorf("response header line %q", truncate(line)))
		return
	}
	switch http.CanonicalHeaderKey(name) {
	case "Content-Length":
		n, err := strconv.ParseUint(value, 10, 63)
		if err != nil || (r.cur.length >= 0 && value != r.cur.lengths) {
			r.fail(fmt.Errorf("Content-Length %q", truncate([]byte(value))))
			return
		}
		r.cur.length, r.cur.lengths = int64(n), value
	case "Transfer-Encoding":
		// Only a single "chunked" frames a body the way every reader
		// agrees on; HTTP/1.0 has no transfer codings at all.
		if r.cur.chunked || r.cur.http10 || !strings.EqualFold(value, "chunked") {
			r.fail(fmt.Errorf("Transfer-Encoding %q", truncate([]byte(value))))
			return
		}
		r.cur.chunked = true
	case "Upgrade":
		r.cur.upgrades++
		r.cur.upgradeWS = strings.EqualFold(value, "websocket")
	case "Connection":
		r.cur.connUpgrade = r.cur.connUpgrade || hasToken(value, "upgrade")
	}
}

// endHead decides, at the empty line, whose response this is and how its
// body is framed.
func (r *responses) endHead() {
	h := r.cur
	r.head = 0
	if h.chunked && h.length >= 0 {
		r.fail(errors.New("response with both Transfer-Encoding and Content-Length"))
		return
	}
	if len(r.pending) == 0 {
		r.fail(fmt.Errorf("a %d response to no request", h.status))
		return
	}
	ex := r.pending[0]
	switch {
	case h.status == http.StatusSwitchingProtocols:
		if !ex.websocket || h.http10 || h.upgrades != 1 || !h.upgradeWS || !h.connUpgrade {
			r.fail(errSwitchedUnasked)
			return
		}
		r.pending = r.pending[1:]
		r.switched = true
		r.tell(ex, true)
		return
	case h.status < 200:
		// Interim (100 Continue, 103 Early Hints): the final response
		// to the same request follows.
		r.state = stStatus
		return
	case ex.method == http.MethodConnect && h.status < 300:
		r.fail(errors.New("the server opened a tunnel"))
		return
	}
	r.pending = r.pending[1:]
	r.tell(ex, false)
	switch {
	case ex.method == http.MethodHead || h.status == http.StatusNoContent || h.status == http.StatusNotModified:
		r.state = stStatus
	case h.chunked:
		r.state = stChunkSize
	case h.length == 0:
		r.state = stStatus
	case h.length > 0:
		r.remain, r.state = h.length, stBody
	default:
		r.state = stUntilClose
	}
}

// chunkSize reads "hex[;extensions]CRLF"; a bare LF or a stray CR is
// refused (RFC 9112 errata 7633).
func (r *responses) chunkSize(raw []byte) {
	line, ok := bytes.CutSuffix(raw, []byte{'\r'})
	if !ok || bytes.IndexByte(line, '\r') >= 0 {
		r.fail(errors.New("chunk-size line without CRLF"))
		return
	}
	size, _, _ := bytes.Cut(bytes.TrimRight(line, " \t"), []byte{';'})
	n, err := strconv.ParseUint(string(size), 16, 63)
	if err != nil {
		r.fail(fmt.Errorf("chunk size %q", truncate(size)))
		return
	}
	if n == 0 {
		r.state = stTrailer
		return
	}
	r.remain, r.state = int64(n), stChunkData
}

// fail stops following the stream: no WebSocket still waiting will be
// accepted.
func (r *responses) fail(err error) {
	r.err = err
	for _, ex := range r.pending {
		r.tell(ex, false)
	}
	r.pending = nil
	r.line = nil
}

func (r *responses) tell(ex exchange, accepted bool) {
	if ex.websocket && r.outcome != nil {
		r.outcome(accepted)
	}
}

// hasToken reports whether the comma-separated list v holds token,
// case-insensitively.
func hasToken(v, token string) bool {
	for t := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(strings.Trim(t, " \t"), token) {
			return true
		}
	}
	return false
}
