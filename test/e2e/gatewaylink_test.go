package e2e

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	gatewayv1 "github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

const e2eSandboxToken = "cgw_s_e2e"

// linkGateway is the supervisor side of a gateway: it serves one
// sandbox's policy versions and records what the supervisor reports.
type linkGateway struct {
	mu       sync.Mutex
	changed  chan struct{}
	policies []string
	statuses []*gatewayv1.ReportPolicyStatusRequest
	phases   []*gatewayv1.ReportPhaseRequest
	entries  []*gatewayv1.LogEntry
}

func (g *linkGateway) change(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f()
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *linkGateway) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		g.mu.Lock()
		ok, ch := cond(), g.changed
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (g *linkGateway) status(v int64) *gatewayv1.ReportPolicyStatusRequest {
	for _, s := range g.statuses {
		if s.GetVersion() == v {
			return s
		}
	}
	return nil
}

func checkToken(h http.Header) error {
	if h.Get("Authorization") != "Bearer "+e2eSandboxToken {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("bad token"))
	}
	return nil
}

func (g *linkGateway) Join(context.Context, *connect.Request[gatewayv1.JoinRequest]) (*connect.Response[gatewayv1.JoinResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no joins here"))
}

func (g *linkGateway) Subscribe(ctx context.Context, r *connect.Request[gatewayv1.SubscribeRequest], s *connect.ServerStream[gatewayv1.Update]) error {
	if err := checkToken(r.Header()); err != nil {
		return err
	}
	have, first := r.Msg.GetPolicyVersion(), true
	for {
		g.mu.Lock()
		n, ch := int64(len(g.policies)), g.changed
		var u gatewayv1.Update
		if n > have {
			u.Policy = &gatewayv1.PolicyVersion{SandboxId: "e2e", Version: n, Yaml: g.policies[n-1]}
		}
		g.mu.Unlock()
		if u.Policy != nil || first {
			if err := s.Send(&u); err != nil {
				return err
			}
			have, first = n, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
	}
}

func (g *linkGateway) ReportPolicyStatus(_ context.Context, r *connect.Request[gatewayv1.ReportPolicyStatusRequest]) (*connect.Response[gatewayv1.ReportPolicyStatusResponse], error) {
	if err := checkToken(r.Header()); err != nil {
		return nil, err
	}
	g.change(func() { g.statuses = append(g.statuses, r.Msg) })
	return connect.NewResponse(&gatewayv1.ReportPolicyStatusResponse{}), nil
}

func (g *linkGateway) ReportPhase(_ context.Context, r *connect.Request[gatewayv1.ReportPhaseRequest]) (*connect.Response[gatewayv1.ReportPhaseResponse], error) {
	if err := checkToken(r.Header()); err != nil {
		return nil, err
	}
	g.change(func() { g.phases = append(g.phases, r.Msg) })
	return connect.NewResponse(&gatewayv1.ReportPhaseResponse{}), nil
}

func (g *linkGateway) PushLogs(_ context.Context, s *connect.ClientStream[gatewayv1.LogBatch]) (*connect.Response[gatewayv1.PushLogsResponse], error) {
	if err := checkToken(s.RequestHeader()); err != nil {
		return nil, err
	}
	var got []*gatewayv1.LogEntry
	for s.Receive() {
		got = append(got, s.Msg().GetEntries()...)
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	g.change(func() { g.entries = append(g.entries, got...) })
	return connect.NewResponse(&gatewayv1.PushLogsResponse{Accepted: int64(len(got))}), nil
}

// TestGatewayLinkPolicyPush runs a real sandbox whose policy comes from a
// gateway: what the first version allows is reachable and nothing else;
// a version pushed while the workload runs is enforced at once and
// reported LOADED; a version changing a section fixed at start is
// reported FAILED and the running policy keeps working; the phases and
// the audit trail reach the gateway.
func TestGatewayLinkPolicyPush(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "one.test", Addr: netip.MustParseAddr("203.0.113.10")},
		netlab.Host{Name: "two.test", Addr: netip.MustParseAddr("203.0.113.11")})
	m := getRootMode(t)
	fx := newFixture(t, m)

	allow := func(hosts ...string) string {
		s := "network_policies:\n  web:\n    endpoints:\n"
		for _, h := range hosts {
			s += "      - {host: " + h + ", port: 80}\n"
		}
		return basePolicy(s)
	}
	g := &linkGateway{changed: make(chan struct{}), policies: []string{allow("one.test")}}
	mux := http.NewServeMux()
	mux.Handle(gatewayv1connect.NewSupervisorServiceHandler(g))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(fx.aux, "gateway-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(fx.aux, "gateway-token")
	if err := os.WriteFile(tokenFile, []byte(e2eSandboxToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	script := `while [ ! -e stop ]; do
  for h in one two; do curl -s -o /dev/null -w "$h %{http_code}\n" --max-time 2 http://$h.test/; done
  sleep 0.1
done`
	p := startCorral(t, fx, runOpts{
		args: []string{"/bin/sh", "-c", script},
		flags: []string{"--upstream-dns", lab.DNS.String(),
			"--gateway", srv.URL, "--gateway-ca", caFile, "--gateway-token-file", tokenFile},
	})
	waitOut(t, p, "one 200", 15*time.Second)
	waitOut(t, p, "two ", 15*time.Second)
	if strings.Contains(p.stdout.String(), "two 200") {
		t.Fatalf("two.test reachable under version 1, which allows only one.test:\n%s", p.stdout)
	}
	g.waitFor(t, "version 1 LOADED and phase ready", func() bool {
		s := g.status(1)
		return s != nil && s.GetStatus() == gatewayv1.PolicyStatus_POLICY_STATUS_LOADED &&
			len(g.phases) > 0 && g.phases[0].GetPhase() == gatewayv1.Phase_PHASE_READY
	})

	g.change(func() { g.policies = append(g.policies, allow("one.test", "two.test")) })
	waitOut(t, p, "two 200", 10*time.Second)
	g.waitFor(t, "version 2 LOADED", func() bool {
		s := g.status(2)
		return s != nil && s.GetStatus() == gatewayv1.PolicyStatus_POLICY_STATUS_LOADED
	})

	// Version 3 opens the home directory: a static section, refused.
	g.change(func() {
		g.policies = append(g.policies, `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt, /root]
network_policies:
  web:
    endpoints:
      - {host: one.test, port: 80}
`)
	})
	g.waitFor(t, "version 3 FAILED", func() bool {
		s := g.status(3)
		return s != nil && s.GetStatus() == gatewayv1.PolicyStatus_POLICY_STATUS_FAILED
	})
	g.mu.Lock()
	failMsg := g.status(3).GetError()
	g.mu.Unlock()
	if !strings.Contains(failMsg, "filesystem") {
		t.Errorf("version 3 FAILED with %q, want the static section named", failMsg)
	}
	// Still version 2: two.test stays reachable.
	mark := len(p.stdout.String())
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stdout.String()[mark:], "two ") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if after := p.stdout.String()[mark:]; !strings.Contains(after, "two 200") {
		t.Errorf("after the refused version 3, two.test answers:\n%s", after)
	}

	fx.signal(t, "stop")
	r := p.wait()
	if r.code != 0 {
		t.Fatalf("corral exited %d\n%s", r.code, r)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	last := g.phases[len(g.phases)-1]
	if last.GetPhase() != gatewayv1.Phase_PHASE_EXITED || last.GetExitCode() != 0 {
		t.Errorf("last phase %v, want exited 0", last)
	}
	events := map[string]int{}
	for _, e := range g.entries {
		events[e.GetEvent()]++
	}
	for _, want := range []string{"sandbox.start", "net.connect.allowed", "policy.reloaded", "policy.reload_failed", "sandbox.exit"} {
		if events[want] == 0 {
			t.Errorf("no %s entry reached the gateway; got %v", want, events)
		}
	}
}
