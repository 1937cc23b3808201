package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadWorldReadable(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"public": 0o644, "private": 0o600} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"public": "public", "private": "", "missing": ""} {
		if got, err := readWorldReadable(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Errorf("%s: got %q, %v; want %q", name, got, err, want)
		}
	}
}

// The sandbox's hosts file names the sandbox; it carries the host's entries
// only when everyone may read them, and localhost resolves either way.
func TestSandboxHosts(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct {
		body string
		mode os.FileMode
	}{
		"public":  {"10.1.2.3 intranet", 0o644},
		"private": {"10.9.9.9 secret-host\n", 0o600},
		"empty":   {"", 0o644},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string][]string{
		"public":  {"10.1.2.3 intranet\n", "127.0.1.1\tcorral-x\n"},
		"private": {"127.0.0.1\tlocalhost\n", "127.0.1.1\tcorral-x\n"},
		"empty":   {"127.0.0.1\tlocalhost\n", "127.0.1.1\tcorral-x\n"},
		"missing": {"127.0.0.1\tlocalhost\n", "127.0.1.1\tcorral-x\n"},
	} {
		got, err := sandboxHosts(filepath.Join(dir, name), "corral-x")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, w := range want {
			if !strings.Contains(string(got), w) {
				t.Errorf("%s: %q lacks %q", name, got, w)
			}
		}
		if strings.Contains(string(got), "secret-host") {
			t.Errorf("%s: the private host file's entries reached the sandbox's: %q", name, got)
		}
	}
}
