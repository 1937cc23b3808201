package policy

import (
	"encoding/json"
	"regexp"
	"testing"
)

func mustParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := Parse([]byte(src), "test")
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return p
}

func TestSHA256Stable(t *testing.T) {
	a := mustParse(t, `version: 1
# comment
limits:
  memory: 1GiB
  pids: 100
filesystem_policy:
  read_only: [/usr, /etc]
network_policies:
  b: {endpoints: [{host: b.example.com, port: 443}]}
  a: {endpoints: [{host: a.example.com, port: 443}]}
`)
	// Same policy: other key order, flow style, defaults spelled out,
	// different case in a host.
	b := mustParse(t, `{network_policies: {a: {name: a, endpoints: [{port: 443, host: A.example.com}]},
  b: {endpoints: [{host: b.example.com, port: 443}]}},
 filesystem_policy: {include_workdir: true, read_only: ["/usr", "/etc"]},
 limits: {pids: 100, memory: 1GiB}, version: 1, sandbox: enabled, seccomp: default,
 network: {mode: proxy}, landlock: {compatibility: best_effort}}
`)
	ha, hb := a.SHA256(), b.SHA256()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(ha) {
		t.Fatalf("SHA256() = %q, want 64 hex digits", ha)
	}
	if ha != hb {
		ja, _ := a.CanonicalJSON()
		jb, _ := b.CanonicalJSON()
		t.Errorf("equivalent policies hash differently:\n%s\n%s", ja, jb)
	}
	if ha != a.SHA256() {
		t.Errorf("SHA256 is not deterministic")
	}

	// Source is not part of the policy.
	b.Source = "elsewhere"
	if b.SHA256() != ha {
		t.Errorf("Source changed the hash")
	}

	// List order and values do matter.
	for _, src := range []string{
		"version: 1\nfilesystem_policy: {read_only: [/etc, /usr]}\nlimits: {memory: 1GiB, pids: 100}\nnetwork_policies: {a: {endpoints: [{host: a.example.com, port: 443}]}, b: {endpoints: [{host: b.example.com, port: 443}]}}\n",
		"version: 1\nfilesystem_policy: {read_only: [/usr, /etc]}\nlimits: {memory: 1GiB, pids: 101}\nnetwork_policies: {a: {endpoints: [{host: a.example.com, port: 443}]}, b: {endpoints: [{host: b.example.com, port: 443}]}}\n",
	} {
		if mustParse(t, src).SHA256() == ha {
			t.Errorf("different policy has the same hash: %s", src)
		}
	}
}

func TestSHA256AppliesDefaultsWithoutMutating(t *testing.T) {
	raw := &Policy{Version: 1}
	parsed := mustParse(t, "version: 1\nextends: none\n")
	if raw.SHA256() != parsed.SHA256() {
		t.Errorf("hash of an undefaulted policy differs from its parsed form")
	}
	if raw.Sandbox != "" || raw.FilesystemPolicy.IncludeWorkdir != nil {
		t.Errorf("SHA256 mutated the policy: %+v", raw)
	}
}

func TestCanonicalJSONShape(t *testing.T) {
	b, err := mustParse(t, "version: 1\nextends: none\n").CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"version":1,"sandbox":"enabled","filesystem_policy":{"include_workdir":true},"landlock":{"compatibility":"best_effort"},"network":{"mode":"block"},"seccomp":"default"}`
	if string(b) != want {
		t.Errorf("canonical JSON:\n got %s\nwant %s", b, want)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || back.SHA256() != mustParse(t, "version: 1\nextends: none\n").SHA256() {
		t.Errorf("canonical JSON does not round-trip: %v", err)
	}
}
