package policylocal

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/service"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

const pol = `version: 1
network_policies:
  gh:
    endpoints: [{host: api.github.com, port: 443, protocol: rest, tls: terminate, access: read-only}]
    binaries: [{path: /usr/bin/curl}]
secrets:
  GITHUB_TOKEN:
    from_env: CORRAL_TEST_REAL_TOKEN_SOURCE
    hosts: [api.github.com]
`

// clock is a settable time for the rate limits.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newServer(t *testing.T) (*httptest.Server, *service.Service, *audit.Logger, *clock) {
	t.Helper()
	p, err := policy.Parse([]byte(pol), "test")
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	aud := audit.Discard()
	rl, err := reload.New(c, func(c *policy.Compiled, _ *reload.Snapshot) (reload.Decider, *secrets.Set, error) {
		e, err := decide.New(c, nil)
		return e, nil, err
	}, aud, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(service.Config{Dir: t.TempDir(), Reloader: rl, Audit: aud, NoProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go svc.Run(ctx)
	clk := &clock{t: time.Unix(1e9, 0)}
	h := &Handler{Advisor: svc, Policy: rl, Now: clk.now,
		Identify: func(context.Context) (egress.Request, bool) {
			return egress.Request{Identity: egress.Identity{Binary: "/usr/bin/curl"}}, true
		}}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); cancel(); svc.Close() })
	return srv, svc, aud, clk
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The policy is shown with secrets by name and scope only: never where
// their value comes from.
func TestCurrentPolicyHidesSecretSources(t *testing.T) {
	srv, _, _, _ := newServer(t)
	code, body := do(t, "GET", srv.URL+"/v1/policy/current", "")
	if code != 200 || !strings.Contains(body, "GITHUB_TOKEN") || !strings.Contains(body, "api.github.com") {
		t.Fatalf("%d %s", code, body)
	}
	if strings.Contains(body, "CORRAL_TEST_REAL_TOKEN_SOURCE") || strings.Contains(body, "from_env") {
		t.Errorf("the policy view shows where a secret comes from:\n%s", body)
	}
}

// An agent's proposal is validated like the advisor's: it must answer a
// denial of the calling binary, and a valid one is pending, not applied.
func TestProposal(t *testing.T) {
	srv, _, aud, _ := newServer(t)
	add := `{"addition": "network_policies:\n  pypi:\n    endpoints: [{host: pypi.org, port: 443, protocol: rest, tls: terminate, access: read-only}]\n    binaries: [{path: /usr/bin/curl}]\n", "intent": "read package metadata"}`
	code, body := do(t, "POST", srv.URL+"/v1/proposals", add)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "invalid") {
		t.Fatalf("a proposal answering no denial: %d %s", code, body)
	}
	aud.Log(audit.NetConnectEvent{Outcome: audit.OutcomeDenied, Host: "pypi.org", Port: 443, Binary: "/usr/bin/curl", Reason: egress.ReasonNoPolicy})
	code, body = do(t, "POST", srv.URL+"/v1/check", add)
	if code != 200 || !strings.Contains(body, `"verdict": "narrow"`) {
		t.Fatalf("check: %d %s", code, body)
	}
	code, body = do(t, "POST", srv.URL+"/v1/proposals", add)
	if code != http.StatusCreated {
		t.Fatalf("proposal: %d %s", code, body)
	}
	var resp struct {
		Draft DraftView `json:"draft"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Draft.State != "pending" || resp.Draft.Author != "agent" {
		t.Errorf("draft %+v", resp.Draft)
	}
	code, body = do(t, "GET", srv.URL+"/v1/proposals/"+resp.Draft.ID+"/wait?timeout=100ms", "")
	if code != http.StatusAccepted || !strings.Contains(body, `"done": false`) {
		t.Errorf("wait on a pending draft: %d %s", code, body)
	}
	// Never applied by itself.
	code, body = do(t, "GET", srv.URL+"/v1/policy/current", "")
	if code != 200 || strings.Contains(body, "pypi") {
		t.Errorf("the proposal is in the policy before anyone approved it:\n%s", body)
	}
}

// Past the limits, requests and proposals get 429 until time passes.
func TestRateLimits(t *testing.T) {
	srv, _, _, clk := newServer(t)
	limited := 0
	for range ProposalsPerMin + 1 {
		if code, _ := do(t, "POST", srv.URL+"/v1/proposals", `{"addition": "network_policies: {}"}`); code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited != 1 {
		t.Errorf("%d of %d proposals refused by the rate limit, want 1", limited, ProposalsPerMin+1)
	}
	clk.t = clk.t.Add(time.Minute)
	if code, _ := do(t, "POST", srv.URL+"/v1/proposals", `{"addition": "network_policies: {}"}`); code == http.StatusTooManyRequests {
		t.Errorf("a proposal a minute later was refused")
	}
	limited = 0
	for range RequestBurst + 5 {
		if code, _ := do(t, "GET", srv.URL+"/v1/skill", ""); code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited == 0 {
		t.Errorf("no request refused past the burst of %d", RequestBurst)
	}
}
