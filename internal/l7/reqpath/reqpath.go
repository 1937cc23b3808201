// Package reqpath turns the path and query a client sent into the form the
// L7 policy matches and the form the proxy forwards upstream.
//
// The attack it defends against is one path meaning two things: the proxy
// decides on its reading of the request target, the upstream acts on its
// own, and any gap between the two readings is a policy bypass. Examples
// are dot segments the proxy leaves alone but the upstream resolves
// ("/allowed/../admin", "/allowed/%2e%2e/admin"), encoded slashes one side
// splits on and the other does not ("/allowed%2F..%2Fadmin"), backslashes
// that Windows-flavoured servers treat as separators, Tomcat and Spring
// stripping ";params" before resolving dots ("/allowed/..;/admin"), double
// encoding decoded once by the proxy and twice by some framework
// ("%252e%252e"), and NUL bytes that truncate the path in C code.
//
// Normalize does not try to guess how a particular upstream reads a path.
// It resolves what every RFC 3986 server agrees on (percent-decoding, dot
// segments) and refuses what servers disagree on, then forwards a path whose
// decoding is exactly the string the policy matched. A request it refuses
// is one a well-behaved client has no reason to send.
package reqpath

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

var (
	// ErrEncodedSlash reports %2F (or %5C) inside a segment: the upstream
	// may or may not split there, so the policy cannot know which segments
	// it is matching. %2F can be allowed per call; %5C never is.
	ErrEncodedSlash = errors.New("encoded slash in path")
	// ErrAmbiguous reports a path servers are known to read differently.
	ErrAmbiguous = errors.New("ambiguous path")
	// ErrQuery reports a query string frameworks are known to split or
	// decode differently.
	ErrQuery = errors.New("malformed query")
)

// maxLen bounds the work per request and sits well under the limits common
// servers enforce, so an over-long path cannot be accepted here and
// truncated or rejected differently upstream.
const maxLen = 8192

// Path is a request path as the policy sees it and as the upstream will
// receive it.
type Path struct {
	// Match is the decoded, normalised path policy globs are matched
	// against, e.g. "/repos/a b/x". With encoded slashes allowed, a slash
	// that was %2F in a segment appears as the text "%2F", so it cannot be
	// mistaken for a separator; any other "%" in Match is a literal one.
	Match string
	// Forward is the escaped path sent upstream. Decoding it segment by
	// segment gives exactly Match.
	Forward string
	// Unparameterised is Match with every segment's ";params" removed (and
	// segments left empty by that dropped): the path Tomcat, Jetty and
	// Spring route on. It equals Match when no segment has parameters; a
	// caller checks both, so "/admin;x" cannot pass for something else.
	Unparameterised string
}

// Normalize takes the raw request-target path as the client sent it
// (escaped, without the query; for HTTP/2 the :path up to "?") and returns
// the canonical path, or an error wrapping ErrEncodedSlash or ErrAmbiguous.
// Asterisk-form ("*") and absolute-form targets are ErrAmbiguous; the
// caller deals with those before getting here.
func Normalize(raw string, allowEncodedSlash bool) (Path, error) {
	if len(raw) > maxLen {
		return Path{}, fmt.Errorf("%w: path is %d bytes, over the %d byte limit", ErrAmbiguous, len(raw), maxLen)
	}
	if raw == "" || raw[0] != '/' {
		return Path{}, fmt.Errorf("%w: path %q does not start with \"/\"", ErrAmbiguous, raw)
	}
	// A "?" or "#" here means the caller's split of the target and an
	// upstream's would end the path in different places.
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		return Path{}, fmt.Errorf("%w: %q inside path", ErrAmbiguous, raw[i])
	}
	if strings.IndexByte(raw, '\\') >= 0 {
		return Path{}, fmt.Errorf("%w: backslash in path", ErrAmbiguous)
	}

	type segment struct{ match, forward string }
	var segs []segment
	trailingSlash := false
	parts := strings.Split(raw[1:], "/")
	for i, rs := range parts {
		dec, err := unescape(rs, false)
		if err != nil {
			return Path{}, fmt.Errorf("%w: segment %q: %v", ErrAmbiguous, rs, err)
		}
		match, err := checkSegment(dec, allowEncodedSlash)
		if err != nil {
			return Path{}, fmt.Errorf("%w (segment %q)", err, rs)
		}
		// A path ending in "/", "/." or "/.." names a directory, and
		// servers route "/a/" and "/a" differently, so the slash survives.
		trailingSlash = i == len(parts)-1 && (dec == "" || dec == "." || dec == "..")
		switch dec {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			fwd := rs
			if !wellFormed(rs) {
				fwd = escape(dec)
			}
			segs = append(segs, segment{match, fwd})
		}
	}

	var m, f, u strings.Builder
	m.Grow(len(raw))
	f.Grow(len(raw))
	u.Grow(len(raw))
	for _, s := range segs {
		m.WriteByte('/')
		m.WriteString(s.match)
		f.WriteByte('/')
		f.WriteString(s.forward)
		if name, _, _ := strings.Cut(s.match, ";"); name != "" {
			u.WriteByte('/')
			u.WriteString(name)
		}
	}
	if trailingSlash || len(segs) == 0 {
		m.WriteByte('/')
		f.WriteByte('/')
	}
	if trailingSlash || u.Len() == 0 {
		u.WriteByte('/')
	}
	// Escaping can triple a path; what is forwarded must keep the limit
	// too, or the upstream would refuse (or cut) what was decided.
	if f.Len() > maxLen {
		return Path{}, fmt.Errorf("%w: path is %d bytes once escaped, over the %d byte limit", ErrAmbiguous, f.Len(), maxLen)
	}
	return Path{Match: m.String(), Forward: f.String(), Unparameterised: u.String()}, nil
}

// checkSegment refuses a decoded segment servers could read differently
// and returns its Match form.
func checkSegment(dec string, allowEncodedSlash bool) (string, error) {
	if strings.IndexByte(dec, '\\') >= 0 {
		// Never allowed: unlike %2F, servers that split on a decoded
		// backslash do so regardless of any setting we could know about.
		return "", fmt.Errorf("%w: %%5C", ErrEncodedSlash)
	}
	for i := 0; i < len(dec); i++ {
		if c := dec[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("%w: control character %#02x", ErrAmbiguous, c)
		}
	}
	if !utf8.ValidString(dec) {
		return "", fmt.Errorf("%w: invalid UTF-8", ErrAmbiguous)
	}
	// Any escape left after one decoding means the client encoded twice,
	// and a framework that decodes twice sees a different path from the
	// policy. This is broader than %252e/%252f/%255c/%2525: "%2561dmin"
	// would get past a rule denying "/admin" just the same.
	if i := findEscape(dec); i >= 0 {
		return "", fmt.Errorf("%w: double encoding %q", ErrAmbiguous, dec[i:i+3])
	}
	hasSlash := strings.IndexByte(dec, '/') >= 0
	if hasSlash && !allowEncodedSlash {
		return "", fmt.Errorf("%w: %%2F", ErrEncodedSlash)
	}
	// Pieces are what an upstream that splits on %2F sees as segments; a
	// dot piece there would be resolved upstream but not here.
	for piece := range strings.SplitSeq(dec, "/") {
		name, _, params := strings.Cut(piece, ";")
		if name != "." && name != ".." {
			continue
		}
		if params {
			return "", fmt.Errorf("%w: dot segment with parameters %q", ErrAmbiguous, piece)
		}
		if hasSlash {
			return "", fmt.Errorf("%w: dot segment %q behind an encoded slash", ErrAmbiguous, piece)
		}
	}
	if hasSlash {
		return strings.ReplaceAll(dec, "/", "%2F"), nil
	}
	return dec, nil
}

// Query parses a raw query string (without the "?") into names and their
// values in the order sent. It is strict where frameworks differ: an
// invalid percent escape or a ";" separator (which some servers split on
// and others do not) is ErrQuery. "+" decodes to a space, as form decoding
// upstream does. Empty "&&" pieces are skipped, and a name without "=" has
// the value "". Which of several values for one name an upstream uses is
// the caller's concern; all are returned.
func Query(raw string) (map[string][]string, error) {
	q := make(map[string][]string)
	if raw == "" {
		return q, nil
	}
	if strings.IndexByte(raw, ';') >= 0 {
		return nil, fmt.Errorf("%w: %q separator", ErrQuery, ';')
	}
	for piece := range strings.SplitSeq(raw, "&") {
		if piece == "" {
			continue
		}
		k, v, _ := strings.Cut(piece, "=")
		name, err := unescape(k, true)
		if err != nil {
			return nil, fmt.Errorf("%w: name %q: %v", ErrQuery, k, err)
		}
		value, err := unescape(v, true)
		if err != nil {
			return nil, fmt.Errorf("%w: value of %q: %v", ErrQuery, name, err)
		}
		q[name] = append(q[name], value)
	}
	return q, nil
}

// unescape percent-decodes s, refusing escapes that are not "%" and two hex
// digits: servers disagree on whether to pass those through, drop them or
// fail, so no reading of them is safe to match on.
func unescape(s string, plusIsSpace bool) (string, error) {
	if strings.IndexByte(s, '%') < 0 && (!plusIsSpace || strings.IndexByte(s, '+') < 0) {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				end := min(i+3, len(s))
				return "", fmt.Errorf("invalid escape %q", s[i:end])
			}
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
		case c == '+' && plusIsSpace:
			b.WriteByte(' ')
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// findEscape returns the index of the first "%" followed by two hex digits
// in s, or -1.
func findEscape(s string) int {
	for i := 0; i+2 < len(s); i++ {
		if s[i] == '%' && isHex(s[i+1]) && isHex(s[i+2]) {
			return i
		}
	}
	return -1
}

// wellFormed reports whether a raw segment (already known to have valid
// escapes) can be forwarded as sent. Keeping the client's bytes where
// possible leaves signed paths intact; anything outside the RFC 3986
// segment grammar is re-escaped instead, since upstreams that reject or
// rewrite such bytes would otherwise see something other than Match.
func wellFormed(raw string) bool {
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c != '%' && !isPchar(c) {
			return false
		}
	}
	return true
}

// escape encodes a decoded segment with the fewest escapes RFC 3986 allows,
// so the forwarded path stays as readable as the policy that matched it.
func escape(dec string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(dec))
	for i := 0; i < len(dec); i++ {
		c := dec[i]
		if isPchar(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// isPchar reports whether c may appear unescaped in a path segment:
// unreserved, sub-delims, ":" or "@" (RFC 3986 section 3.3).
func isPchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
