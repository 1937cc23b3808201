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
