// Package gatewaylink is a supervisor's outbound link to a corral gateway:
// it fetches the sandbox's policy at start, holds one stream on which the
// gateway pushes newer versions, reports load status and the sandbox's
// phase, and pushes the audit trail in batches. The sandbox never depends
// on it to enforce: while the gateway is away the supervisor keeps the
// policy it has, and the link catches up when the gateway returns.
package gatewaylink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	gatewayv1 "github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
)

// Token prefixes: a sandbox's own credential, and a one-time join token a
// supervisor exchanges for one.
const (
	SandboxTokenPrefix = "cgw_s_"
	JoinTokenPrefix    = "cgw_j_"
)

// Defaults of Config's tunables.
const (
	DefaultStartTimeout = 10 * time.Second
	DefaultFinishWait   = 2 * time.Second
	DefaultBuffer       = 10000
	DefaultBatch        = 500
	DefaultFlushEvery   = 200 * time.Millisecond
	DefaultMinBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
)

// Join describes the sandbox to the gateway when the supervisor joins
// with a join token.
type Join struct {
	Name    string
	Labels  map[string]string
	Command []string
	Workdir string
	// Policy is the YAML the sandbox starts with if the gateway has none.
	Policy []byte
}

// Config says where the gateway is and how to reach it.
type Config struct {
	URL       string
	CAFile    string
	TokenFile string
	// StateDir is the supervisor's state directory; the link keeps its
	// credential and last-known-good policy in a directory under it.
	StateDir string
	Join     Join
	Log      *slog.Logger

	// Zero means the Default of the same name.
	StartTimeout time.Duration
	FinishWait   time.Duration
	Buffer       int
	Batch        int
	FlushEvery   time.Duration
	MinBackoff   time.Duration
	MaxBackoff   time.Duration
}

func (c *Config) defaults() {
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	set(&c.StartTimeout, DefaultStartTimeout)
	set(&c.FinishWait, DefaultFinishWait)
	set(&c.FlushEvery, DefaultFlushEvery)
	set(&c.MinBackoff, DefaultMinBackoff)
	set(&c.MaxBackoff, DefaultMaxBackoff)
	if c.Buffer <= 0 {
		c.Buffer = DefaultBuffer
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Policy is the policy a sandbox starts with.
type Policy struct {
	// Version is the gateway's version; 0 when the gateway has none for
	// this sandbox (the supervisor then starts with its own).
	Version int64
	YAML    []byte
	// Cached is set when the gateway could not be reached and this is
	// the last policy loaded by an earlier run.
	Cached bool
	// Secrets are the values, by gateway secret name, of the secrets the
	// policy takes from_gateway. They are held in memory only: a cached
	// start has none.
	Secrets map[string][]byte
	// Routes are the gateway's model routes; nil when it has none or the
	// start is cached.
	Routes *Routes
}

// Routes is one version of the gateway's model routes document.
type Routes struct {
	Version int64
	YAML    []byte
}

// Handlers receive what the gateway pushes. Each may be nil.
type Handlers struct {
	// Policy applies a policy version; its error is reported FAILED.
	Policy func(version int64, yaml []byte) error
	// Secrets receives the values of the secrets the policy takes
	// from_gateway, all of them, whenever the gateway sends them.
	Secrets func(values map[string][]byte)
	// Routes applies a version of the model routes.
	Routes func(version int64, yaml []byte) error
}

// Link is one supervisor's connection to its gateway.
type Link struct {
	cfg    Config
	log    *slog.Logger
	client gatewayv1connect.SupervisorServiceClient
	state  state
	token  atomic.Pointer[string]
	// SandboxID is the gateway's id of this sandbox, when known (after a
	// join or from the first policy).
	sandboxID string

	ctx    context.Context
	cancel context.CancelFunc

	// first is the stream Start opened, handed over to Serve.
	first *connect.ServerStreamForClient[gatewayv1.Update]
	start Policy
	// version is the gateway version of the policy in force; seen is the
	// newest version received, loaded or not, so a refused version that
	// the gateway sends again after a reconnect is not tried again.
	version atomic.Int64
	seen    atomic.Int64
	// routes is the newest routes version received.
	routes atomic.Int64

	logs    *logBuffer
	reports reports
	wake    chan struct{}
	// finishing is closed by Finish; the pusher closes flushed once it
	// has sent everything after that.
	finishing  chan struct{}
	flushed    chan struct{}
	finishOnce sync.Once
	pusher     sync.WaitGroup
	// started is set once the workload runs (its sandbox.start event).
	started atomic.Bool
}

// Start connects to the gateway, exchanges a join token for the sandbox's
// credential if it was given one, and returns the policy the sandbox
// starts with: the gateway's, or when the gateway stays unreachable for
// StartTimeout, the last one an earlier run loaded. A refused credential,
// a certificate that does not verify, or an unreachable gateway with
// nothing cached is an error.
func Start(ctx context.Context, cfg Config) (*Link, Policy, error) {
	cfg.defaults()
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, Policy{}, fmt.Errorf("gateway URL %q: want https://HOST:PORT", cfg.URL)
	}
	raw, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		return nil, Policy{}, fmt.Errorf("gateway token: %w", err)
	}
	token := strings.TrimSpace(string(raw))
	if !strings.HasPrefix(token, SandboxTokenPrefix) && !strings.HasPrefix(token, JoinTokenPrefix) {
		return nil, Policy{}, fmt.Errorf("gateway token file %s: want a sandbox token (%s...) or a join token (%s...)", cfg.TokenFile, SandboxTokenPrefix, JoinTokenPrefix)
	}
	hc, err := httpClient(cfg.CAFile)
	if err != nil {
		return nil, Policy{}, err
	}
	l := &Link{
		cfg:       cfg,
		log:       cfg.Log,
		state:     newState(cfg.StateDir, cfg.URL, token),
		logs:      newLogBuffer(cfg.Buffer),
		wake:      make(chan struct{}, 1),
		finishing: make(chan struct{}),
		flushed:   make(chan struct{}),
	}
	l.client = gatewayv1connect.NewSupervisorServiceClient(&bearer{hc: hc, token: &l.token}, strings.TrimRight(cfg.URL, "/"), connect.WithGRPC())
	l.token.Store(&token)
	if saved, err := l.state.loadCredential(); err != nil {
		return nil, Policy{}, err
	} else if saved != nil {
		// An earlier run of this supervisor joined already: the join
		// token is spent, the credential it got is not.
		l.token.Store(&saved.Token)
		l.sandboxID = saved.SandboxID
	}
	l.ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))

	pol, err := l.connect(ctx)
	if err != nil {
		l.cancel()
		return nil, Policy{}, err
	}
	// The link keeps the policy only: the values are the caller's to hold.
	l.start = Policy{Version: pol.Version, YAML: pol.YAML, Cached: pol.Cached}
	l.version.Store(pol.Version)
	l.seen.Store(pol.Version)
	if pol.Routes != nil {
		l.routes.Store(pol.Routes.Version)
	}
	l.pusher.Add(1)
	go l.push()
	return l, pol, nil
}

// SandboxID is the gateway's id for this sandbox, "" when not yet known.
func (l *Link) SandboxID() string { return l.sandboxID }

// connect joins if needed and subscribes, retrying what may be passing
// (the gateway down or restarting) until StartTimeout.
func (l *Link) connect(ctx context.Context) (Policy, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StartTimeout)
	defer cancel()
	bo := l.backoff()
	for attempt := 0; ; attempt++ {
		pol, err := l.tryConnect(ctx)
		if err == nil {
			return pol, nil
		}
		if fatal(err) {
			return Policy{}, l.explain(err)
		}
		if attempt == 0 {
			l.log.Warn("gateway not reachable; retrying", "url", l.cfg.URL, "for", l.cfg.StartTimeout, "err", err)
		}
		select {
		case <-ctx.Done():
			return l.fallback(err)
		case <-time.After(bo.next()):
		}
	}
}

func (l *Link) tryConnect(ctx context.Context) (Policy, error) {
	if strings.HasPrefix(*l.token.Load(), JoinTokenPrefix) {
		if err := l.join(ctx); err != nil {
			return Policy{}, err
		}
	}
	stream, err := l.client.Subscribe(l.ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		return Policy{}, fmt.Errorf("subscribe: %w", err)
	}
	// The gateway sends the current state at once; only the wait for it
	// is bounded by ctx, the stream lives on.
	got := make(chan bool, 1)
	go func() { got <- stream.Receive() }()
	select {
	case <-ctx.Done():
		stream.Close()
		<-got
		return Policy{}, fmt.Errorf("subscribe: no policy from the gateway: %w", ctx.Err())
	case ok := <-got:
		if !ok {
			err := stream.Err()
			stream.Close()
			if err == nil {
				err = errors.New("the gateway closed the stream")
			}
			return Policy{}, fmt.Errorf("subscribe: %w", err)
		}
	}
	l.first = stream
	var pol Policy
	u := stream.Msg()
	if p := u.GetPolicy(); p != nil {
		pol = Policy{Version: p.GetVersion(), YAML: []byte(p.GetYaml())}
		if l.sandboxID == "" {
			l.sandboxID = p.GetSandboxId()
		}
	}
	pol.Secrets = secretValues(u)
	if r := u.GetRoutes(); r != nil {
		pol.Routes = &Routes{Version: r.GetVersion(), YAML: []byte(r.GetYaml())}
	}
	return pol, nil
}

// secretValues are an update's secrets by name; nil when it has none.
func secretValues(u *gatewayv1.Update) map[string][]byte {
	if len(u.GetSecrets()) == 0 {
		return nil
	}
	out := make(map[string][]byte, len(u.GetSecrets()))
	for _, s := range u.GetSecrets() {
		out[s.GetName()] = s.GetValue()
	}
	return out
}

func (l *Link) join(ctx context.Context) error {
	j := l.cfg.Join
	resp, err := l.client.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{
		Name: j.Name, Labels: j.Labels, Command: j.Command, Workdir: j.Workdir, Policy: string(j.Policy),
	}))
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	tok := resp.Msg.GetToken()
	if !strings.HasPrefix(tok, SandboxTokenPrefix) {
		return connect.NewError(connect.CodeInternal, errors.New("join: the gateway answered without a sandbox credential"))
	}
	// Saved before it is used: the join token is spent now, and a
	// supervisor that died before saving would have no way back in.
	if err := l.state.saveCredential(credential{SandboxID: resp.Msg.GetSandboxId(), Token: tok}); err != nil {
		l.log.Warn("the sandbox credential from the join could not be saved; a restarted supervisor cannot reconnect", "err", err)
	}
	l.token.Store(&tok)
	l.sandboxID = resp.Msg.GetSandboxId()
	return nil
}

// fatal errors are not cured by waiting: the gateway refused the
// credential, or it is not the gateway the CA vouches for.
func fatal(err error) bool {
	var cv *tls.CertificateVerificationError
	if errors.As(err, &cv) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeNotFound,
		connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeUnimplemented:
		return true
	}
	return false
}

func (l *Link) explain(err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return fmt.Errorf("gateway %s refused the token in %s: %w", l.cfg.URL, l.cfg.TokenFile, err)
	}
	var cv *tls.CertificateVerificationError
	if errors.As(err, &cv) {
		return fmt.Errorf("gateway %s: its certificate does not verify with the CA in %s: %w", l.cfg.URL, l.cfg.CAFile, err)
	}
	return fmt.Errorf("gateway %s: %w", l.cfg.URL, err)
}

// fallback is the start-up path when the gateway stayed unreachable.
func (l *Link) fallback(last error) (Policy, error) {
	cached, err := l.state.loadPolicy()
	if err != nil {
		return Policy{}, err
	}
	if cached == nil {
		return Policy{}, fmt.Errorf("gateway %s unreachable for %s and no policy of this sandbox is cached from an earlier run: %w",
			l.cfg.URL, l.cfg.StartTimeout, last)
	}
	l.log.Warn("gateway unreachable: starting with the last policy loaded from it; updates arrive when it is back",
		"url", l.cfg.URL, "version", cached.Version, "err", last)
	return Policy{Version: cached.Version, YAML: cached.YAML, Cached: true}, nil
}

// Serve hands what the gateway pushes to h and reports each policy's
// outcome, until ctx ends or Finish. It first reports the start policy
// loaded: the supervisor calls Serve once it runs.
func (l *Link) Serve(ctx context.Context, h Handlers) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if l.start.Version > 0 {
		l.loaded(l.start.Version, l.start.YAML)
	}
	stream := l.first
	l.first = nil
	bo := l.backoff()
	for ctx.Err() == nil {
		if stream == nil {
			s, err := l.client.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{PolicyVersion: l.version.Load(), RoutesVersion: l.routes.Load()}))
			if err != nil {
				l.retry(ctx, &bo, err)
				continue
			}
			stream = s
		}
		for stream.Receive() {
			bo = l.backoff()
			l.poke()
			l.update(stream.Msg(), h)
		}
		err := stream.Err()
		stream.Close()
		stream = nil
		if ctx.Err() == nil {
			l.retry(ctx, &bo, err)
		}
	}
}

// retry waits before the next attempt to reach the gateway.
func (l *Link) retry(ctx context.Context, bo *backoff, err error) {
	if err == nil {
		err = errors.New("the gateway closed the stream")
	}
	d := bo.next()
	l.log.Debug("gateway link down; the sandbox keeps its policy", "err", err, "retry_in", d)
	if fatal(err) && bo.first() {
		l.log.Warn("gateway refused this sandbox; retrying", "err", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (l *Link) update(u *gatewayv1.Update, h Handlers) {
	// Values first: a policy arriving with them may be the first to
	// need them.
	if vals := secretValues(u); vals != nil && h.Secrets != nil {
		h.Secrets(vals)
	}
	if r := u.GetRoutes(); r != nil && r.GetVersion() > l.routes.Load() {
		l.routes.Store(r.GetVersion())
		if h.Routes != nil {
			if err := h.Routes(r.GetVersion(), []byte(r.GetYaml())); err != nil {
				l.log.Warn("model routes from the gateway refused; the routes in force stay", "version", r.GetVersion(), "err", err)
			}
		}
	}
	p := u.GetPolicy()
	if p == nil || p.GetVersion() <= l.seen.Load() || h.Policy == nil {
		return
	}
	v := p.GetVersion()
	l.seen.Store(v)
	if err := h.Policy(v, []byte(p.GetYaml())); err != nil {
		l.log.Warn("policy from the gateway refused; the running policy stays in force", "version", v, "err", err)
		l.reports.policy(v, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED, err.Error())
		l.poke()
		return
	}
	l.loaded(v, []byte(p.GetYaml()))
}

func (l *Link) loaded(v int64, yaml []byte) {
	l.version.Store(v)
	if err := l.state.savePolicy(cachedPolicy{Version: v, YAML: yaml}); err != nil {
		l.log.Warn("cannot cache the policy for a start without the gateway", "err", err)
	}
	l.reports.policy(v, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED, "")
	l.poke()
}

// Finish reports how the run ended, code being corral's exit code and err
// why it failed, flushes what is buffered, and closes the link. It waits
// at most FinishWait: a gateway that is away does not hold up the exit.
// A run in which the workload started has exited; one in which it never
// did has failed. Only the first call counts.
func (l *Link) Finish(code int, err error) {
	l.finishOnce.Do(func() { l.finish(code, err) })
}

func (l *Link) finish(code int, err error) {
	req := &gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_EXITED, ExitCode: new(int32(code))}
	if !l.started.Load() {
		req.Phase = gatewayv1.Phase_PHASE_FAILED
		req.Reason = "the workload did not start"
		if err != nil {
			req.Reason = err.Error()
		}
	}
	l.reports.phase(req)
	close(l.finishing)
	l.poke()
	select {
	case <-l.flushed:
	case <-time.After(l.cfg.FinishWait):
		if n := l.logs.pending(); n > 0 {
			l.log.Warn("gateway link closed with log entries not yet delivered", "entries", n)
		}
	}
	l.cancel()
	l.pusher.Wait()
}

// poke wakes the pusher.
func (l *Link) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *Link) backoff() backoff {
	return backoff{min: l.cfg.MinBackoff, max: l.cfg.MaxBackoff}
}

// backoff doubles from min to max, each wait jittered down by up to a
// quarter so that supervisors cut off together do not return together.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur - time.Duration(rand.Int64N(int64(b.cur)/4+1))
}

func (b *backoff) first() bool { return b.cur == b.min }

func httpClient(caFile string) (*http.Client, error) {
	t, err := gatewayclient.Transport(caFile)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// bearer sets the sandbox's credential on every request; the credential
// changes once, when a join token is exchanged.
type bearer struct {
	hc    *http.Client
	token *atomic.Pointer[string]
}

func (b *bearer) Do(r *http.Request) (*http.Response, error) {
	r.Header.Set("Authorization", "Bearer "+*b.token.Load())
	return b.hc.Do(r)
}
