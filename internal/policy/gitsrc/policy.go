package gitsrc

import (
	"fmt"
	"path/filepath"

	"github.com/corral-sandbox/corral/internal/policy"
)

// LoadPolicy reads and parses the policy spec names, like policy.Load for
// a path: every error is prefixed with "load policy SPEC: ", and the
// policy's Source is "git:REF:PATH@COMMIT".
func LoadPolicy(workdir, spec string) (*policy.Policy, error) {
	data, commit, _, err := Load(workdir, spec)
	if err != nil {
		return nil, fmt.Errorf("load policy %w", err)
	}
	s, _ := ParseSpec(spec) // Load parsed it already
	p, err := policy.Parse(data, s.Source(commit))
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", s.Source(commit), err)
	}
	return p, nil
}

// ForPlan returns the policy to build the sandbox of a run from: p itself,
// or, for a policy from git whose REF is not a full commit id, a copy of
// p with the repository's git files and directories that p would leave
// writable inside the sandbox (under the working directory or a
// read_write path) added to its read-only paths. A workload that can
// write them can commit on REF, shadow it with a ref git looks up first,
// or replace the repository, and so choose the policy of the next run
// started from REF. A commit id cannot be moved, and every object read is
// checked against its id, so with one the workload may go on committing.
// p itself is left as the file says, so that its hash and a later policy
// set compare with the file.
func ForPlan(p *policy.Policy, workdir, spec string) (*policy.Policy, error) {
	if !IsSpec(spec) {
		return p, nil
	}
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	if _, err := parseHash(s.Ref); err == nil {
		return p, nil
	}
	workdir, err = filepath.Abs(workdir)
	if err != nil {
		return nil, err
	}
	r, err := openRepo(workdir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, err)
	}
	// objectDirs[0] is in commonDir; the others are alternates.
	return p.ReadOnlyWhereWritable(workdir, append([]string{filepath.Join(r.top, ".git"), r.gitDir, r.commonDir}, r.objectDirs[1:]...)), nil
}
