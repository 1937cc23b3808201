package policy

import (
	"slices"
	"strings"
	"testing"
)

// The README's network example names only network_policies: everything
// else must be the default's, or the sandbox has no /usr and no limits.
func TestSectionsFromDefault(t *testing.T) {
	p := mustParse(t, `version: 1
network_policies:
  github:
    endpoints: [{host: api.github.com, port: 443}]
    binaries: [{path: /usr/bin/git}]
`)
	d := Default()
	if !slices.Equal(p.FilesystemPolicy.ReadOnly, d.FilesystemPolicy.ReadOnly) {
		t.Errorf("read_only = %v, want the default's %v", p.FilesystemPolicy.ReadOnly, d.FilesystemPolicy.ReadOnly)
	}
	if p.Limits.MemoryBytes() != d.Limits.MemoryBytes() || p.Limits.PidsMax() != d.Limits.PidsMax() ||
		p.Limits.CPUCores() != d.Limits.CPUCores() || p.Limits.WalltimeDuration() != d.Limits.WalltimeDuration() {
		t.Errorf("limits = %+v, want the default's %+v", p.Limits, d.Limits)
	}
	// landlock and seccomp are the default's too, but say no more than an
	// empty section would, so they are not worth naming.
	if want := []string{"filesystem_policy", "network", "limits"}; !slices.Equal(p.Inherited, want) {
		t.Errorf("Inherited = %v, want %v", p.Inherited, want)
	}
	if p.NetworkMode() != ModeProxy || len(p.NetworkPolicies) != 1 {
		t.Errorf("network = %+v %v", p.Network, p.NetworkPolicies)
	}

	// The hash is the effective policy's: writing the default's sections
	// out, or saying extends: default, changes nothing.
	full := mustParse(t, string(DefaultYAML())+`network_policies:
  github:
    endpoints: [{host: api.github.com, port: 443}]
    binaries: [{path: /usr/bin/git}]
`)
	if len(full.Inherited) != 0 {
		t.Errorf("a file naming every section inherited %v", full.Inherited)
	}
	explicit := mustParse(t, "version: 1\nextends: default\nnetwork_policies:\n  github:\n    endpoints: [{host: api.github.com, port: 443}]\n    binaries: [{path: /usr/bin/git}]\n")
	if p.SHA256() != full.SHA256() || p.SHA256() != explicit.SHA256() {
		t.Errorf("hashes differ: inherited %s, written out %s, extends: default %s", p.SHA256(), full.SHA256(), explicit.SHA256())
	}
	if got := mustParse(t, "version: 1\n").SHA256(); got != d.SHA256() {
		t.Errorf("\"version: 1\" hashes %s, the default %s", got, d.SHA256())
	}
}

// A section the file names replaces the default's whole: nothing of the
// default's list or limits is mixed in behind the user's back.
func TestSectionReplacesWhole(t *testing.T) {
	p := mustParse(t, "version: 1\nfilesystem_policy: {read_write: [/srv/data]}\nlimits: {}\n")
	if len(p.FilesystemPolicy.ReadOnly) != 0 || !slices.Equal(p.FilesystemPolicy.ReadWrite, []string{"/srv/data"}) {
		t.Errorf("filesystem_policy = %+v, want only the file's", p.FilesystemPolicy)
	}
	if p.Limits != (Limits{}) {
		t.Errorf("limits: {} = %+v, want none", p.Limits)
	}
	if slices.Contains(p.Inherited, "filesystem_policy") || slices.Contains(p.Inherited, "limits") {
		t.Errorf("Inherited = %v names a section the file has", p.Inherited)
	}
	// A null section is named too.
	if p := mustParse(t, "version: 1\nlimits:\n"); p.Limits != (Limits{}) {
		t.Errorf("limits: (null) = %+v, want none", p.Limits)
	}
	// Sections reached through a merge key are named.
	p = mustParse(t, "version: 1\n<<: {limits: {pids: 7}}\n")
	if p.Limits.PidsMax() != 7 || p.Limits.Memory != "" {
		t.Errorf("merged limits = %+v", p.Limits)
	}
}

func TestExtendsNone(t *testing.T) {
	p := mustParse(t, "version: 1\nextends: none\nnetwork: {allow: [example.com]}\n")
	if len(p.FilesystemPolicy.ReadOnly) != 0 || p.Limits != (Limits{}) || len(p.Inherited) != 0 {
		t.Errorf("extends: none inherited %v: %+v", p.Inherited, p)
	}
	if p := mustParse(t, "version: 1\nextends: none\n"); p.NetworkMode() != ModeBlock {
		t.Errorf("extends: none without network rules: mode %s, want block", p.NetworkMode())
	}
	got := problems(t, "version: 1\nextends: non\n")
	want := []string{`extends: unknown value "non" — did you mean "none"? (use one of: default, none (or leave it out))`}
	if !slices.Equal(got, want) {
		t.Errorf("problems = %q, want %q", got, want)
	}
}

// corral policy set parses onto the running policy: a file naming only
// network sections keeps the rest as it runs, so StaticDiff finds nothing.
func TestParseOntoRunning(t *testing.T) {
	running := mustParse(t, `version: 1
filesystem_policy: {read_only: [/usr], read_write: [/srv/data]}
limits: {pids: 64}
network: {allow: ["a.example.com:443"]}
network_policies:
  old: {endpoints: [{host: old.example.com, port: 443}]}
`)
	next, err := ParseOnto([]byte("version: 1\nnetwork_policies:\n  new: {endpoints: [{host: new.example.com, port: 443}]}\n"), "next.yaml", running)
	if err != nil {
		t.Fatal(err)
	}
	if d := running.StaticDiff(next); len(d) != 0 {
		t.Errorf("a network-only reload changes %v", d)
	}
	if _, ok := next.NetworkPolicies["old"]; ok || len(next.NetworkPolicies) != 1 {
		t.Errorf("network_policies = %v, want only the file's", next.NetworkPolicies)
	}
	if !slices.Equal(next.Network.Allow, []string{"a.example.com:443"}) {
		t.Errorf("network.allow = %v, want the running one", next.Network.Allow)
	}
	if want := []string{"filesystem_policy", "network", "limits"}; !slices.Equal(next.Inherited, want) {
		t.Errorf("Inherited = %v, want %v", next.Inherited, want)
	}
	// The copy is deep: normalising the new policy cannot touch the
	// running one.
	next.FilesystemPolicy.ReadOnly[0] = "/changed"
	next.Network.Allow[0] = "changed"
	if running.FilesystemPolicy.ReadOnly[0] != "/usr" || running.Network.Allow[0] != "a.example.com:443" {
		t.Errorf("ParseOnto shares state with its base")
	}

	// A section the file names still replaces the running one, and a
	// static one is then reported.
	next, err = ParseOnto([]byte("version: 1\nlimits: {pids: 65}\n"), "next.yaml", running)
	if err != nil {
		t.Fatal(err)
	}
	if d := running.StaticDiff(next); !slices.Equal(d, []string{"limits"}) {
		t.Errorf("StaticDiff = %v, want [limits]", d)
	}
	// extends: none means the file is the whole policy.
	next, err = ParseOnto([]byte("version: 1\nextends: none\nnetwork_policies:\n  new: {endpoints: [{host: new.example.com, port: 443}]}\n"), "next.yaml", running)
	if err != nil {
		t.Fatal(err)
	}
	if d := running.StaticDiff(next); !slices.Equal(d, []string{"filesystem_policy", "limits"}) {
		t.Errorf("StaticDiff = %v, want [filesystem_policy limits]", d)
	}
}

// A file with many mistakes gets every one of them, type errors included,
// each with its fix: one round trip, like a compiler.
func TestEveryProblemAtOnce(t *testing.T) {
	got := problems(t, `version: 1
filesystem_policy:
  read_only: [usr/lib, /etc]
limits: {cpu: lots, pids: 0, walltime: 5ms}
network: {mode: proxi}
seccomp: relaxd
state: scrach
landlock: {compatibility: hard}
sandbox: enabled
sandbox: disabled
procss: {run_as_user: root}
network_policies:
  gh:
    endpoints:
      - {host: api.github.com, port: 70000, protocol: REST, tls: terminat, enforcement: audt, access: read_only}
`)
	want := []string{
		`limits.cpu: expected a number, got string "lots" (line 4) — write a number without quotes, e.g. 1.5`,
		`sandbox: duplicate field (line 10, first at line 9) — remove one of the two`,
		`procss: unknown field (line 11) — did you mean "process"?`,
		`landlock.compatibility: unknown value "hard" — did you mean "hard_requirement"? (use one of: best_effort, hard_requirement (or leave it out))`,
		`network.mode: unknown value "proxi" — did you mean "proxy"? (use one of: block, proxy, allow (or leave it out))`,
		`seccomp: unknown value "relaxd" — did you mean "relaxed"? (use one of: default, relaxed (or leave it out))`,
		`state: unknown value "scrach" — did you mean "scratch"? (use one of: ephemeral, scratch (or leave it out))`,
		`filesystem_policy.read_only[0]: path "usr/lib" is not absolute — write it as an absolute path starting with /, e.g. "/usr/lib"`,
		`limits.pids: 0 is below 1 — allow at least 1 process, or remove the limit`,
		`limits.walltime: "5ms" is shorter than 1s — use at least "1s"`,
		`network_policies.gh.endpoints[0].port: port 70000 is out of range — use a port from 1 to 65535`,
		`network_policies.gh.endpoints[0].protocol: unknown value "REST" — did you mean "rest"? (use one of: rest (or leave it out))`,
		`network_policies.gh.endpoints[0].tls: unknown value "terminat" — did you mean "terminate"? (use one of: terminate, passthrough, skip (or leave it out))`,
		`network_policies.gh.endpoints[0].enforcement: unknown value "audt" — did you mean "audit"? (use one of: enforce, audit (or leave it out))`,
		`network_policies.gh.endpoints[0].access: unknown value "read_only" — did you mean "read-only"? (use one of: read-only, read-write, full (or leave it out))`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
	}
}

// A field the walker reported is not reported again by the rules, nor is
// a field that is missing only because its key is misspelt.
func TestNoCascadingProblems(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"version as string", "version: \"1\"\n", []string{
			`version: expected an integer, got string "1" (line 1) — write a whole number without quotes, e.g. 256`}},
		{"misspelt required field", "version: 1\nnetwork_policies:\n  p:\n    endpoints: [{host: a.example.com, prot: 443}]\n", []string{
			`network_policies.p.endpoints[0].prot: unknown field (line 4) — did you mean "port"?`}},
		{"bad element of a list", "version: 1\nfilesystem_policy: {read_only: [/usr, {a: b}, rel]}\n", []string{
			`filesystem_policy.read_only[1]: expected a single value, got a mapping (line 2) — write one value; quote it if it contains special characters`,
			`filesystem_policy.read_only[2]: path "rel" is not absolute — write it as an absolute path starting with /, e.g. "/rel"`}},
		{"duplicate keeps the rest checked", "version: 1\nlimits: {pids: 0}\nseccomp: default\nseccomp: relaxed\n", []string{
			`seccomp: duplicate field (line 4, first at line 3) — remove one of the two`,
			`limits.pids: 0 is below 1 — allow at least 1 process, or remove the limit`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := problems(t, tt.src); !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tt.want, "\n      "))
			}
		})
	}
}
