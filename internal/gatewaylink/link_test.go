package gatewaylink

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/audit"
	gatewayv1 "github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

const (
	testSandboxToken = SandboxTokenPrefix + "test-sandbox"
	testJoinToken    = JoinTokenPrefix + "test-join"
)

// fakeGateway is the supervisor side of a gateway, as the API describes
// it, with everything it receives recorded.
type fakeGateway struct {
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change
	policies []string      // version i+1
	joinUsed bool
	joins    []*gatewayv1.JoinRequest
	subs     []int64 // the policy_version of each Subscribe
	statuses []*gatewayv1.ReportPolicyStatusRequest
	phases   []*gatewayv1.ReportPhaseRequest
	entries  []*gatewayv1.LogEntry
	dropped  int64
	// secrets are sent on the first update and again each time
	// secretsGen grows; routes are version i+1.
	secrets    map[string]string
	secretsGen int
	routes     []string
}

func newFakeGateway(policies ...string) *fakeGateway {
	return &fakeGateway{changed: make(chan struct{}), policies: policies}
}

// change runs f under the lock and wakes every waiter.
func (g *fakeGateway) change(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f()
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *fakeGateway) setPolicy(yaml string) {
	g.change(func() { g.policies = append(g.policies, yaml) })
}

// waitFor polls cond under the lock until it holds.
func (g *fakeGateway) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
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

func auth(h http.Header, token string) error {
	if h.Get("Authorization") != "Bearer "+token {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("bad token"))
	}
	return nil
}

func (g *fakeGateway) Join(_ context.Context, r *connect.Request[gatewayv1.JoinRequest]) (*connect.Response[gatewayv1.JoinResponse], error) {
	if err := auth(r.Header(), testJoinToken); err != nil {
		return nil, err
	}
	var err error
	g.change(func() {
		if g.joinUsed {
			err = connect.NewError(connect.CodeUnauthenticated, errors.New("join token spent"))
			return
		}
		g.joinUsed = true
		g.joins = append(g.joins, r.Msg)
		if len(g.policies) == 0 {
			g.policies = append(g.policies, r.Msg.GetPolicy())
		}
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&gatewayv1.JoinResponse{SandboxId: "sb1", Token: testSandboxToken}), nil
}

func (g *fakeGateway) Subscribe(ctx context.Context, r *connect.Request[gatewayv1.SubscribeRequest], s *connect.ServerStream[gatewayv1.Update]) error {
	if err := auth(r.Header(), testSandboxToken); err != nil {
		return err
	}
	have := r.Msg.GetPolicyVersion()
	g.change(func() { g.subs = append(g.subs, have) })
	first := true
	haveRoutes, haveSecrets := r.Msg.GetRoutesVersion(), -1
	for {
		g.mu.Lock()
		n, ch := int64(len(g.policies)), g.changed
		var u gatewayv1.Update
		if n > have {
			u.Policy = &gatewayv1.PolicyVersion{SandboxId: "sb1", Version: n, Yaml: g.policies[n-1]}
		}
		if nr := int64(len(g.routes)); nr > haveRoutes {
			u.Routes = &gatewayv1.Routes{Version: nr, Yaml: g.routes[nr-1]}
			haveRoutes = nr
		}
		if g.secretsGen > haveSecrets {
			for name, v := range g.secrets {
				u.Secrets = append(u.Secrets, &gatewayv1.SecretValue{Name: name, Value: []byte(v)})
			}
			haveSecrets = g.secretsGen
		}
		g.mu.Unlock()
		if u.Policy != nil || u.Routes != nil || len(u.Secrets) > 0 || first {
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

func (g *fakeGateway) ReportPolicyStatus(_ context.Context, r *connect.Request[gatewayv1.ReportPolicyStatusRequest]) (*connect.Response[gatewayv1.ReportPolicyStatusResponse], error) {
	if err := auth(r.Header(), testSandboxToken); err != nil {
		return nil, err
	}
	g.change(func() { g.statuses = append(g.statuses, r.Msg) })
	return connect.NewResponse(&gatewayv1.ReportPolicyStatusResponse{}), nil
}

func (g *fakeGateway) ReportPhase(_ context.Context, r *connect.Request[gatewayv1.ReportPhaseRequest]) (*connect.Response[gatewayv1.ReportPhaseResponse], error) {
	if err := auth(r.Header(), testSandboxToken); err != nil {
		return nil, err
	}
	g.change(func() { g.phases = append(g.phases, r.Msg) })
	return connect.NewResponse(&gatewayv1.ReportPhaseResponse{}), nil
}

func (g *fakeGateway) PushLogs(_ context.Context, s *connect.ClientStream[gatewayv1.LogBatch]) (*connect.Response[gatewayv1.PushLogsResponse], error) {
	if err := auth(s.RequestHeader(), testSandboxToken); err != nil {
		return nil, err
	}
	var got []*gatewayv1.LogEntry
	var dropped int64
	for s.Receive() {
		got = append(got, s.Msg().GetEntries()...)
		dropped += s.Msg().GetDropped()
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	// Stored only once the whole call arrived, as a gateway that answers
	// with the count accepted would.
	g.change(func() {
		g.entries = append(g.entries, got...)
		g.dropped += dropped
	})
	return connect.NewResponse(&gatewayv1.PushLogsResponse{Accepted: int64(len(got))}), nil
}

// server serves g over TLS (HTTP/2) and can be stopped and started again
// on the same address, like a gateway that is killed and restarted.
type server struct {
	t      *testing.T
	g      *fakeGateway
	addr   string
	caFile string
	srv    *httptest.Server
}

func startServer(t *testing.T, g *fakeGateway) *server {
	s := &server{t: t, g: g}
	s.start()
	t.Cleanup(s.stop)
	block := &pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw}
	s.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(s.caFile, pem.EncodeToMemory(block), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *server) start() {
	addr := s.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	var err error
	// The port of a server just stopped may take a moment to be free.
	for range 50 {
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(gatewayv1connect.NewSupervisorServiceHandler(s.g))
	s.srv = httptest.NewUnstartedServer(mux)
	s.srv.Listener = l
	s.srv.EnableHTTP2 = true
	s.srv.StartTLS()
	s.addr = l.Addr().String()
}

// stop drops every connection at once, as a killed gateway would.
func (s *server) stop() {
	if s.srv == nil {
		return
	}
	s.srv.CloseClientConnections()
	s.srv.Close()
	s.srv = nil
}

func (s *server) url() string { return "https://" + s.addr }

func writeToken(t *testing.T, token string) string {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func testConfig(t *testing.T, s *server, tokenFile, stateDir string) Config {
	return Config{
		URL: s.url(), CAFile: s.caFile, TokenFile: tokenFile, StateDir: stateDir,
		StartTimeout: 2 * time.Second, FinishWait: 2 * time.Second,
		FlushEvery: 20 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	}
}

// A policy the reloader takes, differing from the default only in what
// may change while a sandbox runs.
func netPolicy(host string) string {
	return fmt.Sprintf(`version: 1
network_policies:
  p:
    endpoints:
      - host: %s
        port: 443
`, host)
}

// hostInForce is the host of netPolicy in the reloader's snapshot.
func hostInForce(r *reload.Reloader) string {
	eps := r.Current().Policy.Policy.NetworkPolicies["p"].Endpoints
	if len(eps) == 0 {
		return ""
	}
	return eps[0].Host
}

// newReloader runs the default policy; the tests apply updates with it,
// as the supervisor does.
func newReloader(t *testing.T, start Policy) *reload.Reloader {
	p, err := policy.Parse(start.YAML, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	r, err := reload.New(c, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func serve(t *testing.T, l *Link, r *reload.Reloader) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Serve(ctx, Handlers{Policy: func(_ int64, y []byte) error { return r.Set(y, "gateway") }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func hasStatus(g *fakeGateway, v int64, st gatewayv1.PolicyStatus) bool {
	for _, s := range g.statuses {
		if s.GetVersion() == v && s.GetStatus() == st {
			return true
		}
	}
	return false
}

func TestPolicyFirstThenUpdates(t *testing.T) {
	g := newFakeGateway(netPolicy("one.example"))
	s := startServer(t, g)
	l, pol, err := Start(context.Background(), testConfig(t, s, writeToken(t, testSandboxToken), t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Finish(0, nil)
	if pol.Version != 1 || string(pol.YAML) != netPolicy("one.example") || pol.Cached {
		t.Fatalf("start policy = %+v, want version 1 from the gateway", pol)
	}
	if l.SandboxID() != "sb1" {
		t.Errorf("sandbox id = %q, want sb1", l.SandboxID())
	}
	r := newReloader(t, pol)
	serve(t, l, r)
	g.waitFor(t, "v1 LOADED", func() bool { return hasStatus(g, 1, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED) })

	g.setPolicy(netPolicy("two.example"))
	g.waitFor(t, "v2 reported", func() bool { return len(g.statuses) == 2 })
	if st := g.statuses[1]; st.GetStatus() != gatewayv1.PolicyStatus_POLICY_STATUS_LOADED {
		t.Fatalf("v2: %v", st)
	}
	if h := hostInForce(r); h != "two.example" {
		t.Fatalf("policy in force after v2 names %q, want two.example", h)
	}

	// A change to a section fixed at start is refused; v2 stays.
	g.setPolicy("version: 1\nfilesystem_policy:\n  read_write: [/etc]\n")
	g.waitFor(t, "v3 FAILED", func() bool { return hasStatus(g, 3, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED) })
	g.mu.Lock()
	msg := g.statuses[len(g.statuses)-1].GetError()
	g.mu.Unlock()
	if !strings.Contains(msg, "fixed when a sandbox starts") {
		t.Errorf("FAILED error = %q, want the reloader's reason", msg)
	}
	if h := hostInForce(r); h != "two.example" {
		t.Fatalf("after a refused v3 the policy in force names %q, want two.example", h)
	}
	if got := l.version.Load(); got != 2 {
		t.Errorf("version in force = %d, want 2", got)
	}
}

func TestReconnectAfterGatewayRestart(t *testing.T) {
	g := newFakeGateway(netPolicy("one.example"))
	s := startServer(t, g)
	l, pol, err := Start(context.Background(), testConfig(t, s, writeToken(t, testSandboxToken), t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	r := newReloader(t, pol)
	serve(t, l, r)
	l.Observe(audit.NetConnectEvent{Outcome: audit.OutcomeAllowed, Host: "before.example"})
	g.waitFor(t, "the first entry", func() bool { return len(g.entries) == 1 })

	s.stop()
	// Away: a policy is set, and the sandbox keeps logging.
	g.setPolicy(netPolicy("while-away.example"))
	for i := range 50 {
		l.Observe(audit.NetConnectEvent{Outcome: audit.OutcomeDenied, Host: fmt.Sprintf("away%d.example", i)})
	}
	time.Sleep(200 * time.Millisecond)
	if h := hostInForce(r); h != "one.example" {
		t.Fatalf("policy changed while the gateway was down: %q", h)
	}
	s.start()

	g.waitFor(t, "v2 LOADED after the restart", func() bool { return hasStatus(g, 2, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED) })
	if h := hostInForce(r); h != "while-away.example" {
		t.Fatalf("policy in force after reconnect names %q, want while-away.example", h)
	}
	g.waitFor(t, "the entries logged while away", func() bool { return len(g.entries) >= 51 })
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.subs[len(g.subs)-1] != 1 {
		t.Errorf("reconnect subscribed with policy_version %d, want 1 (what it runs)", g.subs[len(g.subs)-1])
	}
	seen := map[string]int{}
	for _, e := range g.entries {
		var f struct {
			Host string `json:"host"`
		}
		if err := json.Unmarshal(e.GetFields(), &f); err != nil {
			t.Fatalf("fields of %v: %v", e, err)
		}
		seen[f.Host]++
		if e.GetSource() != SourceAudit || !strings.HasPrefix(e.GetEvent(), "net.connect.") {
			t.Errorf("entry %v: want source audit and a net.connect event", e)
		}
	}
	for i := range 50 {
		if seen[fmt.Sprintf("away%d.example", i)] == 0 {
			t.Errorf("entry away%d logged during the outage never arrived", i)
		}
	}
	if g.dropped != 0 {
		t.Errorf("dropped = %d, want 0", g.dropped)
	}
}

func TestOverflowIsCountedAsDropped(t *testing.T) {
	g := newFakeGateway(netPolicy("one.example"))
	s := startServer(t, g)
	cfg := testConfig(t, s, writeToken(t, testSandboxToken), t.TempDir())
	cfg.Buffer = 5
	l, pol, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, newReloader(t, pol))
	s.stop()
	for i := range 20 {
		l.Observe(audit.NetConnectEvent{Outcome: audit.OutcomeDenied, Host: fmt.Sprintf("h%d.example", i)})
	}
	time.Sleep(100 * time.Millisecond) // the pusher moves them into its buffer
	s.start()
	g.waitFor(t, "entries and the drop count", func() bool { return len(g.entries)+int(g.dropped) == 20 })
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.entries) != 5 || g.dropped != 15 {
		t.Errorf("got %d entries and %d dropped, want 5 kept and 15 counted", len(g.entries), g.dropped)
	}
}

func TestJoinKeepsCredential(t *testing.T) {
	g := newFakeGateway()
	s := startServer(t, g)
	stateDir := t.TempDir()
	tokenFile := writeToken(t, testJoinToken)
	cfg := testConfig(t, s, tokenFile, stateDir)
	cfg.Join = Join{Name: "worker", Labels: map[string]string{"team": "a"}, Command: []string{"make"}, Workdir: "/src", Policy: []byte(netPolicy("joined.example"))}
	l, pol, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if string(pol.YAML) != netPolicy("joined.example") || pol.Version != 1 {
		t.Fatalf("start policy after join = %+v, want the policy sent with the join", pol)
	}
	if l.SandboxID() != "sb1" {
		t.Errorf("sandbox id = %q", l.SandboxID())
	}
	g.mu.Lock()
	j := g.joins[0]
	g.mu.Unlock()
	if j.GetName() != "worker" || j.GetLabels()["team"] != "a" || j.GetWorkdir() != "/src" || j.GetCommand()[0] != "make" {
		t.Errorf("join request = %v", j)
	}
	l.Finish(0, nil)

	st := newState(stateDir, s.url(), testJoinToken)
	fi, err := os.Stat(st.credentialPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("credential file mode %v, want 0600", fi.Mode().Perm())
	}
	// A restarted supervisor, handed the same spent join token, gets in
	// with the credential the first one saved.
	l2, _, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("restart with a spent join token: %v", err)
	}
	l2.Finish(0, nil)
	if len(g.joins) != 1 {
		t.Errorf("joined %d times, want once", len(g.joins))
	}
}

func TestStartWithoutGateway(t *testing.T) {
	g := newFakeGateway(netPolicy("cached.example"))
	s := startServer(t, g)
	stateDir, tokenFile := t.TempDir(), writeToken(t, testSandboxToken)
	cfg := testConfig(t, s, tokenFile, stateDir)
	cfg.StartTimeout = 300 * time.Millisecond

	// Nothing cached yet: a clear error.
	s.stop()
	_, _, err := Start(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "no policy of this sandbox is cached") {
		t.Fatalf("start without gateway or cache: err = %v", err)
	}

	// A run that loaded v1 caches it ...
	s.start()
	l, pol, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, newReloader(t, pol))
	g.waitFor(t, "v1 LOADED", func() bool { return hasStatus(g, 1, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED) })
	l.Finish(0, nil)

	// ... and the next run starts with it while the gateway is down.
	s.stop()
	l, pol, err = Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start from cache: %v", err)
	}
	defer l.Finish(0, nil)
	if !pol.Cached || pol.Version != 1 || string(pol.YAML) != netPolicy("cached.example") {
		t.Fatalf("start policy = %+v, want cached v1", pol)
	}
}

func TestRefusedToken(t *testing.T) {
	g := newFakeGateway(netPolicy("one.example"))
	s := startServer(t, g)
	cfg := testConfig(t, s, writeToken(t, SandboxTokenPrefix+"wrong"), t.TempDir())
	cfg.StartTimeout = 5 * time.Second
	begin := time.Now()
	_, _, err := Start(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "refused the token") {
		t.Fatalf("err = %v, want refused the token", err)
	}
	if time.Since(begin) > 2*time.Second {
		t.Errorf("a refused token took %s: it is not worth retrying", time.Since(begin))
	}

	cfg.TokenFile = writeToken(t, "not-a-token")
	if _, _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "want a sandbox token") {
		t.Fatalf("malformed token: err = %v", err)
	}
}

func TestPhases(t *testing.T) {
	g := newFakeGateway(netPolicy("one.example"))
	s := startServer(t, g)
	cfg := testConfig(t, s, writeToken(t, testSandboxToken), t.TempDir())

	l, _, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.Observe(audit.SandboxStartEvent{PID: 1})
	g.waitFor(t, "ready", func() bool { return len(g.phases) == 1 })
	l.Observe(audit.SandboxExitEvent{Code: 3})
	l.Finish(3, errors.New("exit status 3"))
	g.mu.Lock()
	last := g.phases[len(g.phases)-1]
	n := len(g.entries)
	g.mu.Unlock()
	if g.phases[0].GetPhase() != gatewayv1.Phase_PHASE_READY {
		t.Errorf("first phase %v, want ready", g.phases[0])
	}
	if last.GetPhase() != gatewayv1.Phase_PHASE_EXITED || last.GetExitCode() != 3 {
		t.Errorf("last phase %v, want exited 3", last)
	}
	if n != 2 {
		t.Errorf("Finish returned with %d of 2 entries delivered", n)
	}

	// A run whose workload never started has failed, with the reason.
	l, _, err = Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.Finish(125, errors.New("create cgroup: no space"))
	g.mu.Lock()
	last = g.phases[len(g.phases)-1]
	g.mu.Unlock()
	if last.GetPhase() != gatewayv1.Phase_PHASE_FAILED || !strings.Contains(last.GetReason(), "create cgroup") {
		t.Errorf("phase %v, want failed with the reason", last)
	}

	// With the gateway gone, Finish gives up after FinishWait.
	l, _, err = Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.stop()
	begin := time.Now()
	l.Finish(0, nil)
	if d := time.Since(begin); d > cfg.FinishWait+time.Second {
		t.Errorf("Finish with the gateway down took %s", d)
	}
}

func TestSupervisorWarningsReachTheGateway(t *testing.T) {
	g := newFakeGateway(netPolicy("one.example"))
	s := startServer(t, g)
	l, _, err := Start(context.Background(), testConfig(t, s, writeToken(t, testSandboxToken), t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	log := slogJSON(&out, l)
	log.Info("not sent")
	log.With("k", "v").Warn("disk nearly full", "err", errors.New("ENOSPC"))
	l.Finish(0, nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.entries) != 1 {
		t.Fatalf("entries = %v, want the one warning", g.entries)
	}
	e := g.entries[0]
	if e.GetSource() != SourceSupervisor || e.GetLevel() != "warn" || e.GetMessage() != "disk nearly full" ||
		!strings.Contains(string(e.GetFields()), `"err":"ENOSPC"`) || !strings.Contains(string(e.GetFields()), `"k":"v"`) {
		t.Errorf("entry = %v", e)
	}
	if !strings.Contains(out.String(), "not sent") {
		t.Errorf("the local log lost a record: %q", out.String())
	}
}

func slogJSON(w *strings.Builder, l *Link) *slog.Logger {
	return slog.New(l.Handler(slog.NewJSONHandler(w, nil)))
}
