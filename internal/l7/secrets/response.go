package secrets

import (
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// Responses come back into the sandbox, and a service that echoes the
// credential it received (a token-info endpoint, an error message quoting
// the Authorization header) would hand the workload the real value. They
// are scrubbed the way the environment is: a real value, in any form the
// scrubber knows, becomes its surrogate in the same form.

// ScrubHeader replaces real values with surrogates in every value of h,
// and in names. A name has been canonicalised, which changes the case of
// a value in it: one that holds a real value in any case is dropped,
// since even a case-folded value gives much of it away.
func (s *Set) ScrubHeader(h http.Header) {
	if s == nil || len(s.entries) == 0 {
		return
	}
	v := s.v()
	renamed := http.Header{}
	for k, vs := range h {
		for i, val := range vs {
			vs[i] = v.scrub.replace(val)
		}
		if nk := v.scrub.replace(k); nk != k || v.inFolded(k) {
			delete(h, k)
			if !v.inFolded(nk) {
				renamed[nk] = vs
			}
		}
	}
	maps.Copy(h, renamed)
}

// inFolded reports whether text holds a real value, ignoring case.
func (v *values) inFolded(text string) bool {
	text = strings.ToLower(text)
	return slices.ContainsFunc(v.known, func(e *entry) bool { return strings.Contains(text, strings.ToLower(e.real)) })
}

// Scrub appends data to dst with real values replaced, taking data as
// whole: nothing follows it. The output has exactly the length of data.
func (s *Set) Scrub(dst, data []byte) []byte {
	out, _ := s.scrubber().scrub(dst, string(data), len(data))
	return out
}

// scrubber is the scrubber for the values in force; nil (which passes
// text through) for a nil or empty Set.
func (s *Set) scrubber() *scrubber {
	if s == nil || len(s.entries) == 0 {
		return nil
	}
	return s.v().scrub
}

// Stream scrubs text that arrives in pieces, a body or a WebSocket
// message, so that a real value split between pieces is caught too.
//
// What it passes on, and when, depends only on how much text has come and
// where it has gaps (whitespace, which no form of a value contains), never
// on the real values: it holds back the last bytes of what has come, as
// many as the longest form of a value could span less one (245 for a
// 40-byte token), or only those after the last gap, whether or not they
// could begin a real value. Holding back just a tail that could begin one
// made the hold-back an oracle: a host that reflects text the workload
// chose told it, by when and in which pieces the reflection arrived,
// whether that text was a prefix of a real value, and so the whole value,
// a character at a time. The count itself is no secret: every form of a
// value is as long as that of its surrogate, which the workload holds.
type Stream struct {
	set *Set
	// done is scrubbed and raw not yet scrubbed (a match could begin
	// there and continue in what follows): together, in that order, what
	// has come and not been passed on.
	done, raw []byte
	// run is how many bytes at the end of what has come have no gap,
	// counted up to the hold.
	run int
}

// Stream returns a Stream for one body or message.
func (s *Set) Stream() *Stream { return &Stream{set: s} }

// Next takes the next piece of text, data, and appends to dst, scrubbed,
// all that has come but what the stream holds back.
func (st *Stream) Next(dst, data []byte) []byte {
	sc := st.set.scrubber()
	if sc == nil {
		return append(dst, data...)
	}
	// Only the last hold bytes of data can change the run, so the look
	// for a gap costs nothing per byte of a large read.
	st.run = min(st.run+len(data), sc.hold)
	for i := len(data) - 1; i >= max(0, len(data)-sc.hold); i-- {
		if gap(data[i]) {
			st.run = len(data) - 1 - i
			break
		}
	}
	st.raw = append(st.raw, data...)
	// cut is how much of done and raw goes out now. A match beginning
	// before it has the hold, or a gap, after it: it cannot run on into
	// what comes next.
	cut := len(st.done) + len(st.raw) - st.run
	start := len(dst)
	dst = append(dst, st.done...)
	dst, used := sc.scrub(dst, string(st.raw), max(0, cut-len(st.done)))
	st.done = append(st.done[:0], dst[start+cut:]...)
	st.raw = append(st.raw[:0], st.raw[used:]...)
	return dst[:start+cut]
}

// End appends to dst, scrubbed, all that the stream holds back: the text
// has ended cleanly.
func (st *Stream) End(dst []byte) []byte {
	dst = append(dst, st.done...)
	dst, _ = st.set.scrubber().scrub(dst, string(st.raw), len(st.raw))
	st.done, st.raw, st.run = nil, nil, 0
	return dst
}

// Held is how many bytes the stream holds.
func (st *Stream) Held() int { return len(st.done) + len(st.raw) }

// ScrubBody returns body reading with real values replaced by their
// surrogates, through a Stream: a streamed response (SSE, chunked) flows
// as it arrives up to its last line break or space, and beyond that as
// the stream's hold-back allows. A body that breaks off rather than
// ending cleanly loses what is held back, whatever it is: it may have
// cut a real value short, which scrubbing cannot recognise, and passing
// on only what does not begin one would tell which it was.
func (s *Set) ScrubBody(body io.ReadCloser) io.ReadCloser {
	if s == nil || len(s.entries) == 0 || body == nil || body == http.NoBody {
		return body
	}
	return &scrubReader{body: body, st: s.Stream()}
}

type scrubReader struct {
	body io.ReadCloser
	st   *Stream
	// out is scrubbed and ready.
	out []byte
	err error
	// buf and spare are reused between reads.
	buf, spare []byte
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			if r.st.Held() > 0 && errors.Is(r.err, io.EOF) {
				r.out = r.st.End(r.spare[:0])
				continue
			}
			return 0, r.err
		}
		if len(r.buf) < len(p) {
			r.buf = make([]byte, max(len(p), 4096))
		}
		n, err := r.body.Read(r.buf)
		r.err = err
		r.out = r.st.Next(r.spare[:0], r.buf[:n])
		r.spare = r.out
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *scrubReader) Close() error { return r.body.Close() }
