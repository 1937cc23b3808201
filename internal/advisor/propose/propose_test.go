package propose

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/aggregate"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

func entry(host string, port uint16, bin string, mod ...func(*aggregate.Entry)) aggregate.Entry {
	e := aggregate.Entry{Key: aggregate.Key{Host: host, Port: port, Binary: bin}, Count: 3,
		FirstSeen: time.Unix(1000, 0), LastSeen: time.Unix(1010, 0), Probe: aggregate.Probe{Done: true}}
	for _, m := range mod {
		m(&e)
	}
	return e
}

func one(t *testing.T, m *Mechanistic, o Observation) Chunk {
	t.Helper()
	cs, err := m.Propose(context.Background(), []Observation{o})
	if err != nil || len(cs) != 1 {
		t.Fatalf("Propose: %v, %d chunks; want one", err, len(cs))
	}
	return cs[0]
}

func samples(e *aggregate.Entry, ss ...string) {
	for _, s := range ss {
		m, p, _ := strings.Cut(s, " ")
		e.Samples = append(e.Samples, aggregate.Sample{Method: m, Path: p, Decision: aggregate.SampleAudit, Count: 1})
		e.Requests++
	}
}

func hasNote(c Chunk, sub string) bool {
	return slices.ContainsFunc(c.SecurityNotes, func(n string) bool { return strings.Contains(n, sub) })
}

func TestStage1HTTPPortIsAuditedREST(t *testing.T) {
	for _, tc := range []struct {
		port  uint16
		proto string
		tls   string
	}{{443, "", policy.TLSTerminate}, {8443, "", policy.TLSTerminate}, {80, "", ""}, {8080, "", ""}, {9200, "http", ""}, {4443, "tls", policy.TLSTerminate}} {
		c := one(t, &Mechanistic{}, Observation{Entry: entry("api.example.com", tc.port, "/usr/bin/curl", func(e *aggregate.Entry) { e.Proto = tc.proto })})
		ep := c.Policy.Endpoints[0]
		if c.Stage != StageInitial || ep.Protocol != policy.ProtocolREST || ep.Enforcement != policy.EnforcementAudit || ep.TLS != tc.tls || ep.Access == "" {
			t.Errorf("port %d proto %q: got %+v stage %d", tc.port, tc.proto, ep, c.Stage)
		}
		if c.Name != "draft_api_example_com_"+strconv.Itoa(int(tc.port))+"_curl" || len(c.Policy.Binaries) != 1 || c.Policy.Binaries[0].Path != "/usr/bin/curl" {
			t.Errorf("name %q binaries %v", c.Name, c.Policy.Binaries)
		}
		if c.Author != AuthorAdvisor || c.ID == "" || c.Rationale == "" || c.Confidence <= 0 || c.Confidence > 1 {
			t.Errorf("chunk metadata %+v", c)
		}
		if len(c.Wants) != 1 || c.Wants[0] != (Want{Host: "api.example.com", Port: tc.port, Binary: "/usr/bin/curl"}) {
			t.Errorf("wants %+v", c.Wants)
		}
	}
}

func TestStage1NonHTTPIsL4(t *testing.T) {
	c := one(t, &Mechanistic{}, Observation{Entry: entry("db.corp.example", 5432, "/usr/bin/psql", func(e *aggregate.Entry) {
		e.Probe.Addrs = []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.1.2.4")}
	})})
	ep := c.Policy.Endpoints[0]
	if ep.Protocol != "" || ep.Access != "" || ep.Port != 5432 || ep.Host != "db.corp.example" {
		t.Errorf("endpoint %+v, want plain L4", ep)
	}
	if !slices.Equal(ep.AllowedIPs, []string{"10.1.2.3/32", "10.1.2.4/32"}) {
		t.Errorf("allowed_ips %v", ep.AllowedIPs)
	}
	if !hasNote(c, "resolves to a private address") {
		t.Errorf("notes %v", c.SecurityNotes)
	}
	// A trusted CIDR replaces the /32s.
	m := &Mechanistic{TrustedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	c = one(t, m, Observation{Entry: entry("db.corp.example", 5432, "/usr/bin/psql", func(e *aggregate.Entry) {
		e.Probe.Addrs = []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.1.2.4")}
	})})
	if got := c.Policy.Endpoints[0].AllowedIPs; !slices.Equal(got, []string{"10.1.0.0/16"}) {
		t.Errorf("with trusted CIDR: %v", got)
	}
}

func TestNeverAllowedNotProposed(t *testing.T) {
	m := &Mechanistic{}
	obs := []Observation{
		{Entry: entry("127.0.0.1", 8080, "/usr/bin/curl")},
		{Entry: entry("169.254.169.254", 80, "/usr/bin/curl")},
		{Entry: entry("fe80::1", 22, "/usr/bin/ssh")},
		{Entry: entry("rebind.example.com", 80, "/usr/bin/curl", func(e *aggregate.Entry) {
			e.Probe.Addrs = []netip.Addr{netip.MustParseAddr("169.254.169.254")}
		})},
		{Entry: entry("local.example.com", 80, "/usr/bin/curl", func(e *aggregate.Entry) {
			e.Probe.Addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
		})},
	}
	cs, err := m.Propose(context.Background(), obs)
	if err != nil || len(cs) != 0 {
		t.Fatalf("got %d chunks (%v), want none: %+v", len(cs), err, cs)
	}
	// A name with one public and one metadata address keeps the public
	// one and says so; the metadata address is never in allowed_ips.
	c := one(t, m, Observation{Entry: entry("mixed.example.com", 443, "/usr/bin/curl", func(e *aggregate.Entry) {
		e.Probe.Addrs = []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("169.254.169.254")}
	})})
	if len(c.Policy.Endpoints[0].AllowedIPs) != 0 || !hasNote(c, "never connects to") {
		t.Errorf("allowed_ips %v notes %v", c.Policy.Endpoints[0].AllowedIPs, c.SecurityNotes)
	}
}

func TestUnfixableReasonsNotProposed(t *testing.T) {
	for _, reason := range Unfixable {
		e := entry("api.example.com", 443, "/usr/bin/curl", func(e *aggregate.Entry) { e.Reason = reason })
		if cs, _ := (&Mechanistic{}).Propose(context.Background(), []Observation{{Entry: e}}); len(cs) != 0 {
			t.Errorf("reason %s: proposed %+v", reason, cs)
		}
	}
	e := entry("api.example.com", 443, "/usr/bin/curl", func(e *aggregate.Entry) { e.Reason = egress.ReasonBinary })
	one(t, &Mechanistic{}, Observation{Entry: e})
}

func TestLiteralIP(t *testing.T) {
	c := one(t, &Mechanistic{}, Observation{Entry: entry("192.168.1.20", 6379, "/usr/bin/redis-cli")})
	ep := c.Policy.Endpoints[0]
	if ep.Host != "" || !slices.Equal(ep.AllowedIPs, []string{"192.168.1.20/32"}) || !hasNote(c, "private address") {
		t.Errorf("endpoint %+v notes %v", ep, c.SecurityNotes)
	}
}

func TestSecurityNotes(t *testing.T) {
	c := one(t, &Mechanistic{}, Observation{Entry: entry("pypi.org", 443, "/usr/bin/python3.12")})
	if !hasNote(c, "interpreter") {
		t.Errorf("python: notes %v", c.SecurityNotes)
	}
	c = one(t, &Mechanistic{}, Observation{Entry: entry("pypi.org", 443, "")})
	if !hasNote(c, "any binary") || len(c.Policy.Binaries) != 0 {
		t.Errorf("no binary: notes %v binaries %v", c.SecurityNotes, c.Policy.Binaries)
	}
	c = one(t, &Mechanistic{}, Observation{Entry: entry("dns-only.example.com", 0, "")})
	if c.Policy.Endpoints[0].Port != 443 || !hasNote(c, "guess") || c.Confidence > 0.3 {
		t.Errorf("dns only: %+v", c)
	}
}

func TestStage2Presets(t *testing.T) {
	tests := []struct {
		name    string
		samples []string
		access  string
	}{
		{"reads", []string{"GET /repos/a/b", "HEAD /", "GET /repos/a/b/issues/12", "OPTIONS /x", "GET /y"}, policy.AccessReadOnly},
		{"reads and writes", []string{"GET /a", "POST /a", "PUT /a/1", "PATCH /a/2", "GET /b"}, policy.AccessReadWrite},
	}
	for _, tt := range tests {
		e := entry("api.example.com", 443, "/usr/bin/curl")
		samples(&e, tt.samples...)
		c := one(t, &Mechanistic{}, Observation{Entry: e})
		ep := c.Policy.Endpoints[0]
		if c.Stage != StageRefined || ep.Access != tt.access || ep.Rules != nil || ep.Enforcement != "" || ep.TLS != policy.TLSTerminate {
			t.Errorf("%s: stage %d endpoint %+v", tt.name, c.Stage, ep)
		}
		if len(c.Wants) != 1+len(tt.samples) {
			t.Errorf("%s: wants %+v", tt.name, c.Wants)
		}
	}
}

func TestStage2Threshold(t *testing.T) {
	e := entry("api.example.com", 443, "/usr/bin/curl")
	samples(&e, "GET /a", "GET /b", "GET /c", "GET /d")
	if c := one(t, &Mechanistic{}, Observation{Entry: e}); c.Stage != StageInitial {
		t.Errorf("4 samples: stage %d, want initial", c.Stage)
	}
	if c := one(t, &Mechanistic{}, Observation{Entry: e, Refine: true}); c.Stage != StageRefined {
		t.Errorf("on demand: stage %d, want refined", c.Stage)
	}
	samples(&e, "GET /e")
	if c := one(t, &Mechanistic{}, Observation{Entry: e}); c.Stage != StageRefined {
		t.Errorf("5 samples: stage %d, want refined", c.Stage)
	}
	// No stage 2 for a port that never carried HTTP.
	l4 := entry("db.example.com", 5432, "/usr/bin/psql")
	if c := one(t, &Mechanistic{}, Observation{Entry: l4, Refine: true}); c.Stage != StageInitial || c.Policy.Endpoints[0].Protocol != "" {
		t.Errorf("L4 refine: %+v", c)
	}
}

func TestStage2RulesGeneraliseIDs(t *testing.T) {
	e := entry("api.example.com", 443, "/usr/bin/curl")
	samples(&e,
		"GET /repos/octo/hello/issues/12",
		"GET /repos/octo/hello/issues/13",
		"DELETE /repos/octo/hello/issues/12/labels/bug",
		"GET /v1/objects/3f2504e0-4f89-11d3-9a0c-0305e82c3301",
		"PUT /v1/blobs/deadbeef0123",
		"GET /v1/sessions/AbCdEfGhIjKlMnOp1234QrSt/status",
		"POST /v1/graph[ql]",
	)
	c := one(t, &Mechanistic{}, Observation{Entry: e})
	ep := c.Policy.Endpoints[0]
	if ep.Access != "" {
		t.Fatalf("access %q with DELETE seen, want explicit rules", ep.Access)
	}
	var got []string
	for _, r := range ep.Rules {
		got = append(got, r.Allow.Method+" "+r.Allow.Path)
	}
	want := []string{
		`GET /repos/octo/hello/issues/*`,
		`DELETE /repos/octo/hello/issues/*/labels/bug`,
		`PUT /v1/blobs/*`,
		`POST /v1/graph\[ql\]`,
		`GET /v1/objects/*`,
		`GET /v1/sessions/*/status`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("rules\n got %q\nwant %q", got, want)
	}
	// The chunk must load like a user's policy.
	p := &policy.Policy{Version: 1, NetworkPolicies: c.Addition()}
	if err := p.Validate(); err != nil {
		t.Errorf("refined chunk does not validate: %v", err)
	}
}

func TestIDSegment(t *testing.T) {
	for s, want := range map[string]bool{
		"12": true, "0": true, "3f2504e0-4f89-11d3-9a0c-0305e82c3301": true, "deadbeef01": true,
		"a1b2c3d4": true, "feedfacecafebeef": true, "AbCdEfGhIjKlMnOp1234QrSt": true,
		"repos": false, "v1": false, "issues": false, "deadbeef": false, "api-v2": false, "": false,
		"a-very-long-name-without-digits": false, "2024-01-01": false,
	} {
		if got := IDSegment(s); got != want {
			t.Errorf("IDSegment(%q) = %v, want %v", s, got, want)
		}
	}
}

// The character-set tests of IDSegment accept exactly what these
// expressions do.
func TestIDShapes(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	hex := regexp.MustCompile(`^[0-9a-fA-F]{8,}$`)
	tok := regexp.MustCompile(`^[A-Za-z0-9_-]{20,}$`)
	const alphabet = "0189afAFgzGZ-_./ é"
	rng := rand.New(rand.NewPCG(1, 2))
	const uuidOK = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
	cases := []string{"", uuidOK, uuidOK[:35], uuidOK + "0"}
	// Every position of a UUID changed to each kind of byte.
	for i := range len(uuidOK) {
		for _, c := range "a-g_" {
			cases = append(cases, uuidOK[:i]+string(c)+uuidOK[i+1:])
		}
	}
	for range 20000 {
		b := make([]byte, rng.IntN(40))
		letters := alphabet
		if rng.IntN(2) == 0 {
			letters = alphabet[:8] // hex digits only
		}
		for i := range b {
			b[i] = letters[rng.IntN(len(letters))]
		}
		if rng.IntN(4) == 0 && len(b) >= 36 {
			for _, i := range []int{8, 13, 18, 23} {
				b[i] = '-'
			}
		}
		cases = append(cases, string(b[:min(len(b), 36)]), string(b))
	}
	for _, s := range cases {
		isHexSeg, isTokSeg := len(s) >= 8 && only(s, hexDigits), len(s) >= 20 && only(s, tokenChars)
		if isUUID(s) != uuid.MatchString(s) || isHexSeg != hex.MatchString(s) || isTokSeg != tok.MatchString(s) {
			t.Fatalf("%q: uuid %v/%v hex %v/%v token %v/%v", s, isUUID(s), uuid.MatchString(s),
				isHexSeg, hex.MatchString(s), isTokSeg, tok.MatchString(s))
		}
	}
}

func TestFingerprintStable(t *testing.T) {
	e := entry("api.example.com", 443, "/usr/bin/curl")
	a := one(t, &Mechanistic{}, Observation{Entry: e})
	e.Count, e.LastSeen = 99, time.Unix(2000, 0)
	b := one(t, &Mechanistic{}, Observation{Entry: e})
	if a.ID != b.ID {
		t.Errorf("same addition, different ids %s %s", a.ID, b.ID)
	}
	y, err := a.YAML()
	if err != nil || !strings.Contains(string(y), "network_policies:") || !strings.Contains(string(y), a.Name+":") {
		t.Errorf("YAML %s, %v", y, err)
	}
}

func TestIsInterpreter(t *testing.T) {
	for bin, want := range map[string]bool{
		"/usr/bin/python3": true, "/usr/bin/python3.12": true, "/usr/local/bin/node": true, "/bin/bash": true,
		"/usr/bin/curl": false, "/usr/bin/git": false, "/usr/bin/ssh": false,
	} {
		if got := IsInterpreter(bin); got != want {
			t.Errorf("IsInterpreter(%s) = %v", bin, got)
		}
	}
}
