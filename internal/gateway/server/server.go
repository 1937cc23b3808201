// Package server is the gateway: the connect services (gRPC, gRPC-Web and
// Connect/JSON on one net/http server over TLS), /metrics, /healthz and
// /readyz. It keeps no state of its own beyond what the store holds,
// except the in-memory fan-out to open streams.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/hub"
	"github.com/corral-sandbox/corral/internal/gateway/secretbox"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

// DriverExternal records a sandbox whose supervisor runs elsewhere and
// joins on its own; the gateway starts and stops nothing for it.
const DriverExternal = "external"

// DefaultLogRetention is how many log entries per sandbox the store keeps.
const DefaultLogRetention = 100000

const (
	// maxMessageBytes bounds one request message: a policy, a routes
	// document or a secret. Policies are a few kilobytes; a git policy
	// source is capped at 1 MiB too.
	maxMessageBytes = 1 << 20
	// maxLogBatchBytes bounds one message to the supervisors' service,
	// whose log batches are the largest messages the gateway takes.
	maxLogBatchBytes = 16 << 20
	// streamBuffer is how far a stream may fall behind the hub before it
	// is cut off and resumes from the store.
	streamBuffer   = 1024
	tailPerSandbox = 1000
	pruneEvery     = time.Minute
)

// Config is what a gateway runs with.
type Config struct {
	Store store.Store
	// Drivers by name; "external" is always added. The default driver
	// for Create is "local".
	Drivers map[string]driver.Driver
	PKI     *auth.PKI
	Secrets *secretbox.Box
	// URL is the address supervisors dial, e.g. https://127.0.0.1:7443.
	URL string
	// LogRetention is the number of log entries kept per sandbox.
	LogRetention int
	Logger       *slog.Logger
	// Registry receives the gateway's metrics; nil makes a new one.
	Registry *prometheus.Registry
	// PublicMetrics serves /metrics without a credential; otherwise it
	// takes a user's, as the API does.
	PublicMetrics bool
}

// Server is one gateway.
type Server struct {
	cfg     Config
	store   store.Store
	log     *slog.Logger
	drivers map[string]driver.Driver
	auth    *auth.Authenticator
	reg     *prometheus.Registry
	metrics *metrics

	sandboxEvents *hub.Hub[sandboxEvent]
	changes       *hub.Hub[change]
	logs          *hub.Hub[store.LogEntry]
	tail          *hub.Tail[store.LogEntry]

	// ingest serialises append-then-publish, so live followers see log
	// entries in the order of their sequence numbers.
	ingest  sync.Mutex
	dropped map[string]int64 // per sandbox, guarded by ingest

	ready atomic.Bool
}

// sandboxEvent is a sandbox's new state, or its removal.
type sandboxEvent struct {
	sb      *gatewayv1.Sandbox
	deleted bool
}

// change tells supervisors to look again: at their policy (sandbox set),
// or at the routes, which every supervisor shares.
type change struct {
	sandboxID string
	routes    bool
	deleted   bool
	// secret is the name of a secret whose value was set: every
	// supervisor whose policy takes it from_gateway is sent the values.
	secret string
}

type externalDriver struct{}

func (externalDriver) Create(context.Context, store.Sandbox, driver.Link) (string, error) {
	return "", nil
}

// Inspect cannot see a supervisor on another host; what it reports by
// ReportPhase is the only word on it, so it counts as running.
func (externalDriver) Inspect(context.Context, store.Sandbox) (driver.Status, error) {
	return driver.Status{Running: true}, nil
}

func (externalDriver) Delete(context.Context, store.Sandbox) error { return nil }

// New builds a gateway from cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.PKI == nil || cfg.Secrets == nil {
		return nil, errors.New("gateway: a store, a PKI and a secret box are required")
	}
	if cfg.LogRetention <= 0 {
		cfg.LogRetention = DefaultLogRetention
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	drivers := map[string]driver.Driver{DriverExternal: externalDriver{}}
	for name, d := range cfg.Drivers {
		drivers[name] = d
	}
	s := &Server{
		cfg:           cfg,
		store:         cfg.Store,
		log:           log,
		drivers:       drivers,
		auth:          &auth.Authenticator{Store: cfg.Store},
		reg:           reg,
		sandboxEvents: hub.New[sandboxEvent](),
		changes:       hub.New[change](),
		logs:          hub.New[store.LogEntry](),
		tail:          hub.NewTail[store.LogEntry](tailPerSandbox),
		dropped:       map[string]int64{},
	}
	var err error
	if s.metrics, err = newMetrics(reg, cfg.Store); err != nil {
		return nil, err
	}
	s.auth.Refused = func(c connect.Code) { s.metrics.refused.WithLabelValues(c.String()).Inc() }
	return s, nil
}

// Handler serves the API, /metrics, /healthz and /readyz.
func (s *Server) Handler() http.Handler {
	interceptors := connect.WithInterceptors(s.metrics.interceptor(), s.auth.Interceptor())
	opts := connect.WithHandlerOptions(interceptors, connect.WithReadMaxBytes(maxMessageBytes))
	mux := http.NewServeMux()
	// Every API call is authenticated before connect reads its body.
	api := func(path string, h http.Handler) { mux.Handle(path, s.auth.Require(h)) }
	api(gatewayv1connect.NewSandboxServiceHandler(&sandboxService{s}, opts))
	api(gatewayv1connect.NewPolicyServiceHandler(&policyService{s}, opts))
	api(gatewayv1connect.NewLogServiceHandler(&logService{s}, opts))
	api(gatewayv1connect.NewSecretServiceHandler(&secretService{s}, opts))
	api(gatewayv1connect.NewRouteServiceHandler(&routeService{s}, opts))
	api(gatewayv1connect.NewSupervisorServiceHandler(&supervisorService{s},
		connect.WithHandlerOptions(interceptors, connect.WithReadMaxBytes(maxLogBatchBytes))))
	// The counts tell who calls what and how sandboxes fare: a user's
	// business unless the operator opens them.
	metricsHandler := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	if !s.cfg.PublicMetrics {
		metricsHandler = s.auth.RequireUser(metricsHandler)
	}
	mux.Handle("/metrics", metricsHandler)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", s.readyz)
	return auth.WithTLS(withResponseWriter(mux))
}

type responseWriterKey struct{}

// withResponseWriter lets a stream handler reach its ResponseWriter; see
// sendHeaders.
func withResponseWriter(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), responseWriterKey{}, w)))
	})
}

// sendHeaders sends a server stream's response headers now. connect sends
// them with the first message, and connect clients wait for them before
// the call returns, so a watch or follow with nothing to send yet would
// hang in the call. Every protocol answers a stream with 200 and carries
// its status in trailers or the body, so nothing is lost by committing.
func sendHeaders(ctx context.Context) {
	if w, ok := ctx.Value(responseWriterKey{}).(http.ResponseWriter); ok {
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
	}
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		http.Error(w, "starting: re-adopting sandboxes", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.store.GetSandbox(ctx, "readyz-probe"); err != nil && !errors.Is(err, store.ErrNotFound) {
		http.Error(w, "store: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

// Serve re-adopts the sandboxes a previous run left, then serves on ln
// until ctx ends, and then stops gracefully: open streams are ended (their
// clients reconnect to the next gateway) and unary calls get a few
// seconds to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.Readopt(ctx)
	s.ready.Store(true)

	streams, endStreams := context.WithCancel(context.WithoutCancel(ctx))
	defer endStreams()
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         s.cfg.PKI.ServerConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return streams },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	go s.pruneLoop(streams)

	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	s.log.Info("gateway serving", "addr", ln.Addr().String(), "url", s.cfg.URL)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("gateway stopping")
	s.ready.Store(false)
	endStreams()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	s.log.Info("gateway stopped")
	return nil
}

// Readopt checks every sandbox a previous run left provisioning or ready:
// one whose supervisor is gone without having reported its exit failed.
// Running ones are left alone; their supervisors reconnect by themselves.
func (s *Server) Readopt(ctx context.Context) {
	sbs, err := s.store.ListSandboxes(ctx, nil)
	if err != nil {
		s.log.Error("re-adopt: list sandboxes", "err", err)
		return
	}
	for _, sb := range sbs {
		if sb.Phase != store.PhaseProvisioning && sb.Phase != store.PhaseReady {
			continue
		}
		d, ok := s.drivers[sb.Driver]
		if !ok {
			s.setPhase(ctx, sb.ID, store.PhaseFailed, nil, fmt.Sprintf("driver %q is not available on this gateway", sb.Driver))
			continue
		}
		st, err := d.Inspect(ctx, sb)
		if err != nil {
			s.log.Warn("re-adopt: inspect failed; the sandbox keeps its phase", "sandbox", sb.ID, "err", err)
			continue
		}
		if st.Running {
			s.log.Info("re-adopted sandbox", "sandbox", sb.ID, "phase", sb.Phase)
			continue
		}
		reason := "the supervisor is no longer running and reported no exit"
		if st.Reason != "" {
			reason += ": " + st.Reason
		}
		s.setPhase(ctx, sb.ID, store.PhaseFailed, st.ExitCode, reason)
	}
}

// setPhase records a phase and tells watchers.
func (s *Server) setPhase(ctx context.Context, id string, phase store.Phase, code *int, reason string) {
	if err := s.store.SetPhase(ctx, id, phase, code, reason); err != nil {
		s.log.Error("record phase", "sandbox", id, "phase", phase, "err", err)
		return
	}
	s.log.Info("sandbox phase", "sandbox", id, "phase", phase, "reason", reason)
	s.publishSandbox(ctx, id)
}

// publishSandbox sends a sandbox's current state to its watchers.
func (s *Server) publishSandbox(ctx context.Context, id string) {
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		s.log.Warn("publish sandbox", "sandbox", id, "err", err)
		return
	}
	pb, err := s.sandboxProto(ctx, sb)
	if err != nil {
		s.log.Warn("publish sandbox", "sandbox", id, "err", err)
		return
	}
	s.sandboxEvents.Publish(sandboxEvent{sb: pb})
}

func (s *Server) pruneLoop(ctx context.Context) {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		s.Prune(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Prune applies the log retention once.
func (s *Server) Prune(ctx context.Context) {
	n, err := s.store.PruneLogs(ctx, s.cfg.LogRetention)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("prune logs", "err", err)
		}
		return
	}
	if n > 0 {
		s.log.Info("pruned logs", "removed", n, "keep_per_sandbox", s.cfg.LogRetention)
	}
}

// principal returns the caller; handlers run only behind the auth
// interceptor, so its absence is a wiring bug and refused.
func principal(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no principal"))
	}
	return p, nil
}

// storeErr maps a store error to a connect error.
func storeErr(what string, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: %w", what, err))
	case errors.Is(err, store.ErrExists):
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s: %w", what, err))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeCanceled, fmt.Errorf("%s: %w", what, err))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%s: %w", what, err))
}

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}
