// Package sniff reads the name a client's first bytes announce — a TLS
// ClientHello's SNI or an HTTP/1 Host header — so a connection to one
// allowed host cannot be steered to another (domain fronting). Parsers are
// strict and bounded: anything that claims to be TLS or HTTP but does not
// parse is reported as malformed, for the caller to refuse.
package sniff

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Kinds of opening, as used in egress.Request.SniffedKind.
const (
	KindTLS  = "tls_sni"
	KindHTTP = "http_host"
)

// Defaults for Peek's limits.
const (
	// DefaultTimeout is how long a client may stay quiet before its
	// protocol is taken to be one where the server speaks first (SMTP,
	// MySQL, FTP); client-first protocols send at once.
	DefaultTimeout = 300 * time.Millisecond
	// DefaultMax holds any real ClientHello or request head.
	DefaultMax = 32 << 10
	// MaxDuration bounds a whole Peek, so a client dribbling one byte per
	// timeout cannot hold it open.
	MaxDuration = 10 * time.Second
)

// Unparsable stands in, as egress.Request.Sniffed, for an opening that
// claims TLS or HTTP but cannot be read. It is no hostname, so the gate
// refuses it for every named destination.
const Unparsable = "(unparsable)"

var (
	ErrNotTLS    = errors.New("not a TLS handshake")
	ErrNotHTTP   = errors.New("not an HTTP/1 request")
	ErrMalformed = errors.New("malformed")
)

// Classify runs both parsers over b. complete is true once more bytes
// cannot change the answer; kind "" with complete true means raw TCP.
// While incomplete, kind names the protocol b may still turn out to be.
func Classify(b []byte) (kind, name string, complete bool, err error) {
	sni, done, err := ClientHelloSNI(b)
	if !errors.Is(err, ErrNotTLS) {
		return KindTLS, sni, done, err
	}
	host, done, err := HTTPHost(b)
	if !errors.Is(err, ErrNotHTTP) {
		return KindHTTP, host, done, err
	}
	return "", "", true, nil
}

// Peek reads from conn until its opening is classified, the client stays
// quiet for timeout, or limit bytes have arrived, and returns what was read
// so the caller can replay it upstream. A client that sends nothing, or
// ends its side before completing a first line or ClientHello, is raw
// (kind ""). Bytes that began TLS or HTTP but stop short or overflow limit
// wrap ErrMalformed, with kind set; other errors are the connection's. The
// read deadline is cleared on return.
func Peek(conn net.Conn, limit int, timeout time.Duration) (kind, name string, buffered []byte, err error) {
	return Continue(conn, nil, limit, timeout)
}

// Continue is Peek for a connection whose first bytes were already read
// into buffered.
func Continue(conn net.Conn, buffered []byte, limit int, timeout time.Duration) (kind, name string, _ []byte, err error) {
	if limit <= 0 {
		limit = DefaultMax
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	defer conn.SetReadDeadline(time.Time{})
	hard := time.Now().Add(MaxDuration)
	buf := buffered
	for {
		kind, name, complete, err := Classify(buf)
		if complete || err != nil {
			return kind, name, buf, err
		}
		if len(buf) >= limit {
			return kind, "", buf, fmt.Errorf("%w %s: opening exceeds %d bytes", ErrMalformed, kind, limit)
		}
		if cap(buf)-len(buf) == 0 {
			grown := make([]byte, len(buf), min(limit, max(2*cap(buf), 2048)))
			copy(grown, buf)
			buf = grown
		}
		deadline := time.Now().Add(timeout)
		if deadline.After(hard) {
			deadline = hard
		}
		if err := conn.SetReadDeadline(deadline); err != nil {
			return "", "", buf, err
		}
		n, rerr := conn.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		if rerr == nil {
			continue
		}
		if !errors.Is(rerr, os.ErrDeadlineExceeded) && !errors.Is(rerr, io.EOF) {
			return "", "", buf, rerr
		}
		if len(buf) == 0 {
			return "", "", buf, nil
		}
		kind, name, complete, err = Classify(buf)
		if complete || err != nil {
			return kind, name, buf, err
		}
		if errors.Is(rerr, io.EOF) && (kind == KindTLS || bytes.IndexByte(buf, '\n') < 0) {
			// Nothing more will come, and no server can act on a partial
			// ClientHello or a request with no complete first line, so
			// these bytes can announce no name.
			return "", "", buf, nil
		}
		return kind, "", buf, fmt.Errorf("%w %s: client stopped after %d bytes of its opening", ErrMalformed, kind, len(buf))
	}
}

// Claim is the value for egress.Request.Sniffed given Peek's results: the
// announced name, Unparsable for a malformed opening, "" for raw TCP or a
// nameless one.
func Claim(kind, name string, err error) string {
	switch {
	case kind == "":
		return ""
	case err != nil:
		return Unparsable
	}
	return name
}

// SameHost compares names the way the gate does: case-insensitive,
// ignoring one trailing dot.
func SameHost(a, b string) bool {
	return strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, "."))
}

// Hostname normalises a destination name a client handed to a proxy: lower
// case, no trailing dot, DNS characters only.
func Hostname(s string) (string, error) {
	if !validName(s) {
		return "", fmt.Errorf("invalid host name %q", truncate([]byte(s)))
	}
	return strings.ToLower(strings.TrimSuffix(s, ".")), nil
}

// validName accepts DNS names (letters, digits, '-', '_', dot-separated
// labels of 1–63 bytes, one optional trailing dot), which covers dotted IPv4
// literals too.
func validName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range []byte(label) {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
			if !ok {
				return false
			}
		}
	}
	return true
}
