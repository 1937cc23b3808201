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
	// Refused, when set, is told the code of each call Require refuses.
	Refused func(connect.Code)
}

type tlsKey struct{}

// WithTLS is HTTP middleware that puts the connection's TLS state in the
// request's context, where Authenticate finds it: connect gives a stream's
// interceptor no request, only its context.
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
	errBadCert       = errors.New("invalid credential: the client certificate was revoked, or was not issued by this gateway's issue-client; ask for a new one")
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
		leaf := st.VerifiedChains[0][0]
		cn := leaf.Subject.CommonName
		if cn == "" {
			return Principal{}, errBadCert
		}
		// The CA's signature says who; the store says whether it still
		// counts: issue-client records every certificate, revoke-client
		// marks it.
		c, err := a.Store.ClientCertBySerial(ctx, SerialOf(leaf))
		switch {
		case errors.Is(err, store.ErrNotFound):
			return Principal{}, errBadCert
		case err != nil:
			return Principal{}, fmt.Errorf("look up client certificate: %w", err)
		case !c.RevokedAt.IsZero() || c.Name != cn:
			return Principal{}, errBadCert
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
		if errors.Is(err, errNoCredential) || errors.Is(err, errBadCredential) || errors.Is(err, errBadCert) {
			return nil, connect.NewError(connect.CodeUnauthenticated, err)
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if err := authorize(p, procedure); err != nil {
		return nil, err
	}
	return WithPrincipal(ctx, p), nil
}

func authorize(p Principal, procedure string) error {
	if !Allowed(p.Kind, procedure) {
		return connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("a %s credential may not call %s", p.Kind, procedure))
	}
	return nil
}

// Require is HTTP middleware for the API's handlers: it authenticates and
// authorizes a call from its headers alone (connect's procedure is the
// URL path), and refuses it in the caller's protocol before the handler
// reads, and maybe inflates, a byte of its body, so that whoever can reach
// the port cannot make the gateway decode messages for nothing. The
// principal goes into the request's context for the interceptor and the
// handlers.
func (a *Authenticator) Require(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, err := a.check(r.Context(), r.URL.Path, r.Header)
		if err != nil {
			if a.Refused != nil {
				a.Refused(connect.CodeOf(err))
			}
			_ = errs.Write(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// RequireUser is HTTP middleware for the gateway's plain HTTP endpoints
// that only users may read (/metrics): a user's token or client
// certificate, else 401, or 403 for another kind of credential.
func (a *Authenticator) RequireUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := a.Authenticate(r.Context(), r.Header)
		switch {
		case errors.Is(err, errNoCredential) || errors.Is(err, errBadCredential) || errors.Is(err, errBadCert):
			http.Error(w, err.Error(), http.StatusUnauthorized)
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case p.Kind != store.TokenUser:
			http.Error(w, fmt.Sprintf("a %s credential may not read %s", p.Kind, r.URL.Path), http.StatusForbidden)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// Interceptor returns the connect interceptor that makes sure every call
// comes with the principal Require found and that it may call the
// procedure, and keeps checking a stream's credential while it is open.
func (a *Authenticator) Interceptor() connect.Interceptor { return interceptor{a} }

type interceptor struct{ a *Authenticator }

// authorized returns the principal Require put in ctx if it may call
// procedure; it fails closed when the handlers were served without Require.
func authorized(ctx context.Context, procedure string) (Principal, error) {
	p, ok := FromContext(ctx)
	if !ok {
		return Principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no principal: the API is served without auth.Require"))
	}
	return p, authorize(p, procedure)
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		if _, err := authorized(ctx, req.Spec().Procedure); err != nil {
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
		p, err := authorized(ctx, procedure)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		c := &checkedConn{StreamingHandlerConn: conn, recheck: func() error {
			_, err := i.a.check(ctx, procedure, header)
			return err
		}, checked: time.Now()}
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
