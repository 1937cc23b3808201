package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// Authenticator resolves a request's credential to a principal.
type Authenticator struct {
	Store store.Store
	// Now is the clock for token expiry; nil means time.Now.
	Now func() time.Time
}

type tlsKey struct{}

// WithTLS is HTTP middleware that hands the connection's TLS state to the
// interceptor, which connect does not expose to handlers.
func WithTLS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil {
			r = r.WithContext(context.WithValue(r.Context(), tlsKey{}, r.TLS))
		}
		next.ServeHTTP(w, r)
	})
}

var (
	errNoCredential  = errors.New("no credential: send Authorization: Bearer TOKEN or a client certificate from corral gateway issue-client")
	errBadCredential = errors.New("invalid credential: the token is unknown, expired, spent or malformed")
)

// Authenticate finds the principal for a bearer token in header or, when
// there is none, a verified client certificate. A token that is present
// but wrong fails even with a valid certificate, so a mistake is never
// papered over by another identity.
func (a *Authenticator) Authenticate(ctx context.Context, header http.Header) (Principal, error) {
	if h := header.Get("Authorization"); h != "" {
		scheme, secret, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
			return Principal{}, errBadCredential
		}
		return a.token(ctx, strings.TrimSpace(secret))
	}
	if st, ok := ctx.Value(tlsKey{}).(*tls.ConnectionState); ok && len(st.VerifiedChains) > 0 {
		// VerifiedChains is set only for a certificate the CA signed for
		// client auth (tls.VerifyClientCertIfGiven checked it).
		cn := st.VerifiedChains[0][0].Subject.CommonName
		if cn == "" {
			return Principal{}, errBadCredential
		}
		return Principal{Kind: store.TokenUser, Name: cn}, nil
	}
	return Principal{}, errNoCredential
}

func (a *Authenticator) token(ctx context.Context, secret string) (Principal, error) {
	t, err := a.Store.TokenByHash(ctx, Hash(secret))
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, errBadCredential
	}
	if err != nil {
		return Principal{}, fmt.Errorf("look up token: %w", err)
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	if !t.ExpiresAt.IsZero() && now().After(t.ExpiresAt) {
		return Principal{}, errBadCredential
	}
	p := Principal{Kind: t.Kind, Name: t.Name, TokenID: t.ID}
	switch t.Kind {
	case store.TokenUser:
	case store.TokenSandbox:
		if t.SandboxID == "" {
			return Principal{}, errBadCredential
		}
		p.SandboxID = t.SandboxID
	case store.TokenJoin:
		if !t.UsedAt.IsZero() {
			return Principal{}, errBadCredential
		}
		p.Secrets = t.Secrets
	default:
		return Principal{}, errBadCredential
	}
	return p, nil
}

// check authenticates and authorizes one call.
func (a *Authenticator) check(ctx context.Context, procedure string, header http.Header) (context.Context, error) {
	p, err := a.Authenticate(ctx, header)
	if err != nil {
		if errors.Is(err, errNoCredential) || errors.Is(err, errBadCredential) {
			return nil, connect.NewError(connect.CodeUnauthenticated, err)
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if !Allowed(p.Kind, procedure) {
		return nil, connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("a %s credential may not call %s", p.Kind, procedure))
	}
	return WithPrincipal(ctx, p), nil
}

// Interceptor returns the connect interceptor that authenticates and
// authorizes every unary and streaming call before its handler runs.
func (a *Authenticator) Interceptor() connect.Interceptor { return interceptor{a} }

type interceptor struct{ a *Authenticator }

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := i.a.check(ctx, req.Spec().Procedure, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// recheckEvery bounds how long a stream outlives its credential. Tokens
// are deleted by corral-gateway token delete in another process, so
// nothing tells this one: an open stream authenticates again at this
// interval, and its handler's context ends, with the refusal as its
// cause, once the credential is gone.
const recheckEvery = 2 * time.Second

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		procedure, header := conn.Spec().Procedure, conn.RequestHeader()
		ctx, err := i.a.check(ctx, procedure, header)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		c := &checkedConn{StreamingHandlerConn: conn, recheck: func() error {
			_, err := i.a.check(ctx, procedure, header)
			return err
		}, checked: time.Now()}
		p, _ := FromContext(ctx)
		// A sandbox credential's stream carries secret values and sends
		// rarely: every message is checked, so a revoked credential gets
		// not one more. A user's may send thousands of log lines a second.
		if p.Kind != store.TokenSandbox {
			c.maxAge = recheckEvery
		}
		go func() {
			t := time.NewTicker(recheckEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := c.fresh(); err != nil {
						cancel(err)
						return
					}
				}
			}
		}()
		return next(ctx, c)
	}
}

// checkedConn authenticates its stream's credential again before a
// message goes either way, when the last check is older than maxAge.
type checkedConn struct {
	connect.StreamingHandlerConn
	recheck func() error
	maxAge  time.Duration

	mu      sync.Mutex
	checked time.Time
}

// fresh returns the refusal of a credential that no longer authenticates.
func (c *checkedConn) fresh() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxAge > 0 && time.Since(c.checked) < c.maxAge {
		return nil
	}
	if err := c.recheck(); err != nil {
		return err
	}
	c.checked = time.Now()
	return nil
}

func (c *checkedConn) Send(msg any) error {
	if err := c.fresh(); err != nil {
		return err
	}
	return c.StreamingHandlerConn.Send(msg)
}

func (c *checkedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	return c.fresh()
}
