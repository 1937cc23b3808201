package statedir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestOwnedDir: corral trusts a directory of its state only if it is a
// real directory of its own that nobody else can write.
func TestOwnedDir(t *testing.T) {
	base := t.TempDir()
	ours := filepath.Join(base, "ours")
	if err := os.Mkdir(ours, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := OwnedDir(ours, 0o022); err != nil {
		t.Fatalf("our own 0700 directory refused: %v", err)
	}
	if err := OwnedDir(filepath.Join(base, "missing"), 0o022); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing directory: %v, want fs.ErrNotExist", err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(ours, link); err != nil {
		t.Fatal(err)
	}
	if err := OwnedDir(link, 0o022); err == nil {
		t.Fatal("a symlink to a directory passed as the directory")
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := OwnedDir(open, 0o022); err == nil {
		t.Fatal("a directory anyone can write passed")
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := OwnedDir(file, 0o022); err == nil {
		t.Fatal("a regular file passed as a directory")
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(ours, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := OwnedDir(ours, 0o022); err == nil {
			t.Fatal("a directory owned by another uid passed")
		}
	}
}
