package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
	// NewSecretKey lets the gateway make a new secret key although the
	// database holds secrets sealed with a key that is gone.
	NewSecretKey bool
	// PublicMetrics serves /metrics without a credential.
	PublicMetrics bool
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
	st, err := store.Open(ctx, rc.Database, rc.DataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	box, err := secretKey(ctx, st, filepath.Join(rc.DataDir, "secret.key"), rc.NewSecretKey, rc.Logger)
	if err != nil {
		return err
	}
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
		Store:         st,
		Drivers:       rc.Drivers,
		PKI:           pki,
		Secrets:       box,
		URL:           url,
		LogRetention:  rc.LogRetention,
		Logger:        rc.Logger,
		PublicMetrics: rc.PublicMetrics,
	})
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// secretKey loads the key that seals the stored secrets. A missing key
// file is made anew only when nothing is sealed yet, or when told to: a
// lost key (a restore that left it out, a data directory moved without
// it) would otherwise be replaced silently, and every stored secret fail
// from then on. A key that does not open a stored secret is reported.
func secretKey(ctx context.Context, st store.Store, path string, newKey bool, log *slog.Logger) (*secretbox.Box, error) {
	names, err := st.ListSecrets(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) && len(names) > 0 && !newKey {
		return nil, fmt.Errorf("secret key %s is missing, but the database holds %d secrets sealed with it: restore the key file, or start with --new-secret-key and set every secret again (the stored values cannot be opened without it)", path, len(names))
	}
	box, err := secretbox.LoadOrCreate(path)
	if err != nil {
		return nil, err
	}
	if len(names) > 0 {
		sec, err := st.GetSecret(ctx, names[0])
		if err == nil {
			_, err = box.Open(sec.Name, sec.Sealed)
		}
		if err != nil && log != nil {
			log.Warn("the secret key does not open the stored secrets; set them again", "key", path, "secret", names[0], "err", err)
		}
	}
	return box, nil
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
