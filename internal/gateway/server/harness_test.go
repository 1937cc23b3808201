package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/secretbox"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

// gw is a real gateway on 127.0.0.1:0 over TLS with a SQLite store.
type gw struct {
	t       *testing.T
	url     string
	dir     string
	pki     *auth.PKI
	store   store.Store
	srv     *Server
	fake    *fakeDriver
	user    string // a user token's secret
	stop    func()
	stopped chan struct{}

	mu         sync.Mutex
	transports []*http.Transport
}

type gwOpts struct {
	dir       string // reuse a data directory (a restart)
	drv       *fakeDriver
	retention int
	// publicMetrics serves /metrics without a credential.
	publicMetrics bool
}

func startGateway(t *testing.T, o gwOpts) *gw {
	t.Helper()
	dir := o.dir
	if dir == "" {
		dir = t.TempDir()
	}
	pki, err := auth.EnsurePKI(filepath.Join(dir, "tls"), nil)
	if err != nil {
		t.Fatal(err)
	}
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secret.key"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenSQLite(filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	fake := o.drv
	if fake == nil {
		fake = newFakeDriver()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{
		Store:         st,
		Drivers:       map[string]driver.Driver{"fake": fake},
		PKI:           pki,
		Secrets:       box,
		URL:           URLFor(ln.Addr()),
		Registry:      prometheus.NewRegistry(),
		LogRetention:  o.retention,
		PublicMetrics: o.publicMetrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gw{t: t, url: URLFor(ln.Addr()), dir: dir, pki: pki, store: st, srv: srv, fake: fake, stopped: make(chan struct{})}
	go func() {
		defer close(g.stopped)
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			// Clients hang up first: the server would wait a second
			// for each HTTP/2 client to answer its GOAWAY.
			g.mu.Lock()
			for _, tr := range g.transports {
				tr.CloseIdleConnections()
			}
			g.mu.Unlock()
			cancel()
			<-g.stopped
			st.Close()
		})
	}
	t.Cleanup(g.stop)
	secret, _, err := auth.CreateToken(ctx, st, store.TokenUser, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	g.user = secret
	return g
}

// client is an HTTP/2 client trusting the gateway's CA that sends token
// (when set) as its bearer credential, with cert as its client
// certificate (when set).
func (g *gw) client(token string, cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(g.pki.CA)
	cfg := &tls.Config{RootCAs: pool}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	g.mu.Lock()
	g.transports = append(g.transports, tr)
	g.mu.Unlock()
	var rt http.RoundTripper = tr
	if token != "" {
		rt = bearer{token, rt}
	}
	return &http.Client{Transport: rt}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// clients are the typed connect clients of one principal, over gRPC.
type clients struct {
	sandbox    gatewayv1connect.SandboxServiceClient
	policy     gatewayv1connect.PolicyServiceClient
	logs       gatewayv1connect.LogServiceClient
	secrets    gatewayv1connect.SecretServiceClient
	routes     gatewayv1connect.RouteServiceClient
	supervisor gatewayv1connect.SupervisorServiceClient
}

func (g *gw) clients(token string, cert *tls.Certificate) clients {
	hc := g.client(token, cert)
	o := connect.WithGRPC()
	return clients{
		sandbox:    gatewayv1connect.NewSandboxServiceClient(hc, g.url, o),
		policy:     gatewayv1connect.NewPolicyServiceClient(hc, g.url, o),
		logs:       gatewayv1connect.NewLogServiceClient(hc, g.url, o),
		secrets:    gatewayv1connect.NewSecretServiceClient(hc, g.url, o),
		routes:     gatewayv1connect.NewRouteServiceClient(hc, g.url, o),
		supervisor: gatewayv1connect.NewSupervisorServiceClient(hc, g.url, o),
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func codeOf(err error) connect.Code {
	if err == nil {
		return 0
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

// fakeDriver records what the gateway asks of a driver.
type fakeDriver struct {
	mu      sync.Mutex
	links   map[string]driver.Link
	deleted []string
	running map[string]bool
	// refuseWorkdir is a working directory Check refuses, as the local
	// driver does one outside --allow-workdir.
	refuseWorkdir string
}

func (f *fakeDriver) Check(sb store.Sandbox) error {
	if sb.Workdir != "" && sb.Workdir == f.refuseWorkdir {
		return fmt.Errorf("workdir %s is outside the directories this gateway lets sandboxes use", sb.Workdir)
	}
	return nil
}

func newFakeDriver() *fakeDriver {
	return &fakeDriver{links: map[string]driver.Link{}, running: map[string]bool{}}
}

func (f *fakeDriver) Create(_ context.Context, sb store.Sandbox, l driver.Link) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links[sb.ID] = l
	f.running[sb.ID] = true
	return "ref-" + sb.ID, nil
}

func (f *fakeDriver) Inspect(_ context.Context, sb store.Sandbox) (driver.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running[sb.ID] {
		return driver.Status{Running: true}, nil
	}
	code := 137
	return driver.Status{ExitCode: &code, Reason: "killed"}, nil
}

func (f *fakeDriver) Delete(_ context.Context, sb store.Sandbox) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, sb.ID)
	delete(f.running, sb.ID)
	return nil
}

func (f *fakeDriver) link(id string) driver.Link {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.links[id]
}
