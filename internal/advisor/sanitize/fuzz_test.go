package sanitize

import (
	"strings"
	"testing"
)

// Command lines come from the sandbox, so any bytes at all.
func FuzzLine(f *testing.F) {
	f.Add("curl\x00-H\x00Authorization: Bearer abcdefgh12345678\x00https://u:p@x/?token=t")
	f.Add("mysql\x00-pse\xffcret\x00-u\x00a:b")
	f.Add("sh\x00-c\x00GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345 git push")
	f.Fuzz(func(t *testing.T, s string) {
		argv := strings.Split(s, "\x00")
		got := Line(argv)
		if len(got) > MaxLine+len("…") {
			t.Fatalf("line of %d bytes", len(got))
		}
		const tok = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"
		if strings.Contains(s, tok) && strings.Contains(got, tok) {
			t.Fatalf("token survived: %q", got)
		}
	})
}
