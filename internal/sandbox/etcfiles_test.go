package sandbox

import (
	"os"
	"path/filepath"
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
