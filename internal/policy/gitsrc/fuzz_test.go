package gitsrc

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// FuzzObject feeds arbitrary bytes as a loose object file and as the
// content of a commit and a tree: a workload that may write the
// repository (a policy pinned by commit id) controls them. Nothing may
// panic, and only content hashing to the id asked for may be returned.
func FuzzObject(f *testing.F) {
	f.Add([]byte("tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor a <a> 1 +0000\n\nm\n"), "policy.yaml")
	f.Add([]byte("100644 policy.yaml\x00aaaaaaaaaaaaaaaaaaaa40000 d\x00bbbbbbbbbbbbbbbbbbbb"), "d/policy.yaml")
	f.Add([]byte("100644 x\x00short"), "x")
	dir := f.TempDir()
	objects := filepath.Join(dir, "objects")
	r := &repo{commonDir: dir, gitDir: dir, objectDirs: []string{objects}, packsRead: true}
	f.Fuzz(func(t *testing.T, data []byte, p string) {
		_, _ = header(data, "tree")
		_, _, _, _ = treeEntry(data, p)

		// As a loose commit object: well-formed, and with its header cut.
		h := plumbing.ComputeHash(plumbing.CommitObject, data)
		hx := h.String()
		sub := filepath.Join(objects, hx[:2])
		defer os.RemoveAll(sub)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, raw := range [][]byte{append(fmt.Appendf(nil, "commit %d\x00", len(data)), data...), data} {
			var z bytes.Buffer
			w := zlib.NewWriter(&z)
			_, _ = w.Write(raw)
			_ = w.Close()
			if err := os.WriteFile(filepath.Join(sub, hx[2:]), z.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if typ, content, err := r.object(h); err == nil && plumbing.ComputeHash(typ, content) != h {
				t.Fatalf("returned content that does not hash to %s", h)
			}
			if ps, err := ParseSpec("git:main:" + p); err == nil {
				_, _ = r.file(h, ps.Path)
			}
		}
	})
}
