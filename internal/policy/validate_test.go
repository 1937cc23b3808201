package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// problems parses a policy and returns its problems as strings; a nil
// result means the policy loaded.
func problems(t *testing.T, src string) []string {
	t.Helper()
	_, err := Parse([]byte(src), "test")
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Parse error is %T, want *ValidationError: %v", err, err)
	}
	out := make([]string, len(ve.Problems))
	for i, p := range ve.Problems {
		out[i] = p.String()
	}
	return out
}

// restEndpoint starts an inspected endpoint; cases append rules or access.
const restEndpoint = "host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate\n"

func endpointPolicy(fields string) string {
	var b strings.Builder
	b.WriteString("version: 1\nnetwork_policies:\n  p:\n    endpoints:\n      - ")
	for i, line := range strings.Split(strings.TrimSpace(fields), "\n") {
		if i > 0 {
			b.WriteString("        ")
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func TestValidationRules(t *testing.T) {
	const ep = "network_policies.p.endpoints[0]"
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"version missing", "sandbox: enabled\n", []string{
			`version: missing — add "version: 1" at the top of the file`}},
		{"version 2", "version: 2\n", []string{
			`version: unsupported version 2 — set "version: 1"`}},
		{"sandbox enum", "version: 1\nsandbox: off\n", []string{
			`sandbox: unknown value "off" — use one of: enabled, disabled (or leave it out)`}},
		{"landlock enum", "version: 1\nlandlock: {compatibility: strict}\n", []string{
			`landlock.compatibility: unknown value "strict" — use one of: best_effort, hard_requirement (or leave it out)`}},
		{"network mode enum", "version: 1\nnetwork: {mode: open}\n", []string{
			`network.mode: unknown value "open" — use one of: block, proxy, allow (or leave it out)`}},
		{"seccomp enum", "version: 1\nseccomp: none\n", []string{
			`seccomp: unknown value "none" — use one of: default, relaxed (or leave it out)`}},
		{"state enum", "version: 1\nstate: persistent\n", []string{
			`state: unknown value "persistent" — use one of: ephemeral, scratch (or leave it out)`}},

		{"relative path", "version: 1\nfilesystem_policy: {read_only: [usr/lib]}\n", []string{
			`filesystem_policy.read_only[0]: path "usr/lib" is not absolute — write it as an absolute path starting with /, e.g. "/usr/lib"`}},
		{"dotdot", "version: 1\nfilesystem_policy: {read_only: [/usr/../etc]}\n", []string{
			`filesystem_policy.read_only[0]: path "/usr/../etc" contains a ".." component — write the resolved path "/etc"`}},
		{"unclean", "version: 1\nfilesystem_policy: {read_write: [/tmp//x/]}\n", []string{
			`filesystem_policy.read_write[0]: path "/tmp//x/" is not in clean form — write it as "/tmp/x"`}},
		{"empty path", "version: 1\nfilesystem_policy: {read_only: ['']}\n", []string{
			`filesystem_policy.read_only[0]: empty path — give an absolute path such as /usr, or remove the entry`}},
		{"nul", "version: 1\nfilesystem_policy: {read_only: [\"/a\\0b\"]}\n", []string{
			`filesystem_policy.read_only[0]: path "/a\x00b" contains a NUL byte — remove the NUL byte`}},
		{"rw root", "version: 1\nfilesystem_policy: {read_write: [/]}\n", []string{
			`filesystem_policy.read_write[0]: the root directory cannot be writable — list only the directories the agent needs to write`}},
		{"ro and rw", "version: 1\nfilesystem_policy: {read_only: [/a], read_write: [/a]}\n", []string{
			`filesystem_policy.read_write[0]: "/a" is also listed in read_only — keep it in one list; read_write already allows reading`}},
		{"too many paths", "version: 1\nfilesystem_policy:\n  read_only: [" + manyPaths("ro", 200) + "]\n  read_write: [" + manyPaths("rw", 57) + "]\n", []string{
			`filesystem_policy: 257 paths in read_only and read_write, more than the limit of 256 — list common parent directories instead of individual paths`}},

		{"user root", "version: 1\nprocess: {run_as_user: root}\n", []string{
			`process.run_as_user: must not be root — use an unprivileged user such as "1000"`}},
		{"uid 0", "version: 1\nprocess: {run_as_user: 0}\n", []string{
			`process.run_as_user: must not be root — use an unprivileged user such as "1000"`}},
		{"gid 000", "version: 1\nprocess: {run_as_group: \"000\"}\n", []string{
			`process.run_as_group: must not be root — use an unprivileged group such as "1000"`}},
		{"uid out of range", "version: 1\nprocess: {run_as_user: 4294967295}\n", []string{
			`process.run_as_user: uid 4294967295 is out of range — use a number from 1 to 4294967294`}},
		{"bad user name", "version: 1\nprocess: {run_as_user: Bob}\n", []string{
			`process.run_as_user: invalid user name "Bob" — use a lowercase user name (letters, digits, _ and -, at most 32 characters) or a numeric uid`}},
		{"negative gid", "version: 1\nprocess: {run_as_group: \"-1\"}\n", []string{
			`process.run_as_group: invalid group name "-1" — use a lowercase group name (letters, digits, _ and -, at most 32 characters) or a numeric gid`}},

		{"memory unparsable", "version: 1\nlimits: {memory: lots}\n", []string{
			`limits.memory: cannot parse size "lots" — write a number with a unit, e.g. "512MiB" or "4GiB"`}},
		{"memory too small", "version: 1\nlimits: {memory: 1MiB}\n", []string{
			`limits.memory: "1MiB" is below the minimum of 16 MiB — raise it to at least "16MiB"`}},
		{"pids zero", "version: 1\nlimits: {pids: 0}\n", []string{
			`limits.pids: 0 is below 1 — allow at least 1 process, or remove the limit`}},
		{"pids huge", "version: 1\nlimits: {pids: 5000000}\n", []string{
			`limits.pids: 5000000 exceeds the kernel maximum of 4194304 — use at most 4194304`}},
		{"connections zero", "version: 1\nlimits: {connections: 0}\n", []string{
			`limits.connections: 0 is below 1 — allow at least 1 connection, or remove the limit for the default of 1024`}},
		{"connections huge", "version: 1\nlimits: {connections: 70000}\n", []string{
			`limits.connections: 70000 exceeds the maximum of 65536 — use at most 65536`}},
		{"cpu zero", "version: 1\nlimits: {cpu: 0}\n", []string{
			`limits.cpu: 0 is not greater than 0 — give a number of cores such as 1 or 0.5, or remove the limit`}},
		{"cpu nan", "version: 1\nlimits: {cpu: .nan}\n", []string{
			`limits.cpu: NaN is not greater than 0 — give a number of cores such as 1 or 0.5, or remove the limit`}},
		{"cpu huge", "version: 1\nlimits: {cpu: 2048}\n", []string{
			`limits.cpu: 2048 cores exceed the maximum of 1024 — use at most 1024`}},
		{"walltime no unit", "version: 1\nlimits: {walltime: 600}\n", []string{
			`limits.walltime: cannot parse duration "600" — write a duration with a unit, e.g. "30m" or "2h"`}},
		{"walltime short", "version: 1\nlimits: {walltime: 10ms}\n", []string{
			`limits.walltime: "10ms" is shorter than 1s — use at least "1s"`}},

		{"block with rules", "version: 1\nnetwork: {mode: block, allow: [example.com]}\n", []string{
			`network.mode: block contradicts the network_policies and network.allow rules — remove network.mode to get proxy mode, or remove the network rules`}},
		{"reserved name", "version: 1\nnetwork_policies:\n  network.allow:\n    endpoints: [{host: a.example.com, port: 443}]\n", []string{
			`network_policies["network.allow"]: the name "network.allow" is reserved for the network.allow short form — choose another name`}},
		{"binary relative", "version: 1\nnetwork_policies:\n  p:\n    endpoints: [{host: a.example.com, port: 443}]\n    binaries: [{path: curl}, {path: /usr/bin/*}, {}]\n", []string{
			`network_policies.p.binaries[0].path: path "curl" is not absolute — write it as an absolute path starting with /, e.g. "/curl"`,
			`network_policies.p.binaries[2].path: missing — give an absolute path or glob such as /usr/bin/curl`}},

		{"no host no ips", endpointPolicy("port: 443"), []string{
			ep + `: needs host or allowed_ips — add host: api.example.com or allowed_ips: ["10.0.0.0/8"]`}},
		{"no port", endpointPolicy("host: api.example.com"), []string{
			ep + `: no port — add port: 443 or ports: [80, 443]`}},
		{"port range", endpointPolicy("host: api.example.com\nport: 70000\nports: [0, 80]"), []string{
			ep + `.port: port 70000 is out of range — use a port from 1 to 65535`,
			ep + `.ports[0]: port 0 is out of range — use a port from 1 to 65535`}},
		{"endpoint enums", endpointPolicy("host: api.example.com\nport: 443\nprotocol: sql\ntls: mitm\nenforcement: warn\naccess: everything"), []string{
			ep + `.protocol: unknown value "sql" — use one of: rest (or leave it out)`,
			ep + `.tls: unknown value "mitm" — use one of: terminate, passthrough, skip (or leave it out)`,
			ep + `.enforcement: unknown value "warn" — use one of: enforce, audit (or leave it out)`,
			ep + `.access: unknown value "everything" — use one of: read-only, read-write, full (or leave it out)`}},

		{"host star", endpointPolicy("host: '*'\nport: 443"), []string{
			ep + `.host: "*" matches every host — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`}},
		{"host double star", endpointPolicy("host: '**'\nport: 443"), []string{
			ep + `.host: "**" matches every host — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`}},
		{"host tld wildcard", endpointPolicy("host: '*.com'\nport: 443"), []string{
			ep + `.host: "*.com" covers a whole top-level domain — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`}},
		{"host tld double wildcard", endpointPolicy("host: '**.com'\nport: 443"), []string{
			ep + `.host: "**.com" covers a whole top-level domain — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`}},
		{"host empty label", endpointPolicy("host: a..example.com\nport: 443"), []string{
			ep + `.host: "a..example.com" has an empty label — remove the extra dot`}},
		{"host trailing dot", endpointPolicy("host: example.com.\nport: 443"), []string{
			ep + `.host: "example.com." ends with a dot — write it as "example.com"`}},
		{"host invalid char", endpointPolicy("host: exa$mple.com\nport: 443"), []string{
			ep + `.host: "exa$mple.com" has invalid characters in "exa$mple" — use letters, digits, hyphens and dots; labels cannot start or end with a hyphen`}},
		{"host with port", endpointPolicy("host: example.com:443\nport: 443"), []string{
			ep + `.host: "example.com:443" contains a port — write the port in port: or ports:`}},
		{"host url", endpointPolicy("host: https://example.com\nport: 443"), []string{
			ep + `.host: "https://example.com" is a URL, not a host — write only the host name, e.g. api.example.com`}},
		{"host inner wildcard", endpointPolicy("host: api.*.example.com\nport: 443"), []string{
			ep + `.host: "api.*.example.com" has a wildcard outside the leftmost label — use a wildcard only in the first label, e.g. *.example.com`}},
		{"host partial double star", endpointPolicy("host: 'api**.example.com'\nport: 443"), []string{
			ep + `.host: "api**.example.com" uses ** inside a label — use **. as the whole first label, or a single * inside it`}},
		{"host localhost", endpointPolicy("host: localhost\nport: 443"), []string{
			ep + `.host: "localhost" is a loopback name — ` + forbiddenFix}},
		{"host metadata ip", endpointPolicy("host: 169.254.169.254\nport: 80"), []string{
			ep + `.host: "169.254.169.254" is a metadata address (169.254.169.254/32); corral never connects to those, whatever allowed_ips say: ` +
				whyMetadata + ` — ` + forbiddenFix}},
		{"host bad ipv4", endpointPolicy("host: 10.0.0.300\nport: 80"), []string{
			ep + `.host: "10.0.0.300" is not a valid IPv4 address — fix the address, or list it in allowed_ips`}},

		{"ips unparsable", endpointPolicy("allowed_ips: [10.0.0/8]\nport: 443"), []string{
			ep + `.allowed_ips[0]: "10.0.0/8" is not an IP address or CIDR — write it like "10.0.0.0/8" or "192.0.2.10"`}},
		{"ips host bits", endpointPolicy("allowed_ips: [10.1.2.3/8]\nport: 443"), []string{
			ep + `.allowed_ips[0]: "10.1.2.3/8" has bits set after the /8 prefix — write it as "10.0.0.0/8"`}},
		{"ips loopback", endpointPolicy("allowed_ips: [127.0.0.1, '::1', 0.0.0.0/0]\nport: 443"), []string{
			refused(ep+".allowed_ips[0]", "127.0.0.1", "loopback", "127.0.0.0/8", whyLoopback),
			refused(ep+".allowed_ips[1]", "::1", "loopback", "::1/128", whyLoopback),
			refused(ep+".allowed_ips[2]", "0.0.0.0/0", "loopback", "127.0.0.0/8", whyLoopback)}},
		{"ips link-local and metadata", endpointPolicy("allowed_ips: [169.254.169.254, 169.254.1.0/24, 'fe80::/64', 'fd00:ec2::254', '::ffff:127.0.0.1']\nport: 443"), []string{
			refused(ep+".allowed_ips[0]", "169.254.169.254", "metadata", "169.254.169.254/32", whyMetadata),
			refused(ep+".allowed_ips[1]", "169.254.1.0/24", "link-local", "169.254.0.0/16", whyLinkLocal),
			refused(ep+".allowed_ips[2]", "fe80::/64", "link-local", "fe80::/10", whyLinkLocal),
			refused(ep+".allowed_ips[3]", "fd00:ec2::254", "metadata", "fd00:ec2::254/128", whyMetadata),
			refused(ep+".allowed_ips[4]", "::ffff:127.0.0.1", "loopback", "::ffff:127.0.0.0/104, the IPv4-mapped form of 127.0.0.0/8", whyLoopback)}},

		{"rules and access", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate\naccess: full\nrules: [{allow: {method: GET, path: /**}}]"), []string{
			ep + `: rules and access are both set — keep one of them; access is shorthand for a set of rules`}},
		{"protocol without rules", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate"), []string{
			ep + `.protocol: protocol "rest" needs rules or access — add access: read-only (or read-write, full) or a rules list`}},
		{"terminate without protocol", endpointPolicy("host: api.example.com\nport: 443\ntls: terminate"), []string{
			ep + `.tls: terminate needs a protocol — add protocol: rest, or remove tls: terminate`}},
		{"empty rules", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate\nrules: []"), []string{
			ep + `.rules: an empty rules list would deny every request — add rules, use access instead, or remove rules`}},
		{"rule fields", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate\nrules: [{allow: {}}, {allow: {method: GET, path: repos}}]\ndeny_rules: [{method: DELETE}]"), []string{
			ep + `.rules[0].allow.method: missing — use an HTTP method such as GET, or * for any`,
			ep + `.rules[0].allow.path: missing — use a glob such as "/repos/**", or "**" for any path`,
			ep + `.rules[1].allow.path: path "repos" does not start with / — write it as "/repos"`,
			ep + `.deny_rules[0].path: missing — use a glob such as "/repos/**", or "**" for any path`}},

		{"query value number", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {per_page: 100}}}]"), []string{
			ep + `.rules[0].allow.query.per_page: expected a glob string or a mapping with any:, got number 100 — quote it: "100"`}},
		{"query value bool", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {draft: true}}}]"), []string{
			ep + `.rules[0].allow.query.draft: expected a glob string or a mapping with any:, got boolean true — quote it: "true"`}},
		{"query value list", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {state: [open, closed]}}}]"), []string{
			ep + `.rules[0].allow.query.state: expected a glob string or a mapping with any:, got a list — write a glob such as "v*", or any: ["a", "b"] to accept several values`}},
		{"query value null", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {state: ~}}}]"), []string{
			ep + `.rules[0].allow.query.state: expected a glob string or a mapping with any:, got null — write a glob such as "v*", or any: ["a", "b"] to accept several values`}},
		{"query empty name", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {'': x}}}]"), []string{
			ep + `.rules[0].allow.query[""]: empty query parameter name — name the parameter, e.g. page`}},
		{"query matcher unknown key", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {state: {ayn: [open]}, sort: {any: [a], all: [b]}}}}]"), []string{
			ep + `.rules[0].allow.query.sort.all: unknown matcher key — did you mean "any"?`,
			ep + `.rules[0].allow.query.state.ayn: unknown matcher key — did you mean "any"?`}},
		{"query matcher empty mapping", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {state: {}}}}]"), []string{
			ep + `.rules[0].allow.query.state: an empty matcher mapping — write any: ["a", "b"], or a single glob string`}},
		{"query any not a list", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {state: {any: open}}}}]"), []string{
			ep + `.rules[0].allow.query.state.any: expected a list of glob strings, got string "open" — write any: ["a", "b"]`}},
		{"query any empty", endpointPolicy(restEndpoint + "deny_rules: [{method: GET, path: /, query: {state: {any: []}}}]\naccess: full"), []string{
			ep + `.deny_rules[0].query.state.any: an empty any list would match no value — list at least one glob, or remove the parameter`}},
		{"query any item", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {page: {any: ['1', 2, [3]]}}}}]"), []string{
			ep + `.rules[0].allow.query.page.any[1]: expected a glob string, got number 2 — write a glob string; quote numbers, e.g. "100"`,
			ep + `.rules[0].allow.query.page.any[2]: expected a glob string, got a list — write a glob string; quote numbers, e.g. "100"`}},

		{"rule path unterminated class", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/v[12/x'}}]"), []string{
			ep + `.rules[0].allow.path: path "/v[12/x" has a [ without a closing ] — close the character class, e.g. [a-z]; write [[] to match a literal [`}},
		{"rule path partial double star", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/a**b'}}, {allow: {method: GET, path: '/a/***'}}]"), []string{
			ep + `.rules[0].allow.path: path "/a**b" uses ** inside a segment — use ** only as a whole segment to match across segments (/repos/**), and * to match within one`,
			ep + `.rules[1].allow.path: path "/a/***" uses ** inside a segment — use ** only as a whole segment to match across segments (/repos/**), and * to match within one`}},
		{"rule path empty class", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/a/[]'}}, {allow: {method: GET, path: '/[!]x]'}}]"), []string{
			ep + `.rules[0].allow.path: path "/a/[]" has an empty character class — put at least one character between [ and ], e.g. [abc]`,
			ep + `.rules[1].allow.path: path "/[!]x]" has an empty character class — put at least one character between [ and ], e.g. [abc]`}},
		{"rule path mixed class", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/[a-zA-Z]'}}, {allow: {method: GET, path: '/[a-z_]'}}, {allow: {method: GET, path: '/x[a-]'}}]"), []string{
			ep + `.rules[0].allow.path: path "/[a-zA-Z]" has a character class mixing a range with other characters — a class holds either characters [abc] or one range [a-z]; combine them with braces, e.g. {[a-z],[0-9],_}`,
			ep + `.rules[1].allow.path: path "/[a-z_]" has a character class mixing a range with other characters — a class holds either characters [abc] or one range [a-z]; combine them with braces, e.g. {[a-z],[0-9],_}`,
			ep + `.rules[2].allow.path: path "/x[a-]" has a [ without a closing ] — close the character class, e.g. [a-z]; write [[] to match a literal [`}},
		{"rule path reversed range", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/[z-a]'}}]"), []string{
			ep + `.rules[0].allow.path: path "/[z-a]" has a reversed range z-a — write it as a-z`}},
		{"rule path trailing backslash", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/a\\'}}]"), []string{
			ep + `.rules[0].allow.path: path "/a\\" ends with a lone \ — write \\ to match a literal \, or remove it`}},
		{"rule path unclosed brace", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/{a,b'}}]"), []string{
			ep + `.rules[0].allow.path: path "/{a,b" has a { without a closing } — close the group, e.g. {a,b}; write [{] to match a literal {`}},
		{"rule path star inside braces", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/{**,a}'}}]"), []string{
			ep + `.rules[0].allow.path: path "/{**,a}" uses ** inside a segment — use ** only as a whole segment to match across segments (/repos/**), and * to match within one`}},
		{"query glob syntax", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /, query: {a: '[x', b: {any: [ok, '{x']}}}}]"), []string{
			ep + `.rules[0].allow.query.a: glob "[x" has a [ without a closing ] — close the character class, e.g. [a-z]; write [[] to match a literal [`,
			ep + `.rules[0].allow.query.b.any[1]: glob "{x" has a { without a closing } — close the group, e.g. {a,b}; write [{] to match a literal {`}},
		{"rule path with query", endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/search?q=x&page=2'}}]"), []string{
			ep + `.rules[0].allow.path: path "/search?q=x&page=2" contains a query string — write path: "/search" and put the parameters under query:, e.g. query: {q: "x", page: "2"}`}},
		{"deny path with query", endpointPolicy(restEndpoint + "access: full\ndeny_rules: [{method: GET, path: '/x?a=b'}]"), []string{
			ep + `.deny_rules[0].path: path "/x?a=b" contains a query string — write path: "/x" and put the parameters under query:, e.g. query: {a: "b"}`}},

		{"selector relative", endpointPolicy(restEndpoint + "access: full\npath: api/v4/**"), []string{
			ep + `.path: path "api/v4/**" does not start with / — write it as "/api/v4/**", or "**" for any path`}},
		{"selector glob", endpointPolicy(restEndpoint + "access: full\npath: '/api/v4**'"), []string{
			ep + `.path: path "/api/v4**" uses ** inside a segment — use ** only as a whole segment to match across segments (/repos/**), and * to match within one`}},
		{"selector class", endpointPolicy(restEndpoint + "access: full\npath: '/api/[!v'"), []string{
			ep + `.path: path "/api/[!v" has a [ without a closing ] — close the character class, e.g. [a-z]; write [[] to match a literal [`}},
		{"selector query", endpointPolicy(restEndpoint + "access: full\npath: '/api?v=4'"), []string{
			ep + `.path: path "/api?v=4" contains a query string — write "/api"; the path selector matches only the path`}},
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

func manyPaths(prefix string, n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("/%s%d", prefix, i)
	}
	return strings.Join(s, ", ")
}

func TestValidationCollectsAllProblems(t *testing.T) {
	got := problems(t, "version: 3\nseccomp: strict\nlimits: {pids: -1, walltime: 1ms}\n")
	want := []string{
		`version: unsupported version 3 — set "version: 1"`,
		`seccomp: unknown value "strict" — use one of: default, relaxed (or leave it out)`,
		`limits.pids: -1 is below 1 — allow at least 1 process, or remove the limit`,
		`limits.walltime: "1ms" is shorter than 1s — use at least "1s"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	_, err := Parse([]byte("version: 3\nseccomp: strict\nlimits: {pids: -1, walltime: 1ms}\n"), "x")
	if err.Error() != strings.Join(want, "\n") {
		t.Errorf("Error() = %q, want the problem lines joined by newlines", err.Error())
	}
}

func TestValidPolicies(t *testing.T) {
	for _, src := range []string{
		"version: 1\n",
		"version: 1\nprocess: {run_as_user: \"1000\", run_as_group: users}\n",
		"version: 1\nprocess: {run_as_user: 4294967294, run_as_group: build$}\n",
		"version: 1\nfilesystem_policy: {read_only: [/], read_write: [/tmp/x]}\n",
		"version: 1\nlimits: {memory: 16MiB, pids: 1, cpu: 0.5, walltime: 1s, connections: 1}\n",
		"version: 1\nnetwork: {mode: proxy}\n",
		"version: 1\nnetwork: {allow: [api.github.com, '*.pypi.org', '**.example.org:80', 'api-*.example.com', 10.1.0.0/16:5432, '[2001:db8::/32]:443']}\n",
		endpointPolicy("host: API.GitHub.com\nport: 443\nprotocol: rest\ntls: terminate\nenforcement: audit\naccess: read-only"),
		endpointPolicy("allowed_ips: [10.0.0.0/8, 192.0.2.7, '2001:db8::/32']\nports: [80, 443]"),
		endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate\nrules: [{allow: {method: get, path: /**, query: {per_page: '*'}}}]\ndeny_rules: [{method: DELETE, path: /**}]"),
		endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /**, query: {per_page: '*', state: {any: [open, 'clo*']}, empty: ''}}}]"),
		endpointPolicy(restEndpoint + "path: /api/v4/**\nallow_encoded_slash: true\nrules: [{allow: {method: GET, path: '/projects/*/repository/files/**'}}]"),
		endpointPolicy(restEndpoint + "path: '**'\naccess: read-only"),
		endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/v[12]/[!_]*/item?'}}, {allow: {method: GET, path: '/[!a-z]/[-a]/[ab-]/[!!]/[\\]]'}}, {allow: {method: GET, path: '/a/**/b/**'}}, {allow: {method: GET, path: '*'}}, {allow: {method: GET, path: '/x?'}}]"),
		endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: '/[*][*]x'}}, {allow: {method: GET, path: '/a[[]b]'}}, {allow: {method: GET, path: '/\\*\\*x/{a,b{c,d}}/},'}}, {allow: {method: GET, path: '/{[a-z],[0-9]}/[é]'}}]"),
		endpointPolicy(restEndpoint + "rules: [{allow: {method: GET, path: /**, query: {a: '[!x]*', b: {any: ['{x,y}', '\\[']}}}}]"),
		endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: passthrough\naccess: full"),
	} {
		if got := problems(t, src); got != nil {
			t.Errorf("%q: unexpected problems:\n%s", src, strings.Join(got, "\n"))
		}
	}
}

func TestWarnings(t *testing.T) {
	const ep = "network_policies.p.endpoints[0]"
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"none", "version: 1\n", nil},
		{"unknown method", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: terminate\nrules: [{allow: {method: fetch, path: /**}}]"), []string{
			ep + `.rules[0].allow.method: unknown HTTP method "FETCH" — use one of: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, TRACE, *`}},
		{"rest on 443 with tls unset terminates", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\naccess: read-only"), nil},
		{"rest on 443 with passthrough", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: passthrough\naccess: read-only"), []string{
			ep + `.tls: protocol rest on port 443 with tls: passthrough cannot inspect encrypted requests — use tls: terminate (or leave tls unset)`}},
		{"rules without protocol", endpointPolicy("host: api.example.com\nport: 443\naccess: read-only"), []string{
			ep + `: L7 rules have no effect without protocol — add protocol: rest`}},
		{"no endpoints", "version: 1\nnetwork_policies: {p: {}}\n", []string{
			`network_policies.p: no endpoints, so the policy allows nothing — add endpoints or remove the policy`}},
		{"allow mode with rules", "version: 1\nnetwork: {mode: allow, allow: [example.com]}\n", []string{
			`network.mode: allow ignores network_policies and network.allow — use mode: proxy to enforce the rules, or remove them`}},
		{"path selector without protocol", endpointPolicy("host: api.example.com\nport: 443\npath: /api/**\nallow_encoded_slash: true"), []string{
			ep + `.path: a path selector has no effect without protocol — add protocol: rest, or remove path`,
			ep + `.allow_encoded_slash: has no effect without protocol — add protocol: rest, or remove allow_encoded_slash`}},
		{"tls skip with rest", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: skip\naccess: full"), []string{
			ep + `.tls: protocol rest on port 443 with tls: skip cannot inspect encrypted requests — use tls: terminate (or leave tls unset)`}},
		{"tls passthrough with rest off 443", endpointPolicy("host: api.example.com\nport: 8443\nprotocol: rest\ntls: passthrough\naccess: full"), nil},
		{"sandbox disabled", "version: 1\nsandbox: disabled\n", []string{
			`sandbox: disabled: the command runs without any confinement — remove it to run the command sandboxed`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { requireWarnings(t, tt.src, tt.want) })
	}
}

// requireWarnings parses src, which must be valid, and compares its
// warnings with want.
func requireWarnings(t *testing.T, src string, want []string) {
	t.Helper()
	p, err := Parse([]byte(src), "test")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	var got []string
	for _, w := range p.Warnings() {
		got = append(got, w.String())
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings:\n got: %q\nwant: %q", got, want)
	}
}

func TestValidateWithoutDefaults(t *testing.T) {
	// Policies built in code must validate without a round trip through YAML.
	p := &Policy{Version: 1, Network: Network{Allow: []string{"example.com"}}}
	if err := p.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if p.NetworkMode() != ModeProxy {
		t.Errorf("NetworkMode() = %q, want proxy", p.NetworkMode())
	}
}
