package reqpath

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		allow   bool
		match   string
		forward string
		err     error
	}{
		{name: "root", raw: "/", match: "/", forward: "/"},
		{name: "plain", raw: "/repos/o/r", match: "/repos/o/r", forward: "/repos/o/r"},
		{name: "trailing slash kept", raw: "/repos/o/r/", match: "/repos/o/r/", forward: "/repos/o/r/"},
		{name: "dotdot", raw: "/a/../b", match: "/b", forward: "/b"},
		{name: "dot", raw: "/a/./b", match: "/a/b", forward: "/a/b"},
		{name: "empty segments", raw: "//a///b", match: "/a/b", forward: "/a/b"},
		{name: "empty segment inside", raw: "/a//b", match: "/a/b", forward: "/a/b"},
		{name: "double slash only", raw: "//", match: "/", forward: "/"},
		{name: "trailing double slash", raw: "/a/b//", match: "/a/b/", forward: "/a/b/"},
		{name: "trailing dotdot", raw: "/a/b/..", match: "/a/", forward: "/a/"},
		{name: "trailing dot", raw: "/a/.", match: "/a/", forward: "/a/"},
		{name: "trailing dotdot to root", raw: "/a/..", match: "/", forward: "/"},
		{name: "trailing dotdot slash", raw: "/a/b/../", match: "/a/", forward: "/a/"},
		{name: "dotdot above root", raw: "/../../etc/passwd", match: "/etc/passwd", forward: "/etc/passwd"},
		{name: "dotdot above root middle", raw: "/a/../../b", match: "/b", forward: "/b"},
		{name: "encoded dotdot", raw: "/a/%2e%2e/b", match: "/b", forward: "/b"},
		{name: "encoded dotdot mixed case", raw: "/a/%2E%2e/b", match: "/b", forward: "/b"},
		{name: "half encoded dotdot", raw: "/a/.%2e/b", match: "/b", forward: "/b"},
		{name: "half encoded dotdot other half", raw: "/a/%2e./b", match: "/b", forward: "/b"},
		{name: "encoded dot", raw: "/%2e/b", match: "/b", forward: "/b"},
		{name: "encoded trailing dot", raw: "/a/%2E", match: "/a/", forward: "/a/"},
		{name: "three dots is a name", raw: "/a/.../b", match: "/a/.../b", forward: "/a/.../b"},
		{name: "dot prefix is a name", raw: "/a/.git/b", match: "/a/.git/b", forward: "/a/.git/b"},
		{name: "encoded dot in name", raw: "/a%2eb", match: "/a.b", forward: "/a%2eb"},
		{name: "encoded slash", raw: "/a/%2fb", err: ErrEncodedSlash},
		{name: "encoded slash upper", raw: "/a/%2Fb", err: ErrEncodedSlash},
		{name: "encoded slash allowed", raw: "/a/%2fb", allow: true, match: "/a/%2Fb", forward: "/a/%2fb"},
		{name: "encoded slash allowed whole segment", raw: "/a/%2F/b", allow: true, match: "/a/%2F/b", forward: "/a/%2F/b"},
		{name: "encoded slash dotdot", raw: "/a/..%2Fadmin", allow: true, err: ErrAmbiguous},
		{name: "encoded slash dot", raw: "/a/x%2F.", allow: true, err: ErrAmbiguous},
		{name: "encoded backslash", raw: "/a/%5cb", err: ErrEncodedSlash},
		{name: "encoded backslash upper", raw: "/a/%5Cb", err: ErrEncodedSlash},
		{name: "encoded backslash allow", raw: "/a/%5cb", allow: true, err: ErrEncodedSlash},
		{name: "encoded backslash dotdot", raw: "/a/..%5c..%5cb", allow: true, err: ErrEncodedSlash},
		{name: "backslash", raw: "/a\\b", err: ErrAmbiguous},
		{name: "backslash dotdot", raw: "/a/..\\b", allow: true, err: ErrAmbiguous},
		{name: "dotdot with empty params", raw: "/a/..;/b", err: ErrAmbiguous},
		{name: "dotdot with params", raw: "/a/..;x/b", err: ErrAmbiguous},
		{name: "dot with params", raw: "/a/.;a/b", err: ErrAmbiguous},
		{name: "encoded dotdot with params", raw: "/a/%2e%2e;/b", err: ErrAmbiguous},
		{name: "dotdot with encoded semicolon", raw: "/a/..%3b/b", err: ErrAmbiguous},
		{name: "params kept", raw: "/a;b/c", match: "/a;b/c", forward: "/a;b/c"},
		{name: "params after name kept", raw: "/a/b;jsessionid=1", match: "/a/b;jsessionid=1", forward: "/a/b;jsessionid=1"},
		{name: "double encoded dotdot", raw: "/a/%252e%252e/b", err: ErrAmbiguous},
		{name: "double encoded slash", raw: "/a/%252f", allow: true, err: ErrAmbiguous},
		{name: "double encoded backslash", raw: "/a/%255c", err: ErrAmbiguous},
		{name: "double encoded percent", raw: "/a/%2525", err: ErrAmbiguous},
		{name: "double encoded letter", raw: "/%2561dmin", err: ErrAmbiguous},
		{name: "split double encoding", raw: "/a/%25%32%65", err: ErrAmbiguous},
		{name: "literal percent", raw: "/100%25done", match: "/100%done", forward: "/100%25done"},
		{name: "literal percent at end", raw: "/a%25", match: "/a%", forward: "/a%25"},
		{name: "truncated escape", raw: "/a/%2", err: ErrAmbiguous},
		{name: "bare percent", raw: "/a/%", err: ErrAmbiguous},
		{name: "non-hex escape", raw: "/a/%zz", err: ErrAmbiguous},
		{name: "half hex escape", raw: "/a/%2g", err: ErrAmbiguous},
		{name: "encoded NUL", raw: "/a%00b", err: ErrAmbiguous},
		{name: "raw NUL", raw: "/a\x00b", err: ErrAmbiguous},
		{name: "encoded newline", raw: "/a%0d%0aX-Injected:1", err: ErrAmbiguous},
		{name: "encoded tab", raw: "/a%09", err: ErrAmbiguous},
		{name: "encoded DEL", raw: "/a%7f", err: ErrAmbiguous},
		{name: "encoded space", raw: "/x%20y", match: "/x y", forward: "/x%20y"},
		{name: "raw space re-escaped", raw: "/x y", match: "/x y", forward: "/x%20y"},
		{name: "utf8", raw: "/caf%C3%A9", match: "/café", forward: "/caf%C3%A9"},
		{name: "raw utf8 re-escaped", raw: "/café", match: "/café", forward: "/caf%C3%A9"},
		{name: "invalid utf8", raw: "/caf%C3", err: ErrAmbiguous},
		{name: "overlong utf8 dot", raw: "/a/%c0%ae%c0%ae/b", err: ErrAmbiguous},
		{name: "sub-delims kept", raw: "/a!$&'()*+,;=:@b", match: "/a!$&'()*+,;=:@b", forward: "/a!$&'()*+,;=:@b"},
		{name: "unneeded escape kept", raw: "/%61dmin", match: "/admin", forward: "/%61dmin"},
		{name: "re-escape keeps needed escape", raw: "/a%2Bb c", match: "/a+b c", forward: "/a+b%20c"},
		{name: "question mark", raw: "/a?b", err: ErrAmbiguous},
		{name: "fragment", raw: "/a#b", err: ErrAmbiguous},
		{name: "encoded question mark", raw: "/a%3Fb", match: "/a?b", forward: "/a%3Fb"},
		{name: "empty", raw: "", err: ErrAmbiguous},
		{name: "relative", raw: "a/b", err: ErrAmbiguous},
		{name: "asterisk form", raw: "*", err: ErrAmbiguous},
		{name: "absolute form", raw: "http://example.com/a", err: ErrAmbiguous},
		{name: "authority form", raw: "example.com:443", err: ErrAmbiguous},
		{name: "at limit", raw: "/" + strings.Repeat("a", maxLen-1), match: "/" + strings.Repeat("a", maxLen-1), forward: "/" + strings.Repeat("a", maxLen-1)},
		{name: "over limit", raw: "/" + strings.Repeat("a", maxLen), err: ErrAmbiguous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize(tt.raw, tt.allow)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Normalize(%q, %v) = %+v, %v; want error %v", tt.raw, tt.allow, got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Normalize(%q, %v): %v", tt.raw, tt.allow, err)
			}
			if got.Match != tt.match || got.Forward != tt.forward {
				t.Fatalf("Normalize(%q, %v) = {Match: %q, Forward: %q}; want {Match: %q, Forward: %q}",
					tt.raw, tt.allow, got.Match, got.Forward, tt.match, tt.forward)
			}
			checkPath(t, tt.raw, tt.allow, got)
		})
	}
}

func TestErrorsCarryDetail(t *testing.T) {
	_, err := Normalize("/a/%00", false)
	if err == nil || !strings.Contains(err.Error(), "control character") {
		t.Fatalf("error %v does not say why", err)
	}
	_, err = Normalize("/a/%2fb", false)
	if errors.Is(err, ErrAmbiguous) {
		t.Fatalf("encoded slash error %v also matches ErrAmbiguous", err)
	}
}

func TestQuery(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want map[string][]string
		err  bool
	}{
		{name: "empty", raw: "", want: map[string][]string{}},
		{name: "repeated and plus", raw: "a=1&a=2&b=x+y", want: map[string][]string{"a": {"1", "2"}, "b": {"x y"}}},
		{name: "escapes", raw: "q=%41%2b%20", want: map[string][]string{"q": {"A+ "}}},
		{name: "plus in name", raw: "a+b=1", want: map[string][]string{"a b": {"1"}}},
		{name: "no value", raw: "flag&x=", want: map[string][]string{"flag": {""}, "x": {""}}},
		{name: "empty pieces", raw: "&a=1&&", want: map[string][]string{"a": {"1"}}},
		{name: "equals in value", raw: "a=b=c", want: map[string][]string{"a": {"b=c"}}},
		{name: "empty name", raw: "=v", want: map[string][]string{"": {"v"}}},
		{name: "invalid escape", raw: "a=%zz", err: true},
		{name: "truncated escape", raw: "a=%2", err: true},
		{name: "invalid escape in name", raw: "%g1=1", err: true},
		{name: "semicolon", raw: "a=1;b=2", err: true},
		{name: "encoded semicolon", raw: "a=1%3Bb=2", want: map[string][]string{"a": {"1;b=2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Query(tt.raw)
			if tt.err {
				if !errors.Is(err, ErrQuery) {
					t.Fatalf("Query(%q) = %v, %v; want ErrQuery", tt.raw, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Query(%q): %v", tt.raw, err)
			}
			if got == nil || !maps.EqualFunc(got, tt.want, slices.Equal) {
				t.Fatalf("Query(%q) = %v; want %v", tt.raw, got, tt.want)
			}
		})
	}
}

func TestUnparameterised(t *testing.T) {
	for raw, want := range map[string]string{
		"/a/b":                 "/a/b",
		"/admin;x":             "/admin",
		"/a;b/c;d=e":           "/a/c",
		"/;jsessionid=1/admin": "/admin",
		"/a/;x/":               "/a/",
		"/;x":                  "/",
		"/a;x/":                "/a/",
	} {
		p, err := Normalize(raw, false)
		if err != nil {
			t.Errorf("Normalize(%q): %v", raw, err)
			continue
		}
		if p.Unparameterised != want {
			t.Errorf("Normalize(%q).Unparameterised = %q, want %q", raw, p.Unparameterised, want)
		}
	}
}

// Found by FuzzNormalize: a path under the limit whose escaped form is
// over it would be forwarded longer than any path Normalize accepts.
func TestEscapedFormKeepsTheLimit(t *testing.T) {
	raw := "/" + strings.Repeat("}", 3000)
	if _, err := Normalize(raw, false); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Normalize(%d × \"}\"): err = %v, want ErrAmbiguous", 3000, err)
	}
	p, err := Normalize("/"+strings.Repeat("}", 2000), false)
	if err != nil || len(p.Forward) != 1+3*2000 {
		t.Fatalf("a path whose escaped form fits: %v (%d bytes)", err, len(p.Forward))
	}
}
