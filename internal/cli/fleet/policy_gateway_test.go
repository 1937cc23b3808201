package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/policy"
)

// reportWhenStored waits until the gateway holds version v of the
// sandbox's policy and reports it as the supervisor would.

// Two policies to set at a sandbox, one after the other.
const (
	mirrorPolicy = "version: 1\nnetwork_policies:\n  mirror:\n    endpoints: [{host: mirror.test, port: 443}]\n"
	otherPolicy  = "version: 1\nnetwork_policies:\n  other:\n    endpoints: [{host: other.test, port: 443}]\n"
)

func (g *testGateway) reportWhenStored(id string, v int64, st gatewayv1.PolicyStatus, msg string) <-chan error {
	done := make(chan error, 1)
	sup := g.supervisor(id)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			pv, err := g.store.Policy(ctx, id, 0)
			if err == nil && pv.Version >= v {
				break
			}
			select {
			case <-ctx.Done():
				done <- ctx.Err()
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		_, err := sup.ReportPolicyStatus(ctx, connect.NewRequest(&gatewayv1.ReportPolicyStatusRequest{Version: v, Status: st, Error: msg}))
		done <- err
	}()
	return done
}

func TestPolicyThroughGateway(t *testing.T) {
	g := startTestGateway(t)
	g.useEnv()
	id := g.createExternal("p")
	g.reportPhase(id, gatewayv1.Phase_PHASE_READY, nil)
	mirror := writeTemp(t, "mirror.yaml", mirrorPolicy)
	other := writeTemp(t, "other.yaml", otherPolicy)

	r := runCorral(t, "", "policy", "get", "--sandbox", id)
	if r.code != 0 {
		t.Fatalf("get: %s", r)
	}
	if _, err := policy.Parse([]byte(r.stdout), "get"); err != nil {
		t.Fatalf("policy get printed no valid policy: %v\n%s", err, r.stdout)
	}

	// --wait 0: the version is stored and pending.
	r = runCorral(t, "", "policy", "set", "--sandbox", id, "--wait", "0", mirror)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "sandbox "+id+": policy version 2 (sha256 ") {
		t.Fatalf("set --wait 0: %s", r)
	}
	if r := runCorral(t, "", "policy", "status", "--sandbox", id); r.code != 0 || !strings.Contains(r.stdout, "policy version 2 (sha256") || !strings.HasSuffix(r.stdout, " PENDING\n") {
		t.Fatalf("status after set: %s", r)
	}

	// The supervisor loads it: set waits for that and says so.
	reported := g.reportWhenStored(id, 3, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED, "")
	r = runCorral(t, "", "policy", "set", "--sandbox", id, other)
	if err := <-reported; err != nil {
		t.Fatal(err)
	}
	if r.code != 0 || !strings.Contains(r.stdout, "sandbox "+id+": policy version 3 LOADED\n") {
		t.Fatalf("set, loaded: %s", r)
	}

	// The supervisor fails to load it: set exits non-zero with the error.
	reported = g.reportWhenStored(id, 4, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED, "l7 rules: upstream CA missing")
	r = runCorral(t, "", "policy", "set", "--sandbox", id, mirror)
	if err := <-reported; err != nil {
		t.Fatal(err)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "policy version 4 FAILED, the sandbox keeps its previous policy: l7 rules: upstream CA missing") {
		t.Fatalf("set, failed: %s", r)
	}
	r = runCorral(t, "", "policy", "status", "--sandbox", id)
	if r.code != 0 || !strings.Contains(r.stdout, "policy version 4 ") || !strings.Contains(r.stdout, " FAILED\nerror: l7 rules: upstream CA missing\n") {
		t.Fatalf("status after a failed load: %s", r)
	}

	// Nobody reports: set gives up after --wait without failing.
	start := time.Now()
	r = runCorral(t, "", "policy", "set", "--sandbox", id, "--wait", "300ms", other)
	if r.code != 0 || !strings.Contains(r.stderr, "has not reported policy version 5 after 300ms") || time.Since(start) > 5*time.Second {
		t.Fatalf("set, no report: %s", r)
	}

	r = runCorral(t, "", "policy", "history", "--sandbox", id)
	hist := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(hist) != 6 || !strings.HasPrefix(hist[0], "VERSION") {
		t.Fatalf("history: %s", r)
	}
	// Newest first.
	for i, want := range []string{"PENDING -", "FAILED l7 rules: upstream CA missing", "LOADED -", "PENDING -", "PENDING -"} {
		row := strings.Join(strings.Fields(hist[i+1]), " ")
		if !strings.HasPrefix(row, string(rune('5'-i))+" ") || !strings.HasSuffix(row, want) {
			t.Errorf("history row %q, want version %d …%s", row, 5-i, want)
		}
	}
	if r := runCorral(t, "", "policy", "get", "--sandbox", id, "--version", "2"); r.code != 0 || !strings.Contains(r.stdout, "mirror.test") {
		t.Errorf("get --version 2: %s", r)
	}
	if r := runCorral(t, "", "policy", "get", "--sandbox", id, "--version", "99"); r.code != 1 || !strings.Contains(r.stderr, "no policy version 99") {
		t.Errorf("get --version 99: %s", r)
	}

	// The gateway's refusals are printed as it words them.
	bad := writeTemp(t, "bad.yaml", "version: 1\nnetwork:\n  mode: sideways\n")
	r = runCorral(t, "", "policy", "set", "--sandbox", id, bad)
	if r.code != 2 {
		t.Errorf("bad policy: %s", r)
	}
	for _, p := range checkerProblems(t, bad) {
		if !strings.Contains(r.stderr, p) {
			t.Errorf("bad policy: no %q in %s", p, r.stderr)
		}
	}
	static := writeTemp(t, "static.yaml", "version: 1\nlimits:\n  memory: 1GiB\n")
	if r := runCorral(t, "", "policy", "set", "--sandbox", id, static); r.code != 2 || !strings.Contains(r.stderr, "limits") {
		t.Errorf("static change: %s", r)
	}
	if r := runCorral(t, "", "policy", "set", "--sandbox", "nosuch", mirror); r.code != 1 || !strings.Contains(r.stderr, "no sandbox nosuch at the gateway") {
		t.Errorf("unknown sandbox: %s", r)
	}
	if r := runCorral(t, "", "policy", "status"); r.code != 2 || !strings.Contains(r.stderr, "--sandbox ID is required") {
		t.Errorf("no --sandbox: %s", r)
	}
}

// TestPolicySetWithoutGatewayStaysLocal: with no gateway anywhere (or with
// --local), policy set goes to the control socket as before.
func TestPolicySetWithoutGatewayStaysLocal(t *testing.T) {
	g := startTestGateway(t)
	mirror := writeTemp(t, "mirror.yaml", mirrorPolicy)
	state := t.TempDir()
	local := func(r cliResult) {
		t.Helper()
		if r.code != 1 || strings.Contains(r.stderr, "gateway") || !strings.Contains(r.stderr, "nosuch") {
			t.Errorf("want the local control socket's error: %s", r)
		}
	}
	local(runCorral(t, "", "policy", "set", "--sandbox", "nosuch", "--state-dir", state, mirror))
	g.useEnv()
	local(runCorral(t, "", "policy", "set", "--local", "--sandbox", "nosuch", "--state-dir", state, mirror))
	if r := runCorral(t, "", "policy", "set", "--sandbox", "nosuch", "--state-dir", state, mirror); !strings.Contains(r.stderr, "at the gateway") {
		t.Errorf("with CORRAL_GATEWAY set: %s", r)
	}
}

// TestSandboxTextEscapesSupervisorText: red-team finding rt-gw 4, related
// part. A supervisor that joins labels its sandbox and reports why it
// failed and why a policy did not load; sandbox list/get and policy
// status/history print all of it as visible escapes.
func TestSandboxTextEscapesSupervisorText(t *testing.T) {
	const hostile = "\x1b[2J\x1b[31mprod-db\x1b[0m\nFAKE\tready\u009b2J\u202e"
	const shown = `\x1b[2J\x1b[31mprod-db\x1b[0m\nFAKE\tready\u009b2J\u202e`
	if got, want := labelText(map[string]string{"team": hostile}), "team="+shown; got != want {
		t.Errorf("labels %q, want %q", got, want)
	}

	g := startTestGateway(t)
	g.useEnv()
	id := g.createExternal("joined")
	if err := <-g.reportWhenStored(id, 1, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED, hostile); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.supervisor(id).ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_FAILED, Reason: hostile})); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "get", id}, "phase:    failed: " + shown + "\n"},
		{[]string{"policy", "status", "--sandbox", id}, "error: " + shown + "\n"},
		{[]string{"policy", "history", "--sandbox", id}, `\x1b[2J\x1b[31mprod-db\x1b[0m FAKE ready\u009b2J\u202e`},
	} {
		r := runCorral(t, "", c.args...)
		if r.code != 0 || !strings.Contains(r.stdout, c.want) {
			t.Errorf("%q: exit %d, want %q in\n%q", c.args, r.code, c.want, r.stdout+r.stderr)
		}
		if strings.ContainsAny(r.stdout, "\x1b\u009b\u202e") {
			t.Errorf("%q prints the supervisor's control characters: %q", c.args, r.stdout)
		}
	}
}
