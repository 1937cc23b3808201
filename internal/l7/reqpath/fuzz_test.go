package reqpath

import (
	"net/url"
	"strings"
	"testing"
)

func FuzzNormalize(f *testing.F) {
	for _, seed := range []string{
		"/",
		"/a/../b",
		"//a///b/",
		"/a/%2e%2E/b",
		"/a/.%2e/",
		"/a/%2fb",
		"/a/%5cb",
		"/a\\b",
		"/a/..;/b",
		"/a/%252e%252e/b",
		"/a/%2",
		"/a%00b",
		"/x%20y z",
		"/caf%C3%A9/café",
		"/../../etc/passwd",
		"/a;b/c;d=e/..",
		"/a/..%2F..%2Fb",
		"/100%25done/%2F",
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, raw string, allow bool) {
		p, err := Normalize(raw, allow)
		if err != nil {
			return
		}
		checkPath(t, raw, allow, p)
	})
}

// checkPath asserts the properties every successful Normalize result must
// have; the table tests run it too so a regression shows up without
// fuzzing.
func checkPath(t *testing.T, raw string, allow bool, p Path) {
	t.Helper()
	if !strings.HasPrefix(p.Match, "/") || !strings.HasPrefix(p.Forward, "/") {
		t.Fatalf("Normalize(%q): %+v does not start with /", raw, p)
	}
	for _, s := range []string{p.Match, p.Forward} {
		for _, bad := range []string{"/./", "/../", "//"} {
			if strings.Contains(s, bad) {
				t.Fatalf("Normalize(%q): %+v contains %q", raw, p, bad)
			}
		}
		if strings.HasSuffix(s, "/.") || strings.HasSuffix(s, "/..") {
			t.Fatalf("Normalize(%q): %+v ends in a dot segment", raw, p)
		}
		if strings.Contains(s, "\\") {
			t.Fatalf("Normalize(%q): %+v contains a backslash", raw, p)
		}
	}
	for i := 0; i < len(p.Match); i++ {
		if c := p.Match[i]; c < 0x20 || c == 0x7f {
			t.Fatalf("Normalize(%q): Match %q has control character %#x", raw, p.Match, c)
		}
	}
	for i := 0; i < len(p.Forward); i++ {
		if c := p.Forward[i]; c != '/' && c != '%' && !isPchar(c) {
			t.Fatalf("Normalize(%q): Forward %q has unescaped %q", raw, p.Forward, c)
		}
	}

	// The upstream decodes Forward segment by segment and must end up
	// with what the policy matched.
	fsegs := strings.Split(p.Forward[1:], "/")
	msegs := strings.Split(p.Match[1:], "/")
	if len(fsegs) != len(msegs) {
		t.Fatalf("Normalize(%q): Forward %q and Match %q have different segment counts", raw, p.Forward, p.Match)
	}
	for i, fs := range fsegs {
		dec, err := url.PathUnescape(fs)
		if err != nil {
			t.Fatalf("Normalize(%q): Forward segment %q does not unescape: %v", raw, fs, err)
		}
		if allow {
			dec = strings.ReplaceAll(dec, "/", "%2F")
		}
		if dec != msegs[i] {
			t.Fatalf("Normalize(%q): Forward segment %q decodes to %q, Match has %q", raw, fs, dec, msegs[i])
		}
	}

	again, err := Normalize(p.Forward, allow)
	if err != nil {
		t.Fatalf("Normalize(%q) = %+v, but Normalize(Forward): %v", raw, p, err)
	}
	if again != p {
		t.Fatalf("Normalize(%q) = %+v, but Normalize(Forward) = %+v", raw, p, again)
	}
}

func FuzzQuery(f *testing.F) {
	for _, seed := range []string{"", "a=1&a=2&b=x+y", "a=%zz", "a=1;b=2", "&&=&%41=%", "a+b=%2B"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := Query(raw)
		if err != nil {
			return
		}
		// Go's own parser is no stricter than Query, so it must accept
		// whatever Query did and agree on the result.
		want, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("Query(%q) = %v, but url.ParseQuery: %v", raw, q, err)
		}
		if len(want) != len(q) {
			t.Fatalf("Query(%q) = %v, url.ParseQuery = %v", raw, q, want)
		}
		for k, vs := range want {
			if strings.Join(q[k], "\x00") != strings.Join(vs, "\x00") || len(q[k]) != len(vs) {
				t.Fatalf("Query(%q) = %v, url.ParseQuery = %v", raw, q, want)
			}
		}
	})
}
