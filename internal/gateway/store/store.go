// Package store keeps the gateway's state: sandboxes, their versioned
// policies, logs, credentials, secrets and model routes. One interface, two
// implementations (SQLite embedded, PostgreSQL shared) that pass the same
// tests; each applies its versioned migrations when opened.
package store

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned (wrapped) when the named row does not exist.
var ErrNotFound = errors.New("not found")

// ErrExists is returned (wrapped) when a row with the same key exists.
var ErrExists = errors.New("already exists")

// Phase is where a sandbox is in its life.
type Phase string

const (
	PhaseProvisioning Phase = "provisioning"
	PhaseReady        Phase = "ready"
	PhaseExited       Phase = "exited"
	PhaseFailed       Phase = "failed"
)

// Ended reports whether a sandbox in phase p has stopped for good: exited
// and failed are final.
func (p Phase) Ended() bool { return p == PhaseExited || p == PhaseFailed }

// Sandbox is one sandbox the gateway manages.
type Sandbox struct {
	ID     string
	Name   string
	Labels map[string]string
	// What the driver starts.
	Command []string
	Workdir string
	Env     []string
	Driver  string
	// DriverRef is the driver's own handle (the local driver: the
	// supervisor's pid and start time), so a restarted gateway re-adopts it.
	DriverRef string
	Phase     Phase
	ExitCode  *int
	Reason    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PolicyStatus is what the supervisor reported for one policy version.
type PolicyStatus string

const (
	PolicyPending PolicyStatus = "pending"
	PolicyLoaded  PolicyStatus = "loaded"
	PolicyFailed  PolicyStatus = "failed"
)

// PolicyVersion is one version of a sandbox's policy. Versions start at 1
// and increase by one per sandbox.
type PolicyVersion struct {
	SandboxID string
	Version   int64
	YAML      []byte
	SHA256    string
	Author    string
	CreatedAt time.Time
	Status    PolicyStatus
	Error     string
	// StatusAt is when Status was last reported; zero while pending.
	StatusAt time.Time
}

// LogEntry is one audit event or log line pushed by a supervisor.
type LogEntry struct {
	// Seq is assigned by the store, increasing across all sandboxes, so a
	// follower resumes after the last one it saw.
	Seq       int64
	SandboxID string
	Time      time.Time
	Level     string // debug, info, warn, error
	Source    string // audit, supervisor, gateway
	Event     string // the audit event type, empty for plain log lines
	Message   string
	// Fields is the event's whole JSON object.
	Fields []byte
}

// LogQuery selects log entries; zero fields do not filter.
type LogQuery struct {
	SandboxID string
	AfterSeq  int64
	Since     time.Time
	Event     string
	MinLevel  string
	Limit     int // 0 = the store's default (1000)
}

// TokenKind says what a credential may do.
type TokenKind string

const (
	// TokenUser is a person or tool using the API.
	TokenUser TokenKind = "user"
	// TokenSandbox is one supervisor's credential, bound to its sandbox.
	TokenSandbox TokenKind = "sandbox"
	// TokenJoin lets a supervisor on another host register once; it is
	// exchanged for a TokenSandbox and then spent.
	TokenJoin TokenKind = "join"
)

// Token is a bearer credential; only the SHA-256 of its secret is kept.
type Token struct {
	ID        string
	Name      string
	Kind      TokenKind
	SandboxID string // TokenSandbox, and TokenJoin once spent
	Hash      string // hex SHA-256 of the secret
	CreatedAt time.Time
	ExpiresAt time.Time // zero = never
	UsedAt    time.Time // set when a join token is spent
	// Secrets are, for a TokenJoin, the gateway secrets the sandbox that
	// joins with it may take from_gateway, sorted; the joiner writes its
	// own policy, so the operator's grant bounds it. Other kinds have none.
	Secrets []string
}

// ClientCert is a client certificate issue-client made; only a recorded,
// unrevoked one authenticates.
type ClientCert struct {
	Serial    string // lower-case hex
	Name      string // the user it authenticates as (its CN)
	IssuedAt  time.Time
	ExpiresAt time.Time
	RevokedAt time.Time // zero = not revoked
}

// Secret is a named credential, sealed by the gateway before it is stored.
type Secret struct {
	Name      string
	Sealed    []byte
	UpdatedAt time.Time
}

// Routes is the gateway-wide model routes document (the inference
// section's YAML), versioned like policies.
type Routes struct {
	Version   int64
	YAML      []byte
	Author    string
	CreatedAt time.Time
}

// Store is the gateway's state. Every method is safe for concurrent use.
type Store interface {
	CreateSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// ListSandboxes returns the sandboxes whose labels include every pair
	// of selector, oldest first.
	ListSandboxes(ctx context.Context, selector map[string]string) ([]Sandbox, error)
	// SetPhase records a phase change; exitCode and reason may be empty.
	SetPhase(ctx context.Context, id string, phase Phase, exitCode *int, reason string) error
	SetDriverRef(ctx context.Context, id, ref string) error
	// DeleteSandbox removes the sandbox with its policies, logs and tokens.
	DeleteSandbox(ctx context.Context, id string) error

	// AddPolicy stores the next version of a sandbox's policy, numbered
	// atomically, with status pending.
	AddPolicy(ctx context.Context, sandboxID string, yaml []byte, sha256, author string) (PolicyVersion, error)
	// Policy returns one version; version 0 means the newest.
	Policy(ctx context.Context, sandboxID string, version int64) (PolicyVersion, error)
	// PolicyHistory returns every version, newest first.
	PolicyHistory(ctx context.Context, sandboxID string) ([]PolicyVersion, error)
	SetPolicyStatus(ctx context.Context, sandboxID string, version int64, status PolicyStatus, errText string) error

	// AppendLogs stores entries and assigns their Seq, in order.
	AppendLogs(ctx context.Context, entries []LogEntry) error
	QueryLogs(ctx context.Context, q LogQuery) ([]LogEntry, error)
	// PruneLogs keeps the newest keep entries of each sandbox and reports
	// how many it removed.
	PruneLogs(ctx context.Context, keep int) (int64, error)

	AddToken(ctx context.Context, t Token) error
	// TokenByHash finds a token by the hash of its secret.
	TokenByHash(ctx context.Context, hash string) (Token, error)
	ListTokens(ctx context.Context) ([]Token, error)
	DeleteToken(ctx context.Context, id string) error
	// SpendJoinToken marks a join token used and binds it to sandboxID;
	// it fails with ErrNotFound when the token is unknown or already spent.
	SpendJoinToken(ctx context.Context, id, sandboxID string) error

	AddClientCert(ctx context.Context, c ClientCert) error
	// ClientCertBySerial finds a certificate by serial, revoked or not.
	ClientCertBySerial(ctx context.Context, serial string) (ClientCert, error)
	ListClientCerts(ctx context.Context) ([]ClientCert, error)
	// RevokeClientCert marks a certificate revoked; ErrNotFound when no
	// unrevoked certificate has that serial.
	RevokeClientCert(ctx context.Context, serial string) error

	PutSecret(ctx context.Context, s Secret) error
	GetSecret(ctx context.Context, name string) (Secret, error)
	ListSecrets(ctx context.Context) ([]string, error)
	DeleteSecret(ctx context.Context, name string) error

	// AddRoutes stores the next version of the model routes.
	AddRoutes(ctx context.Context, yaml []byte, author string) (Routes, error)
	// CurrentRoutes returns the newest routes, or ErrNotFound.
	CurrentRoutes(ctx context.Context) (Routes, error)

	Close() error
}
