package cli

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

// The files that chose a run's cage are read-only inside it where it
// could write them.
func TestProtectPolicyFiles(t *testing.T) {
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
	p, err := policy.Parse([]byte("version: 1\nfilesystem_policy: {read_only: [/usr], read_write: ["+rw+"]}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := protectPolicyFiles(p, work, []string{top, nested, inRW, outside, "git:main:policy.yaml", ""})
	for _, f := range []string{top, nested, inRW} {
		if !slices.Contains(q.FilesystemPolicy.ReadOnly, f) {
			t.Errorf("%s is not read-only inside: %v", f, q.FilesystemPolicy.ReadOnly)
		}
	}
	if slices.Contains(q.FilesystemPolicy.ReadOnly, outside) || len(p.FilesystemPolicy.ReadOnly) != 1 {
		t.Errorf("read-only %v (the caller's %v): want the outside file left alone and the caller's policy unchanged", q.FilesystemPolicy.ReadOnly, p.FilesystemPolicy.ReadOnly)
	}
}
