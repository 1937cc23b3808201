package sniff

import (
	"fmt"
	"strings"
)

const (
	recordHeaderLen     = 5
	recordTypeHandshake = 0x16
	// maxRecordLen is TLSPlaintext's limit; a longer record is not TLS a
	// server would accept, so it is refused rather than waited for.
	maxRecordLen = 1 << 14
	// maxHelloLen bounds reassembly across records. Real ClientHellos,
	// post-quantum key shares included, stay far below it.
	maxHelloLen          = 1 << 16
	handshakeClientHello = 0x01
	extServerName        = 0x0000
	nameTypeHostName     = 0x00
)

// ClientHelloSNI reads the server_name of the TLS ClientHello at the start
// of b. complete is false while more bytes are needed. A ClientHello
// without server_name is complete with an empty name. err is ErrNotTLS when
// b does not start a TLS handshake record and wraps ErrMalformed when it
// does but breaks the protocol; a server may be laxer than this parser, so
// callers treat a malformed hello as hostile, not as "no name".
func ClientHelloSNI(b []byte) (sni string, complete bool, err error) {
	if len(b) == 0 {
		return "", false, nil
	}
	if b[0] != recordTypeHandshake || (len(b) > 1 && b[1] != 3) {
		return "", false, ErrNotTLS
	}
	msg, complete, err := clientHelloBody(b)
	if err != nil || !complete {
		return "", false, err
	}
	sni, err = parseClientHello(msg)
	if err != nil {
		return "", false, err
	}
	return sni, true, nil
}

// clientHelloBody reassembles the first handshake message, which a client
// may legally split over several records (and an evasive one would).
func clientHelloBody(b []byte) ([]byte, bool, error) {
	var hs []byte
	for {
		if len(b) < recordHeaderLen {
			return nil, false, nil
		}
		if b[0] != recordTypeHandshake {
			return nil, false, malformed("tls", "record type %d before the ClientHello ended", b[0])
		}
		if b[1] != 3 {
			return nil, false, malformed("tls", "record version %d.%d", b[1], b[2])
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > maxRecordLen {
			return nil, false, malformed("tls", "record length %d", n)
		}
		if len(b) < recordHeaderLen+n {
			return nil, false, nil
		}
		hs = append(hs, b[recordHeaderLen:recordHeaderLen+n]...)
		b = b[recordHeaderLen+n:]
		if len(hs) < 4 {
			continue
		}
		if hs[0] != handshakeClientHello {
			return nil, false, malformed("tls", "handshake type %d is not ClientHello", hs[0])
		}
		m := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
		if m > maxHelloLen {
			return nil, false, malformed("tls", "ClientHello length %d", m)
		}
		if len(hs) >= 4+m {
			return hs[4 : 4+m], true, nil
		}
	}
}

func parseClientHello(msg []byte) (string, error) {
	r := cursor{b: msg}
	r.take(2)  // legacy_version
	r.take(32) // random
	sid := r.vec8()
	suites := r.vec16()
	comp := r.vec8()
	switch {
	case r.short:
		return "", malformed("tls", "ClientHello truncated")
	case len(sid) > 32:
		return "", malformed("tls", "session id of %d bytes", len(sid))
	case len(suites) < 2 || len(suites)%2 != 0:
		return "", malformed("tls", "cipher suites of %d bytes", len(suites))
	case len(comp) < 1:
		return "", malformed("tls", "no compression methods")
	}
	if len(r.b) == 0 {
		return "", nil // no extensions at all: legal, and nameless
	}
	exts := r.vec16()
	if r.short || len(r.b) != 0 {
		return "", malformed("tls", "extensions block does not fill the ClientHello")
	}
	seen := make(map[int]bool)
	var sni string
	for e := (cursor{b: exts}); len(e.b) > 0; {
		typ := e.u16()
		data := e.vec16()
		if e.short {
			return "", malformed("tls", "extension truncated")
		}
		// RFC 8446 §4.2 forbids repeats; two server_names would let the
		// server and this parser pick different ones.
		if seen[typ] {
			return "", malformed("tls", "extension %d repeated", typ)
		}
		seen[typ] = true
		if typ == extServerName {
			name, err := parseServerName(data)
			if err != nil {
				return "", err
			}
			sni = name
		}
	}
	return sni, nil
}

func parseServerName(data []byte) (string, error) {
	r := cursor{b: data}
	list := r.vec16()
	if r.short || len(r.b) != 0 || len(list) == 0 {
		return "", malformed("tls", "server_name list does not fill its extension")
	}
	var host string
	for l := (cursor{b: list}); len(l.b) > 0; {
		typ := l.u8()
		name := l.vec16()
		if l.short {
			return "", malformed("tls", "server_name entry truncated")
		}
		if typ != nameTypeHostName {
			continue
		}
		if host != "" {
			return "", malformed("tls", "more than one host_name")
		}
		if !validName(string(name)) {
			return "", malformed("tls", "host_name %q is not a DNS name", name)
		}
		host = strings.ToLower(string(name))
	}
	return host, nil
}

// cursor reads big-endian TLS fields; a read past the end sets short and
// yields zero values, so a parse checks once per block instead of per field.
type cursor struct {
	b     []byte
	short bool
}

func (c *cursor) take(n int) []byte {
	if n > len(c.b) {
		c.short = true
		c.b = nil
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

func (c *cursor) u8() int {
	v := c.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (c *cursor) u16() int {
	v := c.take(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

func (c *cursor) vec8() []byte  { return c.take(c.u8()) }
func (c *cursor) vec16() []byte { return c.take(c.u16()) }

func malformed(proto, format string, args ...any) error {
	return fmt.Errorf("%w %s: %s", ErrMalformed, proto, fmt.Sprintf(format, args...))
}
