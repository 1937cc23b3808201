package audit

import (
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
)

// Event is one audit event. Each type below is one event name with its
// fields; their JSON names are part of corral's interface, written only
// here and pinned by testdata/events.golden. A field tagged omitempty is
// left out when it holds its zero value.
type Event interface {
	// EventName is the value of the event field.
	EventName() string
}

// SandboxStartEvent: the workload is running.
type SandboxStartEvent struct {
	Summary      string `json:"summary"`
	PolicySHA256 string `json:"policy_sha256"`
	// PolicyCommit is the commit a git:REF:PATH policy was read from.
	PolicyCommit   string   `json:"policy_commit,omitempty"`
	PID            int      `json:"pid"`
	Argv           []string `json:"argv"`
	Workdir        string   `json:"workdir"`
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	Rootless       bool     `json:"rootless"`
	LandlockABI    int      `json:"landlock_abi"`
	Seccomp        string   `json:"seccomp"`
	Network        string   `json:"network"`
	LimitsEnforced bool     `json:"limits_enforced"`
	// Connects says, where connections are identified, what records the
	// process that connects each socket: "kernel" (a cgroup hook) or
	// "seccomp" (the filter hands each connect to the supervisor).
	Connects string `json:"connects,omitempty"`
}

// SandboxStartUncagedEvent: the command runs without a sandbox.
type SandboxStartUncagedEvent struct {
	Reason       string   `json:"reason"`
	PolicySHA256 string   `json:"policy_sha256"`
	PID          int      `json:"pid"`
	Argv         []string `json:"argv"`
	Workdir      string   `json:"workdir"`
}

// SandboxExitEvent: the workload ended; every run ends with one.
type SandboxExitEvent struct {
	Code       int   `json:"code"`
	DurationMS int64 `json:"duration_ms"`
}

// SandboxKilledEvent: the workload ended by a signal.
type SandboxKilledEvent struct {
	Reason string `json:"reason"`
	Signal string `json:"signal,omitempty"`
}

// SandboxLimitsNotEnforcedEvent: limits this host cannot enforce.
type SandboxLimitsNotEnforcedEvent struct {
	Reason string   `json:"reason"`
	Limits []string `json:"limits"`
}

// SandboxCompileErrorEvent: the policy or the plan is invalid.
type SandboxCompileErrorEvent struct {
	Error  string `json:"error"`
	Policy string `json:"policy"`
}

// SandboxSetupErrorEvent: a set-up step failed.
type SandboxSetupErrorEvent struct {
	Step  string `json:"step"`
	Error string `json:"error"`
	Code  int    `json:"code"`
}

// SandboxStaleSweptEvent: state left by a killed supervisor was removed.
type SandboxStaleSweptEvent struct {
	StaleSandboxID string `json:"stale_sandbox_id"`
}

// SandboxDegradedEvent: a protection the policy asks for that this host
// cannot give.
type SandboxDegradedEvent struct {
	What   string `json:"what"`
	Reason string `json:"reason"`
}

// NetConnectEvent is one connection: allowed, denied, failed upstream, or
// revoked by a reload (Outcome picks the event name).
type NetConnectEvent struct {
	Outcome      string   `json:"-"`
	Via          string   `json:"via"`
	Source       string   `json:"source"`
	Host         string   `json:"host"`
	IP           string   `json:"ip,omitempty"`
	Port         uint16   `json:"port"`
	Binary       string   `json:"binary"`
	PID          int      `json:"pid"`
	Ancestors    []string `json:"ancestors"`
	CmdlinePaths []string `json:"cmdline_paths"`
	Untrusted    string   `json:"untrusted,omitempty"`
	Policy       string   `json:"policy"`
	DecisionUS   int64    `json:"decision_us"`
	Reason       string   `json:"reason,omitempty"`
	Detail       string   `json:"detail,omitempty"`
	// Decision is "learn" for a connection no policy allows that learn
	// mode let through.
	Decision string `json:"decision,omitempty"`
	// DraftChunk is the pending advisor chunk that would allow a denied
	// connection, once there is one; NextSteps says how to get it
	// approved.
	DraftChunk string `json:"draft_chunk,omitempty"`
	NextSteps  string `json:"next_steps,omitempty"`
}

// DecisionLearn marks what learn mode let through.
const DecisionLearn = "learn"

// Outcomes of NetConnectEvent.
const (
	OutcomeAllowed = "allowed"
	OutcomeDenied  = "denied"
	OutcomeFailed  = "failed"
	OutcomeRevoked = "revoked"
)

// NetAdmissionDeniedEvent: a connection refused before it was looked at,
// because the sandbox holds too many or the supervisor is short of
// descriptors (a net.connect.denied without a destination).
type NetAdmissionDeniedEvent struct {
	Via        string `json:"via"`
	Source     string `json:"source"`
	Reason     string `json:"reason"`
	Detail     string `json:"detail"`
	Active     int64  `json:"active"`
	Limit      int64  `json:"limit"`
	Suppressed uint64 `json:"suppressed"`
}

// NetDNSDeniedEvent: a name no policy allows.
type NetDNSDeniedEvent struct {
	Name       string `json:"name"`
	QType      string `json:"qtype"`
	Source     string `json:"source"`
	Reason     string `json:"reason"`
	Count      uint64 `json:"count"`
	Suppressed uint64 `json:"suppressed"`
}

// HTTPRequestEvent: one request on an inspected connection.
type HTTPRequestEvent struct {
	Via        string `json:"via"`
	Host       string `json:"host"`
	Port       uint16 `json:"port"`
	Scheme     string `json:"scheme"`
	Proto      string `json:"proto"`
	Method     string `json:"method"`
	Path       string `json:"path"`
	Query      string `json:"query"`
	Decision   string `json:"decision"`
	Policy     string `json:"policy"`
	Rule       string `json:"rule"`
	Status     int    `json:"status"`
	Bytes      int64  `json:"bytes"`
	BytesIn    int64  `json:"bytes_in"`
	BytesOut   int64  `json:"bytes_out"`
	DurationMS int64  `json:"duration_ms"`
	Binary     string `json:"binary"`
	PID        int    `json:"pid"`
	Masked     int    `json:"masked"`
	Reason     string `json:"reason,omitempty"`
	Detail     string `json:"detail,omitempty"`
	WouldDeny  bool   `json:"would_deny,omitempty"`
}

// TLSHandshakeFailedEvent: a workload client gave up on the TLS
// handshake of an inspected connection.
type TLSHandshakeFailedEvent struct {
	Via       string `json:"via"`
	Host      string `json:"host"`
	Port      uint16 `json:"port"`
	Binary    string `json:"binary"`
	PID       int    `json:"pid"`
	Cause     string `json:"cause"`
	Detail    string `json:"detail"`
	NextSteps string `json:"next_steps"`
}

// PolicyReloadedEvent: `corral policy set` put a new policy in force.
type PolicyReloadedEvent struct {
	Source       string `json:"source"`
	Version      int    `json:"version"`
	PolicySHA256 string `json:"policy_sha256"`
}

// PolicyReloadFailedEvent: a new policy was refused; the running one
// stays.
type PolicyReloadFailedEvent struct {
	Source  string `json:"source"`
	Version int    `json:"version"`
	Error   string `json:"error"`
}

// InferenceRequest is one request to inference.local.
const InferenceRequest = "inference.request"

// InferenceRequestEvent: one request to inference.local, routed to a
// model backend. The route's key never appears in it.
type InferenceRequestEvent struct {
	Route        string `json:"route"`
	Protocol     string `json:"protocol"`
	ClientModel  string `json:"client_model"`
	RoutedModel  string `json:"routed_model"`
	Status       int    `json:"status"`
	DurationMS   int64  `json:"duration_ms"`
	TTFBMS       int64  `json:"ttfb_ms"`
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"`
	BytesIn      int64  `json:"bytes_in"`
	BytesOut     int64  `json:"bytes_out"`
	Binary       string `json:"binary"`
	PID          int    `json:"pid"`
	Error        string `json:"error,omitempty"`
}

// EventName implements Event.
func (InferenceRequestEvent) EventName() string { return InferenceRequest }

// Events of the policy advisor.
const (
	DraftProposed = "draft.proposed"
	DraftApproved = "draft.approved"
	DraftRejected = "draft.rejected"
	DraftExpired  = "draft.expired"
	DraftUndone   = "draft.undone"
	// PolicyProposalRefused is a chunk that failed validation.
	PolicyProposalRefused = "policy.proposal_refused"
)

// DraftEvent is one transition of a policy advisor chunk (Name picks the
// event: draft.proposed, .approved, .rejected, .expired, .undone).
type DraftEvent struct {
	Name    string `json:"-"`
	Draft   string `json:"draft"`
	Policy  string `json:"policy"`
	Author  string `json:"author"`
	Stage   int    `json:"stage"`
	Verdict string `json:"verdict"`
	Summary string `json:"summary"`
	Actor   string `json:"actor,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Version and PolicySHA256 are the policy an approval or undo put in
	// force.
	Version      int    `json:"version,omitempty"`
	PolicySHA256 string `json:"policy_sha256,omitempty"`
}

// EventName implements Event.
func (e DraftEvent) EventName() string { return e.Name }

// PolicyProposalRefusedEvent: a chunk (an agent's proposal, or the
// advisor's own) failed validation and was not offered.
type PolicyProposalRefusedEvent struct {
	Author string `json:"author"`
	Policy string `json:"policy"`
	Reason string `json:"reason"`
	Binary string `json:"binary,omitempty"`
	PID    int    `json:"pid,omitempty"`
}

func (SandboxStartEvent) EventName() string             { return SandboxStart }
func (SandboxStartUncagedEvent) EventName() string      { return SandboxStartUncaged }
func (SandboxExitEvent) EventName() string              { return SandboxExit }
func (SandboxKilledEvent) EventName() string            { return SandboxKilled }
func (SandboxLimitsNotEnforcedEvent) EventName() string { return SandboxLimitsNotEnforced }
func (SandboxCompileErrorEvent) EventName() string      { return SandboxCompileError }
func (SandboxSetupErrorEvent) EventName() string        { return SandboxSetupError }
func (SandboxStaleSweptEvent) EventName() string        { return SandboxStaleSwept }
func (SandboxDegradedEvent) EventName() string          { return SandboxDegraded }
func (NetAdmissionDeniedEvent) EventName() string       { return NetConnectDenied }
func (NetDNSDeniedEvent) EventName() string             { return NetDNSDenied }
func (HTTPRequestEvent) EventName() string              { return HTTPRequest }
func (TLSHandshakeFailedEvent) EventName() string       { return TLSHandshakeFailed }
func (PolicyReloadedEvent) EventName() string           { return PolicyReloaded }
func (PolicyReloadFailedEvent) EventName() string       { return PolicyReloadFail }
func (PolicyProposalRefusedEvent) EventName() string    { return PolicyProposalRefused }

// EventName picks net.connect.allowed, .denied, .failed or .revoked.
func (e NetConnectEvent) EventName() string {
	switch e.Outcome {
	case OutcomeAllowed:
		return NetConnectAllowed
	case OutcomeFailed:
		return NetConnectFailed
	case OutcomeRevoked:
		return NetConnectRevoked
	}
	return NetConnectDenied
}

// Log hands e to the observers, then writes it.
func (l *Logger) Log(e Event) {
	if o, ok := observers.Load(l.s); ok {
		for _, f := range *o.(*observerList).fs.Load() {
			f(e)
		}
	}
	l.emit(e.EventName(), fields(e)...)
}

// observerList holds a sink's observers; Log reads it without a lock.
type observerList struct {
	mu sync.Mutex
	fs atomic.Pointer[[]func(Event)]
}

// observers maps a sink to its observerList, so that every Logger sharing
// the sink (For) sees the same observers.
var observers sync.Map

// Observe calls f with every event logged through l or any Logger sharing
// its sink, synchronously in Log and before rate limits or truncation, so
// f sees every event the typed way it was made (the policy advisor counts
// denials from them). f runs on the caller's path, often the proxy's: it
// must be cheap and must not log.
func (l *Logger) Observe(f func(Event)) {
	v, _ := observers.LoadOrStore(l.s, &observerList{})
	o := v.(*observerList)
	o.mu.Lock()
	defer o.mu.Unlock()
	var next []func(Event)
	if cur := o.fs.Load(); cur != nil {
		next = append(next, *cur...)
	}
	next = append(next, f)
	o.fs.Store(&next)
}

// fields turns an event struct into alternating keys and values, in the
// order of its fields, by their JSON names.
func fields(e Event) []any {
	v := reflect.ValueOf(e)
	t := v.Type()
	kv := make([]any, 0, 2*t.NumField())
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		f := v.Field(i)
		if opts == "omitempty" && f.IsZero() {
			continue
		}
		kv = append(kv, name, f.Interface())
	}
	return kv
}
