package gitsrc

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/objfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
)

// Only go-git's object-format packages are used, not its repository or
// storage layers: those pull in its config, URL and OpenPGP packages,
// whose init functions would cost every `corral run` a few milliseconds
// whether or not its policy comes from git.

// maxObject bounds what is read of any one object (a tree of a very large
// directory is the biggest thing on the way to a policy file).
const maxObject = 64 << 20

// repo is the object database and refs of one repository.
type repo struct {
	// top is the working tree's top directory, where .git is.
	top string
	// gitDir holds HEAD; commonDir holds refs, packed-refs and objects
	// (they differ for a linked worktree).
	gitDir, commonDir string
	objectDirs        []string
	packs             []*pack // nil until the first lookup misses the loose objects
	packsRead         bool
}

type pack struct {
	path string
	idx  *idxfile.MemoryIndex
}

var errNoRepo = errors.New("not inside a git repository")

// openRepo finds the repository that dir is in, walking up like git
// does, and follows a .git file (linked worktrees, submodules) and a
// commondir file.
func openRepo(dir string) (*repo, error) {
	for d := dir; ; {
		gitDir, err := dotGit(d)
		if err != nil {
			return nil, err
		}
		if gitDir != "" {
			r, err := newRepo(gitDir)
			if err != nil {
				return nil, err
			}
			r.top = d
			return r, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return nil, errNoRepo
		}
		d = parent
	}
}

// checkPlacement refuses a repository that a sandbox could have put in
// the place where it was found. A sandbox writes its working directory: it
// can plant a repository there when the working directory lies below the
// real repository's top (the walk up finds the nearest .git), or repoint a
// .git that is a symbolic link (the plan protects the link's target, not
// the link). A .git file of a submodule, whose git directory lies in the
// enclosing repository's, is not one of those.
func (r *repo) checkPlacement() error {
	link := filepath.Join(r.top, ".git")
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symbolic link, which a sandbox that can write %s could point at a repository of its own; make it a directory or a \"gitdir:\" file, or pin REF to a full commit id", link, r.top)
	}
	for d := filepath.Dir(r.top); ; d = filepath.Dir(d) {
		outer, err := dotGit(d)
		if err != nil {
			return err
		}
		if outer != "" {
			if within(r.gitDir, outer) {
				return nil
			}
			return fmt.Errorf("the repository at %s lies inside the working tree of the repository at %s, where a sandbox working below %s could have made it; run corral from %s or pin REF to a full commit id", r.top, d, d, d)
		}
		if filepath.Dir(d) == d {
			return nil
		}
	}
}

// within reports whether p is dir or below it, symbolic links resolved.
func within(p, dir string) bool {
	rp, err1 := filepath.EvalSymlinks(p)
	rd, err2 := filepath.EvalSymlinks(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(rd, rp)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// dotGit returns the git directory named by d/.git, or "" if there is none.
func dotGit(d string) (string, error) {
	p := filepath.Join(d, ".git")
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("look for a repository: %w", err)
	case fi.IsDir():
		return p, nil
	}
	data, err := readSmall(p)
	if err != nil {
		return "", err
	}
	target, ok := strings.CutPrefix(strings.TrimSpace(string(data)), "gitdir:")
	if !ok {
		return "", fmt.Errorf("%s is a file without a \"gitdir:\" line", p)
	}
	target = strings.TrimSpace(target)
	if !filepath.IsAbs(target) {
		target = filepath.Join(d, target)
	}
	return target, nil
}

func newRepo(gitDir string) (*repo, error) {
	if _, err := os.Stat(filepath.Join(gitDir, "HEAD")); err != nil {
		return nil, fmt.Errorf("%s is not a git directory: %w", gitDir, err)
	}
	r := &repo{gitDir: gitDir, commonDir: gitDir}
	if data, err := readSmall(filepath.Join(gitDir, "commondir")); err == nil {
		c := strings.TrimSpace(string(data))
		if !filepath.IsAbs(c) {
			c = filepath.Join(gitDir, c)
		}
		r.commonDir = c
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	objects := filepath.Join(r.commonDir, "objects")
	r.objectDirs = []string{objects}
	// Alternates (clone --shared/--reference): one level, as git reads
	// them for a lookup.
	if data, err := readSmall(filepath.Join(objects, "info", "alternates")); err == nil {
		for line := range strings.Lines(string(data)) {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if !filepath.IsAbs(line) {
				line = filepath.Join(objects, line)
			}
			r.objectDirs = append(r.objectDirs, line)
		}
	}
	return r, nil
}

// readSmall reads a file that git keeps small (refs, .git files).
func readSmall(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return data, nil
}

// ref returns the object a ref names, following symbolic refs, or
// ok=false if there is no such ref.
func (r *repo) ref(name string) (h plumbing.Hash, ok bool, err error) {
	for range 10 {
		if !validRefName(name) {
			return h, false, fmt.Errorf("invalid ref name %q", name)
		}
		dir := r.commonDir
		if !strings.HasPrefix(name, "refs/") {
			dir = r.gitDir // HEAD and the other pseudo-refs are per worktree
		}
		data, err := readSmall(filepath.Join(dir, filepath.FromSlash(name)))
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.EISDIR):
			h, ok, err := r.packedRef(name)
			return h, ok, err
		case err != nil:
			return h, false, err
		}
		s := strings.TrimSpace(string(data))
		if target, sym := strings.CutPrefix(s, "ref:"); sym {
			name = strings.TrimSpace(target)
			continue
		}
		h, err := parseHash(s)
		if err != nil {
			return h, false, fmt.Errorf("ref %s: %w", name, err)
		}
		return h, true, nil
	}
	return h, false, fmt.Errorf("ref %s: too many levels of symbolic refs", name)
}

func (r *repo) packedRef(name string) (h plumbing.Hash, ok bool, err error) {
	f, err := os.Open(filepath.Join(r.commonDir, "packed-refs"))
	if errors.Is(err, fs.ErrNotExist) {
		return h, false, nil
	}
	if err != nil {
		return h, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || line[0] == '^' {
			continue
		}
		hexID, ref, found := strings.Cut(line, " ")
		if !found || ref != name {
			continue
		}
		h, err := parseHash(hexID)
		if err != nil {
			return h, false, fmt.Errorf("packed-refs %s: %w", name, err)
		}
		return h, true, nil
	}
	if err := sc.Err(); err != nil {
		return h, false, fmt.Errorf("read packed-refs: %w", err)
	}
	return h, false, nil
}

// validRefName keeps a ref name from reaching outside the git directory
// (a symbolic ref's target comes from the repository, which the workload
// may be able to write).
func validRefName(name string) bool {
	if name == "" || strings.ContainsAny(name, "\x00\\:?*[ ~^") {
		return false
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == "" || c[0] == '.' || strings.HasSuffix(c, ".lock") {
			return false
		}
	}
	return true
}

func parseHash(s string) (plumbing.Hash, error) {
	var h plumbing.Hash
	if len(s) != 2*len(h) {
		return h, fmt.Errorf("%q is not a commit id", s)
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("%q is not a commit id", s)
	}
	return h, nil
}

// object returns an object's type and content, after checking that the
// content hashes to h: without that check a forged object file placed
// under a trusted commit id would be read as that commit.
func (r *repo) object(h plumbing.Hash) (plumbing.ObjectType, []byte, error) {
	t, data, err := r.rawObject(h)
	if err != nil {
		return t, nil, err
	}
	if got := plumbing.ComputeHash(t, data); got != h {
		return t, nil, fmt.Errorf("object %s is corrupt or was tampered with: its content hashes to %s", h, got)
	}
	return t, data, nil
}

func (r *repo) rawObject(h plumbing.Hash) (plumbing.ObjectType, []byte, error) {
	hx := h.String()
	for _, dir := range r.objectDirs {
		f, err := os.Open(filepath.Join(dir, hx[:2], hx[2:]))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		defer f.Close()
		return readLoose(f, h)
	}
	if err := r.readPacks(); err != nil {
		return 0, nil, err
	}
	for _, p := range r.packs {
		if ok, _ := p.idx.Contains(h); ok {
			return p.read(h)
		}
	}
	return 0, nil, fmt.Errorf("object %s: %w", h, plumbing.ErrObjectNotFound)
}

func readLoose(f io.Reader, h plumbing.Hash) (plumbing.ObjectType, []byte, error) {
	or, err := objfile.NewReader(f)
	if err != nil {
		return 0, nil, fmt.Errorf("object %s: %w", h, err)
	}
	defer or.Close()
	t, size, err := or.Header()
	if err != nil {
		return 0, nil, fmt.Errorf("object %s: %w", h, err)
	}
	if size > maxObject {
		return 0, nil, fmt.Errorf("object %s is %d bytes, more than corral reads (%d)", h, size, maxObject)
	}
	data, err := io.ReadAll(io.LimitReader(or, size))
	if err != nil {
		return 0, nil, fmt.Errorf("object %s: %w", h, err)
	}
	return t, data, nil
}

// readPacks loads the index of every pack once.
func (r *repo) readPacks() error {
	if r.packsRead {
		return nil
	}
	r.packsRead = true
	for _, dir := range r.objectDirs {
		idxs, err := filepath.Glob(filepath.Join(dir, "pack", "*.idx"))
		if err != nil {
			return err
		}
		for _, p := range idxs {
			idx, err := readIndex(p)
			if err != nil {
				return err
			}
			r.packs = append(r.packs, &pack{path: strings.TrimSuffix(p, ".idx") + ".pack", idx: idx})
		}
	}
	return nil
}

func readIndex(p string) (*idxfile.MemoryIndex, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	idx := idxfile.NewMemoryIndex()
	if err := idxfile.NewDecoder(bufio.NewReader(f)).Decode(idx); err != nil {
		return nil, fmt.Errorf("pack index %s: %w", p, err)
	}
	return idx, nil
}

func (p *pack) read(h plumbing.Hash) (plumbing.ObjectType, []byte, error) {
	f, err := os.Open(p.path)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	// With no filesystem, the pack gives in-memory objects.
	obj, err := packfile.NewPackfile(p.idx, nil, packFile{f}, 0).Get(h)
	if err != nil {
		return 0, nil, fmt.Errorf("object %s in %s: %w", h, filepath.Base(p.path), err)
	}
	if obj.Size() > maxObject {
		return 0, nil, fmt.Errorf("object %s is %d bytes, more than corral reads (%d)", h, obj.Size(), maxObject)
	}
	rd, err := obj.Reader()
	if err != nil {
		return 0, nil, fmt.Errorf("object %s: %w", h, err)
	}
	defer rd.Close()
	data, err := io.ReadAll(io.LimitReader(rd, maxObject))
	if err != nil {
		return 0, nil, fmt.Errorf("object %s: %w", h, err)
	}
	return obj.Type(), data, nil
}

// packFile is the billy.File the pack reader wants; it only reads.
type packFile struct{ *os.File }

func (packFile) Lock() error   { return nil }
func (packFile) Unlock() error { return nil }

// withPrefix returns every object id starting with the hex prefix.
func (r *repo) withPrefix(prefix string) ([]plumbing.Hash, error) {
	seen := map[plumbing.Hash]bool{}
	var out []plumbing.Hash
	add := func(h plumbing.Hash) {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, dir := range r.objectDirs {
		ents, err := os.ReadDir(filepath.Join(dir, prefix[:2]))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix[2:]) {
				if h, err := parseHash(prefix[:2] + e.Name()); err == nil {
					add(h)
				}
			}
		}
	}
	if err := r.readPacks(); err != nil {
		return nil, err
	}
	for _, p := range r.packs {
		it, err := p.idx.Entries()
		if err != nil {
			return nil, err
		}
		for {
			e, err := it.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				it.Close()
				return nil, err
			}
			if strings.HasPrefix(e.Hash.String(), prefix) {
				add(e.Hash)
			}
		}
		it.Close()
	}
	return out, nil
}

// header returns the value of the first header line of a commit or tag
// named key ("tree", "object").
func header(data []byte, key string) (string, bool) {
	for line := range bytes.Lines(data) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(line) == 0 {
			break // the message starts
		}
		if v, ok := bytes.CutPrefix(line, []byte(key+" ")); ok {
			return string(v), true
		}
	}
	return "", false
}

// treeEntry finds name in a tree object.
func treeEntry(data []byte, name string) (mode string, h plumbing.Hash, ok bool, err error) {
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		nul := bytes.IndexByte(data, 0)
		if sp < 0 || nul < sp || nul+1+len(h) > len(data) {
			return "", h, false, errors.New("malformed tree object")
		}
		m, n := string(data[:sp]), string(data[sp+1:nul])
		copy(h[:], data[nul+1:])
		data = data[nul+1+len(h):]
		if n == name {
			return m, h, true, nil
		}
	}
	return "", h, false, nil
}
