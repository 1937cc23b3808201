package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCopyConfigDir(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	for p, body := range map[string]string{"master_preferences": "{}", "policies/managed/site.json": `{"HomepageLocation": "x"}`} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/chromium.d", filepath.Join(src, "d")); err != nil {
		t.Fatal(err)
	}
	if err := copyConfigDir(src, dst); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"master_preferences": "{}", "policies/managed/site.json": `{"HomepageLocation": "x"}`} {
		got, err := os.ReadFile(filepath.Join(dst, p))
		if err != nil || string(got) != want {
			t.Errorf("%s: got %q, %v; want %q", p, got, err, want)
		}
		// The workload reads the copy as another user.
		if fi, err := os.Stat(filepath.Join(dst, p)); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v, %v; want 0644", p, fi.Mode(), err)
		}
	}
	if link, err := os.Readlink(filepath.Join(dst, "d")); err != nil || link != "/etc/chromium.d" {
		t.Errorf("symlink copied as %q, %v", link, err)
	}

	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "huge"), make([]byte, maxBrowserBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := copyConfigDir(big, filepath.Join(t.TempDir(), "copy")); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("a directory over the size bound: got %v, want an error", err)
	}
}
