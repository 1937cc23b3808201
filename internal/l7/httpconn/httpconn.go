// Package httpconn serves HTTP on a connection that someone else
// accepted: the inspector serves the workload's connection to an
// inspected host (its simple HTTP/1.1 requests inline, see ServeInline),
// a local service (policy.local, inference.local) the connection the
// gate handed it, both with net/http's server for everything else.
package httpconn

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Listener hands out one connection, then blocks until closed.
type Listener struct {
	c    chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

// NewListener returns a Listener whose one connection is c.
func NewListener(c net.Conn) *Listener {
	l := &Listener{c: make(chan net.Conn, 1), done: make(chan struct{}), addr: c.LocalAddr()}
	l.c <- c
	return l
}

// Accept returns the connection the first time, then waits for Close.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close ends Serve; it does not close the connection, which the server
// owns once accepted.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the connection's local address.
func (l *Listener) Addr() net.Addr { return l.addr }

// Limits every one-connection server here shares.
const (
	// HeadTimeout bounds the wait for each request head.
	HeadTimeout = 30 * time.Second
	// MaxHeaderBytes bounds one request head.
	MaxHeaderBytes = 64 << 10
)

// Serve runs an HTTP server for h on the one connection c until the
// connection, or ctx, ends; idle ends a keep-alive connection with no
// request in flight. Requests' contexts derive from ctx. An upgraded
// (hijacked) connection outlives Serve.
func Serve(ctx context.Context, c net.Conn, h http.Handler, idle time.Duration, log *slog.Logger) error {
	ln := NewListener(c)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: HeadTimeout,
		IdleTimeout:       idle,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				ln.Close()
			}
		},
	}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		c.Close()
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
