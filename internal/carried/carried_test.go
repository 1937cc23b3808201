package carried

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"
)

// countingFS counts the opens of the carried program, i.e. the copies made.
type countingFS struct {
	fstest.MapFS
	opens atomic.Int32
}

func (c *countingFS) Open(name string) (fs.File, error) {
	if name != "bin" {
		c.opens.Add(1)
	}
	return c.MapFS.Open(name)
}

// Starts that find the program missing at the same moment write it once:
// the others wait for the first and use its copy.
func TestConcurrentStartsWriteOnce(t *testing.T) {
	prog := bytes.Repeat([]byte("program "), 1<<16)
	fsys := &countingFS{MapFS: fstest.MapFS{"bin/corral-test-0123": {Data: prog, Mode: 0o500}}}
	p := Program{FS: fsys, Prefix: "corral-test-"}
	state := t.TempDir()
	var wg sync.WaitGroup
	paths := make([]string, 8)
	errs := make([]error, 8)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = p.Path(state) })
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != filepath.Join(state, "bin", "corral-test-0123") {
			t.Fatalf("start %d: %q, %v", i, paths[i], errs[i])
		}
	}
	if n := fsys.opens.Load(); n != 1 {
		t.Errorf("the program was copied %d times", n)
	}
	got, err := os.ReadFile(paths[0])
	if err != nil || !bytes.Equal(got, prog) {
		t.Fatalf("installed program differs (%v)", err)
	}
	left, _ := filepath.Glob(filepath.Join(state, "bin", ".corral-test-*"))
	if len(left) != 0 {
		t.Errorf("temporary copies left: %v", left)
	}
}

// testProgram is a program as a corral build carries it.
func testProgram() (Program, string) {
	const name = "corral-test-0123"
	return Program{FS: fstest.MapFS{"bin/" + name: {Data: []byte("program"), Mode: 0o500}}, Prefix: "corral-test-"}, name
}

// A program is written once, 0500 in a 0700 directory, and found there by
// later starts; the same program of other builds goes once stale.
func TestPathWritesOnce(t *testing.T) {
	p, name := testProgram()
	state := t.TempDir()
	stale := filepath.Join(state, "bin", "corral-test-0000")
	fresh := filepath.Join(state, "bin", "corral-test-1111")
	if err := os.MkdirAll(filepath.Dir(stale), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{stale, fresh} {
		if err := os.WriteFile(f, []byte("x"), 0o500); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	path, err := p.Path(state)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(state, "bin", name) {
		t.Fatalf("program at %s, want %s under %s/bin", path, name, state)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o500 {
		t.Fatalf("program mode %v (%v), want 0500", st.Mode(), err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("a stale program of another build was left")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Error("a program of another build written a moment ago was removed")
	}
	again, err := p.Path(state)
	if err != nil || again != path {
		t.Fatalf("second start: %s, %v", again, err)
	}
	if st2, _ := os.Stat(path); !st2.ModTime().Equal(st.ModTime()) {
		t.Error("the program was written again")
	}
}

// A program or directory others could write, or one not ours, is
// refused rather than run with corral's privileges.
func TestPathRefusesWhatOthersControl(t *testing.T) {
	p, _ := testProgram()
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
			prog, err := p.Path(state)
			if err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, prog)
			if got, err := p.Path(state); err == nil {
				t.Fatalf("Path accepted %s", got)
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
