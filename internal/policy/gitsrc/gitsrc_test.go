package gitsrc

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

const policyPath = ".corral/policy.yaml"

func policyText(host string) string {
	return "version: 1\nnetwork:\n  allow: [\"" + host + ":443\"]\n"
}

// fixture is a repository built by go-git: main has two commits (v1 then
// v2 of the policy), branch "other" a third (v3), tag "v1" (annotated)
// and "light" (lightweight) point at the first commit, origin/main at
// the second; the working tree holds an uncommitted fourth version.
type fixture struct {
	dir                  string
	repo                 *git.Repository
	first, second, third plumbing.Hash
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	r, err := git.PlainInitWithOptions(dir, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName("main")}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{dir: dir, repo: r}
	f.first = f.commit(t, policyText("one.test"), "first")
	f.second = f.commit(t, policyText("two.test"), "second")
	sig := &object.Signature{Name: "t", Email: "t@example.invalid", When: time.Unix(1700000000, 0)}
	if _, err := r.CreateTag("v1", f.first, &git.CreateTagOptions{Message: "v1", Tagger: sig}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.CreateTag("light", f.first, nil); err != nil {
		t.Fatal(err)
	}
	f.setRef(t, "refs/remotes/origin/main", f.second)
	wt, err := r.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if err := wt.Checkout(&git.CheckoutOptions{Branch: "refs/heads/other", Create: true}); err != nil {
		t.Fatal(err)
	}
	f.third = f.commit(t, policyText("three.test"), "third")
	if err := wt.Checkout(&git.CheckoutOptions{Branch: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	f.write(t, policyText("worktree.test"))
	return f
}

func (f *fixture) write(t *testing.T, text string) {
	t.Helper()
	p := filepath.Join(f.dir, policyPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) commit(t *testing.T, text, msg string) plumbing.Hash {
	t.Helper()
	f.write(t, text)
	wt, err := f.repo.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wt.Add(policyPath); err != nil {
		t.Fatal(err)
	}
	h, err := wt.Commit(msg, &git.CommitOptions{Author: &object.Signature{Name: "t", Email: "t@example.invalid", When: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (f *fixture) setRef(t *testing.T, name string, h plumbing.Hash) {
	t.Helper()
	if err := f.repo.Storer.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(name), h)); err != nil {
		t.Fatal(err)
	}
}

// pack moves every ref into packed-refs and every object into a pack
// (deltified), removing the loose copies.
func (f *fixture) pack(t *testing.T) {
	t.Helper()
	if err := f.repo.Storer.PackRefs(); err != nil {
		t.Fatal(err)
	}
	if err := f.repo.RepackObjects(&git.RepackConfig{}); err != nil {
		t.Fatal(err)
	}
	loose, _ := filepath.Glob(filepath.Join(f.dir, ".git", "objects", "[0-9a-f][0-9a-f]"))
	for _, d := range loose {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	if refs, _ := filepath.Glob(filepath.Join(f.dir, ".git", "refs", "heads", "*")); len(refs) != 0 {
		t.Fatalf("loose refs left after packing: %v", refs)
	}
}

func TestLoadRefs(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		ref    string
		host   string
		commit plumbing.Hash
	}{
		{"HEAD", "two.test", f.second},
		{"main", "two.test", f.second},
		{"refs/heads/main", "two.test", f.second},
		{"heads/main", "two.test", f.second},
		{"other", "three.test", f.third},
		{"origin/main", "two.test", f.second},
		{"v1", "one.test", f.first},
		{"light", "one.test", f.first},
		{f.first.String(), "one.test", f.first},
		{f.third.String()[:7], "three.test", f.third},
		{strings.ToUpper(f.third.String()[:10]), "three.test", f.third},
	}
	for _, packed := range []bool{false, true} {
		if packed {
			f.pack(t)
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("packed=%v/%s", packed, c.ref), func(t *testing.T) {
				data, commit, file, err := Load(f.dir, "git:"+c.ref+":"+policyPath)
				if err != nil {
					t.Fatal(err)
				}
				if string(data) != policyText(c.host) {
					t.Errorf("read %q, want the version with %s", data, c.host)
				}
				if commit != c.commit.String() || file != policyPath {
					t.Errorf("commit %s file %s, want %s %s", commit, file, c.commit, policyPath)
				}
			})
		}
	}
}

func TestLoadFromSubdirectoryAndLinkedWorktree(t *testing.T) {
	f := newFixture(t)
	sub := filepath.Join(f.dir, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if data, _, _, err := Load(sub, "git:main:"+policyPath); err != nil || string(data) != policyText("two.test") {
		t.Fatalf("from a subdirectory: %q, %v", data, err)
	}

	// A linked worktree as `git worktree add` lays it out: a .git file
	// naming .git/worktrees/NAME, which holds its own HEAD and a
	// commondir pointing back at the shared directory.
	wt := filepath.Join(t.TempDir(), "wt")
	admin := filepath.Join(f.dir, ".git", "worktrees", "wt")
	for p, text := range map[string]string{
		filepath.Join(wt, ".git"):         "gitdir: " + admin + "\n",
		filepath.Join(admin, "HEAD"):      "ref: refs/heads/other\n",
		filepath.Join(admin, "commondir"): "../..\n",
		filepath.Join(admin, "gitdir"):    filepath.Join(wt, ".git") + "\n",
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.pack(t)
	data, commit, _, err := Load(wt, "git:HEAD:"+policyPath)
	if err != nil || string(data) != policyText("three.test") || commit != f.third.String() {
		t.Fatalf("worktree HEAD: %q %s, %v", data, commit, err)
	}
	if data, _, _, err := Load(wt, "git:main:"+policyPath); err != nil || string(data) != policyText("two.test") {
		t.Fatalf("worktree main: %q, %v", data, err)
	}

	// A submodule's .git file names a relative directory, without commondir.
	mod := filepath.Join(f.dir, "mod")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mod, ".git"), []byte("gitdir: ../.git\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if data, _, _, err := Load(mod, "git:v1:"+policyPath); err != nil || string(data) != policyText("one.test") {
		t.Fatalf("relative gitdir: %q, %v", data, err)
	}
}

func TestLoadErrors(t *testing.T) {
	f := newFixture(t)
	if err := os.MkdirAll(filepath.Join(f.dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	notRepo := t.TempDir()
	cases := []struct {
		name, workdir, spec string
		want                string // a regexp the error must match
	}{
		{"missing ref", f.dir, "git:nope:" + policyPath, `ref "nope" does not exist in the repository at .*looked for refs/nope, refs/tags/nope, refs/heads/nope, refs/remotes/nope, refs/remotes/nope/HEAD.*git branch -a`},
		{"missing remote", f.dir, "git:upstream/main:" + policyPath, `ref "upstream/main" does not exist.*fetch it`},
		{"missing commit", f.dir, "git:" + strings.Repeat("ab", 20) + ":" + policyPath, `commit abab.* is not in the repository`},
		{"missing short id", f.dir, "git:deadbeef:" + policyPath, `ref "deadbeef" does not exist.*objects whose id starts with deadbeef`},
		{"missing path", f.dir, "git:main:nope.yaml", `nope.yaml does not exist at commit ` + f.second.String() + `.*git ls-tree -r --name-only`},
		{"path only in the working tree", f.dir, "git:v1:empty/p.yaml", `empty/p.yaml does not exist at commit`},
		{"directory", f.dir, "git:main:.corral", `\.corral at commit .* is not a file`},
		{"file as directory", f.dir, "git:main:.corral/policy.yaml/x", `\.corral/policy.yaml is not a directory`},
		{"not a repository", notRepo, "git:main:" + policyPath, regexp.QuoteMeta(notRepo) + ` is not inside a git repository.*--workdir`},
		{"no path", f.dir, "git:main", `named git:REF:PATH`},
		{"empty ref", f.dir, "git::" + policyPath, `named git:REF:PATH`},
		{"path escapes", f.dir, "git:main:../x", `PATH must be`},
		{"absolute path", f.dir, "git:main:/etc/passwd", `PATH must be`},
		{"ref escapes", f.dir, "git:../../../etc:" + policyPath, `not a valid ref name`},
		{"config is no ref", f.dir, "git:config:" + policyPath, `ref "config" does not exist`},
		{"tree id", f.dir, "git:" + treeOf(t, f, f.first).String() + ":" + policyPath, `names a tree, not a commit`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, err := Load(c.workdir, c.spec)
			if err == nil {
				t.Fatal("loaded")
			}
			if !regexp.MustCompile(c.want).MatchString(err.Error()) {
				t.Errorf("error %q does not match %q", err, c.want)
			}
		})
	}
}

func treeOf(t *testing.T, f *fixture, h plumbing.Hash) plumbing.Hash {
	c, err := f.repo.CommitObject(h)
	if err != nil {
		t.Fatal(err)
	}
	return c.TreeHash
}

// TestForgedObjectIsRefused is the attack a workload with write access to
// .git could make on a pinned commit id: replace the object file of that
// commit (or of the policy blob in it) with other content. The ids no
// longer match the content, and the load fails instead of reading the
// forged policy.
func TestForgedObjectIsRefused(t *testing.T) {
	for _, target := range []string{"commit", "blob"} {
		t.Run(target, func(t *testing.T) {
			f := newFixture(t)
			spec := "git:" + f.first.String() + ":" + policyPath
			victim := f.first
			forged := commitText(treeOf(t, f, f.third)) // a commit whose tree holds three.test
			typ := "commit"
			if target == "blob" {
				c, _ := f.repo.CommitObject(f.first)
				file, err := c.File(policyPath)
				if err != nil {
					t.Fatal(err)
				}
				victim, typ, forged = file.Hash, "blob", policyText("evil.test")
			}
			if _, _, _, err := Load(f.dir, spec); err != nil {
				t.Fatalf("before the forgery: %v", err)
			}
			writeLoose(t, f.dir, victim, typ, forged)
			data, _, _, err := Load(f.dir, spec)
			if err == nil {
				t.Fatalf("read the forged %s: %q", target, data)
			}
			if !strings.Contains(err.Error(), "tampered") {
				t.Errorf("error %q does not say the object was tampered with", err)
			}
		})
	}
}

func commitText(tree plumbing.Hash) string {
	return "tree " + tree.String() + "\nauthor x <x@x> 1700000000 +0000\ncommitter x <x@x> 1700000000 +0000\n\nforged\n"
}

// writeLoose stores content as the loose object h, whatever it hashes to.
func writeLoose(t *testing.T, dir string, h plumbing.Hash, typ, content string) {
	t.Helper()
	var buf bytes.Buffer
	z := zlib.NewWriter(&buf)
	fmt.Fprintf(z, "%s %d\x00%s", typ, len(content), content)
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, ".git", "objects", h.String()[:2], h.String()[2:])
	_ = os.Chmod(p, 0o644)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseSpecAndCommit(t *testing.T) {
	s, err := ParseSpec("git:origin/main:./.corral//policy.yaml")
	if err != nil || s.Ref != "origin/main" || s.Path != ".corral/policy.yaml" {
		t.Fatalf("%+v %v", s, err)
	}
	id := strings.Repeat("0a", 20)
	src := s.Source(id)
	if src != "git:origin/main:.corral/policy.yaml@"+id || Commit(src) != id {
		t.Fatalf("source %s commit %s", src, Commit(src))
	}
	for _, notGit := range []string{"/etc/policy.yaml", "p@" + id, "git:main:p.yaml", ""} {
		if c := Commit(notGit); c != "" {
			t.Errorf("Commit(%q) = %q", notGit, c)
		}
	}
}

func TestLoadPolicySource(t *testing.T) {
	f := newFixture(t)
	p, err := LoadPolicy(f.dir, "git:v1:"+policyPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := "git:v1:" + policyPath + "@" + f.first.String(); p.Source != want {
		t.Errorf("source %q, want %q", p.Source, want)
	}
	if len(p.Network.Allow) != 1 || !strings.HasPrefix(p.Network.Allow[0], "one.test") {
		t.Errorf("allow %v, want the committed one.test", p.Network.Allow)
	}
	f.commit(t, "version: 1\nbogus: true\n", "broken")
	if _, err := LoadPolicy(f.dir, "git:main:"+policyPath); err == nil || !strings.HasPrefix(err.Error(), "load policy git:main:"+policyPath+"@") || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("invalid committed policy: %v", err)
	}
}

// TestForPlanProtectsTheRepository: the git files a sandbox would see
// writable become read-only paths of the policy; those it would not see
// stay out of it.
func TestForPlanProtectsTheRepository(t *testing.T) {
	f := newFixture(t)
	dir, err := filepath.EvalSymlinks(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	added := func(workdir string, ref ...string) []string {
		t.Helper()
		spec := "git:" + append(ref, "main")[0] + ":" + policyPath
		plain, err := LoadPolicy(workdir, spec)
		if err != nil {
			t.Fatal(err)
		}
		sha := plain.SHA256()
		p, err := ForPlan(plain, workdir, spec)
		if err != nil {
			t.Fatal(err)
		}
		if plain.SHA256() != sha {
			t.Error("ForPlan changed the policy it was given")
		}
		var out []string
		for _, ro := range p.FilesystemPolicy.ReadOnly {
			if !slices.Contains(plain.FilesystemPolicy.ReadOnly, ro) {
				out = append(out, ro)
			}
		}
		return out
	}
	gitDir := []string{filepath.Join(dir, ".git")}
	if got := added(dir); !slices.Equal(got, gitDir) {
		t.Errorf("read-only paths added %v, want %v", got, gitDir)
	}
	// A commit id cannot be moved: nothing needs protecting.
	if got := added(dir, f.second.String()); len(got) != 0 {
		t.Errorf("with a commit id: read-only paths added %v", got)
	}
	// From a subdirectory as the working directory, the repository's .git
	// is outside the sandbox and must not be mounted into it.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := added(sub); len(got) != 0 {
		t.Errorf("from a subdirectory: read-only paths added %v", got)
	}
	// The repository as a read_write path is protected too.
	f.commit(t, "version: 1\nfilesystem_policy:\n  include_workdir: false\n  read_write: ["+dir+"]\n", "rw")
	if got := added(sub); !slices.Equal(got, gitDir) {
		t.Errorf("with the repository as a read_write path: read-only paths added %v, want %v", got, gitDir)
	}
}

// A sandbox writes its working directory. When that lies below the
// repository's top, it can plant a repository of its own there, which the
// walk up from the next run's working directory finds first; when .git is
// a symbolic link, it can repoint it. A REF looked up there would be the
// sandbox's choice, so such a repository is refused unless REF is a full
// commit id, whose objects are checked whatever holds them.
func TestLoadRefusesRepositoriesASandboxCouldPlant(t *testing.T) {
	f := newFixture(t)
	pkg := filepath.Join(f.dir, "pkg")
	planted, err := git.PlainInitWithOptions(pkg, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName("main")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(pkg, ".corral"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, policyPath), []byte(policyText("forged.test")), 0o644); err != nil {
		t.Fatal(err)
	}
	wt, err := planted.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wt.Add(policyPath); err != nil {
		t.Fatal(err)
	}
	forged, err := wt.Commit("forged", &git.CommitOptions{Author: &object.Signature{Name: "t", Email: "t@example.invalid", When: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	if data, _, _, err := Load(pkg, "git:main:"+policyPath); err == nil || !strings.Contains(err.Error(), "inside the working tree of the repository at "+f.dir) {
		t.Fatalf("nested repository: %q, %v; want a refusal naming %s", data, err, f.dir)
	}
	if data, _, _, err := Load(pkg, "git:"+forged.String()+":"+policyPath); err != nil || string(data) != policyText("forged.test") {
		t.Fatalf("nested repository, full commit id: %q, %v", data, err)
	}

	top := filepath.Join(t.TempDir(), "top")
	if err := os.MkdirAll(top, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(f.dir, ".git"), filepath.Join(top, ".git")); err != nil {
		t.Fatal(err)
	}
	if data, _, _, err := Load(top, "git:main:"+policyPath); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Fatalf("symlinked .git: %q, %v; want a refusal", data, err)
	}
	if data, _, _, err := Load(top, "git:"+f.second.String()+":"+policyPath); err != nil || string(data) != policyText("two.test") {
		t.Fatalf("symlinked .git, full commit id: %q, %v", data, err)
	}
}
