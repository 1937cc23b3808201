package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// gitPolicyScript fetches from the host only the committed policy allows
// and from the host only the working tree's copy allows (a path per mode:
// the modes share the lab).
const gitPolicyScript = `curl -sf -m 10 http://ref.test/committed-%[1]s; echo " ref=$?"
curl -sf -m 10 http://tree.test/edited-%[1]s; echo " tree=$?"
`

// TestGitPolicy: --policy git:main:PATH enforces the policy committed on
// main, not the working tree's copy of the file, which the workload can
// edit; sandbox.start names the commit; a ref that does not exist fails
// the run before anything starts.
func TestGitPolicy(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "ref.test", Addr: netip.MustParseAddr("203.0.113.50")},
		netlab.Host{Name: "tree.test", Addr: netip.MustParseAddr("203.0.113.51")})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		const rel = ".corral/policy.yaml"
		committed := proxyPolicy("  allow: [\"ref.test:80\"]\n")
		edited := proxyPolicy("  allow: [\"tree.test:80\"]\n")
		commit := commitPolicy(t, fx.W, rel, committed)
		// The working tree now holds another policy, as a workload that
		// edited the file would leave it.
		if err := os.WriteFile(filepath.Join(fx.W, rel), []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(fx.W, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		run := func(policy string) *result {
			return runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", fmt.Sprintf(gitPolicyScript, m.name)}, timeout: 90 * time.Second,
				flags: []string{"--policy", policy, "--upstream-dns", lab.DNS.String()}})
		}

		r := run("git:main:" + rel)
		if r.code != 0 {
			t.Fatalf("run with the committed policy failed\n%s", r)
		}
		if !strings.Contains(r.stdout, "hello from ref.test GET /committed-"+m.name+" ref=0") {
			t.Errorf("the host the committed policy allows was not reached:\n%s", r)
		}
		if strings.Contains(r.stdout, "tree=0") || strings.Contains(r.stdout, "hello from tree.test") {
			t.Errorf("the host only the working tree's policy allows was reached:\n%s", r)
		}
		r.requireEvent(t, "sandbox.start", map[string]any{"policy_commit": commit.String()})
		for _, s := range lab.HTTPRequests() {
			if s.Path == "/edited-"+m.name {
				t.Errorf("the lab served %s %s for tree.test", s.Method, s.Path)
			}
		}

		// Positive control: the same run with the working tree's file as
		// a path reaches tree.test, so the refusal above came from the
		// policy's source, not from the lab.
		r = run(filepath.Join(fx.W, rel))
		if !strings.Contains(r.stdout, "hello from tree.test GET /edited-"+m.name+" tree=0") {
			t.Errorf("control: the working tree's policy did not allow tree.test:\n%s", r)
		}
		if got := r.find("sandbox.start"); len(got) != 1 || got[0]["policy_commit"] != nil {
			t.Errorf("control: sandbox.start of a policy from a path: %v", got)
		}

		r = run("git:nope:" + rel)
		if r.code != 125 {
			t.Errorf("a missing ref: exit %d, want 125\n%s", r.code, r)
		}
		if !strings.Contains(r.stderr, `ref "nope" does not exist`) || !strings.Contains(r.stderr, "refs/heads/nope") {
			t.Errorf("a missing ref: stderr does not say what was looked for:\n%s", r.stderr)
		}
		if len(r.find("sandbox.start")) != 0 || len(r.find("sandbox.compile_error")) != 1 {
			t.Errorf("a missing ref: want one sandbox.compile_error and no start:\n%s", r.eventsText())
		}
	})
}

// commitPolicy commits text at rel on the main branch of the repository
// in dir, made by go-git if there is none yet.
func commitPolicy(t *testing.T, dir, rel, text string) plumbing.Hash {
	t.Helper()
	r, err := git.PlainInitWithOptions(dir, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName("main")}})
	if errors.Is(err, git.ErrRepositoryAlreadyExists) {
		r, err = git.PlainOpen(dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	wt, err := r.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wt.Add(rel); err != nil {
		t.Fatal(err)
	}
	h, err := wt.Commit("policy", &git.CommitOptions{Author: &object.Signature{Name: "t", Email: "t@example.invalid", When: time.Now()}})
	if err != nil {
		t.Fatal(fmt.Errorf("commit %s: %w", rel, err))
	}
	return h
}

// gitTamperScript is what a workload that wants a wider policy next time
// would do to the repository its policy is read from: commit the wider
// policy on the branch, and failing that, replace the repository by one
// whose main holds it. The working tree itself stays writable.
const gitTamperScript = `g() { git -c user.name=agent -c user.email=agent@example.invalid -c safe.directory='*' "$@"; }
touch wd-writable && echo "workdir=ok"
g commit -qam widen 2>&1; echo "commit=$?"
mv .git .git-old 2>&1 && g init -q -b main 2>&1 && g add .corral/policy.yaml && g commit -qm forged 2>&1; echo "replace=$?"
`

// TestGitPolicyWorkloadCannotMoveRef: a workload running under a policy
// from git:main cannot change what git:main gives the next run, though
// the repository is in its (writable) working directory.
func TestGitPolicyWorkloadCannotMoveRef(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/usr/bin/git"); err != nil {
		requireFeature(t, "needs /usr/bin/git (apt-get install git)")
	}
	lab := netlab.Start(t,
		netlab.Host{Name: "ref.test", Addr: netip.MustParseAddr("203.0.113.50")},
		netlab.Host{Name: "tree.test", Addr: netip.MustParseAddr("203.0.113.51")})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		const rel = ".corral/policy.yaml"
		commit := commitPolicy(t, fx.W, rel, proxyPolicy("  allow: [\"ref.test:80\"]\n"))
		if err := os.WriteFile(filepath.Join(fx.W, rel), []byte(proxyPolicy("  allow: [\"ref.test:80\", \"tree.test:80\"]\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(fx.W, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		flags := []string{"--policy", "git:main:" + rel, "--upstream-dns", lab.DNS.String()}
		r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", gitTamperScript}, flags: flags, timeout: 90 * time.Second})
		if !strings.Contains(r.stdout, "workdir=ok") {
			t.Fatalf("control: the workload could not write its working directory\n%s", r)
		}
		for _, done := range []string{"commit=0", "replace=0"} {
			if strings.Contains(r.stdout, done) {
				t.Errorf("the workload changed the repository (%s)\n%s", done, r)
			}
		}

		r = runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "curl -sf -m 10 http://tree.test/after-" + m.name + "; echo \" tree=$?\""},
			flags: flags, timeout: 90 * time.Second})
		if strings.Contains(r.stdout, "tree=0") {
			t.Errorf("the next run's policy is the workload's:\n%s", r)
		}
		r.requireEvent(t, "sandbox.start", map[string]any{"policy_commit": commit.String()})

		// Pinned by commit id, the repository stays writable (the workload
		// may commit), and what it commits cannot change the pinned policy.
		pinned := []string{"--policy", "git:" + commit.String() + ":" + rel, "--upstream-dns", lab.DNS.String()}
		commitOnly := strings.Join(strings.Split(gitTamperScript, "\n")[:3], "\n")
		r = runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", commitOnly}, flags: pinned, timeout: 90 * time.Second})
		if !strings.Contains(r.stdout, "commit=0") {
			t.Errorf("pinned by commit id, the workload could not commit:\n%s", r)
		}
		r = runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "curl -sf -m 10 http://tree.test/pinned-" + m.name + "; echo \" tree=$?\""},
			flags: pinned, timeout: 90 * time.Second})
		if strings.Contains(r.stdout, "tree=0") || r.code != 0 {
			t.Errorf("pinned by commit id, the next run's policy changed:\n%s", r)
		}
		r.requireEvent(t, "sandbox.start", map[string]any{"policy_commit": commit.String()})

		// The workload then puts its own commit's object file where the
		// pinned commit's is: the next run must refuse to start, not read
		// the wider policy under the pinned id.
		id := commit.String()
		forge := fmt.Sprintf(`c=$(git -c safe.directory='*' rev-parse HEAD); dst=.git/objects/%s/%s
chmod u+w "$dst" && cp ".git/objects/$(echo $c | cut -c1-2)/$(echo $c | cut -c3-)" "$dst" && echo forged=ok`, id[:2], id[2:])
		r = runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", forge}, flags: pinned, timeout: 90 * time.Second})
		if !strings.Contains(r.stdout, "forged=ok") {
			t.Fatalf("control: the workload could not write the repository's objects:\n%s", r)
		}
		r = runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "curl -sf -m 10 http://tree.test/forged-" + m.name + "; echo \" tree=$?\""},
			flags: pinned, timeout: 90 * time.Second})
		if r.code != 125 || !strings.Contains(r.stderr, "tampered") || strings.Contains(r.stdout, "tree=0") {
			t.Errorf("a forged object under the pinned commit id: want a refusal to start naming it\n%s", r)
		}
	})
}

// TestGitPolicyRefusesPlantedRepositories: a workload working below the
// repository's top makes its working directory a repository of its own,
// whose main holds a policy that turns the sandbox off; and at the top,
// where .git is a symbolic link, the workload could repoint it. The next
// run with the same command line must refuse to start rather than take
// the workload's policy.
func TestGitPolicyRefusesPlantedRepositories(t *testing.T) {
	if _, err := os.Stat("/usr/bin/git"); err != nil {
		requireFeature(t, "needs /usr/bin/git (apt-get install git)")
	}
	const plant = `g() { git -c user.name=agent -c user.email=agent@example.invalid -c safe.directory='*' "$@"; }
g init -q -b main . && mkdir -p .corral && printf 'version: 1\nsandbox: disabled\n' > .corral/policy.yaml && g add .corral/policy.yaml && g commit -qm forged && echo PLANTED
`
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		const rel = ".corral/policy.yaml"
		commitPolicy(t, fx.W, rel, systemPolicy(""))
		sub := filepath.Join(fx.W, "pkg")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(fx.W, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		flags := []string{"--workdir", sub, "--policy", "git:main:" + rel}
		r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", plant}, flags: flags, timeout: 60 * time.Second})
		if r.code != 0 || !strings.Contains(r.stdout, "PLANTED") {
			t.Fatalf("control: the workload could not make its working directory a repository\n%s", r)
		}
		r = runCorral(t, fx, runOpts{args: []string{"/bin/true"}, flags: flags, timeout: 60 * time.Second})
		if r.code != 125 || !strings.Contains(r.stderr, "inside the working tree of the repository at "+fx.W) || strings.Contains(r.stderr, "WITHOUT A SANDBOX") {
			t.Errorf("a repository planted below the top: want a refusal to start naming %s\n%s", fx.W, r)
		}

		top := filepath.Join(fx.aux, "linked")
		if err := os.MkdirAll(top, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(fx.W, ".git"), filepath.Join(top, ".git")); err != nil {
			t.Fatal(err)
		}
		r = runCorral(t, fx, runOpts{args: []string{"/bin/true"}, flags: []string{"--workdir", top, "--policy", "git:main:" + rel}, timeout: 60 * time.Second})
		if r.code != 125 || !strings.Contains(r.stderr, "is a symbolic link") {
			t.Errorf("a symlinked .git: want a refusal to start\n%s", r)
		}
	})
}

// TestGitPolicyDraftExport: a sandbox started from git:main is refused a
// host; its draft is approved; after the sandbox has exited, draft export
// gives a diff against the file at the commit it ran with, which git
// applies; committed on main, the next run reaches the host.
func TestGitPolicyDraftExport(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "ref.test", Addr: netip.MustParseAddr("203.0.113.50")},
		netlab.Host{Name: "tree.test", Addr: netip.MustParseAddr("203.0.113.51")})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		const rel = ".corral/policy.yaml"
		ran := commitPolicy(t, fx.W, rel, proxyPolicy("  allow: [\"ref.test:80\"]\n"))
		if err := chownTree(fx.W, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		flags := []string{"--policy", "git:main:" + rel, "--upstream-dns", lab.DNS.String()}
		p := startCorral(t, fx, runOpts{flags: flags, timeout: 90 * time.Second, args: []string{"/bin/sh", "-c",
			"curl -sf -m 10 http://tree.test/first-" + m.name + "; echo \" first=$?\"; while [ ! -e go ]; do sleep 0.1; done"}})
		var id string
		for _, e := range readEvents(t, p.audit) {
			if e["event"] == "sandbox.start" {
				id = fmt.Sprint(e["sandbox_id"])
			}
		}
		if id == "" {
			t.Fatalf("no sandbox.start in %s\n%s", p.audit, p.stderr)
		}
		draft := func(args ...string) string {
			t.Helper()
			code, out := corralIn(t, m, fx.W, append(append([]string{"draft"}, args...), "--state-dir", fx.state, "--sandbox", id)...)
			if code != 0 {
				t.Fatalf("corral draft %v: exit %d\n%s", args, code, out)
			}
			return out
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			var pending []json.RawMessage
			if err := json.Unmarshal([]byte(draft("--json")), &pending); err == nil && len(pending) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no draft for tree.test within 15 s\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
			}
			time.Sleep(100 * time.Millisecond)
		}
		draft("approve", "--all", "--include-flagged")
		fx.signal(t, "go")
		if r := p.wait(); !strings.Contains(r.stdout, "first=") || strings.Contains(r.stdout, "first=0") {
			t.Fatalf("the first request was not refused:\n%s", r)
		}

		// Main moves on before the export: the diff must still be against
		// the commit the sandbox ran with.
		moved := commitPolicy(t, fx.W, "README", "unrelated\n")
		diffFile := filepath.Join(fx.W, "export.diff")
		code, out := corralIn(t, m, fx.W, "draft", "export", "--state-dir", fx.state, "--sandbox", id, "--audit-log", p.audit,
			"--policy", "git:main:"+rel, "-o", diffFile)
		if code != 0 || strings.Contains(out, "warning") {
			t.Fatalf("draft export: exit %d\n%s", code, out)
		}
		diff, err := os.ReadFile(diffFile)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("corral draft export:\n%s", diff)
		if !strings.Contains(string(diff), "+++ b/"+rel) || !strings.Contains(string(diff), "tree.test") {
			t.Fatalf("the diff does not add tree.test to %s:\n%s", rel, diff)
		}
		if !strings.Contains(out, ran.String()) {
			t.Errorf("draft export does not name the commit the sandbox ran with (%s, main is now %s):\n%s", ran, moved, out)
		}
		gitIn(t, fx.W, "apply", "--check", diffFile)
		gitIn(t, fx.W, "apply", diffFile)
		gitIn(t, fx.W, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qam", "allow tree.test")
		if err := chownTree(fx.W, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		r := runCorral(t, fx, runOpts{flags: flags, timeout: 90 * time.Second, args: []string{"/bin/sh", "-c",
			"curl -sf -m 10 http://tree.test/second-" + m.name + "; echo \" second=$?\""}})
		if !strings.Contains(r.stdout, "hello from tree.test GET /second-"+m.name+" second=0") {
			t.Errorf("with the exported policy committed, tree.test was not reached:\n%s\ndiff:\n%s", r, diff)
		}
	})
}

// corralIn runs a corral command in dir as the mode's user.
func corralIn(t *testing.T, m *mode, dir string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(corralBin, args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	if m.rootless {
		cmd.Env = append(cmd.Env, "HOME="+m.home, "XDG_STATE_HOME="+filepath.Join(m.home, "state"))
	}
	if m.asUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(m.uid), Gid: uint32(m.gid), Groups: []uint32{}}}
	}
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("corral %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// gitIn runs the real git in dir, as root (the test's own repository).
func gitIn(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}
