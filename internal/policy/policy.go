// Package policy defines the corral sandbox policy: its YAML format (a
// superset of the OpenShell v1 schema), strict loading, validation, defaults,
// the built-in default policy, hashing and the generated JSON Schema.
package policy

import (
	"slices"
	"time"

	"github.com/corral-sandbox/corral/internal/inference"
)

// Values accepted by the enum fields. The empty string is never listed here
// because it always means "use the default".
const (
	SandboxEnabled  = "enabled"
	SandboxDisabled = "disabled"

	LandlockBestEffort      = "best_effort"
	LandlockHardRequirement = "hard_requirement"

	ModeBlock = "block"
	ModeProxy = "proxy"
	ModeAllow = "allow"

	SeccompDefault = "default"
	SeccompRelaxed = "relaxed"

	StateNone      = ""
	StateEphemeral = "ephemeral"
	StateScratch   = "scratch"

	ProtocolREST = "rest"

	TLSTerminate   = "terminate"
	TLSPassthrough = "passthrough"
	TLSSkip        = "skip"

	EnforcementEnforce = "enforce"
	EnforcementAudit   = "audit"

	AccessReadOnly  = "read-only"
	AccessReadWrite = "read-write"
	AccessFull      = "full"

	ExtendsDefault = "default"
	ExtendsNone    = "none"
)

// Limits enforced by validation.
const (
	// SchemaVersion is the only policy version this package understands.
	SchemaVersion = 1
	// MaxPaths bounds read_only+read_write; each path costs a bind mount and
	// a Landlock rule, and a huge list usually means a generated mistake.
	MaxPaths = 256
	// MinMemoryBytes is the smallest memory limit; below it even a shell
	// fails in confusing ways.
	MinMemoryBytes = 16 << 20
	// MaxPids is the kernel's PID_MAX_LIMIT on 64-bit.
	MaxPids = 4194304
	// MaxCPU is the largest CPU quota in cores.
	MaxCPU = 1024
	// DefaultConnections is limits.connections when the policy gives none:
	// far above what an agent's tools open at once, far below what would
	// exhaust the supervisor's descriptors.
	DefaultConnections = 1024
	// MaxConnections bounds limits.connections: each costs the supervisor
	// two descriptors and a few KiB, and 65536 is more than one source
	// address has ports.
	MaxConnections = 65536
	// MinWalltime keeps a typo like "10ms" from killing the agent instantly.
	MinWalltime = time.Second
	// DefaultAllowPort is the port a network.allow entry gets when it has none.
	DefaultAllowPort = 443
	// AllowPolicyName names the policy synthesized from network.allow.
	AllowPolicyName = "network.allow"
)

// Policy is one sandbox policy file. Field order here is the order of keys
// in the JSON Schema and in canonical JSON.
type Policy struct {
	Version          int                      `yaml:"version" json:"version" jsonschema:"required,enum=1" jsonschema_description:"Policy schema version. Must be 1."`
	Extends          string                   `yaml:"extends,omitempty" json:"extends,omitempty" jsonschema:"enum=default,enum=none,default=default" jsonschema_description:"default: every top-level section the file leaves out is the built-in default's (for corral policy set: the running policy's); a section the file names replaces that section whole. none: sections left out are empty."`
	Sandbox          string                   `yaml:"sandbox,omitempty" json:"sandbox,omitempty" jsonschema:"enum=enabled,enum=disabled,default=enabled" jsonschema_description:"Whether to sandbox the command at all. disabled runs it unconfined (for debugging only)."`
	FilesystemPolicy FilesystemPolicy         `yaml:"filesystem_policy,omitempty" json:"filesystem_policy,omitzero" jsonschema_description:"Which host paths are visible inside the sandbox and how."`
	Landlock         LandlockPolicy           `yaml:"landlock,omitempty" json:"landlock,omitzero" jsonschema_description:"Landlock LSM settings."`
	Process          ProcessPolicy            `yaml:"process,omitempty" json:"process,omitzero" jsonschema_description:"Identity the sandboxed process runs as."`
	NetworkPolicies  map[string]NetworkPolicy `yaml:"network_policies,omitempty" json:"network_policies,omitempty" jsonschema_description:"Named egress rules (OpenShell format): which binaries may reach which endpoints."`
	Network          Network                  `yaml:"network,omitempty" json:"network,omitzero" jsonschema_description:"Network mode and short-form allow list."`
	Limits           Limits                   `yaml:"limits,omitempty" json:"limits,omitzero" jsonschema_description:"Resource limits (cgroup v2 and a wall-clock watchdog)."`
	Seccomp          string                   `yaml:"seccomp,omitempty" json:"seccomp,omitempty" jsonschema:"enum=default,enum=relaxed,default=default" jsonschema_description:"Seccomp profile."`
	State            string                   `yaml:"state,omitempty" json:"state,omitempty" jsonschema:"enum=,enum=ephemeral,enum=scratch" jsonschema_description:"What survives the run: empty for nothing extra; ephemeral or scratch for a writable overlay."`
	Secrets          map[string]Secret        `yaml:"secrets,omitempty" json:"secrets,omitempty" jsonschema_description:"Masked secrets, by the environment variable the workload sees: it holds a surrogate that the proxy swaps for the real value only in requests to the secret's hosts."`
	Inference        *inference.Config        `yaml:"inference,omitempty" json:"inference,omitempty" jsonschema_description:"Model routes served at inference.local inside the sandbox (proxy mode): the workload's OpenAI and Anthropic clients reach the backends named here with keys they never see. Hot-reloadable; --inference-routes FILE replaces it."`

	// Source records where the policy was loaded from (a path, a git ref,
	// "<default>"); it is not part of the policy and not hashed.
	Source string `yaml:"-" json:"-"`
	// Inherited lists the top-level sections that came from the base
	// policy (the built-in default, or the running policy for a reload)
	// because the file left them out; like Source it is not hashed.
	Inherited []string `yaml:"-" json:"-"`
}

// FilesystemPolicy lists host paths exposed to the sandbox.
type FilesystemPolicy struct {
	// IncludeWorkdir is a pointer so that "not set" (default true) and an
	// explicit false can be told apart.
	IncludeWorkdir *bool    `yaml:"include_workdir,omitempty" json:"include_workdir,omitempty" jsonschema:"default=true" jsonschema_description:"Mount the working directory read-write. Default true."`
	ReadOnly       []string `yaml:"read_only,omitempty" json:"read_only,omitempty" jsonschema_description:"Absolute host paths mounted read-only. Missing paths are skipped."`
	ReadWrite      []string `yaml:"read_write,omitempty" json:"read_write,omitempty" jsonschema_description:"Absolute host paths mounted read-write."`
	Home           []string `yaml:"home,omitempty" json:"home,omitempty" jsonschema_description:"Files and directories of your home (relative paths such as .gitconfig or .config/gh), mounted read-only at the same place in the sandbox's otherwise empty home. Missing ones are skipped."`
}

// LandlockPolicy configures how strictly Landlock must be available.
type LandlockPolicy struct {
	Compatibility string `yaml:"compatibility,omitempty" json:"compatibility,omitempty" jsonschema:"enum=best_effort,enum=hard_requirement,default=best_effort" jsonschema_description:"best_effort uses what the kernel supports; hard_requirement refuses to run without full Landlock support."`
}

// ProcessPolicy sets the user and group of the sandboxed process.
type ProcessPolicy struct {
	RunAsUser  string `yaml:"run_as_user,omitempty" json:"run_as_user,omitempty" jsonschema_description:"User name or numeric uid to run as. Never root."`
	RunAsGroup string `yaml:"run_as_group,omitempty" json:"run_as_group,omitempty" jsonschema_description:"Group name or numeric gid to run as. Never root."`
}

// NetworkPolicy allows the listed binaries to reach the listed endpoints.
type NetworkPolicy struct {
	Name      string     `yaml:"name,omitempty" json:"name,omitempty" jsonschema_description:"Policy name; defaults to its key in network_policies."`
	Endpoints []Endpoint `yaml:"endpoints,omitempty" json:"endpoints,omitempty" jsonschema_description:"Destinations this policy allows."`
	Binaries  []Binary   `yaml:"binaries,omitempty" json:"binaries,omitempty" jsonschema_description:"Executables allowed to use the endpoints. Empty means any binary."`
}

// Endpoint is one allowed destination with optional L7 (HTTP) rules.
type Endpoint struct {
	Host        string    `yaml:"host,omitempty" json:"host,omitempty" jsonschema_description:"Host name or pattern: *.example.com, **.example.com or api-*.example.com."`
	Port        int       `yaml:"port,omitempty" json:"port,omitempty" jsonschema:"minimum=1,maximum=65535" jsonschema_description:"Destination port."`
	Ports       []int     `yaml:"ports,omitempty" json:"ports,omitempty" jsonschema:"minimum=1,maximum=65535" jsonschema_description:"Destination ports, in addition to port."`
	AllowedIPs  []string  `yaml:"allowed_ips,omitempty" json:"allowed_ips,omitempty" jsonschema_description:"IP addresses or CIDRs. Loopback, link-local and metadata addresses are always refused."`
	Protocol    string    `yaml:"protocol,omitempty" json:"protocol,omitempty" jsonschema:"enum=rest" jsonschema_description:"Application protocol for L7 inspection."`
	TLS         string    `yaml:"tls,omitempty" json:"tls,omitempty" jsonschema:"enum=terminate,enum=passthrough,enum=skip" jsonschema_description:"TLS handling: terminate enables L7 inspection of HTTPS."`
	Enforcement string    `yaml:"enforcement,omitempty" json:"enforcement,omitempty" jsonschema:"enum=enforce,enum=audit" jsonschema_description:"enforce blocks L7 denials; audit only logs them."`
	Access      string    `yaml:"access,omitempty" json:"access,omitempty" jsonschema:"enum=read-only,enum=read-write,enum=full" jsonschema_description:"L7 preset; mutually exclusive with rules."`
	Rules       []L7Rule  `yaml:"rules,omitempty" json:"rules,omitempty" jsonschema_description:"L7 allow rules; mutually exclusive with access."`
	DenyRules   []L7Match `yaml:"deny_rules,omitempty" json:"deny_rules,omitempty" jsonschema_description:"L7 requests to refuse even if a rule allows them."`
	// Path selects the requests this endpoint's L7 rules apply to when
	// several endpoints share a host and port.
	Path              string `yaml:"path,omitempty" json:"path,omitempty" jsonschema_description:"Path glob selecting the requests this endpoint's L7 rules apply to; endpoints with a matching path take precedence over those without."`
	AllowEncodedSlash bool   `yaml:"allow_encoded_slash,omitempty" json:"allow_encoded_slash,omitempty" jsonschema_description:"Accept %2F in request paths (GitLab-style project ids); refused by default because it lets one path mean two things."`
}

// Secret is one masked secret. The real value is read by corral at start
// and never enters the sandbox.
type Secret struct {
	FromEnv  string `yaml:"from_env,omitempty" json:"from_env,omitempty" jsonschema_description:"Name of the variable in corral's environment holding the real value."`
	FromFile string `yaml:"from_file,omitempty" json:"from_file,omitempty" jsonschema_description:"Absolute host path of a file holding the real value (one trailing newline is dropped)."`
	// FromGateway names a secret held by the gateway (corral run
	// --gateway), which sends its value to the supervisor only.
	FromGateway string   `yaml:"from_gateway,omitempty" json:"from_gateway,omitempty" jsonschema_description:"Name of a secret held by the corral gateway (corral run --gateway): the gateway sends its value to the supervisor, never to the workload or to disk."`
	Hosts       []string `yaml:"hosts" json:"hosts" jsonschema:"required" jsonschema_description:"Host names or patterns whose requests get the real value; each must be reached through a TLS-terminating protocol: rest endpoint."`
	Headers     []string `yaml:"headers,omitempty" json:"headers,omitempty" jsonschema_description:"Request headers in which the surrogate is replaced. Default: [Authorization]."`
}

// L7Rule wraps the match in "allow" to stay compatible with OpenShell.
type L7Rule struct {
	Allow L7Match `yaml:"allow" json:"allow" jsonschema:"required" jsonschema_description:"Requests this rule allows."`
}

// L7Match matches HTTP requests. Query is kept loosely typed because its
// matcher syntax belongs to the proxy, not to the loader.
type L7Match struct {
	Method string         `yaml:"method,omitempty" json:"method,omitempty" jsonschema_description:"HTTP method, case-insensitive; * for any."`
	Path   string         `yaml:"path,omitempty" json:"path,omitempty" jsonschema_description:"Path glob such as /repos/** ; ** for any."`
	Query  map[string]any `yaml:"query,omitempty" json:"query,omitempty" jsonschema_description:"Query parameter matchers, by parameter name."`
}

// Binary identifies an executable by path or glob.
type Binary struct {
	Path string `yaml:"path" json:"path" jsonschema:"required" jsonschema_description:"Absolute path or glob (/usr/bin/* or /opt/tools/**)."`
}

// Network is the corral extension for the network mode and short-form rules.
type Network struct {
	Mode  string   `yaml:"mode,omitempty" json:"mode,omitempty" jsonschema:"enum=block,enum=proxy,enum=allow" jsonschema_description:"block: no network; proxy: egress only via the policy proxy; allow: unrestricted. Default: proxy if any network rules exist; else block."`
	Allow []string `yaml:"allow,omitempty" json:"allow,omitempty" jsonschema_description:"Short-form rules host[:port] or cidr[:port] usable by any binary; the port defaults to 443."`
	Learn bool     `yaml:"learn,omitempty" json:"learn,omitempty" jsonschema_description:"Learn mode (proxy mode only): connections no policy allows are let through (internal, loopback, metadata and host addresses stay refused), audited with decision: learn and turned into draft policy chunks (corral draft). For discovering what a workload needs, never for production. Fixed at start: policy set cannot change it."`
}

// Limits are resource limits. Pids and CPU are pointers so that an explicit
// 0 is rejected instead of silently meaning "unlimited".
type Limits struct {
	Memory      string   `yaml:"memory,omitempty" json:"memory,omitempty" jsonschema:"pattern=^ *[0-9.]+ *([kKmMgGtT]([iI]?[bB])?|[bB])? *$,example=512MiB,example=4GiB" jsonschema_description:"Memory limit: a number with an optional unit B/KiB/MiB/GiB/TiB (or k/m/g/t) or KB/MB/GB/TB. At least 16MiB."`
	Pids        *int     `yaml:"pids,omitempty" json:"pids,omitempty" jsonschema:"minimum=1,maximum=4194304" jsonschema_description:"Maximum number of processes and threads."`
	CPU         *float64 `yaml:"cpu,omitempty" json:"cpu,omitempty" jsonschema:"exclusiveMinimum=0,maximum=1024" jsonschema_description:"CPU quota in cores; 1.5 means one and a half cores."`
	Walltime    string   `yaml:"walltime,omitempty" json:"walltime,omitempty" jsonschema:"example=10m,example=2h" jsonschema_description:"Wall-clock limit as a Go duration (e.g. 90s or 2h). At least 1s."`
	Connections *int     `yaml:"connections,omitempty" json:"connections,omitempty" jsonschema:"minimum=1,maximum=65536,default=1024" jsonschema_description:"Proxy mode: most connections the sandbox may hold through corral at once; more are refused (HTTP 429, SOCKS5 general failure, TCP reset). Default 1024."`
}

// MemoryBytes returns the memory limit in bytes, or 0 when unset or invalid.
func (l Limits) MemoryBytes() int64 {
	if l.Memory == "" {
		return 0
	}
	n, err := ParseSize(l.Memory)
	if err != nil {
		return 0
	}
	return n
}

// WalltimeDuration returns the wall-clock limit, or 0 when unset or invalid.
func (l Limits) WalltimeDuration() time.Duration {
	if l.Walltime == "" {
		return 0
	}
	d, err := time.ParseDuration(l.Walltime)
	if err != nil {
		return 0
	}
	return d
}

// PidsMax returns the process limit, or 0 when unset.
func (l Limits) PidsMax() int {
	if l.Pids == nil {
		return 0
	}
	return *l.Pids
}

// ConnectionsMax returns the connection limit, DefaultConnections when
// unset.
func (l Limits) ConnectionsMax() int {
	if l.Connections == nil {
		return DefaultConnections
	}
	return *l.Connections
}

// CPUCores returns the CPU quota in cores, or 0 when unset.
func (l Limits) CPUCores() float64 {
	if l.CPU == nil {
		return 0
	}
	return *l.CPU
}

// NetworkMode returns the effective network mode, applying the default even
// if ApplyDefaults has not run.
func (p *Policy) NetworkMode() string {
	if p.Network.Mode != "" {
		return p.Network.Mode
	}
	if len(p.NetworkPolicies) > 0 || len(p.Network.Allow) > 0 {
		return ModeProxy
	}
	return ModeBlock
}

// IncludeWorkdir reports whether the working directory is mounted read-write.
func (p *Policy) IncludeWorkdir() bool {
	w := p.FilesystemPolicy.IncludeWorkdir
	return w == nil || *w
}

// LandlockHard reports whether missing Landlock support must abort the run.
func (p *Policy) LandlockHard() bool {
	return p.Landlock.Compatibility == LandlockHardRequirement
}

// SandboxDisabled reports whether the policy turns sandboxing off.
func (p *Policy) SandboxDisabled() bool {
	return p.Sandbox == SandboxDisabled
}

// SeccompProfile returns the effective seccomp profile name.
func (p *Policy) SeccompProfile() string {
	if p.Seccomp == "" {
		return SeccompDefault
	}
	return p.Seccomp
}

// PortList returns the endpoint's ports (port plus ports) sorted and without
// duplicates.
func (e Endpoint) PortList() []int {
	seen := map[int]bool{}
	var out []int
	add := func(n int) {
		if n != 0 && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	add(e.Port)
	for _, n := range e.Ports {
		add(n)
	}
	slices.Sort(out)
	return out
}
