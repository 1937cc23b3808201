// Package audit writes the sandbox's audit trail: one JSON object per line,
// with field names that are part of corral's interface and never change
// meaning. Consumers (SIEMs, the gateway, tests) key on the event names below.
//
// A workload decides how many refusals it causes and how long the paths and
// names in them are, so the trail defends itself: string fields are cut to a
// cap (truncate.go), events a workload can repeat are rate-limited per key
// with the suppressed counts reported (limit.go), and a file sink never blocks
// its caller and rotates at a size cap (sink.go, rotate.go). Lifecycle events
// (sandbox.*, policy.*, audit.*) are never limited or dropped.
package audit

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
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
	// NetConnectRevoked is an open connection a policy reload closed
	// because the new policy denies it.
	NetConnectRevoked = "net.connect.revoked"
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

	// AuditSuppressed counts the events of one key (or, with scope
	// "event", of one event name) that the rate limit left out between
	// window_start and window_end.
	AuditSuppressed = "audit.suppressed"
	// AuditDropped counts events lost because the writer could not keep
	// up (the queue to a slow disk was full).
	AuditDropped = "audit.dropped"
)

// Field names shared by every event.
const (
	FieldEvent     = "event"
	FieldTime      = "time"
	FieldSandboxID = "sandbox_id"
	FieldSession   = "session"
)

// Fields of audit.suppressed and audit.dropped.
const (
	FieldSuppressedEvent = "suppressed_event"
	FieldScope           = "scope" // "key" or "event"
	FieldClass           = "class" // "refusal" or "allowed"
	FieldCount           = "count"
	FieldKeys            = "keys" // keys folded into an event-scope count
	FieldWindowStart     = "window_start"
	FieldWindowEnd       = "window_end"
)

// Defaults of a file sink.
const (
	DefaultMaxFileBytes  = 64 << 20
	DefaultKeep          = 2
	DefaultMaxFieldBytes = 1024
	DefaultQueueLen      = 4096
)

// Option tunes Open.
type Option func(*config)

// WithMaxFileBytes rotates the file once it would pass n bytes.
func WithMaxFileBytes(n int64) Option { return func(c *config) { c.maxFile = n } }

// WithKeep keeps n rotated files (path.1 is the newest).
func WithKeep(n int) Option { return func(c *config) { c.keep = n } }

// WithQueueLen bounds the events waiting for the writer.
func WithQueueLen(n int) Option { return func(c *config) { c.queue = n } }

// rate is a token bucket's shape.
type rate struct {
	burst  float64
	perSec float64
}

type config struct {
	maxFile  int64
	keep     int
	maxField int
	maxItems int // elements kept of a list field
	queue    int

	// Per key, and per sandbox and event name (so that a workload varying
	// a key field — port, method — still meets a bound), for events that
	// record a refusal or failure and for allowed ones.
	refusalKey, refusalEvent rate
	allowedKey, allowedEvent rate
	maxKeys                  int
	maxReports               int // per-key suppressed reports per flush
	reportEvery              time.Duration
	now                      func() time.Time
}

func defaults() config {
	return config{
		maxFile:      DefaultMaxFileBytes,
		keep:         DefaultKeep,
		maxField:     DefaultMaxFieldBytes,
		maxItems:     64,
		queue:        DefaultQueueLen,
		refusalKey:   rate{burst: 20, perSec: 5},
		refusalEvent: rate{burst: 200, perSec: 50},
		allowedKey:   rate{burst: 200, perSec: 100},
		allowedEvent: rate{burst: 1000, perSec: 500},
		maxKeys:      4096,
		maxReports:   64,
		reportEvery:  time.Second,
		now:          time.Now,
	}
}

func (c *config) check() error {
	switch {
	case c.maxFile < 4096:
		return fmt.Errorf("audit log size cap %d: must be at least 4096 bytes", c.maxFile)
	case c.keep < 1:
		return fmt.Errorf("audit log rotation keeps %d files: must keep at least 1", c.keep)
	case c.queue < 1:
		return fmt.Errorf("audit queue length %d: must be at least 1", c.queue)
	}
	return nil
}

// Logger appends audit events to one sink. It is safe for concurrent use.
type Logger struct {
	s    *sink
	base []slog.Attr
}

// Open appends to the file at path, creating it (0600) and its directory.
// Events go through a bounded queue to one writer goroutine, so Emit never
// waits for the disk; the file is rotated to path.1 … path.N when it would
// pass its size cap. Close flushes the queue.
func Open(path string, opts ...Option) (*Logger, error) {
	c := defaults()
	for _, o := range opts {
		o(&c)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create audit log directory: %w", err)
	}
	w, err := openRotator(path, c.maxFile, c.keep)
	if err != nil {
		return nil, err
	}
	return &Logger{s: newSink(JSONLines(w, w), c, true)}, nil
}

// NewSink writes events to out (a FanOut of several, for one) through the
// same bounded queue as Open, with the same truncation and rate limits.
func NewSink(out Sink, opts ...Option) (*Logger, error) {
	c := defaults()
	for _, o := range opts {
		o(&c)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return &Logger{s: newSink(out, c, true)}, nil
}

// New writes events to w before Emit returns: for in-memory sinks and tests
// that read what was written at once. Fields are truncated and rate-limited
// as for Open.
func New(w io.Writer) *Logger {
	return &Logger{s: newSink(JSONLines(w, nil), defaults(), false)}
}

// Discard is a Logger that drops everything; for paths that must not fail
// because auditing is unavailable.
func Discard() *Logger { return New(io.Discard) }

// For returns a Logger whose events all carry the sandbox id and session.
func (l *Logger) For(sandboxID, session string) *Logger {
	base := append(l.base[:len(l.base):len(l.base)],
		slog.String(FieldSandboxID, truncate(sandboxID, l.s.cfg.maxField)),
		slog.String(FieldSession, truncate(session, l.s.cfg.maxField)))
	return &Logger{s: l.s, base: base}
}

// emit writes one event with alternating key/value fields. It never blocks
// on the sink for events a workload can cause; after Close it does nothing.
func (l *Logger) emit(event string, kv ...any) {
	s := l.s
	now := s.cfg.now()
	attrs := s.cfg.attrs(l.base, kv)
	life := lifecycle(event)
	if !life && !s.lim.allow(event, attrs, now) {
		return
	}
	r := slog.NewRecord(now, slog.LevelInfo, event, 0)
	r.AddAttrs(attrs...)
	s.put(r, life, now)
}

// Close flushes queued events and pending suppressed counts, then closes
// the file, if any. Closing twice, or any Logger sharing the sink, is fine.
func (l *Logger) Close() error { return l.s.close() }

// lifecycle events record the sandbox's own life and the trail's health:
// few, and never left out.
func lifecycle(event string) bool {
	return strings.HasPrefix(event, "sandbox.") || strings.HasPrefix(event, "policy.") || strings.HasPrefix(event, "audit.")
}
