// Package audit writes the sandbox's audit trail: one JSON object per line,
// with field names that are part of corral's interface and never change
// meaning. Consumers (SIEMs, the gateway, tests) key on the event names below.
package audit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
)

// Event names. Adding one is fine; renaming one breaks users.
const (
	SandboxStart             = "sandbox.start"
	SandboxStartUncaged      = "sandbox.start.uncaged"
	SandboxExit              = "sandbox.exit"
	SandboxKilled            = "sandbox.killed"
	SandboxLimitsNotEnforced = "sandbox.limits_not_enforced"
	SandboxCompileError      = "sandbox.compile_error"
	SandboxSetupError        = "sandbox.setup_error"
	SandboxStaleSwept        = "sandbox.stale_swept"
	SandboxDegraded          = "sandbox.protection_degraded"

	NetConnectAllowed = "net.connect.allowed"
	NetConnectDenied  = "net.connect.denied"
	NetConnectFailed  = "net.connect.failed"
	NetDNSDenied      = "net.dns.denied"
	// HTTPRequest is one request on an inspected connection: allowed,
	// denied, or denied in audit mode and forwarded (decision "audit").
	HTTPRequest = "http.request"
	// TLSHandshakeFailed is a client that gave up on the TLS handshake of
	// an inspected connection, most often because it does not trust the
	// sandbox CA (a tool with its own trust store).
	TLSHandshakeFailed = "tls.handshake_failed"
	PolicyReloaded     = "policy.reloaded"
	PolicyReloadFail   = "policy.reload_failed"
)

// Field names shared by every event.
const (
	FieldEvent     = "event"
	FieldTime      = "time"
	FieldSandboxID = "sandbox_id"
	FieldSession   = "session"
)

// Logger appends audit events to one sink. It is safe for concurrent use
// because slog handlers serialise their writes.
type Logger struct {
	closer io.Closer
	log    *slog.Logger
}

// Open appends to the file at path, creating it (0600) and its directory.
func Open(path string) (*Logger, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create audit log directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit log %s: %w", path, err)
	}
	l := New(f)
	l.closer = f
	return l, nil
}

// New writes events to w.
func New(w io.Writer) *Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.LevelKey:
				return slog.Attr{}
			case slog.MessageKey:
				a.Key = FieldEvent
			case slog.TimeKey:
				a.Key = FieldTime
			}
			return a
		},
	})
	return &Logger{log: slog.New(h)}
}

// Discard is a Logger that drops everything; for paths that must not fail
// because auditing is unavailable.
func Discard() *Logger { return New(io.Discard) }

// For returns a Logger whose events all carry the sandbox id and session.
func (l *Logger) For(sandboxID, session string) *Logger {
	return &Logger{closer: l.closer, log: l.log.With(FieldSandboxID, sandboxID, FieldSession, session)}
}

// Emit writes one event with alternating key/value fields.
func (l *Logger) Emit(event string, kv ...any) {
	l.log.Log(context.Background(), slog.LevelInfo, event, kv...)
}

// Close closes the underlying file, if any.
func (l *Logger) Close() error {
	if l.closer == nil {
		return nil
	}
	return l.closer.Close()
}
