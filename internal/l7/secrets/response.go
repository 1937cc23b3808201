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

// Scrub appends data with real values replaced to dst. Unless final, it
// stops where a real value could continue past the end of data and
// returns how many bytes it consumed; the rest must be offered again,
// followed by what comes next. The output has exactly the length of the
// consumed input.
func (s *Set) Scrub(dst, data []byte, final bool) ([]byte, int) {
	if s == nil || len(s.entries) == 0 {
		return append(dst, data...), len(data)
	}
	return s.v().scrub.scrub(dst, string(data), final)
}

// ScrubBody returns body reading with real values replaced by their
// surrogates. It holds back only a tail that could be the start of a real
// value, so a streamed response (SSE, chunked) still flows as it arrives.
func (s *Set) ScrubBody(body io.ReadCloser) io.ReadCloser {
	if s == nil || len(s.entries) == 0 || body == nil || body == http.NoBody {
		return body
	}
	return &scrubReader{body: body, set: s}
}

type scrubReader struct {
	body io.ReadCloser
	set  *Set
	// out is scrubbed and ready; held is read but may still turn out to
	// begin a real value.
	out, held []byte
	err       error
	// buf and spare are reused between reads.
	buf, spare []byte
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			// A body that broke off may have cut a real value short:
			// what is held is passed on only at a clean end.
			if len(r.held) > 0 && errors.Is(r.err, io.EOF) {
				r.out, _ = r.set.Scrub(nil, r.held, true)
				r.held = nil
				continue
			}
			return 0, r.err
		}
		if len(r.buf) < len(p) {
			r.buf = make([]byte, max(len(p), 4096))
		}
		n, err := r.body.Read(r.buf)
		r.err = err
		data := append(r.held, r.buf[:n]...)
		var used int
		r.out, used = r.set.Scrub(r.spare[:0], data, false)
		r.spare = r.out
		r.held = append(data[:0], data[used:]...)
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *scrubReader) Close() error { return r.body.Close() }
