package initbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func carriedName(t *testing.T) string {
	t.Helper()
	name, err := program.Name()
	if err != nil {
		t.Fatal(err)
	}
	if name == "" {
		if os.Getenv("CORRAL_NO_SKIP") != "" {
			t.Fatal("this test binary carries no init program: run go generate ./internal/sandbox/initbin first (.ci/run does)")
		}
		t.Skip("no init program carried: go generate ./internal/sandbox/initbin was not run")
	}
	return name
}

// The init program is written once, 0500 in a 0700 directory, and found
// there by later starts; the programs of other builds go once stale.
func TestPathWritesOnce(t *testing.T) {
	name := carriedName(t)
	state := t.TempDir()
	stale := filepath.Join(state, "bin", "corral-init-0000")
	fresh := filepath.Join(state, "bin", "corral-init-1111")
	if err := os.MkdirAll(filepath.Dir(stale), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("x"), 0o500); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	p, err := Path(state)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p) != name || !strings.HasPrefix(p, filepath.Join(state, "bin")+"/") {
		t.Fatalf("init program at %s, want %s under %s/bin", p, name, state)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o500 {
		t.Fatalf("init program mode %v (%v), want 0500", st.Mode(), err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("a stale init program of another build was left")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Error("an init program of another build written a moment ago was removed")
	}
	again, err := Path(state)
	if err != nil || again != p {
		t.Fatalf("second start: %s, %v", again, err)
	}
	st2, _ := os.Stat(p)
	if !st2.ModTime().Equal(st.ModTime()) {
		t.Error("the init program was written again")
	}
}

// An init program or directory others could write, or one not ours, is
// refused rather than run with corral's privileges.
func TestPathRefusesWhatOthersControl(t *testing.T) {
	carriedName(t)
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, prog string)
	}{
		{"group-writable program", func(t *testing.T, prog string) { chmod(t, prog, 0o520) }},
		{"world-writable directory", func(t *testing.T, prog string) { chmod(t, filepath.Dir(prog), 0o777) }},
		{"group-readable directory", func(t *testing.T, prog string) { chmod(t, filepath.Dir(prog), 0o750) }},
		{"program of another uid", func(t *testing.T, prog string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give the file away")
			}
			if err := os.Chown(prog, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink in its place", func(t *testing.T, prog string) {
			if err := os.Remove(prog); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/bin/sh", prog); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			prog, err := Path(state)
			if err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, prog)
			if p, err := Path(state); err == nil {
				t.Fatalf("Path accepted %s", p)
			}
		})
	}
}

func chmod(t *testing.T, p string, m os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, m); err != nil {
		t.Fatal(err)
	}
}
