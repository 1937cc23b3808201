// Package egress is the vocabulary every part of the egress speaks: the
// request and decision types, the stable reasons, the interfaces a listener
// is built from (Decider, Identifier, Dialer, Names, Inspector) and the
// facts an identifier reports. It depends on nothing else in corral, so an
// identifier or a decider can use it without pulling in the machinery,
// which lives in egress/gate (the Gate, the accept loop) and is put
// together in egress/assemble. Listener kinds (transparent, HTTP proxy,
// SOCKS5, DNS) live in sub-packages and never decide or dial on their own.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Via names the listener a request arrived on.
const (
	ViaTransparent = "transparent"
	ViaHTTPConnect = "http_connect"
	ViaHTTPForward = "http_forward"
	ViaSOCKS5      = "socks5"
)

// Deny reasons. They appear in audit events and in replies to clients, so
// they are stable identifiers, not prose.
const (
	ReasonNoPolicy        = "no_matching_policy"
	ReasonBinary          = "binary_not_allowed"
	ReasonIdentity        = "identity_unknown"
	ReasonIdentityExited  = "identity_process_exited"
	ReasonIntegrity       = "binary_integrity"
	ReasonSNIMismatch     = "sni_mismatch"
	ReasonHostMismatch    = "host_mismatch"
	ReasonInternalAddress = "internal_address"
	ReasonEngine          = "decision_error"
	// Failures to reach a destination the policy allowed (see
	// UpstreamFailure): audited as net.connect.failed, not as denials.
	ReasonResolve         = "upstream_dns_failed"
	ReasonUpstream        = "upstream_connect_failed"
	ReasonUpstreamTimeout = "upstream_timeout"
	ReasonLiteralIP       = "literal_ip_not_allowed"
	// Per-request (L7) reasons.
	ReasonL7DenyRule   = "l7_deny_rule"
	ReasonL7NoRule     = "l7_no_matching_rule"
	ReasonL7NoEndpoint = "l7_no_matching_endpoint"
	ReasonL7BadPath    = "l7_ambiguous_path"
	ReasonL7BadQuery   = "l7_malformed_query"
	ReasonL7Upgrade    = "l7_upgrade_not_allowed"
	// Connections refused before anything is decided about them.
	//
	// ReasonConnLimit: the sandbox already holds limits.connections.
	ReasonConnLimit = "connection_limit"
	// ReasonFDReserve: the supervisor is close to its descriptor limit and
	// keeps the rest for its control socket, DNS and the tunnels it has.
	ReasonFDReserve = "descriptor_reserve"
)

// Identity is the process that opened a connection inside the sandbox.
type Identity struct {
	PID          int      `json:"pid"`
	Binary       string   `json:"binary"`
	BinarySHA256 string   `json:"binary_sha256,omitempty"`
	Ancestors    []string `json:"ancestors,omitempty"`
	CmdlinePaths []string `json:"cmdline_paths,omitempty"`
	// Untrusted says why the process is not the binary it claims to be
	// (code mapped from a place the sandbox can write, LD_PRELOAD): a
	// policy bound to binaries does not apply to it; one bound to none
	// still does.
	Untrusted string `json:"untrusted,omitempty"`
}

// Request is one connection attempt.
type Request struct {
	// Host is the destination name, lower-case without a trailing dot, when
	// the client named one (or reached a synthetic address standing for
	// one); empty for a literal IP destination.
	Host string
	// IP is the literal destination when Host is empty.
	IP       netip.Addr
	Port     uint16
	Identity Identity
	Via      string
	// Source is the client's address inside the sandbox.
	Source netip.AddrPort
	// Sniffed is the name the client's first bytes announce: a TLS
	// ClientHello's SNI or an HTTP/1 Host header (port stripped); empty
	// when the protocol carries none.
	Sniffed     string
	SniffedKind string // "tls_sni" or "http_host"
}

// Target is the destination as people write it: host:port or ip:port.
func (r Request) Target() string {
	h := r.Host
	if h == "" {
		h = r.IP.String()
	}
	return net.JoinHostPort(h, fmt.Sprint(r.Port))
}

// Decision is the verdict on a Request. The zero value denies.
type Decision struct {
	Allow bool
	// Policy is the network policy that matched, if any.
	Policy string
	// Reason is one of the Reason constants when denied.
	Reason string
	// Detail is a human explanation for logs and deny replies.
	Detail string
	// AllowedIPs are the matched endpoint's allowed_ips: internal addresses
	// inside them may be dialled, others never. The slice may be the
	// policy's own: read it, never write to it.
	AllowedIPs []netip.Prefix
	// Inspect is set when the deciding policy has a protocol: rest
	// endpoint for this destination: the connection's requests are then
	// decided one by one (HTTPDecider) instead of being relayed as bytes.
	Inspect bool
	// TLS is that endpoint's tls mode: "" (detect), terminate or
	// passthrough (an endpoint with tls: skip is not inspected at all).
	TLS string
	// AllowEncodedSlash is set when one of the policy's inspected
	// endpoints for this destination accepts %2F in paths, or when none of
	// them has a rule that depends on path segments.
	AllowEncodedSlash bool
	// PathRule names a rule (or path selector) that depends on path
	// segments when AllowEncodedSlash is not set: what %2F could slip a
	// request past, for the refusal to point at.
	PathRule string
}

// HTTPRequest is one request on an inspected connection, as the rules see
// it.
type HTTPRequest struct {
	// Method is upper-cased.
	Method string
	// Path is the decoded, normalised path (see l7/reqpath).
	Path  string
	Query map[string][]string
}

// HTTPDecision is the verdict on one HTTPRequest. The zero value denies.
type HTTPDecision struct {
	Allow bool
	// Audit is set when the deciding endpoint has enforcement: audit: a
	// denial is then logged as would-deny and the request forwarded.
	Audit  bool
	Policy string
	// Rule names what decided, e.g. "rules[2]", "deny_rules[0]" or
	// "access: read-only"; empty when no rule matched.
	Rule string
	// Reason is one of the Reason constants when denied.
	Reason string
	Detail string
}

// HTTPDecider decides requests on inspected connections against the
// policy in force when each request arrives, so a hot reload tightens open
// keep-alive connections too.
type HTTPDecider interface {
	DecideHTTP(ctx context.Context, r Request, h HTTPRequest) HTTPDecision
}

// Decider evaluates requests against the current policy. Implementations
// must be safe for concurrent use and must deny on any internal error.
type Decider interface {
	Decide(ctx context.Context, r Request) Decision
	// NameAllowed reports whether some policy could allow a connection to
	// host; the DNS server answers only such names.
	NameAllowed(host string) bool
}

// Identifier finds the process owning the sandbox end of conn.
type Identifier interface {
	Identify(conn net.Conn) (Identity, error)
}

// Dialer connects upstream, from the host's network namespace, refusing
// internal addresses unless allowed covers them.
type Dialer interface {
	Dial(ctx context.Context, r Request, allowed []netip.Prefix) (net.Conn, error)
}

// Names maps the synthetic addresses handed out by the sandbox's DNS server
// back to the names they stand for.
type Names interface {
	Lookup(ip netip.Addr) (host string, ok bool)
}

// Tunnel is an allowed connection.
type Tunnel struct {
	Up net.Conn
	// Request is the caller's request with the client's identity filled in.
	Request  Request
	Decision Decision
	// Generation is how many reloads the deciding gate had seen when it
	// decided: a tunnel decided before a reload is decided again.
	Generation uint64
	// Local is set, and Up nil, for a connection to a name the supervisor
	// answers itself.
	Local LocalService
}

// LocalService answers a name inside the sandbox from the supervisor
// itself (policy.local, inference.local): its connections get no policy
// decision and no upstream, only their audit event. ServeConn returns when
// the connection ends, having closed it.
type LocalService interface {
	ServeConn(ctx context.Context, client net.Conn, r Request)
}

type requestKey struct{}

// WithRequest returns ctx carrying the connection's request, for the
// handlers of a local service.
func WithRequest(ctx context.Context, r Request) context.Context {
	return context.WithValue(ctx, requestKey{}, r)
}

// RequestFrom returns the request of the connection a local service's
// handler is serving: who is asking (binary, pid) and through which
// listener.
func RequestFrom(ctx context.Context) (Request, bool) {
	r, ok := ctx.Value(requestKey{}).(Request)
	return r, ok
}

// Inspector takes over an allowed connection whose decision sets Inspect
// and returns when it ends, having closed both ends. check is the gate's
// Recheck for the names the client announces. A connection exempt from
// inspection (TLS to a passthrough endpoint) is handed back instead, with
// what was read of it, for the caller to relay as bytes like any other
// tunnel; both ends are then the caller's.
type Inspector interface {
	Inspect(ctx context.Context, client net.Conn, t *Tunnel, check func(kind, name string, err error) error) (passthrough net.Conn)
}

// DenyError is returned when a request is refused; listeners turn it into
// their protocol's refusal (403 JSON, SOCKS reply 0x02, RST).
type DenyError struct {
	Request  Request
	Decision Decision
}

func (e *DenyError) Error() string {
	msg := fmt.Sprintf("connection to %s denied: %s", e.Request.Target(), e.Decision.Reason)
	if e.Decision.Detail != "" {
		msg += " (" + e.Decision.Detail + ")"
	}
	return msg
}

// AsDeny returns the DenyError in err's chain, if any.
func AsDeny(err error) (*DenyError, bool) {
	var d *DenyError
	ok := errors.As(err, &d)
	return d, ok
}
