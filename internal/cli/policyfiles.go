package cli

import (
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/policy/gitsrc"
)

// protectPolicyFiles returns p with the files that chose this run's cage
// (--policy, --policy-rules, --inference-routes) read-only inside the
// sandbox where they lie in a path it can write: the same command line
// runs them again next time, and a workload that rewrote ./policy.yaml to
// "sandbox: disabled" would choose that run's cage. A file directly in a
// mount's top is then safe (a mount point can be neither renamed nor
// removed); one deeper is not, since the directory holding it can be
// renamed away and another put in its place, so that is warned about.
func protectPolicyFiles(p *policy.Policy, workdir string, files []string, log *slog.Logger) *policy.Policy {
	fsp := p.FilesystemPolicy
	writable := slices.Clone(fsp.ReadWrite)
	if p.IncludeWorkdir() {
		writable = append(writable, workdir)
	}
	var roots []string
	for _, r := range writable {
		if real, err := filepath.EvalSymlinks(r); err == nil {
			roots = append(roots, real)
		}
	}
	ro := slices.Clone(fsp.ReadOnly)
	for _, f := range files {
		if f == "" || gitsrc.IsSpec(f) {
			continue
		}
		abs, err := filepath.Abs(f)
		if err != nil {
			continue
		}
		real, err := filepath.EvalSymlinks(abs)
		if err != nil {
			continue
		}
		for _, root := range roots {
			rel, err := filepath.Rel(root, real)
			if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
				continue
			}
			if !slices.Contains(ro, real) {
				ro = append(ro, real)
			}
			if strings.Contains(rel, "/") {
				log.Warn("a file that decides this sandbox's policy lies in a directory the sandbox can write; it is read-only inside, but the workload could rename a directory above it and put its own file in its place for the next run: keep it outside "+root+", or use --policy git:REF:PATH", "file", real)
			}
			break
		}
	}
	if len(ro) == len(fsp.ReadOnly) {
		return p
	}
	q := *p
	q.FilesystemPolicy.ReadOnly = ro
	return &q
}
