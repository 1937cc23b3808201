package secrets

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/corral-sandbox/corral/internal/policy"
)

// encodings are the ways an echoing server writes what it received, each
// applied to a whole string so that the value sits at whatever alignment
// and among whatever neighbours the string gives it.
var encodings = []struct {
	name string
	enc  func([]byte) string
	// bytes: the encoding takes any bytes around the value; the others
	// are text encodings whose neighbours are text.
	bytes bool
}{
	{"raw", func(b []byte) string { return string(b) }, false},
	{"hex", hex.EncodeToString, true},
	{"HEX", func(b []byte) string { return strings.ToUpper(hex.EncodeToString(b)) }, true},
	{"base64", base64.StdEncoding.EncodeToString, true},
	{"base64-raw", base64.RawStdEncoding.EncodeToString, true},
	{"base64url", base64.URLEncoding.EncodeToString, true},
	{"base64url-raw", base64.RawURLEncoding.EncodeToString, true},
	{"percent-all", func(b []byte) string { return percentAll(b, "%%%02X") }, false},
	{"percent-all-lower", func(b []byte) string { return percentAll(b, "%%%02x") }, false},
	{"query-escape", func(b []byte) string { return url.QueryEscape(string(b)) }, false},
	{"path-escape", func(b []byte) string { return url.PathEscape(string(b)) }, false},
	{"json", jsonString, false},
	{"json-u-all", func(b []byte) string { return jsonAllU(b, "\\u%04x") }, false},
	{"json-U-all", func(b []byte) string { return jsonAllU(b, "\\u%04X") }, false},
	{"json-slash", func(b []byte) string { return strings.ReplaceAll(jsonString(b), "/", `\/`) }, false},
}

func percentAll(b []byte, f string) string {
	var s strings.Builder
	for _, c := range b {
		fmt.Fprintf(&s, f, c)
	}
	return s.String()
}

func jsonString(b []byte) string {
	js, _ := json.Marshal(string(b))
	return string(js[1 : len(js)-1])
}

func jsonAllU(b []byte, f string) string {
	var s strings.Builder
	for _, r := range string(b) {
		if r > 0xFFFF {
			r -= 0x10000
			fmt.Fprintf(&s, f+f, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
			continue
		}
		fmt.Fprintf(&s, f, r)
	}
	return s.String()
}

// testValues cover a plain token, one with separators that URL and JSON
// encoders escape (and base64 characters + and /), and one with
// multi-byte runes.
var testValues = []string{
	"ghp_0123456789abcdefghijklmnopqrstuvwxyz",
	"sk-ant-api03-Ab/cd+ef.gh~ij<kl>&mn_op=qr:st@uv%wx\\yz\"09",
	"tok-é-ü-日本-😀-abcdefgh12345678",
}

func loadValue(t testing.TB, real string) (*Set, string) {
	t.Helper()
	s, err := loadSpecs(map[string]policy.Secret{"TOKEN": {FromEnv: "REAL", Hosts: []string{"api.example.com"}}},
		func(string) string { return real })
	if err != nil {
		t.Fatal(err)
	}
	return s, strings.TrimPrefix(s.Env()[0], "TOKEN=")
}

// scrubChunked runs body through ScrubBody in reads of the given sizes.
func scrubChunked(t testing.TB, s *Set, body string, sizes []int) string {
	t.Helper()
	got, err := io.ReadAll(s.ScrubBody(io.NopCloser(&chunkReader{data: body, sizes: sizes})))
	if err != nil {
		t.Fatal(err)
	}
	return string(got)
}

// chunkReader returns data in reads of the given sizes, cycling.
type chunkReader struct {
	data  string
	sizes []int
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.data == "" {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = max(1, c.sizes[c.i%len(c.sizes)])
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// Every encoding of "prefix + real + suffix" must come out as the same
// encoding of "prefix + surrogate + suffix", whatever the alignment and
// however the body is split into reads: the workload sees the surrogate
// it knows, in the form the server chose, and nothing of the real value.
func TestScrubEncodings(t *testing.T) {
	for _, real := range testValues {
		s, sur := loadValue(t, real)
		for _, e := range encodings {
			for _, pre := range []string{"", "x:", "ab:", "user:", "\x00\xff"} {
				for _, post := range []string{"", "!", "@h", "xyz"} {
					if !e.bytes && strings.IndexFunc(pre+post, func(r rune) bool { return r == 0 || r == utf8.RuneError }) >= 0 {
						continue
					}
					in := "start " + e.enc([]byte(pre+real+post)) + " end"
					want := "start " + e.enc([]byte(pre+sur+post)) + " end"
					for _, sizes := range [][]int{nil, {1}, {2, 3}, {7}} {
						if got := scrubChunked(t, s, in, sizes); got != want {
							t.Errorf("%s of %q+value+%q in reads of %v:\n got %q\nwant %q", e.name, pre, post, sizes, got, want)
						}
					}
				}
			}
		}
	}
}

// A Basic credential echoed back: "x:TOKEN" puts the token at the second
// byte of a base64 group, the case the attack used.
func TestScrubBasicEcho(t *testing.T) {
	real := testValues[0]
	s, sur := loadValue(t, real)
	for _, user := range []string{"", "x", "xy"} {
		echo := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+real))
		got := s.v().scrub.replace(echo)
		dec, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(got, "Basic "))
		if err != nil {
			t.Fatalf("user %q: the scrubbed credential is not base64: %v", user, err)
		}
		if string(dec) != user+":"+sur {
			t.Errorf("user %q: decoded %q, want %q", user, dec, user+":"+sur)
		}
	}
}

// Text without secrets, including near misses, passes unchanged.
func TestScrubLeavesOtherText(t *testing.T) {
	real := testValues[0]
	s, _ := loadValue(t, real)
	for _, in := range []string{
		"", "plain text", "%41%42 \\u0041 \\\\ %zz %", "ghp_", real[:len(real)-1],
		hex.EncodeToString([]byte(real[:len(real)-1])) + "00",
		base64.StdEncoding.EncodeToString([]byte("not the value at all, just base64")),
	} {
		if got := scrubChunked(t, s, in, []int{3}); got != in {
			t.Errorf("%q became %q", in, got)
		}
	}
}

// FuzzScrub splits bodies holding encodings of a real value into random
// reads and checks that each comes out as the surrogate's encoding and
// that nothing else changes. The real value is random per run, so fuzzed
// text cannot contain it by construction except where the test puts it.
func FuzzScrub(f *testing.F) {
	f.Add([]byte("hello "), []byte("x:"), []byte(""), uint8(3), []byte{1, 2, 3})
	f.Add([]byte("{\"auth\": \""), []byte("ab"), []byte("!"), uint8(11), []byte{5})
	f.Add([]byte(""), []byte{0xff}, []byte{0, 1}, uint8(1), []byte{})
	f.Add([]byte("%\\u00"), []byte("user:"), []byte("@"), uint8(7), []byte{2, 9, 1})
	var b [24]byte
	rand.Read(b[:])
	real := "ghp_" + base64.RawURLEncoding.EncodeToString(b[:]) + "/.~+"
	s, sur := loadValue(f, real)
	f.Fuzz(func(t *testing.T, fill, pre, post []byte, kind uint8, chunks []byte) {
		sizes := make([]int, len(chunks))
		for i, c := range chunks {
			sizes[i] = int(c%64) + 1
		}
		// Arbitrary bytes alone are left as they are.
		if got := scrubChunked(t, s, string(fill), sizes); got != string(fill) {
			t.Fatalf("text without the value changed: %q -> %q", fill, got)
		}
		e := encodings[int(kind)%len(encodings)]
		pre, post = pre[:min(len(pre), 4)], post[:min(len(post), 4)]
		if !e.bytes {
			pre, post = text(pre), text(post)
		}
		fl := text(fill)
		in := string(fl) + e.enc(append(append(append([]byte{}, pre...), real...), post...)) + string(fl)
		want := string(fl) + e.enc(append(append(append([]byte{}, pre...), sur...), post...)) + string(fl)
		got := scrubChunked(t, s, in, sizes)
		if got != want {
			t.Fatalf("%s: got %q, want %q", e.name, got, want)
		}
		for _, form := range leaks(real) {
			if strings.Contains(got, form) {
				t.Fatalf("%s: output %q holds %q", e.name, got, form)
			}
		}
	})
}

// text maps bytes onto characters that are neither escapes nor likely
// neighbours that change how the value is written.
func text(b []byte) []byte {
	const alphabet = " \n\t,:;{}[]()<>!?*#=&'\"xyzXYZ.-"
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = alphabet[int(c)%len(alphabet)]
	}
	return out
}

// leaks are literal substrings that would carry the real value: raw, hex
// and the base64 core at each alignment.
func leaks(real string) []string {
	out := []string{real, hex.EncodeToString([]byte(real)), strings.ToUpper(hex.EncodeToString([]byte(real)))}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for a := range 3 {
			out = append(out, newB64Form(enc, a, real, real).core)
		}
	}
	return out
}

// The base64 core of each alignment is exactly the characters that do
// not depend on the bytes around the value.
func TestBase64CoreIsValueOnly(t *testing.T) {
	for _, real := range testValues {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			for a := range 3 {
				f := newB64Form(enc, a, real, real)
				// Filled to whole groups, so no padding is common to both.
				tail := 3 + (3-(a+len(real))%3)%3
				lo := enc.EncodeToString(slices.Concat(bytes.Repeat([]byte{0}, a), []byte(real), bytes.Repeat([]byte{0}, tail)))
				hi := enc.EncodeToString(slices.Concat(bytes.Repeat([]byte{0xff}, a), []byte(real), bytes.Repeat([]byte{0xff}, tail)))
				var common strings.Builder
				for i := range len(lo) {
					if lo[i] == hi[i] {
						common.WriteByte(lo[i])
					}
				}
				if common.String() != f.core {
					t.Errorf("alignment %d: core %q, value-only characters %q", a, f.core, common.String())
				}
			}
		}
	}
}

// BenchmarkScrubBody is the scrubber's throughput on a JSON-like body
// without secrets, the common case for a scoped host's responses.
func BenchmarkScrubBody(b *testing.B) {
	s, _ := loadValue(b, testValues[0])
	var body strings.Builder
	for body.Len() < 1<<20 {
		fmt.Fprintf(&body, `{"id": %d, "name": "repo-%x", "url": "https://api.github.com/repos/o/r%d", "sha": "%x"},`+"\n",
			body.Len(), body.Len()*7919, body.Len(), body.Len()*104729)
	}
	text := body.String()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		io.Copy(io.Discard, s.ScrubBody(io.NopCloser(strings.NewReader(text))))
	}
}

// A header name made from the real value is renamed or dropped: its case
// was changed by canonicalisation, so the value cannot be swapped in it.
func TestScrubHeaderNames(t *testing.T) {
	real := testValues[0]
	s, sur := loadValue(t, real)
	h := http.Header{
		"X-" + real:                                 {"a"},
		http.CanonicalHeaderKey("x-" + real):        {"b"},
		"X-Hex-" + hex.EncodeToString([]byte(real)): {"c"},
		"X-Fine": {real},
	}
	s.ScrubHeader(h)
	for k, v := range h {
		if strings.Contains(strings.ToLower(k), strings.ToLower(real)) || strings.Contains(k, hex.EncodeToString([]byte(real))) {
			t.Errorf("header %q: %q kept its name", k, v)
		}
	}
	// Values are looked up by the exact keys, which are not canonical.
	if h.Get("X-Fine") != sur || strings.Join(h["X-"+sur], "") != "a" || strings.Join(h["X-Hex-"+hex.EncodeToString([]byte(sur))], "") != "c" || len(h) != 3 {
		t.Errorf("headers after scrubbing: %v", h)
	}
}
