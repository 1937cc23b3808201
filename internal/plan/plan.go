// Package plan is the exact list of things one sandbox will do, as the
// supervisor hands it to the init and as `corral policy explain` prints it.
// It holds data only: the init links this package, and what builds a plan
// from a policy (internal/planner) would bring the policy parser, YAML and
// the HTTP stack into every sandbox's first exec.
package plan

//go:generate go tool msgp -file plan.go -o plan_msgp.go -tests=false -io=false -d "tag json"

import (
	"fmt"

	"github.com/corral-sandbox/corral/internal/linux/idmap"
)

// HostnameAddr is the sandbox's own hostname's address, in its /etc/hosts
// and from its resolver: loopback inside the sandbox, as Debian names its
// host 127.0.1.1.
const HostnameAddr = "127.0.1.1"

// Plan is everything the in-sandbox init needs, and everything explain shows.
// It travels to the init as MessagePack, encoded and decoded by the code
// go generate writes into plan_msgp.go from the json field names (no
// reflection, so the init's start does not pay for building decoders); both
// ends are always the same corral build.
type Plan struct {
	Caged    bool   `json:"caged"`
	Workdir  string `json:"workdir"`
	Hostname string `json:"hostname"`
	// Defaults are the policy's top-level sections taken from the built-in
	// default because the file left them out.
	Defaults []string `json:"policy_defaults,omitempty"`

	Namespaces []string `json:"namespaces"`
	// Rootless means the sandbox gets a user namespace that maps the invoking
	// user to itself; the workload then runs as that user.
	Rootless bool    `json:"rootless"`
	User     User    `json:"user"`
	Mounts   []Mount `json:"mounts"`
	// Skipped lists policy paths that will not appear inside, with why.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Path is the workload's PATH: the inherited one without the entries
	// that do not exist inside (PathDropped).
	Path        string   `json:"path,omitempty"`
	PathDropped []string `json:"path_dropped,omitempty"`

	Landlock Landlock `json:"landlock"`
	Seccomp  Seccomp  `json:"seccomp"`
	Limits   Limits   `json:"limits"`
	Network  Network  `json:"network"`
	State    State    `json:"state"`

	// Warnings are things a user must hear about at start: degraded
	// protections, unwritable paths. They are never silent.
	Warnings []string `json:"warnings,omitempty"`
}

// User is the identity the workload runs as.
type User struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
	Name   string   `json:"name"`
	Home   string   `json:"home"`
	// Why says how the identity was chosen, for explain.
	Why string `json:"why"`
}

// Mount kinds, applied in the order they appear in Plan.Mounts.
const (
	KindBind   = "bind"
	KindTmpfs  = "tmpfs"
	KindProc   = "proc"
	KindDev    = "dev"
	KindDevPts = "devpts"
)

// Mount is one entry of the new root. Target is the path inside the sandbox;
// Source is a host path for binds.
type Mount struct {
	Kind     string `json:"kind"`
	Source   string `json:"source,omitempty"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only"`
	// SizeBytes caps a tmpfs (for dev: its /dev/shm); 0 is the kernel's
	// default of half the host's RAM. tmpfs pages are memory, and only a
	// cgroup would otherwise charge them to the sandbox.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Mode and owner for tmpfs roots (private /tmp, private home).
	Mode uint32 `json:"mode,omitempty"`
	UID  uint32 `json:"uid,omitempty"`
	GID  uint32 `json:"gid,omitempty"`
	// IDMap, on a bind, shows the source's owner as the workload's user:
	// what it creates lands on disk owned by that owner, so a workload that
	// is not root can write a root-owned workdir as its owner.
	IDMap *idmap.Mapping `json:"idmap,omitempty"`
	Why   string         `json:"why"`
}

// Skipped is a policy path that will not be available inside.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Landlock is the allowlist re-applied by Landlock on top of the mount tree.
type Landlock struct {
	Compatibility string   `json:"compatibility"`
	ABI           int      `json:"abi"`
	ReadOnly      []string `json:"read_only"`
	ReadWrite     []string `json:"read_write"`
	// ListOnly directories can be listed but grant nothing inside.
	ListOnly []string `json:"list_only"`
}

// SeccompRule is one line of the filter, for explain.
type SeccompRule struct {
	Syscalls  []string `json:"syscalls"`
	Action    string   `json:"action"`
	Condition string   `json:"condition,omitempty"`
	Reason    string   `json:"reason"`
}

// Seccomp names the profile; the supervisor assembles the filter from the
// name when it starts the init, so the BPF program is never carried in
// the plan.
type Seccomp struct {
	Profile string        `json:"profile"`
	NetMode string        `json:"net_mode"`
	Rules   []SeccompRule `json:"rules"`
}

// Limits are the resource limits and how each is enforced here.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes"`
	Pids        int64   `json:"pids"`
	CPUCores    float64 `json:"cpu_cores"`
	WalltimeMS  int64   `json:"walltime_ms"`
	// Connections and TunnelIdleMS bound proxy mode's tunnels (0 when
	// there is no proxy): how many at once, and how long one may carry
	// nothing either way before it is closed.
	Connections  int64 `json:"connections,omitempty"`
	TunnelIdleMS int64 `json:"tunnel_idle_ms,omitempty"`
	// NprocMax, where no pids cgroup can hold Pids in a sandbox with a
	// user namespace of its own, is the RLIMIT_NPROC the init sets for
	// itself and so for everything it starts; 0 otherwise.
	NprocMax int64 `json:"nproc_max,omitempty"`
	// Enforcement says per limit how this host enforces it.
	Enforcement []string `json:"enforcement"`
	// Enforced is false when no cgroup can be created here.
	Enforced bool `json:"enforced"`
	// NotEnforced lists the limits this host cannot enforce, with why.
	NotEnforced []string `json:"not_enforced,omitempty"`
}

// Network is the network plan.
type Network struct {
	Mode        string `json:"mode"`
	Description string `json:"description"`
	// Capture is set in proxy mode: how the sandbox's namespace sends all
	// traffic to corral's listeners.
	Capture *Capture `json:"capture,omitempty"`
	// Secrets are the masked secrets: what the workload holds a surrogate
	// for, and where the real value goes (never the value itself).
	Secrets []Secret `json:"secrets,omitempty"`
	// Uninspected are the endpoints (host:port) relayed without HTTP
	// inspection: over TLS only the SNI is seen, so the server may be asked
	// for any other name it serves at that address.
	Uninspected []string `json:"uninspected,omitempty"`
}

// Secret is one masked secret as the plan shows it.
type Secret struct {
	Name    string   `json:"name"`
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers"`
}

// Capture is the in-namespace plumbing of proxy mode.
type Capture struct {
	// Addr is the address inside the sandbox where the explicit proxies
	// and the DNS server answer.
	Addr            string   `json:"addr"`
	DNSPort         uint16   `json:"dns_port"`
	TransparentPort uint16   `json:"transparent_port"`
	HTTPProxyPort   uint16   `json:"http_proxy_port"`
	SOCKSPort       uint16   `json:"socks_port"`
	Rules           []string `json:"rules"`
}

// ProxyEnv is what the workload's environment gets in proxy mode, so tools
// that honour proxy variables use the explicit proxies; the rest are
// captured transparently anyway. The sandbox's own hostname is local like
// localhost: a server the workload runs is reached by that name too.
func (p Plan) ProxyEnv() []string {
	c := p.Network.Capture
	if c == nil {
		return nil
	}
	http := fmt.Sprintf("http://%s:%d", c.Addr, c.HTTPProxyPort)
	socks := fmt.Sprintf("socks5h://%s:%d", c.Addr, c.SOCKSPort)
	noProxy := "localhost,127.0.0.1,::1," + HostnameAddr
	if p.Hostname != "" {
		noProxy += "," + p.Hostname
	}
	return []string{
		"HTTP_PROXY=" + http, "HTTPS_PROXY=" + http, "ALL_PROXY=" + socks, "NO_PROXY=" + noProxy,
		"http_proxy=" + http, "https_proxy=" + http, "all_proxy=" + socks, "no_proxy=" + noProxy,
		"grpc_proxy=" + http,
		// The sandbox's CA, so that TLS the proxy terminates for
		// inspection verifies. Every variable names the whole bundle,
		// which keeps what the host trusts too: node adds
		// NODE_EXTRA_CA_CERTS to its own list, and a host CA missing from
		// that list would otherwise fail on endpoints not inspected.
		"SSL_CERT_FILE=" + CABundlePath, "REQUESTS_CA_BUNDLE=" + CABundlePath, "CURL_CA_BUNDLE=" + CABundlePath,
		"GIT_SSL_CAINFO=" + CABundlePath, "NODE_EXTRA_CA_CERTS=" + CABundlePath,
		// Java reads neither PEM nor these variables, only its trust store.
		JavaToolOptions + "=" + JavaTrustOptions,
	}
}

// ForInit is p without what only explain shows: the seccomp rules (the
// init gets the filter the supervisor assembled from them), how each limit is
// enforced, the PATH entries dropped and the sections taken from the
// default. The init decodes its config cold on every start, and the
// seccomp rules alone are half of it. Skipped paths stay: the init names
// them when a command is not found.
func (p Plan) ForInit() Plan {
	p.Seccomp.Rules = nil
	p.Limits.Enforcement, p.Limits.NotEnforced = nil, nil
	p.PathDropped, p.Defaults = nil, nil
	return p
}

// Where proxy mode puts the sandbox CA inside the sandbox. The directory
// is a mount corral owns, so nothing in the policy can shadow or edit it.
const (
	TLSDir         = "/run/corral"
	CABundlePath   = TLSDir + "/ca-bundle.pem"  // host roots + sandbox CA
	CACertPath     = TLSDir + "/ca.pem"         // sandbox CA alone
	TrustStorePath = TLSDir + "/truststore.jks" // the bundle as a Java trust store
)

// JavaToolOptions is the variable every JVM reads options from; the
// workload's own value for it is appended to JavaTrustOptions, so it can
// add options (or override these) without losing the sandbox's CA.
const (
	JavaToolOptions  = "JAVA_TOOL_OPTIONS"
	JavaTrustOptions = "-Djavax.net.ssl.trustStore=" + TrustStorePath +
		" -Djavax.net.ssl.trustStoreType=JKS -Djavax.net.ssl.trustStorePassword=" + TrustStorePassword
	// TrustStorePassword protects nothing (a trust store holds only
	// public certificates); Java checks the store's digest with it, and
	// this is the one its own cacerts uses.
	TrustStorePassword = "changeit"
)

// SystemBundles are where distributions keep the CA bundle most TLS
// libraries read by default; in proxy mode each one visible inside is
// covered by the combined bundle, for tools that ignore the variables.
var SystemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/ssl/cert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
}

// BrowserConfigDirs are where Chromium (Debian's) and Google Chrome read
// their managed policies (policies/managed/*.json). Neither browser reads
// the CA bundle or the variables; in proxy mode each of these directories
// that exists on the host and is visible inside is covered by a copy that
// adds BrowserPolicyFile, whose CACertificates policy trusts the sandbox CA.
var BrowserConfigDirs = []string{"/etc/chromium", "/etc/opt/chrome"}

// BrowserPolicyFile is corral's file in a browser's managed policies.
const BrowserPolicyFile = "policies/managed/corral-sandbox-ca.json"

// State describes /scratch.
type State struct {
	Mode string `json:"mode"`
	// HostDir is where /scratch lives on the host; empty when there is none.
	HostDir string `json:"host_dir,omitempty"`
}
