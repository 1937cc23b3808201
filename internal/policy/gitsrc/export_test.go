package gitsrc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

func apiChunk(name, host string) Chunk {
	return Chunk{
		Name: name,
		Policy: policy.NetworkPolicy{
			Endpoints: []policy.Endpoint{{Host: host, Port: 443}},
			Binaries:  []policy.Binary{{Path: "/usr/bin/curl"}},
		},
		Note: "draft 0a1b: curl was refused " + host + ":443",
	}
}

const withPolicies = `# team policy
version: 1

network_policies:
  # the package mirror
  mirror:
    endpoints:
      - host: mirror.test
        port: 443
    binaries:
      - path: /usr/bin/apt

# limits below
limits:
  memory: 2GiB
`

func TestAddNetworkPolicies(t *testing.T) {
	cases := []struct {
		name, base string
		want       string // the file expected, exactly
	}{
		{"block mapping with a section after it", withPolicies, `# team policy
version: 1

network_policies:
  # the package mirror
  mirror:
    endpoints:
      - host: mirror.test
        port: 443
    binaries:
      - path: /usr/bin/apt
  # draft 0a1b: curl was refused api.test:443
  draft_api:
    endpoints:
      - host: api.test
        port: 443
    binaries:
      - path: /usr/bin/curl

# limits below
limits:
  memory: 2GiB
`},
		{"block mapping last, four-space indent, no final newline", "version: 1\nnetwork_policies:\n    mirror:\n        endpoints: [{host: mirror.test, port: 443}]", "version: 1\nnetwork_policies:\n    mirror:\n        endpoints: [{host: mirror.test, port: 443}]\n" +
			"    # draft 0a1b: curl was refused api.test:443\n    draft_api:\n      endpoints:\n        - host: api.test\n          port: 443\n      binaries:\n        - path: /usr/bin/curl\n"},
		{"no network_policies", "version: 1\nnetwork:\n  allow: [\"x.test:443\"]\n", "version: 1\nnetwork:\n  allow: [\"x.test:443\"]\n" +
			"network_policies:\n  # draft 0a1b: curl was refused api.test:443\n  draft_api:\n    endpoints:\n      - host: api.test\n        port: 443\n    binaries:\n      - path: /usr/bin/curl\n"},
		{"empty flow mapping", "version: 1\nnetwork_policies: {}  # none yet\nlimits:\n  pids: 10\n", "version: 1\nnetwork_policies:\n" +
			"  # draft 0a1b: curl was refused api.test:443\n  draft_api:\n    endpoints:\n      - host: api.test\n        port: 443\n    binaries:\n      - path: /usr/bin/curl\nlimits:\n  pids: 10\n"},
		{"null", "version: 1\nnetwork_policies:\nlimits:\n  pids: 10\n", "version: 1\nnetwork_policies:\n" +
			"  # draft 0a1b: curl was refused api.test:443\n  draft_api:\n    endpoints:\n      - host: api.test\n        port: 443\n    binaries:\n      - path: /usr/bin/curl\nlimits:\n  pids: 10\n"},
		{"built-in default", "", "version: 1\nnetwork_policies:\n" +
			"  # draft 0a1b: curl was refused api.test:443\n  draft_api:\n    endpoints:\n      - host: api.test\n        port: 443\n    binaries:\n      - path: /usr/bin/curl\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := AddNetworkPolicies([]byte(c.base), []Chunk{apiChunk("draft_api", "api.test")})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}

func TestAddNetworkPoliciesRefuses(t *testing.T) {
	cases := []struct{ name, base, want string }{
		{"flow mapping with entries", "version: 1\nnetwork_policies: {mirror: {endpoints: [{host: m.test, port: 443}]}}\n", "not written as a block mapping"},
		{"name taken", withPolicies, `already has "mirror"`},
		{"invalid base", "version: 1\nbogus: 1\n", "does not load"},
		{"not yaml", "version: [1\n", "not valid YAML"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := "draft_api"
			if c.name == "name taken" {
				name = "mirror"
			}
			_, err := AddNetworkPolicies([]byte(c.base), []Chunk{apiChunk(name, "api.test")})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
	if _, err := AddNetworkPolicies([]byte(withPolicies), nil); err == nil {
		t.Error("no chunks gave no error")
	}
}

// TestAddNetworkPoliciesChecksTheResult: a chunk that is not a valid
// network policy must not come out as a file that does not load.
func TestAddNetworkPoliciesChecksTheResult(t *testing.T) {
	bad := Chunk{Name: "draft_bad", Policy: policy.NetworkPolicy{Endpoints: []policy.Endpoint{{Host: "api.test"}}}}
	if _, err := AddNetworkPolicies([]byte(withPolicies), []Chunk{bad}); err == nil || !strings.Contains(err.Error(), "does not load") {
		t.Errorf("error %v", err)
	}
}

func TestUnifiedDiff(t *testing.T) {
	cases := []struct{ name, a, b, want string }{
		{"same", "a\n", "a\n", ""},
		{"insert in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n", "1\n2\n3\n4\nx\ny\n5\n6\n7\n8\n",
			"diff --git a/p.yaml b/p.yaml\n--- a/p.yaml\n+++ b/p.yaml\n@@ -2,6 +2,8 @@\n 2\n 3\n 4\n+x\n+y\n 5\n 6\n 7\n"},
		{"two hunks", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n13\n",
			"diff --git a/p.yaml b/p.yaml\n--- a/p.yaml\n+++ b/p.yaml\n@@ -1,3 +1,4 @@\n+0\n 1\n 2\n 3\n@@ -10,3 +11,4 @@\n 10\n 11\n 12\n+13\n"},
		{"new file", "", "a\nb\n", "diff --git a/p.yaml b/p.yaml\nnew file mode 100644\n--- /dev/null\n+++ b/p.yaml\n@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{"no final newline", "a\nb", "a\nb\nc\n", "diff --git a/p.yaml b/p.yaml\n--- a/p.yaml\n+++ b/p.yaml\n@@ -1,2 +1,3 @@\n a\n-b\n\\ No newline at end of file\n+b\n+c\n"},
		{"change", "a\nb\nc\n", "a\nB\nc\n", "diff --git a/p.yaml b/p.yaml\n--- a/p.yaml\n+++ b/p.yaml\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := UnifiedDiff("p.yaml", []byte(c.a), []byte(c.b))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}

// TestExportAppliesWithGit checks the diffs with the real git: each
// applies cleanly to the file it was made against and gives the file
// AddNetworkPolicies returned.
func TestExportAppliesWithGit(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed: apt-get install git")
	}
	bases := map[string]string{
		"block":      withPolicies,
		"none":       "version: 1\nnetwork:\n  allow: [\"x.test:443\"]\n",
		"no newline": "version: 1\nnetwork_policies:\n  mirror:\n    endpoints: [{host: mirror.test, port: 443}]",
		"default":    "",
	}
	chunks := []Chunk{apiChunk("draft_b", "b.test"), apiChunk("draft_a", "a.test")}
	for name, base := range bases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			run := func(args ...string) {
				t.Helper()
				cmd := exec.Command(gitBin, args...)
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("git %v: %v\n%s", args, err, out)
				}
			}
			run("init", "-q")
			if base != "" {
				if err := os.MkdirAll(filepath.Join(dir, ".corral"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, policyPath), []byte(base), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			after, err := AddNetworkPolicies([]byte(base), chunks)
			if err != nil {
				t.Fatal(err)
			}
			diff, err := UnifiedDiff(policyPath, []byte(base), after)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "export.diff"), []byte(diff), 0o644); err != nil {
				t.Fatal(err)
			}
			run("apply", "--check", "export.diff")
			run("apply", "export.diff")
			got, err := os.ReadFile(filepath.Join(dir, policyPath))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(after) {
				t.Errorf("git apply gave:\n%s\nwant:\n%s", got, after)
			}
			if _, err := policy.Load(filepath.Join(dir, policyPath)); err != nil {
				t.Errorf("the exported policy does not load: %v", err)
			}
		})
	}
}
