package policy

import (
	"testing"

	"gopkg.in/yaml.v3"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte("version: 1\n"))
	f.Add(defaultYAML)
	f.Add([]byte("version: 1\nnetwork:\n  allow: [\"api.github.com:443\", \"*.pypi.org\", \"10.1.0.0/16:5432\"]\n"))
	f.Add([]byte("version: 1\nnetwork_policies:\n  gh:\n    endpoints:\n      - host: api.github.com\n        port: 443\n        protocol: rest\n        tls: terminate\n        rules: [{allow: {method: GET, path: \"/**\", query: {a: b}}}]\n        deny_rules: [{method: DELETE, path: /x}]\n    binaries: [{path: /usr/bin/curl}]\n"))
	f.Add([]byte("version: 1\nnetwork_policies:\n  gl:\n    endpoints:\n      - host: '*.example.com'\n        port: 443\n        protocol: rest\n        path: /api/v4/**\n        allow_encoded_slash: true\n        rules: [{allow: {method: GET, path: \"/projects/[!_]*/**\", query: {state: {any: [open, 'c*']}}}}]\nsecrets:\n  GL_TOKEN: {from_env: GITLAB_TOKEN, hosts: [gitlab.example.com], headers: [private-token]}\n"))
	f.Add([]byte("version: 1\nlimits: &l {pids: 5}\nfilesystem_policy: {<<: *l}\n"))
	f.Add([]byte("version: 1\nprocess: {run_as_user: 0}\nlimits: {memory: 1.5g, cpu: .nan}\n"))
	f.Add([]byte("{version: 1, state: scratch}\n---\n"))
	// A mapping or list key beside a merge key panicked inside yaml.v3
	// (found by CI's fuzzing).
	f.Add([]byte("version: 1\n? {a: 1}\n: x\n<<: {}\n"))
	f.Add([]byte("version: 1\nlimits: {? [a] : 1, <<: {pids: 5}}\n"))
	f.Add([]byte("version: 1\nx: &k {a: 1}\nlimits: {? *k : 1, <<: {pids: 5}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data, "fuzz")
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed policy fails Validate: %v", err)
		}
		h := p.SHA256()
		if h == "" {
			t.Fatal("valid policy cannot be hashed")
		}
		_ = p.Warnings()
		if _, err := p.Compile(); err != nil {
			t.Fatalf("a policy that validates does not compile: %v", err)
		}
		// What we accept must survive a YAML round trip unchanged, written
		// whole as the gateway stores it: with "extends: none", since a
		// section named but empty ("limits: {}") is left out of the YAML
		// and must not be inherited back.
		whole := *p
		whole.Extends = ExtendsNone
		out, err := yaml.Marshal(&whole)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		q, err := Parse(out, "roundtrip")
		if err != nil {
			t.Fatalf("re-parse of\n%s\nfailed: %v", out, err)
		}
		if q.SHA256() != h {
			t.Fatalf("round trip changed the hash:\n%s", out)
		}
	})
}
