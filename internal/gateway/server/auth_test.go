package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

// call is one procedure invoked as some principal; it returns the call's
// error (a stream's first Receive error).
type call func(ctx context.Context, c clients, sandboxID string) error

func recvErr(s interface {
	Receive() bool
	Err() error
}) error {
	if s.Receive() {
		return nil
	}
	return s.Err()
}

var procedures = map[string]call{
	gatewayv1connect.SandboxServiceCreateProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Driver: DriverExternal}))
		return err
	},
	gatewayv1connect.SandboxServiceListProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.sandbox.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
		return err
	},
	gatewayv1connect.SandboxServiceGetProcedure: func(ctx context.Context, c clients, id string) error {
		_, err := c.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: id}))
		return err
	},
	gatewayv1connect.SandboxServiceDeleteProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: "no-such-sandbox"}))
		return err
	},
	gatewayv1connect.SandboxServiceWatchProcedure: func(ctx context.Context, c clients, id string) error {
		s, err := c.sandbox.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Id: id}))
		if err != nil {
			return err
		}
		defer s.Close()
		return recvErr(s)
	},
	gatewayv1connect.PolicyServiceGetProcedure: func(ctx context.Context, c clients, id string) error {
		_, err := c.policy.Get(ctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id}))
		return err
	},
	gatewayv1connect.PolicyServiceSetProcedure: func(ctx context.Context, c clients, id string) error {
		_, err := c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: "version: 1\n"}))
		return err
	},
	gatewayv1connect.PolicyServiceHistoryProcedure: func(ctx context.Context, c clients, id string) error {
		_, err := c.policy.History(ctx, connect.NewRequest(&gatewayv1.PolicyHistoryRequest{SandboxId: id}))
		return err
	},
	gatewayv1connect.LogServiceQueryProcedure: func(ctx context.Context, c clients, id string) error {
		_, err := c.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id}))
		return err
	},
	gatewayv1connect.LogServiceFollowProcedure: func(ctx context.Context, c clients, id string) error {
		s, err := c.logs.Follow(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id}))
		if err != nil {
			return err
		}
		defer s.Close()
		return recvErr(s)
	},
	gatewayv1connect.SecretServiceSetProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.secrets.Set(ctx, connect.NewRequest(&gatewayv1.SetSecretRequest{Name: "MATRIX", Value: []byte("v")}))
		return err
	},
	gatewayv1connect.SecretServiceListProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.secrets.List(ctx, connect.NewRequest(&gatewayv1.ListSecretsRequest{}))
		return err
	},
	gatewayv1connect.SecretServiceDeleteProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.secrets.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSecretRequest{Name: "NONE"}))
		return err
	},
	gatewayv1connect.RouteServiceSetProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: "routes: []\n"}))
		return err
	},
	gatewayv1connect.RouteServiceGetProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.routes.Get(ctx, connect.NewRequest(&gatewayv1.GetRoutesRequest{}))
		return err
	},
	gatewayv1connect.SupervisorServiceJoinProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "joined"}))
		return err
	},
	gatewayv1connect.SupervisorServiceSubscribeProcedure: func(ctx context.Context, c clients, _ string) error {
		s, err := c.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
		if err != nil {
			return err
		}
		defer s.Close()
		return recvErr(s)
	},
	gatewayv1connect.SupervisorServiceReportPolicyStatusProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.supervisor.ReportPolicyStatus(ctx, connect.NewRequest(&gatewayv1.ReportPolicyStatusRequest{Version: 1, Status: gatewayv1.PolicyStatus_POLICY_STATUS_LOADED}))
		return err
	},
	gatewayv1connect.SupervisorServiceReportPhaseProcedure: func(ctx context.Context, c clients, _ string) error {
		_, err := c.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY}))
		return err
	},
	gatewayv1connect.SupervisorServicePushLogsProcedure: func(ctx context.Context, c clients, _ string) error {
		s := c.supervisor.PushLogs(ctx)
		if err := s.Send(&gatewayv1.LogBatch{Entries: []*gatewayv1.LogEntry{{Message: "m"}}}); err != nil {
			_, err = s.CloseAndReceive()
			return err
		}
		_, err := s.CloseAndReceive()
		return err
	},
}

// TestProceduresCovered keeps the matrix complete: a new procedure must
// be added to it (and to auth.Allowed) before this passes.
func TestProceduresCovered(t *testing.T) {
	services := gatewayv1.File_corral_gateway_v1_gateway_proto.Services()
	n := 0
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			proc := fmt.Sprintf("/%s/%s", sd.FullName(), sd.Methods().Get(j).Name())
			if _, ok := procedures[proc]; !ok {
				t.Errorf("%s is missing from the auth matrix", proc)
			}
			n++
		}
	}
	if n != len(procedures) {
		t.Errorf("the matrix has %d procedures, the API %d", len(procedures), n)
	}
}

// loadClientCert loads the certificate at path with its key beside it.
func loadClientCert(t *testing.T, path string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(path, strings.TrimSuffix(path, ".pem")+"-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAuthMatrix calls every procedure as every kind of principal: no
// credential and a wrong one get Unauthenticated; a principal outside a
// procedure's row gets PermissionDenied; inside it, the call is not
// refused for who made it.
func TestAuthMatrix(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	admin := g.clients(g.user, nil)
	sb, err := admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Name: "m", Command: []string{"true"}, Driver: "fake"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.Msg.Id
	sandboxToken := g.fake.link(id).Token

	certPath, _, err := auth.IssueClientCert(ctx, g.store, g.pki, "carol", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert := loadClientCert(t, certPath)
	// Signed by the gateway's CA but never recorded (issued before
	// revocation existed, or by hand with the CA key), and one revoked.
	unrecordedPath, _, err := g.pki.IssueClient("dave", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	unrecorded := loadClientCert(t, unrecordedPath)
	revokedPath, rc, err := auth.IssueClientCert(ctx, g.store, g.pki, "erin", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	revoked := loadClientCert(t, revokedPath)
	if err := g.store.RevokeClientCert(ctx, rc.Serial); err != nil {
		t.Fatal(err)
	}
	// An expired token, as an operator's expiry would leave it.
	if err := g.store.AddToken(ctx, store.Token{ID: auth.NewID(), Name: "expired", Kind: store.TokenUser, Hash: auth.Hash("cgw_u_expired"), ExpiresAt: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}

	userServices := map[string]bool{
		gatewayv1connect.SandboxServiceName: true, gatewayv1connect.PolicyServiceName: true,
		gatewayv1connect.LogServiceName: true, gatewayv1connect.SecretServiceName: true,
		gatewayv1connect.RouteServiceName: true,
	}
	isSupervisor := func(p string) bool { return serviceOf(p) == gatewayv1connect.SupervisorServiceName }
	type row struct {
		name    string
		token   func() string // fresh per call where a call spends it
		cert    *tls.Certificate
		allowed func(proc string) bool // nil: Unauthenticated everywhere
	}
	rows := []row{
		{name: "none", token: func() string { return "" }},
		{name: "wrong token", token: func() string { return "cgw_u_wrongwrongwrong" }},
		{name: "expired token", token: func() string { return "cgw_u_expired" }},
		{name: "user token", token: func() string { return g.user }, allowed: func(p string) bool { return userServices[serviceOf(p)] }},
		{name: "client certificate", token: func() string { return "" }, cert: &cert, allowed: func(p string) bool { return userServices[serviceOf(p)] }},
		{name: "unrecorded client certificate", token: func() string { return "" }, cert: &unrecorded},
		{name: "revoked client certificate", token: func() string { return "" }, cert: &revoked},
		{name: "sandbox token", token: func() string { return sandboxToken }, allowed: func(p string) bool {
			return isSupervisor(p) && p != gatewayv1connect.SupervisorServiceJoinProcedure
		}},
		{name: "join token", token: func() string {
			s, _, err := auth.CreateToken(ctx, g.store, store.TokenJoin, "j", "")
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, allowed: func(p string) bool { return p == gatewayv1connect.SupervisorServiceJoinProcedure }},
	}
	for _, r := range rows {
		for proc, fn := range procedures {
			t.Run(r.name+proc, func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
				err := fn(cctx, g.clients(r.token(), r.cert), id)
				code := codeOf(err)
				switch {
				case r.allowed == nil:
					if code != connect.CodeUnauthenticated {
						t.Fatalf("got %v (%v), want unauthenticated", code, err)
					}
				case r.allowed(proc):
					if code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied {
						t.Fatalf("refused: %v", err)
					}
				default:
					if code != connect.CodePermissionDenied {
						t.Fatalf("got %v (%v), want permission_denied", code, err)
					}
				}
			})
		}
	}
}

func serviceOf(proc string) string {
	for i := 1; i < len(proc); i++ {
		if proc[i] == '/' {
			return proc[1:i]
		}
	}
	return ""
}

// TestServerCertIsNoClientCert: the gateway's own certificate, signed by
// the same CA but for server auth only, does not log anyone in.
func TestServerCertIsNoClientCert(t *testing.T) {
	g := startGateway(t, gwOpts{})
	c := g.clients("", &g.pki.Server)
	_, err := c.sandbox.List(ctxT(t), connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
	// The handshake fails (the server's certificate is not for client
	// auth); the client-certificate row of TestAuthMatrix is the control.
	if err == nil {
		t.Fatal("the server certificate was accepted as a client certificate")
	}
}

// TestJoinTokenSpentOnce: of concurrent joins with one token exactly one
// gets a sandbox; the token is then refused, and the sandbox credential it
// returned works as that sandbox.
func TestJoinTokenSpentOnce(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	join, _, err := auth.CreateToken(ctx, g.store, store.TokenJoin, "host-b", "")
	if err != nil {
		t.Fatal(err)
	}
	c := g.clients(join, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []*gatewayv1.JoinResponse
	for i := range 5 {
		wg.Go(func() {
			// Names of their own, so that only the token can tell them apart.
			r, err := c.supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: fmt.Sprintf("remote-%d", i)}))
			if err == nil {
				mu.Lock()
				ok = append(ok, r.Msg)
				mu.Unlock()
			} else if codeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("losing join: %v", err)
			}
		})
	}
	wg.Wait()
	if len(ok) != 1 {
		t.Fatalf("%d joins succeeded with one token", len(ok))
	}
	sbs, err := g.store.ListSandboxes(ctx, nil)
	if err != nil || len(sbs) != 1 {
		t.Fatalf("sandboxes after the joins: %v, %v", sbs, err)
	}
	sup := g.clients(ok[0].Token, nil)
	if _, err := sup.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY})); err != nil {
		t.Fatal(err)
	}
	got, err := g.store.GetSandbox(ctx, ok[0].SandboxId)
	if err != nil || got.Phase != store.PhaseReady || got.Driver != DriverExternal {
		t.Fatalf("joined sandbox = %+v, %v", got, err)
	}
}

// TestDeletedSandboxCredentialRefused: deleting a sandbox revokes its
// supervisor's credential.
func TestDeletedSandboxCredentialRefused(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	admin := g.clients(g.user, nil)
	sb, err := admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"true"}, Driver: "fake"}))
	if err != nil {
		t.Fatal(err)
	}
	sup := g.clients(g.fake.link(sb.Msg.Id).Token, nil)
	if _, err := admin.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: sb.Msg.Id})); err != nil {
		t.Fatal(err)
	}
	_, err = sup.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY}))
	if codeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("deleted sandbox's credential: %v, want unauthenticated", err)
	}
}

// TestSandboxCredentialCannotActForAnother: a supervisor's stream carries
// only its own sandbox's policy, and its reports change only its own
// sandbox, whatever another sandbox does.
func TestSandboxCredentialCannotActForAnother(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	a, supA := createFake(t, g, "a")
	b, _ := createFake(t, g, "b")
	user := g.clients(g.user, nil)

	s, err := supA.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().Policy.SandboxId != a {
		t.Fatalf("first update: %v %v", s.Msg(), s.Err())
	}
	for _, id := range []string{b, a} {
		if _, err := user.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: "version: 1\nnetwork: {allow: [\"" + id + ".example.com:443\"]}\n"})); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	if p := s.Msg().Policy; p.SandboxId != a || !strings.Contains(p.Yaml, a+".example.com") {
		t.Fatalf("a's stream carried %s's policy:\n%s", p.SandboxId, p.Yaml)
	}

	if _, err := supA.supervisor.ReportPolicyStatus(ctx, connect.NewRequest(&gatewayv1.ReportPolicyStatusRequest{Version: 2, Status: gatewayv1.PolicyStatus_POLICY_STATUS_FAILED, Error: "x"})); err != nil {
		t.Fatal(err)
	}
	if _, err := supA.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_FAILED, Reason: "x"})); err != nil {
		t.Fatal(err)
	}
	gb, err := user.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: b}))
	if err != nil || gb.Msg.Phase != gatewayv1.Phase_PHASE_PROVISIONING || gb.Msg.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_PENDING {
		t.Fatalf("b changed by a's reports: %+v, %v", gb.Msg, err)
	}
	ga, err := user.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: a}))
	if err != nil || ga.Msg.Phase != gatewayv1.Phase_PHASE_FAILED || ga.Msg.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_FAILED {
		t.Fatalf("a's own reports: %+v, %v", ga.Msg, err)
	}
}

// tokenID is the id of the token bound to sandboxID, or named name.
func tokenID(t *testing.T, g *gw, sandboxID, name string) string {
	t.Helper()
	ts, err := g.store.ListTokens(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range ts {
		if (sandboxID != "" && tk.SandboxID == sandboxID) || (name != "" && tk.Name == name) {
			return tk.ID
		}
	}
	t.Fatalf("no token for sandbox %q or name %q", sandboxID, name)
	return ""
}

// endsUnauthenticated waits for stream s to end and checks it ended
// refusing the credential, with no message after the revocation that
// bad says must not arrive.
func endsUnauthenticated[T any](t *testing.T, what string, s interface {
	Receive() bool
	Msg() *T
	Err() error
}, bad func(*T) bool) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		for s.Receive() {
			if bad(s.Msg()) {
				done <- fmt.Errorf("received %v after the revocation", s.Msg())
				return
			}
		}
		done <- s.Err()
	}()
	select {
	case err := <-done:
		if codeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("%s opened with a deleted token ended with %v, want unauthenticated", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("%s opened with a deleted token is still open 10s later", what)
	}
}

// TestDeletedTokenEndsOpenStreams: deleting a token (corral-gateway token
// delete, in another process) ends the streams opened with it, not only
// new calls: a supervisor's Subscribe gets no secret rotated afterwards
// and its PushLogs stream is refused; a user's follow and watch end.
func TestDeletedTokenEndsOpenStreams(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	admin := g.clients(g.user, nil)
	setSecret(t, admin, "gh-token", "ghp_firstVALUE0123456789")
	sb, err := admin.sandbox.Create(ctx, connect.NewRequest(&gatewayv1.CreateSandboxRequest{Command: []string{"agent"}, Driver: "fake", Policy: gatewaySecretPolicy}))
	if err != nil {
		t.Fatal(err)
	}
	sup := g.clients(g.fake.link(sb.Msg.Id).Token, nil)
	sub, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	receive(t, sub)
	pushing := sup.supervisor.PushLogs(ctx)
	if err := pushing.Send(&gatewayv1.LogBatch{Entries: []*gatewayv1.LogEntry{{Message: "before"}}}); err != nil {
		t.Fatal(err)
	}

	bobSecret, _, err := auth.CreateToken(ctx, g.store, store.TokenUser, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	bob := g.clients(bobSecret, nil)
	follow, err := bob.logs.Follow(ctx, connect.NewRequest(&gatewayv1.LogQuery{All: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()
	watch, err := bob.sandbox.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}

	for _, id := range []string{tokenID(t, g, sb.Msg.Id, ""), tokenID(t, g, "", "bob")} {
		if err := g.store.DeleteToken(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	setSecret(t, admin, "gh-token", "ghp_rotatedAFTERrevoke0123")
	endsUnauthenticated(t, "subscribe", sub, func(u *gatewayv1.Update) bool { return len(u.Secrets) > 0 })
	// Send fails once the server has ended the stream; what it ended
	// with comes from CloseAndReceive either way.
	_ = pushing.Send(&gatewayv1.LogBatch{Entries: []*gatewayv1.LogEntry{{Message: "after"}}})
	if _, err := pushing.CloseAndReceive(); codeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("push logs opened with a deleted token: %v, want unauthenticated", err)
	}
	endsUnauthenticated(t, "follow", follow, func(*gatewayv1.LogEntry) bool { return false })
	endsUnauthenticated(t, "watch", watch, func(*gatewayv1.SandboxEvent) bool { return false })
}

// TestRevokedClientCertEndsOpenStreams: revoking a client certificate
// (corral-gateway revoke-client, in another process) refuses it from then
// on and ends the streams opened with it.
func TestRevokedClientCertEndsOpenStreams(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	path, c, err := auth.IssueClientCert(ctx, g.store, g.pki, "frank", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert := loadClientCert(t, path)
	createFake(t, g, "watched")
	frank := g.clients("", &cert)
	watch, err := frank.sandbox.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}
	if err := g.store.RevokeClientCert(ctx, c.Serial); err != nil {
		t.Fatal(err)
	}
	endsUnauthenticated(t, "watch", watch, func(*gatewayv1.SandboxEvent) bool { return false })
	if _, err := frank.sandbox.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{})); codeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("list with a revoked certificate: %v, want unauthenticated", err)
	}
}

// countingBody is a request body that counts the bytes read from it.
type countingBody struct {
	r io.Reader
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return nil }

// TestRefusedCallBodyNotRead: a call without a valid credential, or one
// its credential may not make, is refused in its own protocol before a
// byte of its body is read, so nobody who can reach the port makes the
// gateway read, inflate or decode messages; each refusal is counted by
// code. A message is capped at 1 MiB even for a user.
func TestRefusedCallBodyNotRead(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	id, _ := createFake(t, g, "s")
	sandboxToken := g.fake.link(id).Token
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	if _, err := zw.Write(bytes.Repeat([]byte("#"), 8<<20)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	h := g.srv.Handler()
	for _, tc := range []struct {
		name, authz, contentType string
		status                   int
		grpcStatus               string
	}{
		{"no credential, connect", "", "application/proto", http.StatusUnauthorized, ""},
		{"unknown token, connect", "Bearer cgw_u_nosuchtoken", "application/proto", http.StatusUnauthorized, ""},
		{"no credential, grpc", "", "application/grpc", http.StatusOK, "16"},
		{"sandbox token on a user procedure", "Bearer " + sandboxToken, "application/proto", http.StatusForbidden, ""},
	} {
		body := &countingBody{r: bytes.NewReader(zipped.Bytes())}
		req := httptest.NewRequestWithContext(ctx, "POST", "/corral.gateway.v1.PolicyService/Set", body)
		req.Header.Set("Content-Type", tc.contentType)
		if tc.contentType == "application/grpc" {
			req.Header.Set("Grpc-Encoding", "gzip")
		} else {
			req.Header.Set("Content-Encoding", "gzip")
		}
		if tc.authz != "" {
			req.Header.Set("Authorization", tc.authz)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status || rec.Header().Get("Grpc-Status") != tc.grpcStatus {
			t.Errorf("%s: HTTP %d grpc-status %q, want %d %q", tc.name, rec.Code, rec.Header().Get("Grpc-Status"), tc.status, tc.grpcStatus)
		}
		if n := body.n.Load(); n > 0 {
			t.Errorf("%s: refused after reading %d bytes of the body", tc.name, n)
		}
	}

	m := get(t, g, "/metrics")
	for _, want := range []string{`corral_gateway_rpc_refused_total{code="unauthenticated"} 3`, `corral_gateway_rpc_refused_total{code="permission_denied"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	admin := g.clients(g.user, nil)
	_, err := admin.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: "x", Yaml: "version: 1\n" + strings.Repeat("#", 2<<20)}))
	if codeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a user's 2 MiB policy: %v, want resource exhausted", err)
	}
}
