package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

// gatewaySecretPolicy takes GH_TOKEN from the gateway secret gh-token.
const gatewaySecretPolicy = `version: 1
network_policies:
  gh:
    endpoints:
      - {host: api.github.com, port: 443, protocol: rest, tls: terminate, access: read-only}
secrets:
  GH_TOKEN: {from_gateway: gh-token, hosts: [api.github.com]}
`

func setSecret(t *testing.T, c clients, name, value string) {
	t.Helper()
	if _, err := c.secrets.Set(ctxT(t), connect.NewRequest(&gatewayv1.SetSecretRequest{Name: name, Value: []byte(value)})); err != nil {
		t.Fatal(err)
	}
}

func secretMap(u *gatewayv1.Update) map[string]string {
	out := map[string]string{}
	for _, s := range u.GetSecrets() {
		out[s.Name] = string(s.Value)
	}
	return out
}

// receive returns the next update on s, failing after a few seconds.
func receive(t *testing.T, s *connect.ServerStreamForClient[gatewayv1.Update]) *gatewayv1.Update {
	t.Helper()
	got := make(chan bool, 1)
	go func() { got <- s.Receive() }()
	select {
	case ok := <-got:
		if !ok {
			t.Fatalf("stream ended: %v", s.Err())
		}
		return s.Msg()
	case <-time.After(5 * time.Second):
		t.Fatal("no update within 5s")
		return nil
	}
}

// TestSubscribeSendsOnlyReferencedSecrets: a supervisor's first update
// carries the values of exactly the secrets its policy takes
// from_gateway; setting one of them pushes the new value, setting another
// secret pushes nothing to it, and another sandbox gets none.
func TestSubscribeSendsOnlyReferencedSecrets(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	setSecret(t, c, "gh-token", "ghp_firstVALUE0123456789")
	setSecret(t, c, "other", "sk-not-for-this-sandbox-0123")
	sb, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake", Policy: gatewaySecretPolicy}))
	if err != nil {
		t.Fatal(err)
	}
	sup := g.clients(g.fake.link(sb.Msg.Id).Token, nil)
	s, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := receive(t, s)
	if first.GetPolicy().GetVersion() != 1 {
		t.Fatalf("first update without the policy: %v", first)
	}
	if got := secretMap(first); len(got) != 1 || got["gh-token"] != "ghp_firstVALUE0123456789" {
		t.Fatalf("first update's secrets = %v, want only gh-token", got)
	}

	// A sandbox whose policy takes nothing from the gateway gets nothing.
	_, plain := createFake(t, g, "plain")
	ps, err := plain.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if u := receive(t, ps); len(u.GetSecrets()) != 0 {
		t.Fatalf("a sandbox without from_gateway got secrets %v", secretMap(u))
	}

	// Another secret changing sends nothing; the next update is the
	// referenced one's new value.
	setSecret(t, c, "other", "sk-still-not-for-this-0123")
	setSecret(t, c, "gh-token", "ghp_secondVALUE012345678")
	u := receive(t, s)
	if got := secretMap(u); len(got) != 1 || got["gh-token"] != "ghp_secondVALUE012345678" || u.Policy != nil || u.Routes != nil {
		t.Fatalf("update after the set = %v, want only the new gh-token", u)
	}
	// The plain sandbox's stream stays quiet: routes set now are the
	// next thing it sees.
	if _, err := c.routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: routesYAML})); err != nil {
		t.Fatal(err)
	}
	if u := receive(t, ps); u.GetRoutes() == nil || len(u.GetSecrets()) != 0 {
		t.Fatalf("plain sandbox got %v", u)
	}

	// A reconnecting supervisor gets the newest value at once.
	s2, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{PolicyVersion: 1, RoutesVersion: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := secretMap(receive(t, s2)); !maps1(got, "gh-token", "ghp_secondVALUE012345678") {
		t.Fatalf("reconnect got secrets %v", got)
	}
}

// maps1 reports whether m holds k: v and nothing else.
func maps1(m map[string]string, k, v string) bool { return len(m) == 1 && m[k] == v }

// TestMissingGatewaySecretRefused: a policy that takes from_gateway a
// secret the gateway does not hold is refused at Create, Join and Set,
// naming the secret and how to set it.
func TestMissingGatewaySecretRefused(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	wantMissing := func(what string, err error) {
		t.Helper()
		if codeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "gh-token") || !strings.Contains(err.Error(), "corral gateway secret set") {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake", Policy: gatewaySecretPolicy}))
	wantMissing("create", err)
	list, err := c.sandbox.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
	if err != nil || len(list.Msg.Sandboxes) != 0 {
		t.Fatalf("a refused create left sandboxes: %v %v", list, err)
	}

	// A join whose token grants the secret is refused the same way, and
	// leaves its token unspent.
	join, _, err := auth.CreateToken(ctx, g.store, store.TokenJoin, "host-b", "", "gh-token")
	if err != nil {
		t.Fatal(err)
	}
	joiner := g.clients(join, nil)
	_, err = joiner.supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "remote", Policy: gatewaySecretPolicy}))
	wantMissing("join", err)

	setSecret(t, c, "gh-token", "ghp_firstVALUE0123456789")
	if _, err := joiner.supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "remote", Policy: gatewaySecretPolicy})); err != nil {
		t.Fatalf("join once the secret is set: %v", err)
	}
	sb, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake", Policy: gatewaySecretPolicy}))
	if err != nil {
		t.Fatal(err)
	}
	// Deleted meanwhile: a new version naming it is refused too.
	if _, err := c.secrets.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSecretRequest{Name: "gh-token"})); err != nil {
		t.Fatal(err)
	}
	_, err = c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: sb.Msg.Id, Yaml: gatewaySecretPolicy}))
	wantMissing("set", err)
	hist, err := c.policy.History(ctx, connect.NewRequest(&gatewayv1.PolicyHistoryRequest{SandboxId: sb.Msg.Id}))
	if err != nil || !slices.EqualFunc(hist.Msg.Versions, []int64{1}, func(v *gatewayv1.PolicyVersion, n int64) bool { return v.Version == n }) {
		t.Fatalf("history after a refused set: %v %v", hist, err)
	}
}

// policyTaking is a policy taking each named gateway secret.
func policyTaking(names ...string) string {
	var b strings.Builder
	b.WriteString("version: 1\nnetwork_policies:\n  x:\n    endpoints:\n      - {host: api.example, port: 443, protocol: rest, tls: terminate, access: read-only}\nsecrets:\n")
	for i, n := range names {
		fmt.Fprintf(&b, "  S%d: {from_gateway: %s, hosts: [api.example]}\n", i, n)
	}
	return b.String()
}

// TestJoinTakesOnlyGrantedSecrets: the joiner writes its own policy, so
// it may take from_gateway only the secrets its join token grants. Naming
// any other is refused with the same answer whether the gateway holds
// that secret or not (a refused join cannot probe which names exist), the
// token stays unspent, and the joined sandbox receives, now and on
// rotation, only what was granted.
func TestJoinTakesOnlyGrantedSecrets(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	admin := g.clients(g.user, nil)
	setSecret(t, admin, "prod-db-password", "hunter2-prod-db-0123456789")
	setSecret(t, admin, "gh-token", "ghp_grantedVALUE0123456789")

	join := func(c clients, names ...string) (*connect.Response[gatewayv1.JoinResponse], error) {
		return c.supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "remote", Policy: policyTaking(names...)}))
	}
	// The answer for a held secret and a missing one differs only in the
	// name the policy gave.
	refusal := func(c clients, name string) string {
		t.Helper()
		_, err := join(c, name)
		if codeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "corral gateway token create --join --secret NAME") {
			t.Fatalf("join taking ungranted %s: %v", name, err)
		}
		return strings.ReplaceAll(err.Error(), name, "NAME")
	}
	bare, _, err := auth.CreateToken(ctx, g.store, store.TokenJoin, "host-b", "")
	if err != nil {
		t.Fatal(err)
	}
	noGrant := g.clients(bare, nil)
	if held, missing := refusal(noGrant, "prod-db-password"), refusal(noGrant, "aws-key"); held != missing {
		t.Errorf("a refused join tells a held secret from a missing one:\n%s\n%s", held, missing)
	}

	granting, _, err := auth.CreateToken(ctx, g.store, store.TokenJoin, "host-c", "", "gh-token")
	if err != nil {
		t.Fatal(err)
	}
	j := g.clients(granting, nil)
	if held, missing := refusal(j, "prod-db-password"), refusal(j, "aws-key"); held != missing {
		t.Errorf("a refused join tells a held secret from a missing one:\n%s\n%s", held, missing)
	}
	if _, err := join(j, "gh-token", "prod-db-password"); codeOf(err) != connect.CodePermissionDenied || strings.Contains(err.Error(), "gh-token") {
		t.Fatalf("join taking a granted and an ungranted secret: %v", err)
	}
	// The refusals left the token unspent: it joins taking what it grants.
	r, err := join(j, "gh-token")
	if err != nil {
		t.Fatalf("join taking the granted secret: %v", err)
	}
	sup := g.clients(r.Msg.Token, nil)
	s, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := secretMap(receive(t, s)); !maps1(got, "gh-token", "ghp_grantedVALUE0123456789") {
		t.Fatalf("the joined sandbox got %v, want only the granted gh-token", got)
	}
	setSecret(t, admin, "prod-db-password", "hunter2-rotated-0123456789")
	setSecret(t, admin, "gh-token", "ghp_rotatedVALUE0123456789")
	if got := secretMap(receive(t, s)); !maps1(got, "gh-token", "ghp_rotatedVALUE0123456789") {
		t.Fatalf("after rotation the joined sandbox got %v, want only the new gh-token", got)
	}

	// A sandbox a user creates runs the operator's policy: it may take
	// any secret the gateway holds.
	if _, err := admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake", Policy: policyTaking("gh-token", "prod-db-password")})); err != nil {
		t.Fatalf("create taking two secrets: %v", err)
	}
}

// TestEndedSandboxGetsNoSecrets: once a sandbox has exited or failed its
// credential, still valid for its last log lines, receives no secret
// value: not on a stream open before, not on rotation, not on a new
// Subscribe.
func TestEndedSandboxGetsNoSecrets(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	admin := g.clients(g.user, nil)
	setSecret(t, admin, "gh-token", "ghp_firstVALUE0123456789")
	for i, phase := range []gatewayv1.Phase{gatewayv1.Phase_PHASE_EXITED, gatewayv1.Phase_PHASE_FAILED} {
		sb, err := admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake", Policy: gatewaySecretPolicy}))
		if err != nil {
			t.Fatal(err)
		}
		sup := g.clients(g.fake.link(sb.Msg.Id).Token, nil)
		open, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		defer open.Close()
		if got := secretMap(receive(t, open)); got["gh-token"] == "" {
			t.Fatalf("a running sandbox got no secret: %v", got)
		}
		code := int32(0)
		if _, err := sup.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: phase, ExitCode: &code})); err != nil {
			t.Fatal(err)
		}
		rotated := fmt.Sprintf("ghp_rotatedAFTERend%05d", i)
		setSecret(t, admin, "gh-token", rotated)
		// The routes set after the rotation are the next thing the open
		// stream sees, without the value.
		if _, err := admin.routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: routesYAML})); err != nil {
			t.Fatal(err)
		}
		if u := receive(t, open); len(u.Secrets) > 0 || u.Routes == nil {
			t.Errorf("%v sandbox's open stream got %v, want the routes and no secret", phase, u)
		}
		again, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		if u := receive(t, again); len(u.Secrets) > 0 {
			t.Errorf("%v sandbox's new stream got secrets %v", phase, secretMap(u))
		}
		push(t, sup, 0, &gatewayv1.LogEntry{Level: "info", Message: "last line"})
	}
}
