package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-sandbox/corral/internal/plan"
)

func TestCopyConfigDir(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, body := range map[string]string{"master_preferences": "{}", "policies/managed/site.json": `{"HomepageLocation": "x"}`, "private": "root's"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(src, "private"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/chromium.d", filepath.Join(src, "d")); err != nil {
		t.Fatal(err)
	}
	// As on a hardened host.
	defer syscall.Umask(syscall.Umask(0o077))
	if err := copyConfigDir(src, dst); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"master_preferences": "{}", "policies/managed/site.json": `{"HomepageLocation": "x"}`} {
		got, err := os.ReadFile(filepath.Join(dst, p))
		if err != nil || string(got) != want {
			t.Errorf("%s: got %q, %v; want %q", p, got, err, want)
		}
	}
	// Modes are the host's, whatever the umask: readable stays readable to
	// the workload, private stays private.
	for p, want := range map[string]os.FileMode{"master_preferences": 0o644, "private": 0o600, "policies": 0o755, "policies/managed": 0o755, ".": 0o755} {
		if fi, err := os.Stat(filepath.Join(dst, p)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode().Perm(), err, want)
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

// The policy lands in the copy, never through a link the host's directory
// has where it goes: that would write into the host's own files.
func TestAddBrowserPolicyFollowsNoLink(t *testing.T) {
	host, copyDir := t.TempDir(), t.TempDir()
	if err := os.Symlink(host, filepath.Join(copyDir, "policies")); err != nil {
		t.Fatal(err)
	}
	if err := addBrowserPolicy(copyDir, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 0 {
		t.Errorf("the policy was written through the link, into %s: %v", host, entries)
	}
	if fi, err := os.Lstat(filepath.Join(copyDir, "policies")); err != nil || !fi.IsDir() {
		t.Errorf("policies in the copy is not a directory of corral's: %v, %v", fi, err)
	}
	got, err := os.ReadFile(filepath.Join(copyDir, plan.BrowserPolicyFile))
	if err != nil || string(got) != "{}" {
		t.Errorf("policy file: %q, %v", got, err)
	}

	// The same for a link in the file's place.
	other := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(other, []byte("host's"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(copyDir, plan.BrowserPolicyFile)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, p); err != nil {
		t.Fatal(err)
	}
	if err := addBrowserPolicy(copyDir, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(other); string(b) != "host's" {
		t.Errorf("the policy was written through a link in its place: the host's file is now %q", b)
	}
}
