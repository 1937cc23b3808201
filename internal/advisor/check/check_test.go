package check

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/advisor/aggregate"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

const currentYAML = `
version: 1
network_policies:
  github:
    endpoints:
      - host: api.github.com
        port: 443
    binaries:
      - path: /usr/bin/git
limits:
  memory: 512MiB
`

func current(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(currentYAML), "test")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func chunkFor(t *testing.T, e aggregate.Entry, refine bool) propose.Chunk {
	t.Helper()
	cs, err := (&propose.Mechanistic{}).Propose(context.Background(), []propose.Observation{{Entry: e, Refine: refine}})
	if err != nil || len(cs) != 1 {
		t.Fatalf("Propose: %v %d", err, len(cs))
	}
	return cs[0]
}

func entry(host string, port uint16, bin string) aggregate.Entry {
	return aggregate.Entry{Key: aggregate.Key{Host: host, Port: port, Binary: bin}, Count: 1, Probe: aggregate.Probe{Done: true}}
}

var ctx = context.Background()

func TestAdvisorChunks(t *testing.T) {
	cur := current(t)
	// Stage 1 on HTTPS: valid, broad because audited.
	c := chunkFor(t, entry("api.example.com", 443, "/usr/bin/curl"), false)
	r := Chunk(ctx, cur, c, Options{})
	if r.Verdict != Broad || r.Merged == nil {
		t.Fatalf("stage 1: %+v", r)
	}
	if !strings.Contains(strings.Join(r.Flags, ";"), "audit") {
		t.Errorf("flags %v", r.Flags)
	}
	if got := r.Summary.String(); got != "api.example.com × ports 443 × /usr/bin/curl × any request (audited); GET, HEAD, OPTIONS on any path" {
		t.Errorf("summary %q", got)
	}
	// The existing policy survives the merge untouched.
	if _, ok := r.Merged.NetworkPolicies["github"]; !ok || r.Merged.Limits.Memory != "512MiB" {
		t.Errorf("merged lost the current policy: %+v", r.Merged)
	}
	// Stage 2 with reads only: narrow.
	e := entry("api.example.com", 443, "/usr/bin/curl")
	e.Requests = 6
	e.Samples = []aggregate.Sample{{Method: "GET", Path: "/v1/items/12"}, {Method: "HEAD", Path: "/"}}
	c = chunkFor(t, e, false)
	if r := Chunk(ctx, cur, c, Options{}); r.Verdict != Narrow {
		t.Errorf("stage 2 read-only: %+v", r)
	}
	// Stage 2 with explicit rules: narrow, and the summary lists them.
	e.Samples = append(e.Samples, aggregate.Sample{Method: "DELETE", Path: "/v1/items/12"})
	c = chunkFor(t, e, false)
	r = Chunk(ctx, cur, c, Options{})
	if r.Verdict != Narrow || !strings.Contains(r.Summary.String(), "DELETE /v1/items/*") {
		t.Errorf("stage 2 rules: %+v", r)
	}
	// L4 with a private address: broad, and the address is in the summary.
	e = entry("db.corp.example", 5432, "/usr/bin/psql")
	e.Probe.Addrs = []netip.Addr{netip.MustParseAddr("10.1.2.3")}
	r = Chunk(ctx, cur, chunkFor(t, e, false), Options{})
	if r.Verdict != Broad || !strings.Contains(r.Summary.String(), "10.1.2.3/32") || !strings.Contains(strings.Join(r.Flags, ";"), "L4") {
		t.Errorf("L4: %+v", r)
	}
	// Interpreter and any binary are flagged.
	for _, bin := range []string{"/usr/bin/python3", ""} {
		r = Chunk(ctx, cur, chunkFor(t, entry("pypi.org", 443, bin), true), Options{})
		if r.Verdict != Broad {
			t.Errorf("binary %q: %+v", bin, r)
		}
	}
}

func ep(host string, port int) policy.Endpoint { return policy.Endpoint{Host: host, Port: port} }

func np(bin string, eps ...policy.Endpoint) policy.NetworkPolicy {
	n := policy.NetworkPolicy{Endpoints: eps}
	if bin != "" {
		n.Binaries = []policy.Binary{{Path: bin}}
	}
	return n
}

func want(host string, port uint16, bin string) propose.Want {
	return propose.Want{Host: host, Port: port, Binary: bin}
}

// Each forbidden shape is refused with a reason naming it.
func TestInvalidShapes(t *testing.T) {
	cur := current(t)
	curl := "/usr/bin/curl"
	w := []propose.Want{want("api.example.com", 443, curl)}
	tests := []struct {
		name   string
		add    map[string]policy.NetworkPolicy
		wants  []propose.Want
		opts   Options
		reason string
	}{
		{"adds nothing", nil, w, Options{}, "adds nothing"},
		{"answers nothing", map[string]policy.NetworkPolicy{"x": np(curl, ep("api.example.com", 443))}, nil, Options{}, "answers no denied request"},
		{"changes an existing key", map[string]policy.NetworkPolicy{"github": np("", ep("api.example.com", 443))}, w, Options{}, "already exists"},
		{"replace of a user key", map[string]policy.NetworkPolicy{"github": np(curl, ep("api.example.com", 443))}, w, Options{Replace: []string{"github"}}, "already exists"},
		{"does not load", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{Host: "api.example.com", Port: 443, Protocol: "rest"})}, w, Options{}, "does not load"},
		{"reserved name", map[string]policy.NetworkPolicy{policy.AllowPolicyName: np(curl, ep("api.example.com", 443))}, w, Options{}, "does not load"},
		{"draws a warning", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{Host: "api.example.com", Port: 443, Access: "read-only"})}, w, Options{}, "warning"},
		{"wrong binary", map[string]policy.NetworkPolicy{"x": np("/usr/bin/wget", ep("api.example.com", 443))}, w, Options{}, "still refuses"},
		{"other host", map[string]policy.NetworkPolicy{"x": np(curl, ep("evil.example.net", 443))}, w, Options{}, "was not denied"},
		{"extra port", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{Host: "api.example.com", Ports: []int{443, 22}})}, w, Options{}, "port 22 was not denied"},
		{"loopback host", map[string]policy.NetworkPolicy{"x": np(curl, ep("127.0.0.1", 443))}, []propose.Want{want("127.0.0.1", 443, curl)}, Options{}, "never allowed"},
		{"localhost name", map[string]policy.NetworkPolicy{"x": np(curl, ep("localhost", 443))}, []propose.Want{want("localhost", 443, curl)}, Options{}, "never allowed"},
		{"metadata name", map[string]policy.NetworkPolicy{"x": np(curl, ep("metadata.google.internal", 80))}, []propose.Want{want("metadata.google.internal", 80, curl)}, Options{}, "never allowed"},
		{"link-local range", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{Host: "api.example.com", Port: 443, AllowedIPs: []string{"169.254.0.0/16"}})}, w, Options{}, "never allowed"},
		{"metadata address", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{AllowedIPs: []string{"169.254.169.254"}, Port: 80})}, []propose.Want{want("169.254.169.254", 80, curl)}, Options{}, "never allowed"},
		{"mapped loopback", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{AllowedIPs: []string{"::ffff:127.0.0.1"}, Port: 80})}, []propose.Want{want("::ffff:127.0.0.1", 80, curl)}, Options{}, "never allowed"},
		{"wildcard for one name", map[string]policy.NetworkPolicy{"x": np(curl, ep("*.example.com", 443))}, w, Options{}, "broader than the denied name"},
		{"wildcard above the common parent", map[string]policy.NetworkPolicy{"x": np(curl, ep("*.example.com", 443))},
			[]propose.Want{want("a.eu.example.com", 443, curl), want("b.eu.example.com", 443, curl)}, Options{}, "broader than the denied name"},
		{"any-depth wildcard for one depth", map[string]policy.NetworkPolicy{"x": np(curl, ep("**.example.com", 443))},
			[]propose.Want{want("a.example.com", 443, curl), want("b.example.com", 443, curl)}, Options{}, "common parent"},
		{"range wider than the address", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{AllowedIPs: []string{"10.0.0.0/8"}, Port: 5432})},
			[]propose.Want{want("10.1.2.3", 5432, curl)}, Options{}, "would also allow"},
		{"range not covering the address", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{AllowedIPs: []string{"10.9.0.0/16"}, Port: 5432})},
			[]propose.Want{want("10.1.2.3", 5432, curl)}, Options{}, "covers none"},
		{"every binary", map[string]policy.NetworkPolicy{"x": np("/**", ep("api.example.com", 443))}, w, Options{}, "would also allow"},
		{"unrelated request given by the caller", map[string]policy.NetworkPolicy{"x": np(curl, ep("api.example.com", 443))}, w,
			Options{Unrelated: []egress.Request{{Host: "api.example.com", Port: 443, Identity: egress.Identity{Binary: curl}}}}, "would also allow"},
		{"refused L7 sample", map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{Host: "api.example.com", Port: 443, Protocol: "rest", Access: "read-only"})},
			[]propose.Want{want("api.example.com", 443, curl), {Host: "api.example.com", Port: 443, Binary: curl, Method: "POST", Path: "/x"}}, Options{}, "still refuses POST /x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Addition(ctx, cur, tt.add, tt.wants, tt.opts)
			if r.Verdict != Invalid || !strings.Contains(r.Reason, tt.reason) {
				t.Errorf("got %s %q, want invalid with %q", r.Verdict, r.Reason, tt.reason)
			}
			if r.Merged != nil {
				t.Error("an invalid chunk has a merged policy")
			}
		})
	}
}

func TestAllowedShapes(t *testing.T) {
	cur := current(t)
	curl := "/usr/bin/curl"
	two := []propose.Want{want("a.example.com", 443, curl), want("b.example.com", 443, curl)}
	r := Addition(ctx, cur, map[string]policy.NetworkPolicy{"x": np(curl, ep("*.example.com", 443))}, two, Options{})
	if r.Verdict != Broad || !strings.Contains(strings.Join(r.Flags, ";"), "wildcard") {
		t.Errorf("wildcard over two denied names: %+v", r)
	}
	r = Addition(ctx, cur, map[string]policy.NetworkPolicy{"x": np(curl, policy.Endpoint{AllowedIPs: []string{"10.1.2.3/32"}, Port: 5432})},
		[]propose.Want{want("10.1.2.3", 5432, curl)}, Options{})
	if r.Verdict != Broad {
		t.Errorf("hostless /32: %+v", r)
	}
	// A refined chunk may replace the approved draft it supersedes.
	cur.NetworkPolicies["draft_api_example_com_443_curl"] = np(curl, policy.Endpoint{Host: "api.example.com", Port: 443, Protocol: "rest", Access: "read-only", Enforcement: "audit"})
	add := map[string]policy.NetworkPolicy{"draft_api_example_com_443_curl": np(curl, policy.Endpoint{Host: "api.example.com", Port: 443, Protocol: "rest", Access: "read-only"})}
	if r := Addition(ctx, cur, add, []propose.Want{want("api.example.com", 443, curl)}, Options{}); r.Verdict != Invalid {
		t.Errorf("replacing a draft without Replace: %+v", r)
	}
	if r := Addition(ctx, cur, add, []propose.Want{want("api.example.com", 443, curl)}, Options{Replace: []string{"draft_api_example_com_443_curl"}}); r.Verdict != Narrow {
		t.Errorf("replacing a draft with Replace: %+v", r)
	}
}

func TestParseAddition(t *testing.T) {
	good := `{"network_policies": {"npm": {"endpoints": [{"host": "registry.npmjs.org", "port": 443, "protocol": "rest", "access": "read-only"}], "binaries": [{"path": "/usr/bin/node"}]}}}`
	add, err := ParseAddition([]byte(good))
	if err != nil || add["npm"].Endpoints[0].Host != "registry.npmjs.org" {
		t.Fatalf("good proposal: %v %+v", err, add)
	}
	for name, doc := range map[string]string{
		"other section":  "network_policies: {a: {endpoints: [{host: x.example.com, port: 443}]}}\nfilesystem_policy: {read_write: [/]}\n",
		"network mode":   "network: {mode: allow}\n",
		"unknown field":  "network_policies: {a: {endpoints: [{host: x.example.com, port: 443, allowed: true}]}}\n",
		"invalid host":   "network_policies: {a: {endpoints: [{host: '*', port: 443}]}}\n",
		"empty":          "network_policies: {}\n",
		"not a document": "[1, 2]\n",
		// yaml.v3 panics on a list key beside a merge key.
		"list key and merge": "? [a] : 1\n<<: {}\n",
	} {
		if _, err := ParseAddition([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
