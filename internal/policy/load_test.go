package policy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseDocumentErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"empty", "", `the policy is empty — it must contain at least "version: 1"`},
		{"comments only", "# nothing here\n", `the policy is empty — it must contain at least "version: 1"`},
		{"null", "~\n", `the policy is empty — it must contain at least "version: 1"`},
		{"list", "- version: 1\n", `line 1: the policy must be a mapping of fields, got a list — start the file with "version: 1"`},
		{"scalar", "hello\n", `line 1: the policy must be a mapping of fields, got string "hello" — start the file with "version: 1"`},
		{"two documents", "version: 1\n---\nversion: 1\n", `multiple YAML documents (another starts at line 2) — a policy file holds exactly one; remove the extra "---" separator`},
		{"syntax", "version: [1\n", "invalid YAML: line 1: did not find expected ',' or ']'"},
		{"tab indent", "version: 1\nlimits:\n\tpids: 5\n", "invalid YAML: line 3: found character that cannot start any token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src), "test")
			if err == nil || err.Error() != tt.want {
				t.Errorf("error = %v\nwant    %s", err, tt.want)
			}
		})
	}
}

func TestParseTrailingSeparator(t *testing.T) {
	if _, err := Parse([]byte("---\nversion: 1\n---\n"), "test"); err != nil {
		t.Fatalf("a trailing empty document should be accepted: %v", err)
	}
}

func TestUnknownFieldsAndTypes(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"top-level typo", "version: 1\nfilesytem_policy: {}\n", []string{
			`filesytem_policy: unknown field (line 2) — did you mean "filesystem_policy"?`}},
		{"nested typo", "version: 1\nfilesystem_policy:\n  read_olny: [/usr]\n", []string{
			`filesystem_policy.read_olny: unknown field (line 3) — did you mean "read_only"?`}},
		{"case", "Version: 1\n", []string{
			`Version: unknown field (line 1) — did you mean "version"?`}},
		{"prefix", "version: 1\nfilesystem: {}\nnetwork_policy: {}\n", []string{
			`filesystem: unknown field (line 2) — did you mean "filesystem_policy"?`,
			`network_policy: unknown field (line 3) — did you mean "network_policies"?`}},
		{"no suggestion", "version: 1\nlandlock:\n  mode: strict\n", []string{
			`landlock.mode: unknown field (line 3) — remove it; fields allowed here: compatibility`}},
		{"deep path", "version: 1\nnetwork_policies:\n  gh:\n    endpoints:\n      - host: api.github.com\n        port: 443\n        rule: []\n", []string{
			`network_policies.gh.endpoints[0].rule: unknown field (line 7) — did you mean "rules"?`}},
		{"deny rule shape", endpointPolicy("host: a.example.com\nport: 443\ndeny_rules: [{deny: {method: GET}}]"), []string{
			`network_policies.p.endpoints[0].deny_rules[0].deny: unknown field (line 7) — remove it; fields allowed here: method, path, query`}},
		{"duplicate", "version: 1\nseccomp: default\nseccomp: relaxed\n", []string{
			`seccomp: duplicate field (line 3, first at line 2) — remove one of the two`}},
		{"pids string", "version: 1\nlimits:\n  pids: lots\n", []string{
			`limits.pids: expected an integer, got string "lots" (line 3) — write a whole number without quotes, e.g. 256`}},
		{"port float", endpointPolicy("host: a.example.com\nport: 44.3"), []string{
			`network_policies.p.endpoints[0].port: expected an integer, got number 44.3 (line 6) — write a whole number without quotes, e.g. 256`}},
		{"cpu quoted", "version: 1\nlimits: {cpu: '2'}\n", []string{
			`limits.cpu: expected a number, got string "2" (line 2) — write a number without quotes, e.g. 1.5`}},
		{"bool as string", "version: 1\nfilesystem_policy: {include_workdir: 'no'}\n", []string{
			`filesystem_policy.include_workdir: expected true or false, got string "no" (line 2) — write true or false without quotes`}},
		{"list as scalar", "version: 1\nfilesystem_policy: {read_only: /usr}\n", []string{
			`filesystem_policy.read_only: expected a list, got string "/usr" (line 2) — write it as [a, b] or as one "- item" line per entry`}},
		{"section as list", "version: 1\nlimits: [1]\n", []string{
			`limits: expected a mapping, got a list (line 2) — write it as indented "key: value" lines`}},
		{"string as mapping", "version: 1\nseccomp: {a: b}\n", []string{
			`seccomp: expected a single value, got a mapping (line 2) — write one value; quote it if it contains special characters`}},
		{"query non-finite", endpointPolicy("host: a.example.com\nport: 443\nrules: [{allow: {method: GET, path: /, query: {n: .inf}}}]"), []string{
			`network_policies.p.endpoints[0].rules[0].allow.query.n: ".inf" is not a finite number (line 7) — quote it to use it as text`}},
		{"query non-string key", endpointPolicy("host: a.example.com\nport: 443\nrules: [{allow: {method: GET, path: /, query: {a: {1: x}}}}]"), []string{
			`network_policies.p.endpoints[0].rules[0].allow.query.a.1: key number 1 is not a string (line 7) — quote the key`}},
		{"secret field typo", "version: 1\nsecrets:\n  TOKEN:\n    from_evn: GH_TOKEN\n    hosts: [api.github.com]\n    header: [X-Token]\n", []string{
			`secrets.TOKEN.from_evn: unknown field (line 4) — did you mean "from_env"?`,
			`secrets.TOKEN.header: unknown field (line 6) — did you mean "headers"?`,
			// Not a consequence of the typos, so reported with them.
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "api.github.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for api.github.com with protocol: rest and tls: terminate`}},
		{"secret field unknown", "version: 1\nsecrets:\n  TOKEN: {value: hunter2, hosts: [api.github.com]}\n", []string{
			`secrets.TOKEN.value: unknown field (line 3) — remove it; fields allowed here: from_env, from_file, from_gateway, hosts, headers`,
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "api.github.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for api.github.com with protocol: rest and tls: terminate`}},
		{"secret hosts scalar", "version: 1\nsecrets:\n  TOKEN: {from_env: T, hosts: api.github.com}\n", []string{
			`secrets.TOKEN.hosts: expected a list, got string "api.github.com" (line 3) — write it as [a, b] or as one "- item" line per entry`}},
		{"secrets as list", "version: 1\nsecrets: [GITHUB_TOKEN]\n", []string{
			`secrets: expected a mapping, got a list (line 2) — write it as indented "key: value" lines`}},
		{"secrets typo", "version: 1\nsecret: {}\n", []string{
			`secret: unknown field (line 2) — did you mean "secrets"?`}},
		{"endpoint path typo", endpointPolicy("host: a.example.com\nport: 443\nallow_encoded_slashes: true\npat: /x"), []string{
			`network_policies.p.endpoints[0].allow_encoded_slashes: unknown field (line 7) — did you mean "allow_encoded_slash"?`,
			`network_policies.p.endpoints[0].pat: unknown field (line 8) — did you mean "path"?`}},
		{"encoded slash not bool", endpointPolicy("host: a.example.com\nport: 443\nallow_encoded_slash: yes"), []string{
			`network_policies.p.endpoints[0].allow_encoded_slash: expected true or false, got string "yes" (line 7) — write true or false without quotes`}},
		{"several at once", "version: 1\nlimits: {pids: x, cpu: y}\nstat: scratch\n", []string{
			`limits.pids: expected an integer, got string "x" (line 2) — write a whole number without quotes, e.g. 256`,
			`limits.cpu: expected a number, got string "y" (line 2) — write a number without quotes, e.g. 1.5`,
			`stat: unknown field (line 3) — did you mean "state"?`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.src)
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tt.want, "\n      "))
			}
		})
	}
}

func TestSuggest(t *testing.T) {
	known := []string{"include_workdir", "read_only", "read_write"}
	for in, want := range map[string]string{
		"read_olny":      "read_only",
		"READ_ONLY":      "read_only",
		"readonly":       "read_only",
		"read_writ":      "read_write",
		"include":        "include_workdir",
		"xyz":            "",
		"include_workdi": "include_workdir",
	} {
		if got := suggest(in, known); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAnchorsAndMerges(t *testing.T) {
	src := `version: 1
network_policies:
  a:
    endpoints:
      - &gh {host: api.github.com, port: 443}
    binaries: &bins
      - path: /usr/bin/git
  b:
    endpoints:
      - <<: *gh
        port: 80
    binaries: *bins
`
	p, err := Parse([]byte(src), "test")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	b := p.NetworkPolicies["b"]
	if b.Endpoints[0].Host != "api.github.com" || b.Endpoints[0].Port != 80 || b.Binaries[0].Path != "/usr/bin/git" {
		t.Errorf("merged policy b = %+v", b)
	}

	// A merged key is checked against the type it lands in.
	got := problems(t, "version: 1\nlimits: &l {pids: 5}\nfilesystem_policy:\n  <<: *l\n")
	want := []string{`filesystem_policy.pids: unknown field (line 2) — remove it; fields allowed here: include_workdir, read_only, read_write, home`}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nnetwork_policies:\n  p:\n    endpoints:\n      - host: a.example.com\n        port: 443\n        rules:\n          - allow:\n              method: GET\n              path: /\n              query:\n                a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("                a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	start := time.Now()
	_, err := Parse([]byte(b.String()), "bomb")
	if err == nil || !strings.Contains(err.Error(), "the document expands to too many nodes") {
		t.Fatalf("alias bomb: error = %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("alias bomb took %v", time.Since(start))
	}
}

func TestDefaultsApplied(t *testing.T) {
	p, err := Parse([]byte("version: 1\nnetwork_policies:\n  gh:\n    endpoints: [{host: API.GitHub.com, port: 443, protocol: rest, tls: terminate, rules: [{allow: {method: get, path: /**}}]}]\n"), "src.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p.Source != "src.yaml" {
		t.Errorf("Source = %q", p.Source)
	}
	if p.Sandbox != SandboxEnabled || p.Landlock.Compatibility != LandlockBestEffort || p.Seccomp != SeccompDefault || p.State != StateNone {
		t.Errorf("enum defaults not applied: %+v", p)
	}
	if p.FilesystemPolicy.IncludeWorkdir == nil || !*p.FilesystemPolicy.IncludeWorkdir || !p.IncludeWorkdir() {
		t.Errorf("include_workdir default not applied")
	}
	if p.Network.Mode != ModeProxy || p.NetworkMode() != ModeProxy {
		t.Errorf("network mode = %q, want proxy", p.Network.Mode)
	}
	gh := p.NetworkPolicies["gh"]
	if gh.Name != "gh" || gh.Endpoints[0].Host != "api.github.com" || gh.Endpoints[0].Rules[0].Allow.Method != "GET" {
		t.Errorf("network policy not normalized: %+v", gh)
	}
	if p.LandlockHard() || p.SandboxDisabled() {
		t.Errorf("LandlockHard/SandboxDisabled should be false")
	}

	p, err = Parse([]byte("version: 1\nextends: none\nfilesystem_policy: {include_workdir: false}\nlandlock: {compatibility: hard_requirement}\nsandbox: disabled\n"), "")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p.IncludeWorkdir() || !p.LandlockHard() || !p.SandboxDisabled() || p.NetworkMode() != ModeBlock {
		t.Errorf("explicit values lost: %+v", p)
	}
}

func TestLimitsAccessors(t *testing.T) {
	p, err := Parse([]byte("version: 1\nlimits: {memory: 512m, pids: 64, cpu: 1.5, walltime: 10m}\n"), "")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	l := p.Limits
	if l.MemoryBytes() != 512<<20 || l.PidsMax() != 64 || l.CPUCores() != 1.5 || l.WalltimeDuration() != 10*time.Minute {
		t.Errorf("accessors = %d %d %v %v", l.MemoryBytes(), l.PidsMax(), l.CPUCores(), l.WalltimeDuration())
	}
	var zero Limits
	if zero.MemoryBytes() != 0 || zero.PidsMax() != 0 || zero.CPUCores() != 0 || zero.WalltimeDuration() != 0 {
		t.Errorf("unset limits should read as 0")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("version: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(good)
	if err != nil || p.Source != good {
		t.Fatalf("Load = %v, %v", p, err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	want := "load policy " + bad + `: version: unsupported version 2 — set "version: 1"`
	if err == nil || err.Error() != want {
		t.Errorf("Load(bad) = %v, want %s", err, want)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Errorf("Load error does not unwrap to *ValidationError")
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "load policy ") {
		t.Errorf("Load(missing) = %v", err)
	}
}
