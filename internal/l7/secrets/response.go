package secrets

import (
	"io"
	"net/http"
	"strings"
)

// Responses come back into the sandbox, and a service that echoes the
// credential it received (a token-info endpoint, an error message quoting
// the Authorization header) would hand the workload the real value. They
// are scrubbed the way the environment is: real values, raw or base64,
// become their surrogates.

// ScrubHeader replaces real values with surrogates in every value of h.
func (s *Set) ScrubHeader(h http.Header) {
	if s == nil || len(s.entries) == 0 {
		return
	}
	for k, vs := range h {
		for i, v := range vs {
			h[k][i] = s.scrub.replace(v)
		}
	}
}

// ScrubBody returns body reading with real values replaced by their
// surrogates. It holds back only a tail that could be the start of a real
// value, so a streamed response (SSE, chunked) still flows as it arrives.
func (s *Set) ScrubBody(body io.ReadCloser) io.ReadCloser {
	if s == nil || len(s.entries) == 0 || body == nil || body == http.NoBody {
		return body
	}
	return &scrubReader{body: body, scrub: s.scrub}
}

type scrubReader struct {
	body  io.ReadCloser
	scrub *replacements
	// pending is read but not yet returned: out is ready, held may still
	// turn out to begin a real value.
	out, held []byte
	err       error
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			if len(r.held) > 0 {
				r.out, r.held = []byte(r.scrub.replace(string(r.held))), nil
				continue
			}
			return 0, r.err
		}
		buf := make([]byte, max(len(p), 4096))
		n, err := r.body.Read(buf)
		r.err = err
		data := string(r.held) + string(buf[:n])
		keep := r.scrub.partialSuffix(data)
		r.out = []byte(r.scrub.replace(data[:len(data)-keep]))
		r.held = []byte(data[len(data)-keep:])
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *scrubReader) Close() error { return r.body.Close() }

// partialSuffix is the length of the longest suffix of s that is a proper
// prefix of some old string: bytes that must wait for more input before
// they can be told apart from the start of a secret.
func (r *replacements) partialSuffix(s string) int {
	longest := 0
	for _, p := range r.pairs {
		for k := min(len(p.old)-1, len(s)); k > longest; k-- {
			if strings.HasPrefix(p.old, s[len(s)-k:]) {
				longest = k
				break
			}
		}
	}
	return longest
}
