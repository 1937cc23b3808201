package secrets

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// A scoped host that echoes what it received can hand a real value back in
// any form it likes to print bytes in. The scrubber knows the forms a
// server plausibly uses — the bytes themselves, percent-encoded (any subset
// of bytes, either case), JSON-escaped, hex, and base64 in both alphabets at
// each of the three byte alignments — and swaps each for the surrogate in
// the same form. Surrogates have the real value's length and keep its
// non-alphanumeric bytes, so every form of the surrogate is exactly as long
// as the same form of the real value: a Content-Length, a WebSocket frame
// length or an offset into the text stays right.

// form is one way a real value can be written.
type form interface {
	// match reports a match beginning at s[i]: n > 0 bytes that hold the
	// value, and whether a longer (or any) match could still follow if s
	// went on.
	match(s string, i int) (n int, more bool)
	// write appends the surrogate's rendering of the n matched bytes.
	write(b []byte, s string, i, n int) []byte
	// starts lists the bytes a match can begin with.
	starts() []byte
	// reach bounds how far match looks: with at least reach bytes of s
	// from i on, its answer is final (more is false).
	reach() int
}

// scrubber applies every form of every secret in one left-to-right pass.
type scrubber struct {
	forms []form
	// cands lists, per byte, the forms a match may begin with there, and
	// leads the base64 forms whose core may begin there, a character
	// after their match begins; text that cannot start a match costs two
	// table look-ups.
	cands, leads [256][]int
	// leadForms are all forms with a lead character, any of which the
	// last byte of unfinished text may be.
	leadForms []int
	// hold is how many bytes at the end of unfinished text must wait
	// for what follows: one less than the longest reach of any form, so
	// that a match beginning before them is decided with all the text
	// it could span.
	hold int
}

// gap reports whether c can be in no form of any value: checkValue
// refuses values with control characters or spaces, and no encoding the
// scrubber knows writes one. A match never spans a gap.
func gap(c byte) bool { return c <= ' ' || c == 0x7f }

func newScrubber(entries []*entry) *scrubber {
	sc := &scrubber{}
	for _, e := range entries {
		sc.forms = append(sc.forms, &escaped{real: e.real, sur: e.surrogate})
		sc.forms = append(sc.forms, &hexForm{real: hex.EncodeToString([]byte(e.real)), sur: hex.EncodeToString([]byte(e.surrogate))})
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			for a := range 3 {
				sc.forms = append(sc.forms, newB64Form(enc, a, e.real, e.surrogate))
			}
		}
	}
	for i, f := range sc.forms {
		sc.hold = max(sc.hold, f.reach()-1)
		seen := [256]bool{}
		for _, c := range f.starts() {
			if !seen[c] {
				seen[c] = true
				sc.cands[c] = append(sc.cands[c], i)
			}
		}
		if b, ok := f.(*b64Form); ok && b.lead != nil {
			sc.leads[b.core[0]] = append(sc.leads[b.core[0]], i)
			sc.leadForms = append(sc.leadForms, i)
		}
	}
	return sc
}

// scrub appends s with every real value replaced to dst and returns how
// many bytes of s it consumed; the output is exactly that long. A match
// that begins in s[:settled] is decided there: the caller vouches that
// none can run past the end of s (hold bytes or a gap come after it).
// From settled on, it stops before the first place where a match could
// continue past the end of s, and the rest must be offered again with
// what follows. settled == len(s) scrubs s to its end.
func (sc *scrubber) scrub(dst []byte, s string, settled int) ([]byte, int) {
	if sc == nil || len(sc.forms) == 0 {
		return append(dst, s...), len(s)
	}
	pos := 0
	for i := 0; i < len(s); {
		best, bf, more := 0, -1, false
		try := func(forms []int) {
			for _, fi := range forms {
				n, m := sc.forms[fi].match(s, i)
				more = more || m
				// The first secret (by name) wins a tie: two secrets
				// sharing a value must still map to one surrogate.
				if n > best || n == best && n > 0 && fi < bf {
					best, bf = n, fi
				}
			}
		}
		try(sc.cands[s[i]])
		if i+1 < len(s) {
			try(sc.leads[s[i+1]])
		} else if i >= settled {
			try(sc.leadForms)
		}
		if more && i >= settled {
			return append(dst, s[pos:i]...), i
		}
		if best == 0 {
			i++
			continue
		}
		dst = append(dst, s[pos:i]...)
		dst = sc.forms[bf].write(dst, s, i, best)
		i += best
		pos = i
	}
	return append(dst, s[pos:]...), len(s)
}

func (sc *scrubber) replace(s string) string {
	out, _ := sc.scrub(nil, s, len(s))
	return string(out)
}

// escaped matches the value with each byte written as itself, as %XX
// (URL encoding of any subset of bytes, in either case) or in a JSON
// string escape (\uXXXX for a whole rune, \" \\ \/).
type escaped struct{ real, sur string }

func (f *escaped) starts() []byte { return []byte{f.real[0], '%', '\\'} }

// reach: a value byte is written in at most 6 bytes (\u00XX), and the
// unit read for the last one may look 12 bytes ahead (a \uXXXX\uXXXX
// surrogate pair).
func (f *escaped) reach() int { return 6*(len(f.real)-1) + 12 }

func (f *escaped) match(s string, i int) (int, bool) {
	p, more := i, false
	for j := 0; j < len(f.real); {
		if p >= len(s) {
			return 0, true
		}
		n, k, short := f.unit(s[p:], j)
		more = more || short
		if n == 0 {
			return 0, more
		}
		p, j = p+n, j+k
	}
	return p - i, more
}

// unit reads one written unit at the start of s that stands for bytes of
// the value from j on: n bytes of text for k bytes of value. short means
// s ends inside an escape that could still match, so with more text the
// reading could differ.
func (f *escaped) unit(s string, j int) (n, k int, short bool) {
	switch s[0] {
	case '%':
		if len(s) < 3 {
			short = allHex(s[1:])
		} else if c, ok := hexByte(s[1], s[2]); ok && c == f.real[j] {
			return 3, 1, false
		}
	case '\\':
		if len(s) < 2 {
			short = true
		} else if s[1] == 'u' {
			r, n, sh := jsonRune(s)
			short = sh
			if n > 0 {
				var buf [utf8.UTFMax]byte
				enc := buf[:utf8.EncodeRune(buf[:], r)]
				if strings.HasPrefix(f.real[j:], string(enc)) {
					return n, len(enc), false
				}
			}
		} else if (s[1] == '"' || s[1] == '\\' || s[1] == '/') && f.real[j] == s[1] {
			return 2, 1, false
		}
	}
	if s[0] == f.real[j] {
		return 1, 1, short
	}
	return 0, 0, short
}

func (f *escaped) write(b []byte, s string, i, n int) []byte {
	s = s[:i+n]
	pctUp, jsonUp := escapeCase(s[i:])
	for p, j := i, 0; p < len(s); {
		m, k, _ := f.unit(s[p:], j)
		switch {
		case f.sur[j:j+k] == f.real[j:j+k]:
			// Separators and non-ASCII bytes are the same in the
			// surrogate; the text is kept as written.
			b = append(b, s[p:p+m]...)
		case m == 1:
			b = append(b, f.sur[j])
		case s[p] == '%':
			b = appendHex(append(b, '%'), f.sur[j], pctUp)
		default: // \u00XX of an ASCII letter or digit
			b = appendHex(append(b, `\u00`...), f.sur[j], jsonUp)
		}
		p, j = p+m, j+k
	}
	return b
}

// escapeCase tells from the hex letters already in the percent and \u
// escapes of s which case new escapes take. Without any to go by,
// percent-encoding is upper case (RFC 3986 section 2.1) and JSON lower
// case (what encoders of JSON write).
func escapeCase(s string) (pctUp, jsonUp bool) {
	pctUp = true
	pctSeen, jsonSeen := false, false
	for p := 0; p < len(s); p++ {
		var digits string
		switch {
		case s[p] == '%' && p+3 <= len(s):
			digits = s[p+1 : p+3]
		case s[p] == '\\' && p+6 <= len(s) && s[p+1] == 'u':
			digits = s[p+2 : p+6]
		default:
			continue
		}
		for _, c := range []byte(digits) {
			if c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' {
				up := c <= 'F'
				if s[p] == '%' && !pctSeen {
					pctUp, pctSeen = up, true
				} else if s[p] != '%' && !jsonSeen {
					jsonUp, jsonSeen = up, true
				}
			}
		}
	}
	return pctUp, jsonUp
}

// jsonRune decodes \uXXXX, or a \uXXXX\uXXXX surrogate pair, at the start
// of s; n == 0 means it is not one.
func jsonRune(s string) (r rune, n int, short bool) {
	first, ok, short := u4(s)
	if !ok {
		return 0, 0, short
	}
	if first < 0xD800 || first > 0xDFFF {
		return first, 6, false
	}
	if first > 0xDBFF {
		return 0, 0, false
	}
	second, ok, short := u4(s[6:])
	if !ok || second < 0xDC00 || second > 0xDFFF {
		return 0, 0, short
	}
	return 0x10000 + (first-0xD800)<<10 + (second - 0xDC00), 12, false
}

// u4 reads \uXXXX at the start of s.
func u4(s string) (rune, bool, bool) {
	if len(s) < 6 {
		return 0, false, strings.HasPrefix(`\u`, s[:min(len(s), 2)]) && allHex(s[min(len(s), 2):])
	}
	if s[0] != '\\' || s[1] != 'u' || !allHex(s[2:6]) {
		return 0, false, false
	}
	hi, _ := hexByte(s[2], s[3])
	lo, _ := hexByte(s[4], s[5])
	return rune(hi)<<8 | rune(lo), true, false
}

// hexForm matches the value as hex digits, in either case.
type hexForm struct{ real, sur string } // lower case

func (f *hexForm) starts() []byte {
	return []byte{f.real[0], upper(f.real[0])}
}

func (f *hexForm) reach() int { return len(f.real) }

func (f *hexForm) match(s string, i int) (int, bool) {
	rest := s[i:]
	if len(rest) < len(f.real) {
		return 0, strings.EqualFold(rest, f.real[:len(rest)])
	}
	if strings.EqualFold(rest[:len(f.real)], f.real) {
		return len(f.real), false
	}
	return 0, false
}

func (f *hexForm) write(b []byte, s string, i, n int) []byte {
	if hasUpper(s[i : i+n]) {
		return append(b, strings.ToUpper(f.sur)...)
	}
	return append(b, f.sur...)
}

// b64Form matches the value base64-encoded starting a bytes into a 3-byte
// group. core is the run of characters made of the value's bits alone;
// the character before it (lead) and after it (trail) share bits with
// the neighbouring bytes, so they are matched and rewritten only in the
// bits that belong to the value.
type b64Form struct {
	enc         *base64.Encoding
	alphabet    string
	dec         [256]byte // 0xFF: not in the alphabet
	core, repl  string
	lead, trail *edge
}

// edge is a straddling character: mask selects the value's bits in its
// 6-bit number, real and sur are those bits for each value.
type edge struct{ mask, real, sur byte }

const (
	stdAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	urlAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
)

func newB64Form(enc *base64.Encoding, a int, real, sur string) *b64Form {
	f := &b64Form{enc: enc, alphabet: stdAlphabet}
	if enc == base64.URLEncoding {
		f.alphabet = urlAlphabet
	}
	for i := range f.dec {
		f.dec[i] = 0xFF
	}
	for i := range len(f.alphabet) {
		f.dec[f.alphabet[i]] = byte(i)
	}
	// The value sits after a zero bytes; zero padding bits leave the
	// value's own bits readable in every character.
	encode := func(v string) string {
		return enc.WithPadding(base64.NoPadding).EncodeToString(append(make([]byte, a), v...))
	}
	er, es := encode(real), encode(sur)
	startBit, endBit := 8*a, 8*(a+len(real))
	first, last := (startBit+5)/6, endBit/6 // core is [first, last)
	f.core, f.repl = er[first:last], es[first:last]
	if startBit%6 != 0 {
		bits := 6*first - startBit // the value's low bits in the lead
		m := byte(1)<<bits - 1
		f.lead = &edge{mask: m, real: f.dec[er[first-1]] & m, sur: f.dec[es[first-1]] & m}
	}
	if endBit%6 != 0 {
		bits := endBit - 6*last // the value's high bits in the trail
		m := (byte(1)<<bits - 1) << (6 - bits)
		f.trail = &edge{mask: m, real: f.dec[er[last]] & m, sur: f.dec[es[last]] & m}
	}
	return f
}

// starts leaves out the lead: the scrubber finds those by the core's
// first character one byte on.
func (f *b64Form) starts() []byte { return []byte{f.core[0]} }

// reach covers the lead, the core and the trail.
func (f *b64Form) reach() int { return len(f.core) + 2 }

func (f *b64Form) match(s string, i int) (int, bool) {
	n, more := 0, false
	if s[i] == f.core[0] {
		n, more = f.coreAt(s, i)
	}
	if f.fits(s[i], f.lead) {
		if i+1 == len(s) {
			return n, true
		}
		// match prefers the lead, and write relies on that.
		if s[i+1] != f.core[0] {
			return n, more
		}
		if ln, lmore := f.coreAt(s, i+1); ln > 0 || lmore {
			if ln > 0 {
				ln++
			}
			return ln, lmore
		}
	}
	return n, more
}

// coreAt matches the core at s[i] and the trail after it.
func (f *b64Form) coreAt(s string, i int) (int, bool) {
	rest := s[i:]
	if len(rest) < len(f.core) {
		return 0, strings.HasPrefix(f.core, rest)
	}
	if !strings.HasPrefix(rest, f.core) {
		return 0, false
	}
	n := len(f.core)
	if f.trail == nil {
		return n, false
	}
	if len(rest) == n {
		return n, true
	}
	if f.fits(rest[n], f.trail) {
		n++
	}
	return n, false
}

// fits reports whether c carries the real value's bits of edge e.
func (f *b64Form) fits(c byte, e *edge) bool {
	return e != nil && f.dec[c] != 0xFF && f.dec[c]&e.mask == e.real
}

func (f *b64Form) write(b []byte, s string, i, n int) []byte {
	if f.fits(s[i], f.lead) && strings.HasPrefix(s[i+1:], f.core) {
		b = append(b, f.swap(s[i], f.lead))
		i, n = i+1, n-1
	}
	b = append(b, f.repl...)
	if n > len(f.core) {
		b = append(b, f.swap(s[i+len(f.core)], f.trail))
	}
	return b
}

func (f *b64Form) swap(c byte, e *edge) byte {
	return f.alphabet[f.dec[c]&^e.mask|e.sur]
}

func hexByte(a, b byte) (byte, bool) {
	x, ok1 := unhex(a)
	y, ok2 := unhex(b)
	return x<<4 | y, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func allHex(s string) bool {
	for i := range len(s) {
		if _, ok := unhex(s[i]); !ok {
			return false
		}
	}
	return true
}

func hasUpper(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return 'A' <= r && r <= 'Z' })
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - 'a' + 'A'
	}
	return c
}

func appendHex(b []byte, c byte, up bool) []byte {
	digits := "0123456789abcdef"
	if up {
		digits = "0123456789ABCDEF"
	}
	return append(b, digits[c>>4], digits[c&15])
}
