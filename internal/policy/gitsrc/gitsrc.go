// Package gitsrc reads a policy file as committed in git ("--policy
// git:REF:PATH"), so that a workload that can edit the working tree cannot
// widen the policy of its next run: a change has to be committed on REF,
// which a person reviews. It reads the repository's object database
// directly, never running git, and checks every object on the way from
// the commit to the file against its id.
package gitsrc

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
)

// Prefix marks a policy source in git.
const Prefix = "git:"

// maxPolicy bounds the file read; policies are a few kilobytes.
const maxPolicy = 1 << 20

// Spec is a parsed "git:REF:PATH".
type Spec struct {
	// Ref is a branch, remote-tracking branch, tag, HEAD, or a full or
	// abbreviated commit id.
	Ref string
	// Path is the file's path from the repository's top directory.
	Path string
}

// IsSpec reports whether a --policy value names a file in git.
func IsSpec(s string) bool { return strings.HasPrefix(s, Prefix) }

// ParseSpec parses "git:REF:PATH". Git forbids ':' in ref names, so the
// first ':' after the prefix ends REF.
func ParseSpec(s string) (Spec, error) {
	rest, ok := strings.CutPrefix(s, Prefix)
	ref, p, found := strings.Cut(rest, ":")
	if !ok || !found || ref == "" || p == "" {
		return Spec{}, fmt.Errorf("%q: a policy in git is named git:REF:PATH, e.g. git:origin/main:.corral/policy.yaml", s)
	}
	clean := path.Clean(strings.TrimPrefix(p, "/"))
	if strings.HasPrefix(p, "/") || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return Spec{}, fmt.Errorf("%q: PATH must be a file's path from the repository's top directory, e.g. .corral/policy.yaml", s)
	}
	return Spec{Ref: ref, Path: clean}, nil
}

func (s Spec) String() string { return Prefix + s.Ref + ":" + s.Path }

// Source is what Policy.Source records for the file read at commit.
func (s Spec) Source(commit string) string { return s.String() + "@" + commit }

// Commit returns the commit id recorded in a Policy.Source made by
// Source, or "" for a policy that did not come from git.
func Commit(source string) string {
	if !IsSpec(source) {
		return ""
	}
	i := strings.LastIndexByte(source, '@')
	if i < 0 {
		return ""
	}
	if _, err := parseHash(source[i+1:]); err != nil {
		return ""
	}
	return source[i+1:]
}

// Load reads the file spec names from the repository that workdir is in
// (workdir or the nearest directory above it holding .git). It returns
// the file's content, the full id of the commit REF resolved to, and the
// file's path in the repository. Errors say what was looked for and how
// to fix it.
func Load(workdir, spec string) (data []byte, commit, file string, err error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, "", "", err
	}
	_, data, h, err := load(workdir, s)
	if err != nil {
		return nil, "", "", err
	}
	return data, h.String(), s.Path, nil
}

func load(workdir string, s Spec) (*repo, []byte, plumbing.Hash, error) {
	abs, err := filepath.Abs(workdir)
	if err != nil {
		return nil, nil, plumbing.ZeroHash, fmt.Errorf("%s: %w", s, err)
	}
	r, err := openRepo(abs)
	if errors.Is(err, errNoRepo) {
		return nil, nil, plumbing.ZeroHash, fmt.Errorf("%s: %s is not inside a git repository (no .git in it or any directory above it); run corral in the repository's working tree, pass --workdir, or name the policy file by its path", s, abs)
	}
	if err != nil {
		return nil, nil, plumbing.ZeroHash, fmt.Errorf("%s: %w", s, err)
	}
	// A full commit id pins the content, whichever repository holds it:
	// every object is checked against its id. Any other REF is only as
	// trustworthy as the repository it is looked up in.
	if _, err := parseHash(s.Ref); err != nil {
		if err := r.checkPlacement(); err != nil {
			return nil, nil, plumbing.ZeroHash, fmt.Errorf("%s: %w", s, err)
		}
	}
	h, err := r.resolve(s.Ref)
	if err != nil {
		return nil, nil, h, fmt.Errorf("%s: %w", s, err)
	}
	data, err := r.file(h, s.Path)
	if err != nil {
		return nil, nil, h, fmt.Errorf("%s: %w", s, err)
	}
	return r, data, h, nil
}

// TopLevel returns the top directory of the working tree dir is in.
func TopLevel(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	r, err := openRepo(abs)
	if err != nil {
		return "", fmt.Errorf("%s: %w", abs, err)
	}
	return r.top, nil
}

// refPatterns is the order in which git looks a short name up
// (gitrevisions(7)).
var refPatterns = []string{"%s", "refs/%s", "refs/tags/%s", "refs/heads/%s", "refs/remotes/%s", "refs/remotes/%s/HEAD"}

// resolve turns REF into a commit id, peeling annotated tags.
func (r *repo) resolve(ref string) (plumbing.Hash, error) {
	h, err := r.lookup(ref)
	if err != nil {
		return h, err
	}
	for range 10 {
		t, data, err := r.object(h)
		if err != nil {
			return h, fmt.Errorf("ref %q: %w", ref, err)
		}
		switch t {
		case plumbing.CommitObject:
			return h, nil
		case plumbing.TagObject:
			target, ok := header(data, "object")
			if h, err = parseHash(target); !ok || err != nil {
				return h, fmt.Errorf("ref %q: tag %s names no object", ref, h)
			}
		default:
			return h, fmt.Errorf("ref %q names a %s, not a commit", ref, t)
		}
	}
	return h, fmt.Errorf("ref %q: too many nested tags", ref)
}

func (r *repo) lookup(ref string) (plumbing.Hash, error) {
	if h, err := parseHash(ref); err == nil {
		if _, _, err := r.object(h); err != nil {
			return h, fmt.Errorf("commit %s is not in the repository at %s: %w; fetch it, or check the id", ref, r.commonDir, err)
		}
		return h, nil
	}
	var tried []string
	for _, p := range refPatterns {
		name := fmt.Sprintf(p, ref)
		if !validRefName(name) {
			continue
		}
		// Of the names at the top of the git directory only HEAD-like
		// ones are refs: "config" or "index" are other files.
		if p == "%s" && !isPseudoRef(name) && !strings.HasPrefix(name, "refs/") {
			continue
		}
		tried = append(tried, name)
		h, ok, err := r.ref(name)
		if err != nil {
			return h, err
		}
		if ok {
			return h, nil
		}
	}
	if isHex(ref) && len(ref) >= 4 {
		ids, err := r.withPrefix(strings.ToLower(ref))
		if err != nil {
			return plumbing.ZeroHash, err
		}
		switch len(ids) {
		case 1:
			return ids[0], nil
		case 0:
		default:
			return plumbing.ZeroHash, fmt.Errorf("commit id %q is ambiguous (%d objects start with it); give more of it", ref, len(ids))
		}
		tried = append(tried, "objects whose id starts with "+ref)
	}
	if len(tried) == 0 {
		return plumbing.ZeroHash, fmt.Errorf("%q is not a valid ref name", ref)
	}
	return plumbing.ZeroHash, fmt.Errorf("ref %q does not exist in the repository at %s (looked for %s); check the name with 'git branch -a' or 'git tag', or fetch it", ref, r.commonDir, strings.Join(tried, ", "))
}

func isPseudoRef(name string) bool {
	for _, c := range name {
		if (c < 'A' || c > 'Z') && c != '_' {
			return false
		}
	}
	return strings.HasSuffix(name, "HEAD")
}

func isHex(s string) bool {
	for _, c := range strings.ToLower(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}

// file reads the blob at p in the commit's tree.
func (r *repo) file(commit plumbing.Hash, p string) ([]byte, error) {
	_, data, err := r.object(commit)
	if err != nil {
		return nil, err
	}
	tree, ok := header(data, "tree")
	h, err := parseHash(tree)
	if !ok || err != nil {
		return nil, fmt.Errorf("commit %s has no tree", commit)
	}
	parts := strings.Split(p, "/")
	for i, name := range parts {
		t, data, err := r.object(h)
		if err != nil {
			return nil, err
		}
		if t != plumbing.TreeObject {
			return nil, fmt.Errorf("%s at commit %s: %s is not a directory", p, commit, strings.Join(parts[:i], "/"))
		}
		mode, next, found, err := treeEntry(data, name)
		if err != nil {
			return nil, fmt.Errorf("tree %s: %w", h, err)
		}
		if !found {
			return nil, fmt.Errorf("%s does not exist at commit %s (the path is from the repository's top directory; list the files with 'git ls-tree -r --name-only %s')", p, commit, commit.String()[:12])
		}
		h = next
		last := i == len(parts)-1
		switch {
		case last && mode == "120000":
			return nil, fmt.Errorf("%s at commit %s is a symbolic link; name the file it points to", p, commit)
		case last && mode != "100644" && mode != "100755":
			return nil, fmt.Errorf("%s at commit %s is not a file (mode %s)", p, commit, mode)
		case !last && mode != "40000":
			return nil, fmt.Errorf("%s at commit %s: %s is not a directory", p, commit, strings.Join(parts[:i+1], "/"))
		}
	}
	t, data, err := r.object(h)
	if err != nil {
		return nil, err
	}
	if t != plumbing.BlobObject {
		return nil, fmt.Errorf("%s at commit %s is a %s, not a file", p, commit, t)
	}
	if len(data) > maxPolicy {
		return nil, fmt.Errorf("%s at commit %s is %d bytes; a policy is at most %d", p, commit, len(data), maxPolicy)
	}
	return data, nil
}
