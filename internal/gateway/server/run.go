package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/secretbox"
	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// RunConfig is what `corral-gateway serve` was given.
type RunConfig struct {
	Listen   string
	DataDir  string
	Database string
	SANs     []string
	// URL is what supervisors dial; empty derives it from Listen.
	URL          string
	LogRetention int
	// Drivers besides "external" (the command adds "local").
	Drivers map[string]driver.Driver
	Logger  *slog.Logger
}

// Run starts a gateway and serves until ctx ends.
func Run(ctx context.Context, rc RunConfig) error {
	if err := os.MkdirAll(rc.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	pki, err := auth.EnsurePKI(filepath.Join(rc.DataDir, "tls"), rc.SANs)
	if err != nil {
		return err
	}
	box, err := secretbox.LoadOrCreate(filepath.Join(rc.DataDir, "secret.key"))
	if err != nil {
		return err
	}
	st, err := store.Open(ctx, rc.Database, rc.DataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	ln, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	url := rc.URL
	if url == "" {
		url = URLFor(ln.Addr())
	}
	s, err := New(Config{
		Store:        st,
		Drivers:      rc.Drivers,
		PKI:          pki,
		Secrets:      box,
		URL:          url,
		LogRetention: rc.LogRetention,
		Logger:       rc.Logger,
	})
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// URLFor is the URL a supervisor on this host dials for a listener bound
// to addr: a wildcard address becomes loopback.
func URLFor(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "https://" + addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "https://" + net.JoinHostPort(host, port)
}
