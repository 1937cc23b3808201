package policy

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Paths in a directory the sandbox may write are added to read_only, each
// once; others are left alone, and so is the caller's policy.
func TestReadOnlyWhereWritable(t *testing.T) {
	dir := t.TempDir()
	work, rw, out := filepath.Join(dir, "w"), filepath.Join(dir, "cache"), filepath.Join(dir, "etc")
	for _, d := range []string{filepath.Join(work, ".corral"), rw, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	top, nested, inRW, outside := filepath.Join(work, "policy.yaml"), filepath.Join(work, ".corral", "rules.rego"), filepath.Join(rw, "routes.yaml"), filepath.Join(out, "policy.yaml")
	for _, f := range []string{top, nested, inRW, outside} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(top, link); err != nil {
		t.Fatal(err)
	}
	p, err := Parse([]byte("version: 1\nfilesystem_policy: {read_only: [/usr], read_write: ["+rw+"]}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := p.ReadOnlyWhereWritable(work, []string{top, nested, inRW, outside, link, filepath.Join(dir, "missing")})
	want := []string{"/usr", top, nested, inRW}
	if !slices.Equal(q.FilesystemPolicy.ReadOnly, want) {
		t.Errorf("read_only %q, want %q", q.FilesystemPolicy.ReadOnly, want)
	}
	if len(p.FilesystemPolicy.ReadOnly) != 1 {
		t.Errorf("the caller's policy changed: %q", p.FilesystemPolicy.ReadOnly)
	}
	if r := p.ReadOnlyWhereWritable(work, []string{outside}); r != p {
		t.Error("a policy with nothing to add is not returned as it is")
	}
}
