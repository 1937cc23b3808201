package server

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/policy"
)

// TestStoredPolicyRoundTrips: what the store keeps parses back to the very
// policy that was checked (same canonical hash), whatever it inherited.
func TestStoredPolicyRoundTrips(t *testing.T) {
	for name, src := range map[string]string{
		"default": "",
		"partial": "version: 1\nnetwork: {allow: [\"api.example.com:443\"]}\n",
		"rules": `version: 1
network_policies:
  gh:
    endpoints:
      - {host: api.github.com, port: 443, protocol: rest, tls: terminate, access: read-only}
    binaries: [{path: /usr/bin/git}]
secrets:
  GH_TOKEN: {from_env: GH_TOKEN, hosts: [api.github.com]}
limits: {memory: 1GiB, walltime: 30m}
`,
		"inference": "version: 1\ninference:\n  routes:\n    - {name: local, base_url: \"http://127.0.0.1:8000/v1\", protocols: [openai_chat_completions], timeout: 30s}\n",
	} {
		t.Run(name, func(t *testing.T) {
			p := policy.Default()
			if src != "" {
				var err error
				if p, err = policy.Parse([]byte(src), "test"); err != nil {
					t.Fatal(err)
				}
			}
			data, sum, err := storedPolicy(p)
			if err != nil {
				t.Fatal(err)
			}
			back, err := policy.ParseOnto(data, "stored", policy.Default())
			if err != nil {
				t.Fatalf("stored policy does not parse: %v\n%s", err, data)
			}
			if back.SHA256() != sum || sum != p.SHA256() {
				t.Fatalf("hash %s after the round trip, %s before\n%s", back.SHA256(), sum, data)
			}
		})
	}
}

func TestPolicySetPushedToSubscriber(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	sb, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.Msg.Id
	sup := g.clients(g.fake.link(id).Token, nil)

	stream, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	first := stream.Msg()
	if first.Policy == nil || first.Policy.Version != 1 || first.Policy.Sha256 != policy.Default().SHA256() || first.Routes != nil || len(first.Secrets) != 0 {
		t.Fatalf("first update: %+v", first)
	}

	var worst time.Duration
	for i, host := range []string{"a.example.com", "b.example.com", "c.example.com"} {
		start := time.Now()
		set, err := c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: "version: 1\nnetwork: {allow: [\"" + host + ":443\"]}\n"}))
		if err != nil {
			t.Fatal(err)
		}
		if !stream.Receive() {
			t.Fatal(stream.Err())
		}
		d := time.Since(start)
		worst = max(worst, d)
		u := stream.Msg()
		if u.Policy == nil || u.Policy.Version != int64(i+2) || u.Policy.Sha256 != set.Msg.Sha256 || !strings.Contains(u.Policy.Yaml, host) || u.Policy.Author != "alice" {
			t.Fatalf("update %d: %+v", i, u.Policy)
		}
		t.Logf("policy v%d: Set returned and the subscriber received it in %v", u.Policy.Version, d)
	}
	t.Logf("worst policy set -> subscriber latency: %v", worst)

	// The supervisor reports; users see the status.
	if _, err := sup.supervisor.ReportPolicyStatus(ctx, connect.NewRequest(&gatewayv1.ReportPolicyStatusRequest{Version: 3, Status: gatewayv1.PolicyStatus_POLICY_STATUS_LOADED})); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.supervisor.ReportPolicyStatus(ctx, connect.NewRequest(&gatewayv1.ReportPolicyStatusRequest{Version: 4, Status: gatewayv1.PolicyStatus_POLICY_STATUS_FAILED, Error: "compile network policy: boom"})); err != nil {
		t.Fatal(err)
	}
	hist, err := c.policy.History(ctx, connect.NewRequest(&gatewayv1.PolicyHistoryRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if len(hist.Msg.Versions) != 4 || hist.Msg.Versions[0].Version != 4 ||
		hist.Msg.Versions[0].Status != gatewayv1.PolicyStatus_POLICY_STATUS_FAILED || hist.Msg.Versions[0].Error != "compile network policy: boom" ||
		hist.Msg.Versions[1].Status != gatewayv1.PolicyStatus_POLICY_STATUS_LOADED || hist.Msg.Versions[1].StatusAt == nil ||
		hist.Msg.Versions[3].Status != gatewayv1.PolicyStatus_POLICY_STATUS_PENDING {
		t.Fatalf("history: %+v", hist.Msg.Versions)
	}
	got, err := c.policy.Get(ctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id, Version: 2}))
	if err != nil || got.Msg.Version != 2 || !strings.Contains(got.Msg.Yaml, "a.example.com") {
		t.Fatalf("get v2: %+v, %v", got.Msg, err)
	}

	// A supervisor that reconnects with v1 gets v4 at once; one that runs
	// v4 gets a first message without a policy.
	for _, tc := range []struct {
		have int64
		want int64
	}{{1, 4}, {4, 0}} {
		s2, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{PolicyVersion: tc.have}))
		if err != nil {
			t.Fatal(err)
		}
		if !s2.Receive() {
			t.Fatal(s2.Err())
		}
		if got := s2.Msg().GetPolicy().GetVersion(); got != tc.want {
			t.Fatalf("reconnect with v%d got v%d, want v%d", tc.have, got, tc.want)
		}
		s2.Close()
	}
}

// TestPolicySetRefused: an invalid policy gets the checker's own problem
// lines; a change to a section fixed at start is refused as `corral
// policy set` refuses it; neither makes a version.
func TestPolicySetRefused(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	sb, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: DriverExternal}))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.Msg.Id

	bad := "version: 1\nnetwork: {allow: [\"bad host name:443\"]}\nlimitz: {}\n"
	_, checkErr := policy.Parse([]byte(bad), "x")
	var ve *policy.ValidationError
	if !errors.As(checkErr, &ve) || len(ve.Problems) < 2 {
		t.Fatalf("the checker should find problems: %v", checkErr)
	}
	_, err = c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: bad}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad policy: %v", err)
	}
	for _, pr := range ve.Problems {
		if !strings.Contains(err.Error(), pr.String()) {
			t.Errorf("the refusal lacks the checker's %q:\n%v", pr.String(), err)
		}
	}

	for yaml, section := range map[string]string{
		"version: 1\nnetwork: {mode: block}\n":                 "network.mode",
		"version: 1\nlimits: {pids: 7}\n":                      "limits",
		"version: 1\nfilesystem_policy: {read_only: [/usr]}\n": "filesystem_policy",
	} {
		_, err := c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: yaml}))
		if codeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "changes "+section+", which is fixed when a sandbox starts") {
			t.Errorf("static change of %s: %v", section, err)
		}
	}
	hist, err := c.policy.History(ctx, connect.NewRequest(&gatewayv1.PolicyHistoryRequest{SandboxId: id}))
	if err != nil || len(hist.Msg.Versions) != 1 {
		t.Fatalf("refused sets made versions: %v, %v", hist, err)
	}
	if _, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: DriverExternal, Policy: bad})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("create with a bad policy: %v", err)
	}
	if _, err := c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: "nope", Yaml: "version: 1\n"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("set on an unknown sandbox: %v", err)
	}
}
