package secrets

import (
	"io"
	"net/http"
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
