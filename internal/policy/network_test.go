package policy

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
)

func TestParseAllowEntry(t *testing.T) {
	tests := []struct {
		in      string
		want    Endpoint
		wantErr string
	}{
		{"api.github.com", Endpoint{Host: "api.github.com", Port: 443}, ""},
		{"API.GitHub.com:8443", Endpoint{Host: "api.github.com", Port: 8443}, ""},
		{"*.pypi.org", Endpoint{Host: "*.pypi.org", Port: 443}, ""},
		{"10.1.0.0/16:5432", Endpoint{AllowedIPs: []string{"10.1.0.0/16"}, Port: 5432}, ""},
		{"192.0.2.7", Endpoint{AllowedIPs: []string{"192.0.2.7/32"}, Port: 443}, ""},
		{"2001:db8::/32", Endpoint{AllowedIPs: []string{"2001:db8::/32"}, Port: 443}, ""},
		{"[2001:db8::1]:80", Endpoint{AllowedIPs: []string{"2001:db8::1/128"}, Port: 80}, ""},
		{"", Endpoint{}, `empty entry — write host[:port] or cidr[:port], e.g. "api.github.com:443" or "10.1.0.0/16:5432"`},
		{"example.com:", Endpoint{}, `"example.com:" has an empty port — write host[:port] or cidr[:port], e.g. "api.github.com:443" or "10.1.0.0/16:5432"`},
		{"example.com:http", Endpoint{}, `"example.com:http" has an invalid port "http" — use a port from 1 to 65535`},
		{"example.com:0", Endpoint{}, `"example.com:0" has an invalid port "0" — use a port from 1 to 65535`},
		{"[::1", Endpoint{}, `"[::1" has no closing ] — write host[:port] or cidr[:port], e.g. "api.github.com:443" or "10.1.0.0/16:5432"`},
		{"*", Endpoint{}, `"*" matches every host — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`},
		{"*.com:443", Endpoint{}, `"*.com" covers a whole top-level domain — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`},
		{"127.0.0.1:8080", Endpoint{}, refusedEntry("127.0.0.1", "loopback", "127.0.0.0/8", whyLoopback)},
		{"[fe80::1]:22", Endpoint{}, refusedEntry("fe80::1", "link-local", "fe80::/10", whyLinkLocal)},
		{"10.0.0/8", Endpoint{}, `"10.0.0/8" is not an IP address or CIDR — write it like "10.0.0.0/8" or "192.0.2.10"`},
	}
	for _, tt := range tests {
		got, err := ParseAllowEntry(tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseAllowEntry(%q) error = %v\nwant %s", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseAllowEntry(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestNetworkAllowValidation(t *testing.T) {
	got := problems(t, "version: 1\nnetwork: {allow: [ok.example.com, 'bad host', '169.254.169.254:80']}\n")
	want := []string{
		`network.allow[1]: "bad host" has invalid characters in "bad host" — use letters, digits, hyphens and dots; labels cannot start or end with a hyphen`,
		refused("network.allow[2]", "169.254.169.254", "metadata", "169.254.169.254/32", whyMetadata),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// The short form compiles into a grant for any binary, beside the named
// policies, ordered by name.
func TestCompileShortForm(t *testing.T) {
	p := mustParse(t, `version: 1
network:
  allow: ["api.github.com:443", "*.pypi.org", "10.1.0.0/16:5432"]
network_policies:
  git:
    endpoints: [{host: github.com, port: 22}]
    binaries: [{path: /nonexistent/ssh}]
`)
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Grants) != 2 || c.Grants[0].Key != "git" || c.Grants[1].Key != AllowPolicyName {
		t.Fatalf("grants %+v, want git then %s", c.Grants, AllowPolicyName)
	}
	git, allow := c.Grants[0], c.Grants[1]
	if !slices.Equal(git.Binaries, []string{"/nonexistent/ssh"}) || git.Targets[0].Host.Host != "github.com" || !slices.Equal(git.Targets[0].Ports, []int{22}) {
		t.Errorf("git grant %+v", git)
	}
	var got []string
	for _, tg := range allow.Targets {
		got = append(got, fmt.Sprintf("%s%v%v", tg.Host.Host, tg.Prefixes, tg.Ports))
	}
	want := []string{"api.github.com[][443]", "*.pypi.org[][443]", "[10.1.0.0/16][5432]"}
	if allow.Name != AllowPolicyName || len(allow.Binaries) != 0 || !slices.Equal(got, want) {
		t.Errorf("short form compiled to %q (binaries %v), want %q for any binary", got, allow.Binaries, want)
	}
	if _, ok := p.NetworkPolicies[AllowPolicyName]; ok {
		t.Errorf("Compile modified the policy")
	}
	empty, err := mustParse(t, "version: 1\n").Compile()
	if err != nil || len(empty.Grants) != 0 {
		t.Errorf("empty policy compiles to %+v, %v", empty, err)
	}
}

func TestPortList(t *testing.T) {
	got := Endpoint{Port: 443, Ports: []int{80, 443, 8080, 80}}.PortList()
	if !reflect.DeepEqual(got, []int{80, 443, 8080}) {
		t.Errorf("PortList() = %v", got)
	}
}
