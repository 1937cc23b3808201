package policy

import (
	"slices"
	"testing"
)

func TestStaticDiff(t *testing.T) {
	base := "version: 1\nnetwork: {allow: [\"a.example.com:443\"]}\nlimits: {pids: 10}\n"
	cases := []staticCase{
		{"network policies may change", "version: 1\nnetwork: {allow: [\"b.example.com:443\"]}\nlimits: {pids: 10}\n", nil},
		{"limits may not", "version: 1\nnetwork: {allow: [\"a.example.com:443\"]}\nlimits: {pids: 11}\n", []string{"limits"}},
		{"mode may not", "version: 1\nnetwork: {mode: block}\nlimits: {pids: 10}\n", []string{"network.mode"}},
		{"filesystem and seccomp may not", "version: 1\nnetwork: {allow: [\"a.example.com:443\"]}\nlimits: {pids: 10}\nseccomp: relaxed\nfilesystem_policy: {read_only: [/usr]}\n",
			[]string{"filesystem_policy", "seccomp"}},
	}
	requireStaticDiff(t, base, cases)
}

func TestStaticDiffSecrets(t *testing.T) {
	const net = "version: 1\nnetwork_policies:\n  p: {endpoints: [{host: api.example.com, port: 443, protocol: rest, tls: terminate, access: full}]}\n"
	base := net + "secrets: {T: {from_env: T, hosts: [api.example.com]}}\n"
	cases := []staticCase{
		{"same secrets, defaults spelled out", net + "secrets: {T: {from_env: T, hosts: [API.example.com], headers: [authorization]}}\n", nil},
		{"endpoints may change", net + "  q: {endpoints: [{host: b.example.com, port: 443}]}\nsecrets: {T: {from_env: T, hosts: [api.example.com]}}\n", nil},
		{"source may not", net + "secrets: {T: {from_env: U, hosts: [api.example.com]}}\n", []string{"secrets"}},
		{"headers may change", net + "secrets: {T: {from_env: T, hosts: [api.example.com], headers: [X-Token]}}\n", nil},
		{"hosts may change", net + "  q: {endpoints: [{host: b.example.com, port: 443, protocol: rest, access: full}]}\nsecrets: {T: {from_env: T, hosts: [b.example.com]}}\n", nil},
		{"file instead of env may not", net + "secrets: {T: {from_file: /run/t, hosts: [api.example.com]}}\n", []string{"secrets"}},
		{"adding one may not", net + "secrets: {T: {from_env: T, hosts: [api.example.com]}, U: {from_env: U, hosts: [api.example.com]}}\n", []string{"secrets"}},
		{"removing all may not", net, []string{"secrets"}},
		{"gateway instead of env may not", net + "secrets: {T: {from_gateway: t, hosts: [api.example.com]}}\n", []string{"secrets"}},
	}
	requireStaticDiff(t, base, cases)
}

// TestStaticDiffGatewaySecrets: the gateway secret a from_gateway names is
// fixed like a variable or a file: its surrogate is already in the
// workload's environment.
func TestStaticDiffGatewaySecrets(t *testing.T) {
	const net = "version: 1\nnetwork_policies:\n  p: {endpoints: [{host: api.example.com, port: 443, protocol: rest, tls: terminate, access: full}]}\n"
	base := net + "secrets: {T: {from_gateway: gh, hosts: [api.example.com]}}\n"
	cases := []staticCase{
		{"headers may change", net + "secrets: {T: {from_gateway: gh, hosts: [api.example.com], headers: [X-Token]}}\n", nil},
		{"the gateway name may not", net + "secrets: {T: {from_gateway: gh2, hosts: [api.example.com]}}\n", []string{"secrets"}},
		{"env instead of gateway may not", net + "secrets: {T: {from_env: gh, hosts: [api.example.com]}}\n", []string{"secrets"}},
	}
	requireStaticDiff(t, base, cases)
}

type staticCase struct {
	name, next string
	want       []string
}

// requireStaticDiff checks StaticDiff from base to each case's policy.
func requireStaticDiff(t *testing.T, base string, cases []staticCase) {
	t.Helper()
	p, err := Parse([]byte(base), "base")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, err := Parse([]byte(tc.next), "next")
			if err != nil {
				t.Fatal(err)
			}
			if got := p.StaticDiff(q); !slices.Equal(got, tc.want) {
				t.Fatalf("StaticDiff = %v, want %v", got, tc.want)
			}
		})
	}
}
