package secrets

import (
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/corral-sandbox/corral/internal/policy"
)

func loadOne(t *testing.T, real string) *Set {
	t.Helper()
	s, err := loadSpecs(map[string]policy.Secret{"GH_TOKEN": {FromEnv: "REAL", Hosts: []string{"api.github.com"}}},
		func(string) string { return real })
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScrubResponse(t *testing.T) {
	const real = "ghp_0123456789abcdefghijklmnopqrstuvwxyz"
	s := loadOne(t, real)
	sur := strings.TrimPrefix(s.Env()[0], "GH_TOKEN=")

	h := http.Header{"X-Echo": {"token " + real}}
	s.ScrubHeader(h)
	if got := h.Get("X-Echo"); got != "token "+sur {
		t.Errorf("header: %q", got)
	}

	body := "before " + real + " middle " + real + " after"
	// One byte at a time: a real value split across reads is still caught.
	r := s.ScrubBody(io.NopCloser(iotest.OneByteReader(strings.NewReader(body))))
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := "before " + sur + " middle " + sur + " after"; string(got) != want {
		t.Errorf("body: %q, want %q", got, want)
	}
}

// A streamed event must not wait for the next one unless its end could be
// the start of a real value.
func TestScrubBodyDoesNotHoldStreams(t *testing.T) {
	s := loadOne(t, "ghp_0123456789abcdefghijklmnopqrstuvwxyz")
	pr, pw := io.Pipe()
	r := s.ScrubBody(pr)
	go pw.Write([]byte("data: first\n\n"))
	buf := make([]byte, 64)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "data: first\n\n" {
		t.Fatalf("first read: %q %v", buf[:n], err)
	}
	go func() {
		pw.Write([]byte("x gh"))
		pw.Write([]byte("p_ tail"))
		pw.Close()
	}()
	rest, _ := io.ReadAll(r)
	if string(rest) != "x ghp_ tail" {
		t.Errorf("rest: %q", rest)
	}
}

// A reload may move a secret's scope; its value and surrogate stay, and
// nothing can add or swap in a value.
func TestRescope(t *testing.T) {
	const real = "ghp_0123456789abcdefghijklmnopqrstuvwxyz"
	s := loadOne(t, real)
	sur := strings.TrimPrefix(s.Env()[0], "GH_TOKEN=")
	scopes, err := compileSpecs(map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "REAL", Hosts: []string{"uploads.github.com"}, Headers: []string{"X-Token"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := s.Rescope(scopes)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"X-Token": {sur}, "Authorization": {"Bearer " + sur}}
	if n := moved.Swap("api.github.com", h); n != 0 {
		t.Errorf("the old scope still swaps (%d)", n)
	}
	if n := moved.Swap("uploads.github.com", h); n != 1 || h.Get("X-Token") != real || h.Get("Authorization") != "Bearer "+sur {
		t.Errorf("new scope: %d swaps, headers %v", n, h)
	}
	if got := moved.Env(); got[0] != "GH_TOKEN="+sur {
		t.Errorf("the surrogate changed: %q", got)
	}
	for name, specs := range map[string]map[string]policy.Secret{
		"added":   {"GH_TOKEN": {FromEnv: "REAL", Hosts: []string{"a.example.com"}}, "NEW": {FromEnv: "X", Hosts: []string{"a.example.com"}}},
		"removed": {},
		"renamed": {"OTHER": {FromEnv: "REAL", Hosts: []string{"a.example.com"}}},
	} {
		scopes, err := compileSpecs(specs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Rescope(scopes); err == nil {
			t.Errorf("%s: Rescope accepted it", name)
		}
	}
}

// scripted is a body that returns one chunk per Read, then end.
type scripted struct {
	chunks []string
	end    error
	n      int
}

func (b *scripted) Read(p []byte) (int, error) {
	if b.n == len(b.chunks) {
		return 0, b.end
	}
	b.n++
	return copy(p, b.chunks[b.n-1]), nil
}

// released reads chunks, then end, through ScrubBody and describes what
// the workload would see: for each Read that returned anything, how many
// chunks had come and how many bytes it returned, then how it ended.
func released(s *Set, chunks []string, end error) string {
	body := &scripted{chunks: chunks, end: end}
	r := s.ScrubBody(io.NopCloser(body))
	var steps strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			fmt.Fprintf(&steps, "after %d: %d bytes; ", body.n, n)
		}
		if err != nil {
			fmt.Fprintf(&steps, "%v", err)
			return steps.String()
		}
	}
}

// twin changes the last byte of text to another of its kind, so that text
// and twin differ only in whether they begin a real value.
func twin(text string) string {
	c := text[len(text)-1]
	switch {
	case c == 'z' || c == 'Z' || c == '9':
		c -= 1
	case '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		c++
	default:
		c = 'q'
	}
	return text[:len(text)-1] + string(c)
}

// A host that reflects text the workload chose must not tell it whether
// that text begins a real value: for every prefix of every form of a
// value, and a twin of it that begins none, the body comes out in the
// same pieces after the same reads, and ends the same way, cleanly or
// not. (Holding back only a tail that could begin a value told the two
// apart, and gave up the value a character at a time.)
func TestScrubBodyReleaseIgnoresValues(t *testing.T) {
	for _, real := range testValues {
		s, _ := loadValue(t, real)
		// About half the hold: the probe ends before the hold begins,
		// across it and inside it.
		filler := strings.Repeat("y", 3*len(real))
		for _, e := range encodings {
			pres := []string{""}
			if e.bytes { // hex, and base64 at each byte alignment
				pres = []string{"", "x:", "ab:"}
			}
			for _, pre := range pres {
				form := e.enc([]byte(pre + real))
				for k := 1; k < len(form); k++ {
					probe := "<" + form[:k]
					for _, chunks := range [][]string{
						{"data: ", probe},
						{"data: " + filler, probe},
						{filler + filler + filler + probe[:len(probe)/2], probe[len(probe)/2:]},
					} {
						other := slices.Clone(chunks)
						other[len(other)-1] = twin(other[len(other)-1])
						for _, end := range []error{io.EOF, io.ErrUnexpectedEOF} {
							got, want := released(s, chunks, end), released(s, other, end)
							if got != want {
								t.Fatalf("%s of %.12q…, %d bytes: chunks %q end %v:\nbeginning the value: %s\nnot beginning it:    %s",
									e.name, real, k, chunks, end, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// The hold-back is a fixed length, cut short by a gap: after each piece,
// all but the last hold bytes of what has come has been passed on, or all
// up to the last whitespace if that is later; at the end, the rest. Real
// values in the text are still all replaced, however it is split.
func TestStreamHoldsFixedTail(t *testing.T) {
	real := testValues[0]
	s, sur := loadValue(t, real)
	hold := s.v().scrub.hold
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var text strings.Builder
		for text.Len() < 3*hold {
			switch rng.IntN(8) {
			case 0:
				text.WriteString(real)
			case 1:
				text.WriteString(base64.StdEncoding.EncodeToString([]byte("x:" + real)))
			case 2:
				if round%2 == 0 {
					text.WriteByte(" \n\t\r"[rng.IntN(4)])
				}
			default:
				text.WriteString(real[:rng.IntN(len(real))])
			}
		}
		in := text.String()
		st := s.Stream()
		var out []byte
		for read := 0; read < len(in); {
			n := min(len(in)-read, 1+rng.IntN(2*hold))
			out = st.Next(out, []byte(in[read:read+n]))
			read += n
			run := min(hold, read)
			if g := strings.LastIndexFunc(in[:read], func(r rune) bool { return r <= ' ' }); g >= 0 {
				run = min(run, read-g-1)
			}
			if len(out) != read-run || st.Held() != run {
				t.Fatalf("round %d, %d bytes in: %d passed on and %d held, want %d and %d", round, read, len(out), st.Held(), read-run, run)
			}
		}
		out = st.End(out)
		want := strings.ReplaceAll(in, real, sur)
		want = strings.ReplaceAll(want, base64.StdEncoding.EncodeToString([]byte("x:"+real)), base64.StdEncoding.EncodeToString([]byte("x:"+sur)))
		if string(out) != want {
			t.Fatalf("round %d: scrubbed\n%q\nwant\n%q", round, out, want)
		}
	}
}

// The hold covers every form: given its reach of text from where a match
// would begin, no form waits for more, even where the text goes on in the
// form's own alphabet, so a match that begins before the last hold bytes
// is decided with all of it at hand.
func TestFormReach(t *testing.T) {
	for _, real := range testValues {
		s, _ := loadValue(t, real)
		sc := s.v().scrub
		// A high surrogate escape whose low half is cut short makes
		// the escaped form look furthest ahead.
		texts := []string{strings.Repeat(jsonAllU([]byte(real[:len(real)-1]), "\\u%04x")+`\ud83d\ude0a`, 2)}
		for _, e := range encodings {
			for _, pre := range []string{"", "x:", "ab:"} {
				texts = append(texts, e.enc([]byte(pre+real+real)))
			}
		}
		for _, f := range sc.forms {
			if f.reach() > sc.hold+1 {
				t.Fatalf("%T reaches %d bytes, past the hold of %d", f, f.reach(), sc.hold)
			}
			for _, text := range texts {
				for i := range 8 {
					for k := i + f.reach(); k <= min(len(text), i+f.reach()+8); k++ {
						if _, more := f.match(text[:k], i); more {
							t.Errorf("%T of %.12q… at %d of %q waits for more text %d bytes on, past its reach of %d", f, real, i, text[:k], k-i, f.reach())
						}
					}
				}
			}
		}
	}
}
