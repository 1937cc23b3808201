package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/sandbox"
)

const (
	ranPolicy   = "version: 1\nnetwork_policies:\n  mirror:\n    endpoints: [{host: mirror.test, port: 443}]\n"
	laterPolicy = "version: 1\nnetwork_policies:\n  other:\n    endpoints: [{host: other.test, port: 443}]\n"
)

func commitFile(t *testing.T, r *git.Repository, dir, rel, text string) plumbing.Hash {
	t.Helper()
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
		t.Fatal(err)
	}
	return h
}

func addDraft(t *testing.T, store *drafts.FileStore, id, name, host string, approve bool) {
	t.Helper()
	c := propose.Chunk{
		ID: id, Name: name, Author: "advisor", Rationale: "curl was refused " + host + ":443\nmore words",
		Policy: policy.NetworkPolicy{Endpoints: []policy.Endpoint{{Host: host, Port: 443}}, Binaries: []policy.Binary{{Path: "/usr/bin/curl"}}},
	}
	d, err := store.Add(c, check.Result{Verdict: check.Broad}, drafts.System)
	if err != nil {
		t.Fatal(err)
	}
	if approve {
		if _, err := store.Approve(d.ID, drafts.Actor{UID: 0, User: "root"}, "ok"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDraftExportGitPolicy: the sandbox ran with git:main:PATH at a
// commit; main has moved since. The export is a diff against the file
// at the commit the sandbox ran with, holds only the approved chunks,
// and applies with git.
func TestDraftExportGitPolicy(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed: apt-get install git")
	}
	repoDir, state := t.TempDir(), t.TempDir()
	r, err := git.PlainInitWithOptions(repoDir, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName("main")}})
	if err != nil {
		t.Fatal(err)
	}
	ran := commitFile(t, r, repoDir, exportPath, ranPolicy)
	commitFile(t, r, repoDir, exportPath, laterPolicy)

	p, err := policy.Parse([]byte(ranPolicy), "x")
	if err != nil {
		t.Fatal(err)
	}
	start, _ := json.Marshal(map[string]any{"event": "sandbox.start", "sandbox_id": "sb1", "session": "s1",
		"policy_sha256": p.SHA256(), "policy_commit": ran.String()})
	other, _ := json.Marshal(map[string]any{"event": "sandbox.start", "sandbox_id": "sb0", "session": "s0", "policy_sha256": "x"})
	if err := os.WriteFile(filepath.Join(state, "audit.log"), append(append(other, '\n'), append(start, '\n')...), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := drafts.Open(sandbox.DraftsDir(state, "s1"), drafts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addDraft(t, store, "c1", "draft_api_test_443_curl", "api.test", true)
	addDraft(t, store, "c2", "draft_pending_test_443_curl", "pending.test", false)
	addDraft(t, store, "c3", "draft_b_test_443_curl", "b.test", true)

	t.Chdir(repoDir)
	out := filepath.Join(t.TempDir(), "export.diff")
	stderr, err := runExport(t, state, "--sandbox", "sb1", "--policy", "git:main:"+exportPath, "-o", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if strings.Contains(stderr, "warning") {
		t.Errorf("unexpected warning: %s", stderr)
	}
	diff, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"+++ b/" + exportPath, "+  draft_api_test_443_curl:", "+  draft_b_test_443_curl:", " mirror:"} {
		if !strings.Contains(string(diff), want) {
			t.Errorf("diff lacks %q:\n%s", want, diff)
		}
	}
	if strings.Contains(string(diff), "pending.test") || strings.Contains(string(diff), "other.test") {
		t.Errorf("diff holds a pending chunk or the later commit:\n%s", diff)
	}

	// It applies to the commit the sandbox ran with, giving a policy that
	// loads and allows the approved hosts.
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command(gitBin, args...)
		cmd.Dir = repoDir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
	git("-c", "advice.detachedHead=false", "checkout", "-q", ran.String())
	git("apply", "--check", out)
	git("apply", out)
	exported, err := policy.Load(filepath.Join(repoDir, exportPath))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mirror", "draft_api_test_443_curl", "draft_b_test_443_curl"} {
		if _, ok := exported.NetworkPolicies[name]; !ok {
			t.Errorf("exported policy lacks %s", name)
		}
	}

	// The built-in default as base: the diff against it warns, since the
	// sandbox ran with another policy.
	stderr, err = runExport(t, state, "--sandbox", "sb1")
	if err != nil || !strings.Contains(stderr, "warning: sandbox sb1 started with policy sha256") {
		t.Errorf("export against the default: %v, stderr %q", err, stderr)
	}
}

func TestDraftExportErrors(t *testing.T) {
	state := t.TempDir()
	t.Chdir(t.TempDir())
	if _, err := runExport(t, state, "--session", "nobody"); err == nil || !strings.Contains(err.Error(), "no drafts for session nobody") {
		t.Errorf("no drafts: %v", err)
	}
	store, err := drafts.Open(sandbox.DraftsDir(state, "s1"), drafts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addDraft(t, store, "c2", "draft_pending_test_443_curl", "pending.test", false)
	if _, err := runExport(t, state, "--session", "s1"); err == nil || !strings.Contains(err.Error(), "no approved drafts") {
		t.Errorf("nothing approved: %v", err)
	}
	addDraft(t, store, "c1", "draft_api_test_443_curl", "api.test", true)
	if _, err := runExport(t, state, "--session", "s1", "--policy", "git:main:p.yaml"); err == nil || !strings.Contains(err.Error(), "not inside a git repository") {
		t.Errorf("git policy outside a repository: %v", err)
	}
	if _, err := runExport(t, state, "--sandbox", "gone"); err == nil || !strings.Contains(err.Error(), "sandbox.start of sandbox gone") {
		t.Errorf("unknown sandbox: %v", err)
	}
}

func runExport(t *testing.T, state string, args ...string) (string, error) {
	t.Helper()
	saved := draftFlags
	t.Cleanup(func() { draftFlags = saved })
	draftFlags.stateDir, draftFlags.sandbox = state, ""
	for i, a := range args {
		if a == "--sandbox" {
			draftFlags.sandbox = args[i+1]
			args = append(args[:i:i], args[i+2:]...)
			break
		}
	}
	cmd := newDraftExportCmd()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return stderr.String(), err
}
