package secretbox

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestSealOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret.key")
	b, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v, want 0600", fi.Mode().Perm())
	}
	sealed, err := b.Seal("GITHUB_TOKEN", []byte("ghp_value"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("ghp_value")) {
		t.Fatal("sealed value contains the plaintext")
	}
	// The same key file opens it after a restart.
	b2, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b2.Open("GITHUB_TOKEN", sealed)
	if err != nil || string(got) != "ghp_value" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if _, err := b2.Open("OTHER", sealed); err == nil {
		t.Fatal("a value sealed for one name opened under another")
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := b2.Open("GITHUB_TOKEN", sealed); err == nil {
		t.Fatal("a tampered value opened")
	}
}

func TestLoadRefusesOpenKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret.key")
	if _, err := LoadOrCreate(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(path); err == nil {
		t.Fatal("a world-readable key file was used")
	}
}
