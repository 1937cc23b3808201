package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

func TestSandboxLifecycle(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)

	watch, err := c.sandbox.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Selector: map[string]string{"team": "a"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()

	a, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{
		Name: "a", Labels: map[string]string{"team": "a"}, Command: []string{"sh", "-c", "exit 3"}, Workdir: "/work", Driver: "fake",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if a.Msg.Phase != gatewayv1.Phase_PHASE_PROVISIONING || a.Msg.PolicyVersion != 1 || a.Msg.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_PENDING {
		t.Fatalf("created %+v", a.Msg)
	}
	b, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Name: "b", Labels: map[string]string{"team": "b"}, Driver: DriverExternal}))
	if err != nil {
		t.Fatal(err)
	}

	// The driver got what a supervisor needs to reach the gateway.
	link := g.fake.link(a.Msg.Id)
	if link.URL != g.url || link.CAFile != g.pki.CAFile() || !strings.HasPrefix(link.Token, "cgw_s_") {
		t.Fatalf("link = %+v", link)
	}
	stored, err := g.store.GetSandbox(ctx, a.Msg.Id)
	if err != nil || stored.DriverRef != "ref-"+a.Msg.Id {
		t.Fatalf("stored = %+v, %v", stored, err)
	}

	list, err := c.sandbox.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{Selector: map[string]string{"team": "b"}}))
	if err != nil || len(list.Msg.Sandboxes) != 1 || list.Msg.Sandboxes[0].Id != b.Msg.Id {
		t.Fatalf("list team=b: %v, %v", list, err)
	}
	if _, err := c.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: "nope"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("get unknown: %v", err)
	}
	if _, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: "kubernetes"})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("unknown driver: %v", err)
	}

	// The supervisor reports ready, then its workload's exit.
	sup := g.clients(link.Token, nil)
	for _, r := range []*gatewayv1.ReportPhaseRequest{
		{Phase: gatewayv1.Phase_PHASE_READY},
		{Phase: gatewayv1.Phase_PHASE_EXITED, ExitCode: ptr(int32(3)), Reason: "workload exited"},
	} {
		if _, err := sup.supervisor.ReportPhase(ctx, connect.NewRequest(r)); err != nil {
			t.Fatal(err)
		}
	}
	// An ended sandbox does not come back to life.
	if _, err := sup.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY})); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("ready after exit: %v", err)
	}
	got, err := c.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: a.Msg.Id}))
	if err != nil || got.Msg.Phase != gatewayv1.Phase_PHASE_EXITED || got.Msg.GetExitCode() != 3 || got.Msg.Reason != "workload exited" {
		t.Fatalf("after exit: %+v, %v", got.Msg, err)
	}

	if _, err := c.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: a.Msg.Id})); err != nil {
		t.Fatal(err)
	}
	if len(g.fake.deleted) != 1 || g.fake.deleted[0] != a.Msg.Id {
		t.Fatalf("driver deletes: %v", g.fake.deleted)
	}
	if _, err := c.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: a.Msg.Id})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("get deleted: %v", err)
	}

	// The watcher (team=a) saw a's states in order and its removal, and
	// nothing of b.
	var phases []string
	for watch.Receive() {
		e := watch.Msg()
		if e.Sandbox.Id != a.Msg.Id {
			t.Fatalf("watch of team=a got %s", e.Sandbox.Id)
		}
		if e.Deleted {
			phases = append(phases, "deleted")
			break
		}
		if n := len(phases); n == 0 || phases[n-1] != e.Sandbox.Phase.String() {
			phases = append(phases, e.Sandbox.Phase.String())
		}
	}
	want := "PHASE_PROVISIONING PHASE_READY PHASE_EXITED deleted"
	if strings.Join(phases, " ") != want {
		t.Fatalf("watched %v, want %s", phases, want)
	}
}

// TestWatchSendsCurrentStateFirst: a watcher of one sandbox gets its
// state at once, before any change.
func TestWatchSendsCurrentStateFirst(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	sb, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: DriverExternal}))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.sandbox.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Id: sb.Msg.Id}))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !w.Receive() || w.Msg().Sandbox.Id != sb.Msg.Id || w.Msg().Sandbox.Phase != gatewayv1.Phase_PHASE_PROVISIONING {
		t.Fatalf("first event: %v %v", w.Msg(), w.Err())
	}
	// Deleting the one sandbox watched ends the watch.
	if _, err := c.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: sb.Msg.Id})); err != nil {
		t.Fatal(err)
	}
	if !w.Receive() || !w.Msg().Deleted {
		t.Fatalf("delete event: %v %v", w.Msg(), w.Err())
	}
	if w.Receive() || w.Err() != nil {
		t.Fatalf("the watch went on after the delete: %v %v", w.Msg(), w.Err())
	}
}

// TestProtocols: the same handlers answer gRPC, gRPC-Web and Connect
// (JSON and binary) clients.
func TestProtocols(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	hc := g.client(g.user, nil)
	for name, opts := range map[string][]connect.ClientOption{
		"grpc":         {connect.WithGRPC()},
		"grpc-web":     {connect.WithGRPCWeb()},
		"connect json": {connect.WithProtoJSON()},
		"connect":      nil,
	} {
		c := gatewayv1connect.NewSandboxServiceClient(hc, g.url, opts...)
		if _, err := c.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{})); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		w, err := c.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Id: "nope"}))
		if err != nil {
			t.Fatalf("%s watch: %v", name, err)
		}
		if w.Receive() || codeOf(w.Err()) != connect.CodeNotFound {
			t.Errorf("%s watch of an unknown sandbox: %v", name, w.Err())
		}
		w.Close()
	}
}

// TestReadopt: after a restart, a sandbox whose supervisor is gone without
// reporting its exit is failed with a reason; a running one keeps its
// phase; an external one is left to its supervisor.
func TestReadopt(t *testing.T) {
	drv := newFakeDriver()
	g := startGateway(t, gwOpts{drv: drv})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	var ids []string
	for range 2 {
		sb, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"true"}, Driver: "fake"}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.Msg.Id)
	}
	ext, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: DriverExternal}))
	if err != nil {
		t.Fatal(err)
	}
	sup := g.clients(drv.link(ids[0]).Token, nil)
	if _, err := sup.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY})); err != nil {
		t.Fatal(err)
	}
	g.stop()

	// ids[1]'s supervisor died while the gateway was down.
	drv.mu.Lock()
	delete(drv.running, ids[1])
	drv.mu.Unlock()
	g2 := startGateway(t, gwOpts{dir: g.dir, drv: drv})
	waitReady(t, g2)
	want := map[string]store.Phase{ids[0]: store.PhaseReady, ids[1]: store.PhaseFailed, ext.Msg.Id: store.PhaseProvisioning}
	for id, phase := range want {
		sb, err := g2.store.GetSandbox(ctx, id)
		if err != nil || sb.Phase != phase {
			t.Fatalf("%s after restart: %+v, %v; want %s", id, sb, err, phase)
		}
		if phase == store.PhaseFailed && (!strings.Contains(sb.Reason, "no longer running") || sb.ExitCode == nil || *sb.ExitCode != 137) {
			t.Fatalf("failed sandbox: reason %q exit %v", sb.Reason, sb.ExitCode)
		}
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	g := startGateway(t, gwOpts{})
	waitReady(t, g)
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	if _, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: DriverExternal})); err != nil {
		t.Fatal(err)
	}
	body := get(t, g, "/metrics")
	for _, want := range []string{
		`corral_gateway_sandboxes{phase="provisioning"} 1`,
		`corral_gateway_sandboxes{phase="ready"} 0`,
		`corral_gateway_policy_versions_total 1`,
		`corral_gateway_rpc_duration_seconds_count{code="ok",procedure="/corral.gateway.v1.SandboxService/Create"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if got := get(t, g, "/healthz"); got != "ok\n" {
		t.Errorf("/healthz = %q", got)
	}
}

// TestMetricsNeedAUser: /metrics answers a user's token or client
// certificate, refuses no credential (401) and a supervisor's (403), and
// is open only with --public-metrics; /healthz is open either way.
func TestMetricsNeedAUser(t *testing.T) {
	status := func(c *http.Client, url string) int {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	g := startGateway(t, gwOpts{})
	id, _ := createFake(t, g, "m")
	for _, tc := range []struct {
		name  string
		token string
		want  int
	}{
		{"none", "", http.StatusUnauthorized},
		{"wrong token", "cgw_u_wrongwrongwrong", http.StatusUnauthorized},
		{"sandbox token", g.fake.link(id).Token, http.StatusForbidden},
		{"user token", g.user, http.StatusOK},
	} {
		if got := status(g.client(tc.token, nil), g.url+"/metrics"); got != tc.want {
			t.Errorf("/metrics with %s: HTTP %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := status(g.client("", nil), g.url+"/healthz"); got != http.StatusOK {
		t.Errorf("/healthz without a credential: HTTP %d", got)
	}
	open := startGateway(t, gwOpts{publicMetrics: true})
	if got := status(open.client("", nil), open.url+"/metrics"); got != http.StatusOK {
		t.Errorf("/metrics of a gateway with public metrics, no credential: HTTP %d", got)
	}
}

func waitReady(t *testing.T, g *gw) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := g.client("", nil).Get(g.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get reads path as the gateway's user.
func get(t *testing.T, g *gw, path string) string {
	t.Helper()
	resp, err := g.client(g.user, nil).Get(g.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func ptr[T any](v T) *T { return &v }

// A sandbox its driver will not run as asked is refused before anything
// is recorded or started: the driver's Check runs first.
func TestCreateRefusedByDriverCheck(t *testing.T) {
	g := startGateway(t, gwOpts{})
	g.fake.refuseWorkdir = "/root"
	c := g.clients(g.user, nil)
	ctx := context.Background()
	_, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{
		Name: "x", Command: []string{"true"}, Workdir: "/root", Driver: "fake",
	}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("create with a refused workdir: %v, want InvalidArgument naming it", err)
	}
	list, err := c.sandbox.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
	if err != nil || len(list.Msg.Sandboxes) != 0 {
		t.Fatalf("sandboxes after the refusal: %v, %v", list, err)
	}
	if len(g.fake.links) != 0 {
		t.Fatal("the driver was asked to start a refused sandbox")
	}
}

// TestSandboxNameTaken: a name is one sandbox's, whether a user creates it
// or a supervisor joins with it, so a joined sandbox cannot pass for
// another in `corral sandbox list`; once deleted, the name is free again.
func TestSandboxNameTaken(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	admin := g.clients(g.user, nil)
	first, err := admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Name: "prod-agent", Command: []string{"true"}, Driver: "fake"}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Name: "prod-agent", Command: []string{"true"}, Driver: "fake"}))
	if codeOf(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), first.Msg.Id) {
		t.Errorf("second create with the name: %v, want AlreadyExists naming %s", err, first.Msg.Id)
	}
	join, _, err := auth.CreateToken(ctx, g.store, store.TokenJoin, "host-b", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.clients(join, nil).supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "prod-agent"}))
	if codeOf(err) != connect.CodeAlreadyExists || strings.Contains(err.Error(), first.Msg.Id) {
		t.Errorf("join with the name: %v, want AlreadyExists without the holder's id", err)
	}
	if _, err := admin.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: first.Msg.Id})); err != nil {
		t.Fatal(err)
	}
	// The failed join did not spend the token.
	if _, err := g.clients(join, nil).supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "prod-agent"})); err != nil {
		t.Errorf("join with the name after the sandbox holding it was deleted: %v", err)
	}
}
