package policy

import (
	"path/filepath"
	"slices"
	"strings"
)

// ReadOnlyWhereWritable returns p with each of paths (host paths, symlinks
// resolved) that lies in a directory the sandbox may write (the workdir
// when the policy includes it, a read_write path) added to read_only, or p
// itself when none does: files that decide later runs (the policy's own
// file, a repository's refs) must not be the workload's to change. p is
// left as it is, so its hash still matches the file.
func (p *Policy) ReadOnlyWhereWritable(workdir string, paths []string) *Policy {
	fsp := p.FilesystemPolicy
	writable := slices.Clone(fsp.ReadWrite)
	if fsp.IncludeWorkdir == nil || *fsp.IncludeWorkdir {
		writable = append(writable, workdir)
	}
	var roots []string
	for _, r := range writable {
		if real, err := filepath.EvalSymlinks(r); err == nil {
			r = real
		}
		roots = append(roots, r)
	}
	ro := slices.Clone(fsp.ReadOnly)
	for _, path := range paths {
		real, err := filepath.EvalSymlinks(path)
		if err != nil || slices.Contains(ro, real) {
			continue
		}
		if slices.ContainsFunc(roots, func(root string) bool {
			rel, err := filepath.Rel(root, real)
			return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
		}) {
			ro = append(ro, real)
		}
	}
	if len(ro) == len(fsp.ReadOnly) {
		return p
	}
	q := *p
	q.FilesystemPolicy.ReadOnly = ro
	return &q
}
