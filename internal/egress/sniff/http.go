package sniff

import (
	"bytes"
	"net/netip"
	"strings"
)

// knownMethods commit a connection to HTTP as soon as "METHOD " is seen:
// from then on a deviation (two spaces, a bare LF, a folded header) is
// malformed and refused, not waved through as raw TCP, because lenient
// servers would still route it by its Host header. Any other method
// commits it once its first line names an HTTP version.
var knownMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true,
	"CONNECT": true, "OPTIONS": true, "TRACE": true, "PATCH": true,
	"PROPFIND": true, "PROPPATCH": true, "MKCOL": true, "COPY": true,
	"MOVE": true, "LOCK": true, "UNLOCK": true, "REPORT": true,
	"SEARCH": true, "PURGE": true, "MKCALENDAR": true,
}

// HTTPHost reads the host an HTTP/1.x request head at the start of b is
// addressed to: its single Host header, or the authority of an absolute-form
// or CONNECT request-target, which must agree with Host when both exist.
// The port is stripped and the name lower-cased. complete is false while
// the head (up to the empty line) is unfinished. err is ErrNotHTTP when b
// cannot be a request line and wraps ErrMalformed when it is one but the
// head breaks the rules above.
func HTTPHost(b []byte) (host string, complete bool, err error) {
	method, target, n, err := requestLine(b)
	if err != nil || n == 0 {
		return "", false, err
	}
	hosts := 0
	var hostHeader string
	for {
		lf := bytes.IndexByte(b[n:], '\n')
		if lf < 0 {
			return "", false, nil
		}
		line := trimCR(b[n : n+lf])
		n += lf + 1
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return "", false, malformed("http", "folded header line")
		}
		if bytes.IndexByte(line, '\r') >= 0 || bytes.IndexByte(line, 0) >= 0 {
			return "", false, malformed("http", "control byte in header")
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !allTchar(line[:colon]) {
			return "", false, malformed("http", "header line %q", truncate(line))
		}
		if strings.EqualFold(string(line[:colon]), "host") {
			hosts++
			hostHeader = string(bytes.Trim(line[colon+1:], " \t"))
		}
	}
	if hosts > 1 {
		return "", false, malformed("http", "%d Host headers", hosts)
	}
	var fromTarget string
	if authority, ok := targetAuthority(method, target); ok {
		h, err := authorityHost(authority)
		if err != nil {
			return "", false, err
		}
		fromTarget = h
	}
	if hosts == 0 {
		if fromTarget == "" {
			return "", false, malformed("http", "no Host header")
		}
		return fromTarget, true, nil
	}
	h, err := authorityHost(hostHeader)
	if err != nil {
		return "", false, err
	}
	if fromTarget != "" && !SameHost(h, fromTarget) {
		return "", false, malformed("http", "Host %q disagrees with request-target %q", h, fromTarget)
	}
	return h, true, nil
}

// requestLine parses "METHOD SP target SP HTTP/d.d" up to its LF and returns
// the bytes consumed; n is 0 while the line is unfinished but still
// plausible.
//
// What is not HTTP is relayed unchecked, so the line is taken for HTTP
// whenever some server could take it for one: whatever the method's length,
// after empty lines (which servers skip, RFC 9112 section 2.2), with tabs
// for spaces, with bytes above 0x7e in the target. Such a line must then
// parse strictly or it is malformed. Only a line that ends without naming
// an HTTP version, or holds a control byte no server accepts in a request
// line, is something else (memcached's "get key", git's pkt-lines).
func requestLine(b []byte) (method, target string, n int, err error) {
	start := 0
	for start < len(b) && (b[start] == '\r' || b[start] == '\n') {
		start++
	}
	line := b[start:]
	i := 0
	for i < len(line) && isTchar(line[i]) {
		i++
	}
	if i == len(line) {
		return "", "", 0, nil
	}
	if i == 0 || (line[i] != ' ' && line[i] != '\t') {
		return "", "", 0, ErrNotHTTP
	}
	method = string(line[:i])
	lf := bytes.IndexByte(line, '\n')
	end := lf
	if end < 0 {
		end = len(line)
	}
	for _, c := range line[i:end] {
		if (c < ' ' && c != '\t' && c != '\r') || c == 0x7f {
			if knownMethods[method] {
				return "", "", 0, malformed("http", "control byte in request line")
			}
			return "", "", 0, ErrNotHTTP
		}
	}
	if lf < 0 {
		if knownMethods[method] && !plausibleRest(line[i:]) {
			return "", "", 0, malformed("http", "request line %q", truncate(line))
		}
		return "", "", 0, nil
	}
	first := trimCR(line[:lf])
	if !knownMethods[method] && !namesVersion(first[i:]) {
		return "", "", 0, ErrNotHTTP
	}
	// From here on the line is HTTP.
	if start > 0 {
		return "", "", 0, malformed("http", "empty line before the request line")
	}
	j := i + 1
	for j < len(first) && first[j] > ' ' && first[j] < 0x7f {
		j++
	}
	if line[i] != ' ' || j == i+1 || j == len(first) || first[j] != ' ' {
		return "", "", 0, malformed("http", "request line %q", truncate(first))
	}
	target = string(first[i+1 : j])
	version := first[j+1:]
	if len(version) != len("HTTP/1.1") || !versionPrefix(version) {
		return "", "", 0, malformed("http", "request line %q", truncate(first))
	}
	// Only 1.x carries a Host header that can be checked here.
	if string(version) != "HTTP/1.1" && string(version) != "HTTP/1.0" {
		return "", "", 0, malformed("http", "version %s", version)
	}
	return method, target, start + lf + 1, nil
}

// plausibleRest reports whether rest, the unfinished line after a known
// method, could still become " target HTTP/d.d".
func plausibleRest(rest []byte) bool {
	if rest[0] != ' ' {
		return false
	}
	j := 1
	for j < len(rest) && rest[j] > ' ' && rest[j] < 0x7f {
		j++
	}
	switch {
	case j == len(rest):
		return true
	case j == 1 || rest[j] != ' ':
		return false
	}
	return versionPrefix(rest[j+1:])
}

// namesVersion reports whether a request line's text after the method
// holds "HTTP/" and a digit, in any case: a server may take the line for
// HTTP then, however the rest looks.
func namesVersion(rest []byte) bool {
	for k := 0; k+5 < len(rest); k++ {
		if bytes.EqualFold(rest[k:k+5], []byte("HTTP/")) && rest[k+5] >= '0' && rest[k+5] <= '9' {
			return true
		}
	}
	return false
}

// versionPrefix reports whether v could begin "HTTP/d.d\r".
func versionPrefix(v []byte) bool {
	const shape = "HTTP/0.0\r"
	if len(v) > len(shape) {
		return false
	}
	for i, c := range v {
		switch shape[i] {
		case '0':
			if c < '0' || c > '9' {
				return false
			}
		default:
			if c != shape[i] {
				return false
			}
		}
	}
	return true
}

// targetAuthority returns the authority of an absolute-form or
// authority-form (CONNECT) request-target.
func targetAuthority(method, target string) (string, bool) {
	if method == "CONNECT" {
		return target, true
	}
	lower := strings.ToLower(target)
	for _, scheme := range []string{"http://", "https://"} {
		if strings.HasPrefix(lower, scheme) {
			rest := target[len(scheme):]
			if i := strings.IndexAny(rest, "/?#"); i >= 0 {
				rest = rest[:i]
			}
			return rest, true
		}
	}
	return "", false
}

// authorityHost strips the port from host[:port] or [v6][:port] and checks
// what remains is a DNS name or an IP literal. Userinfo, percent-encoding
// and other exotica are refused: a server might decode them differently.
func authorityHost(a string) (string, error) {
	if strings.HasPrefix(a, "[") {
		end := strings.IndexByte(a, ']')
		if end < 0 || !validPort(a[end+1:]) {
			return "", malformed("http", "authority %q", a)
		}
		ip, err := netip.ParseAddr(a[1:end])
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return "", malformed("http", "authority %q", a)
		}
		return ip.String(), nil
	}
	host := a
	if i := strings.IndexByte(a, ':'); i >= 0 {
		host = a[:i]
		if !validPort(a[i:]) {
			return "", malformed("http", "authority %q", a)
		}
	}
	if !validName(host) {
		return "", malformed("http", "host %q", host)
	}
	return strings.ToLower(host), nil
}

// validPort accepts "" or ":" followed by at most five digits (RFC 3986
// allows an empty port).
func validPort(p string) bool {
	if p == "" {
		return true
	}
	if p[0] != ':' || len(p) > 6 {
		return false
	}
	for _, c := range []byte(p[1:]) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func trimCR(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\r' {
		return b[:len(b)-1]
	}
	return b
}

func allTchar(b []byte) bool {
	for _, c := range b {
		if !isTchar(c) {
			return false
		}
	}
	return true
}

// isTchar reports whether c may appear in an HTTP token (RFC 9110 §5.6.2).
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
