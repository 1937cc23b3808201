package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/secretbox"
	"github.com/corral-sandbox/corral/internal/gateway/server"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
	"github.com/corral-sandbox/corral/internal/gatewayconf"
)

// testGateway is a real gateway on 127.0.0.1:0 over TLS with SQLite in a
// temporary directory, as corral-gateway serves it.
type testGateway struct {
	t      *testing.T
	url    string
	caFile string
	ca     *x509.Certificate
	store  store.Store
	user   string // a user token's secret
}

// startTestGateway starts a gateway and gives the test a clean
// environment: no CORRAL_GATEWAY* variables and an empty config home.
func startTestGateway(t *testing.T) *testGateway {
	t.Helper()
	cleanGatewayEnv(t)
	dir := t.TempDir()
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := server.URLFor(ln.Addr())
	srv, err := server.New(server.Config{Store: st, PKI: pki, Secrets: box, URL: url, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
		st.Close()
	})
	secret, _, err := auth.CreateToken(ctx, st, store.TokenUser, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	return &testGateway{t: t, url: url, caFile: pki.CAFile(), ca: pki.CA, store: st, user: secret}
}

func cleanGatewayEnv(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	for _, k := range []string{gatewayconf.EnvURL, gatewayconf.EnvCA, gatewayconf.EnvToken, gatewayconf.EnvTokenFile} {
		t.Setenv(k, "")
	}
}

// useEnv points the CLI at g with the user's token through the
// environment.
func (g *testGateway) useEnv() {
	g.t.Setenv(gatewayconf.EnvURL, g.url)
	g.t.Setenv(gatewayconf.EnvCA, g.caFile)
	g.t.Setenv(gatewayconf.EnvToken, g.user)
}

// supervisor returns the supervisor client of sandbox id, with a
// credential bound to it as the gateway's drivers hand out.
func (g *testGateway) supervisor(id string) gatewayv1connect.SupervisorServiceClient {
	g.t.Helper()
	secret, _, err := auth.CreateToken(context.Background(), g.store, store.TokenSandbox, "sandbox "+id, id)
	if err != nil {
		g.t.Fatal(err)
	}
	return gatewayv1connect.NewSupervisorServiceClient(g.httpClient(secret), g.url, connect.WithGRPC())
}

func (g *testGateway) httpClient(token string) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(g.ca)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	g.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: bearerRT{token: token, next: tr}}
}

type bearerRT struct {
	token string
	next  http.RoundTripper
}

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// createExternal creates a sandbox with the external driver through the
// CLI and returns its id.
func (g *testGateway) createExternal(name string, extra ...string) string {
	g.t.Helper()
	r := runCorral(g.t, "", append([]string{"sandbox", "create", "--driver", "external", "--name", name}, extra...)...)
	if r.code != 0 {
		g.t.Fatalf("sandbox create: %s", r)
	}
	return strings.TrimSpace(r.stdout)
}

func (g *testGateway) reportPhase(id string, phase gatewayv1.Phase, code *int32) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.supervisor(id).ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: phase, ExitCode: code})); err != nil {
		g.t.Fatal(err)
	}
}

type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%sstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runCorral runs the corral CLI in-process as a user would.
func runCorral(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return runCorralCtx(ctx, stdin, args...)
}

func runCorralCtx(ctx context.Context, stdin string, args ...string) cliResult {
	var out, errb syncBuffer
	code := cli.ExecuteWith(ctx, args, strings.NewReader(stdin), &out, &errb)
	return cliResult{stdout: out.String(), stderr: errb.String(), code: code}
}

// background is a long-running command (watch, logs --follow) the test
// reads while it runs, then interrupts.
type background struct {
	out, err syncBuffer
	cancel   context.CancelFunc
	done     chan int
}

func startCorral(t *testing.T, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &background{cancel: cancel, done: make(chan int, 1)}
	go func() { b.done <- cli.ExecuteWith(ctx, args, strings.NewReader(""), &b.out, &b.err) }()
	t.Cleanup(func() { b.stop(t) })
	return b
}

// waitFor waits until stdout holds every one of want.
func (b *background) waitFor(t *testing.T, want ...string) {
	t.Helper()
	has := func() bool {
		out := b.out.String()
		for _, w := range want {
			if !strings.Contains(out, w) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if has() {
			return
		}
		select {
		case code := <-b.done:
			b.done <- code
			if has() { // printed just before it ended
				return
			}
			t.Fatalf("exited %d before printing %q:\n%s\nstderr:\n%s", code, want, b.out.String(), b.err.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no %q in:\n%s\nstderr:\n%s", want, b.out.String(), b.err.String())
}

// stop interrupts the command and returns its exit code.
func (b *background) stop(t *testing.T) int {
	t.Helper()
	b.cancel()
	select {
	case code := <-b.done:
		b.done <- code
		return code
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not end when interrupted")
		return -1
	}
}

// syncBuffer is written by a command while a test polls it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
