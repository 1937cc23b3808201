package inspect

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"

	"github.com/corral-sandbox/corral/internal/l7/secrets"
)

// reasonUnscrubbable is the 502 reason for a response from a host a
// masked secret is scoped to that corral could not scrub, so did not
// pass on. Field values are part of corral's interface.
const reasonUnscrubbable = "response_not_scrubbable"

// unscrubbable is a scoped host's response that cannot be scrubbed of
// real secret values.
type unscrubbable struct{ error }

func (u unscrubbable) Unwrap() error { return u.error }

// scrubResponse prepares a scoped host's response so that no real value
// reaches the workload: headers scrubbed, a content coding undone so the
// body can be, a WebSocket's frames scrubbed as they arrive.
func (h *handler) scrubResponse(resp *http.Response) error {
	set := h.secretsFor(resp.Request.Context())
	set.ScrubHeader(resp.Header)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The request offered no extension (rewrite removed them), so
		// frames can only be plain; a server that names one anyway
		// would send frames the scrubber cannot read.
		if ext := resp.Header.Get("Sec-WebSocket-Extensions"); ext != "" {
			return unscrubbable{fmt.Errorf("the server accepted the WebSocket with extension %q, which was not offered and whose frames cannot be scrubbed", ext)}
		}
		conn, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return unscrubbable{errors.New("the upgraded connection cannot be relayed")}
		}
		resp.Body = &wsScrubber{ReadWriteCloser: conn, r: bufio.NewReader(conn), set: set, msg: set.Stream(),
			onErr: func(err error) {
				h.in.log().Warn("WebSocket from a host a masked secret is scoped to closed", "target", h.t.Request.Target(), "err", err)
			}}
		return nil
	}
	if err := secrets.DecodeResponse(resp); err != nil {
		return unscrubbable{err}
	}
	resp.Body = &trailerScrubber{ReadCloser: set.ScrubBody(resp.Body), scrub: func() { set.ScrubHeader(resp.Trailer) }}
	return nil
}

// trailerScrubber scrubs the trailers once the body has ended: their
// values arrive after it, and ReverseProxy copies them after Close.
// Scrubbing twice changes nothing, so both the end and Close do.
type trailerScrubber struct {
	io.ReadCloser
	scrub func()
}

func (t *trailerScrubber) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		t.scrub()
	}
	return n, err
}

func (t *trailerScrubber) Close() error {
	err := t.ReadCloser.Close()
	t.scrub()
	return err
}

// scrubTransport scrubs the headers of interim (1xx) responses, which
// ReverseProxy relays to the client before ModifyResponse sees anything.
// Its trace is added after ReverseProxy's, so it runs first.
type scrubTransport struct {
	h  *handler
	rt http.RoundTripper
}

func (t scrubTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if set := t.h.secretsFor(req.Context()); set.Scoped(t.h.t.Request.Host) {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(_ int, hdr textproto.MIMEHeader) error {
				set.ScrubHeader(http.Header(hdr))
				return nil
			},
		}))
	}
	return t.rt.RoundTrip(req)
}

// WebSocket frames from a scoped host (RFC 6455 section 5.2). Payloads are
// scrubbed in place: a surrogate's every form is as long as the real
// value's, so frame lengths stay. A message's payloads go through one
// secrets.Stream, so a value split across its fragments is caught; a
// fragment is sent whole once the stream has passed on all of it, which
// depends only on the sizes and gaps of what came after it, never on the
// real values. Holding a fragment back while its tail could begin a real
// value, as was done before, told a host that echoes chosen text as
// fragments, by which echoes never came, whether that text was a prefix of
// the value. The end of each message (FIN) releases what is held.
const (
	// maxFrame bounds what one frame (or a message's held-back
	// fragments) may take in memory; a larger one closes the connection.
	maxFrame = 16 << 20

	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
)

type wsScrubber struct {
	io.ReadWriteCloser
	r     *bufio.Reader
	set   *secrets.Set
	onErr func(error)

	// ready is scrubbed and may go to the client.
	ready []byte
	// held are the data frames of the current message not yet sent:
	// out is the start of their payloads that msg has passed on, the
	// rest is in msg.
	held []wsFrame
	out  []byte
	msg  *secrets.Stream
	// frag: a message's first fragment has come and its last not yet.
	frag bool
	err  error
}

type wsFrame struct {
	head []byte
	n    int // payload length
}

func (w *wsScrubber) Read(p []byte) (int, error) {
	for len(w.ready) == 0 {
		if w.err != nil {
			return 0, w.err
		}
		if err := w.next(); err != nil {
			w.err = err
			if !errors.Is(err, io.EOF) && w.onErr != nil {
				w.onErr(err)
			}
		}
	}
	n := copy(p, w.ready)
	w.ready = w.ready[n:]
	return n, nil
}

// next reads one frame and moves what can be sent to ready.
func (w *wsScrubber) next() error {
	head, fin, op, payload, err := w.frame()
	if err != nil {
		if errors.Is(err, io.EOF) && w.frag {
			return fmt.Errorf("the connection ended inside a fragmented message: %w", io.ErrUnexpectedEOF)
		}
		return err
	}
	if op >= opClose {
		// Control frames may come between a message's fragments; they
		// go out at once, scrubbed whole (at most 125 bytes).
		if op == opClose && w.frag {
			return errors.New("the server closed inside a fragmented message")
		}
		w.ready = w.set.Scrub(append(w.ready, head...), payload)
		return nil
	}
	if (op == opContinuation) != w.frag {
		return fmt.Errorf("frame opcode %d out of sequence", op)
	}
	w.frag = !fin
	if len(w.out)+w.msg.Held()+len(payload) > maxFrame {
		return fmt.Errorf("a fragmented message larger than %d MiB cannot be scrubbed", maxFrame>>20)
	}
	w.held = append(w.held, wsFrame{head: head, n: len(payload)})
	w.out = w.msg.Next(w.out, payload)
	if fin {
		w.out = w.msg.End(w.out)
	}
	// Send every frame the stream has passed on all of.
	for len(w.held) > 0 && w.held[0].n <= len(w.out) {
		f := w.held[0]
		w.ready = append(append(w.ready, f.head...), w.out[:f.n]...)
		w.out = w.out[f.n:]
		w.held = w.held[1:]
	}
	if len(w.held) == 0 {
		w.out = nil
	}
	return nil
}

// frame reads one whole frame: its header bytes as sent, and payload.
func (w *wsScrubber) frame() (head []byte, fin bool, op byte, payload []byte, err error) {
	var b [14]byte
	if _, err := io.ReadFull(w.r, b[:2]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, false, 0, nil, fmt.Errorf("reading a frame header: %w", err)
		}
		return nil, false, 0, nil, err
	}
	fin, op = b[0]&0x80 != 0, b[0]&0x0f
	if b[0]&0x70 != 0 {
		return nil, false, 0, nil, errors.New("a frame uses an extension (RSV bits), which was not negotiated")
	}
	if b[1]&0x80 != 0 {
		return nil, false, 0, nil, errors.New("the server sent a masked frame")
	}
	switch op {
	case opContinuation, opText, opBinary:
	case opClose, 0x9, 0xA:
		if !fin || b[1]&0x7f > 125 {
			return nil, false, 0, nil, errors.New("a control frame is fragmented or longer than 125 bytes")
		}
	default:
		return nil, false, 0, nil, fmt.Errorf("reserved frame opcode %d", op)
	}
	hl, n := 2, uint64(b[1]&0x7f)
	switch n {
	case 126:
		hl = 4
	case 127:
		hl = 10
	}
	if _, err := io.ReadFull(w.r, b[2:hl]); err != nil {
		return nil, false, 0, nil, fmt.Errorf("reading a frame header: %w", noEOF(err))
	}
	switch hl {
	case 4:
		n = uint64(binary.BigEndian.Uint16(b[2:4]))
	case 10:
		n = binary.BigEndian.Uint64(b[2:10])
	}
	if n > maxFrame {
		return nil, false, 0, nil, fmt.Errorf("a frame of %d bytes is larger than the %d MiB that can be scrubbed", n, maxFrame>>20)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(w.r, payload); err != nil {
		return nil, false, 0, nil, fmt.Errorf("reading a frame payload: %w", noEOF(err))
	}
	return append([]byte(nil), b[:hl]...), fin, op, payload, nil
}

// noEOF turns a clean end into an unexpected one: inside a frame it is.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
