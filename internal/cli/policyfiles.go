package cli

import (
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
// "sandbox: disabled" would choose that run's cage. The plan keeps such a
// file in place too: a mount point can be neither renamed nor removed,
// and the directories above it are pinned (see the planner).
func protectPolicyFiles(p *policy.Policy, workdir string, files []string) *policy.Policy {
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
