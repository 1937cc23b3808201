package termsafe

import (
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"OSC 52 clipboard write", "x\x1b]52;c;ZWNobyBwd25lZAo=\x07y", `x\x1b]52;c;ZWNobyBwd25lZAo=\ay`},
		{"clear screen", "\x1b[2J\x1b[H", `\x1b[2J\x1b[H`},
		{"cursor up and erase line", "ok\x1b[1A\x1b[2K\rSAFE", `ok\x1b[1A\x1b[2K\rSAFE`},
		{"window title", "\x1b]0;PWNED\x07", `\x1b]0;PWNED\a`},
		{"forged line", "need it\nsecurity notes: none", `need it\nsecurity notes: none`},
		{"tab shifts columns", "prod\tready", `prod\tready`},
		{"NUL and DEL", "a\x00b\x7f", `a\x00b\x7f`},
		{"C1 CSI", "\u009b2J", `\u009b2J`},
		{"C1 NEL", "a\u0085b", `a\u0085b`},
		{"right-to-left override", "/tmp/\u202egnp.sh", `/tmp/\u202egnp.sh`},
		{"bidi isolates", "\u2066a\u2067b\u2068c\u2069", `\u2066a\u2067b\u2068c\u2069`},
		{"bidi embeddings", "\u202a\u202b\u202c\u202d", `\u202a\u202b\u202c\u202d`},
		{"zero width and BOM", "cu\u200brl\ufeff", `cu\u200brl\ufeff`},
		{"line separator", "a\u2028b", `a\u2028b`},
		{"invalid UTF-8", "a\xffb\xc3", `a\xffb\xc3`},
		{"raw C1 byte", "a\x9bb", `a\x9bb`},
		{"tag character", "a\U000e0041", `a\U000e0041`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Line(c.in)
			if got != c.want {
				t.Errorf("Line(%q) = %q, want %q", c.in, got, c.want)
			}
			if strings.ContainsAny(got, "\x1b\x07\n\r\t\u009b\u202e") {
				t.Errorf("Line(%q) = %q keeps a character a terminal acts on", c.in, got)
			}
		})
	}
}

func TestText(t *testing.T) {
	in := "network_policies:\n  ex:\n    binaries:\n      - path: /tmp/\u202egnp\x1b[2K\r\tx\n"
	want := "network_policies:\n  ex:\n    binaries:\n      - path: /tmp/\\u202egnp\\x1b[2K\\r\\tx\n"
	if got := Text(in); got != want {
		t.Errorf("Text(%q) = %q, want %q", in, got, want)
	}
}

// TestPlainUnchanged: text with nothing a terminal acts on is returned as
// it is, so escaping costs ordinary output nothing in readability.
func TestPlainUnchanged(t *testing.T) {
	for _, s := range []string{
		"",
		"/usr/bin/curl",
		"api.example.com:443",
		"[2001:db8::1]:443",
		"proposed by the agent: fetch the docs (GET only) — 100% sure",
		`C:\path\with\backslashes and "quotes" = fine`,
		"naïve café Ærøskøbing",
		"日本語のテキスト",
		"עברית ومرحبا", // right-to-left letters are text; only overrides are escaped
		"curl ×3 → ok",
		"\ufffd", // a real replacement character is printable
	} {
		if got := Line(s); got != s {
			t.Errorf("Line(%q) = %q, want it unchanged", s, got)
		}
		if got := Text(s); got != s {
			t.Errorf("Text(%q) = %q, want it unchanged", s, got)
		}
	}
}
