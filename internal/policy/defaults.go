package policy

import (
	_ "embed"
	"strings"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultSource is the Source of the policy returned by Default.
const DefaultSource = "<default>"

// DefaultYAML returns the built-in default policy file, comments included.
func DefaultYAML() []byte {
	return append([]byte(nil), defaultYAML...)
}

// Default returns a fresh copy of the built-in default policy. It panics
// only if the embedded file is invalid, which a test rules out.
func Default() *Policy {
	p, err := ParseOnto(defaultYAML, DefaultSource, nil)
	if err != nil {
		panic("policy: embedded default.yaml is invalid: " + err.Error())
	}
	return p
}

// ApplyDefaults fills in every unset field that has a default and
// normalizes case-insensitive values, so that equivalent policies compare
// and hash equal. It is idempotent.
func (p *Policy) ApplyDefaults() {
	if p.Sandbox == "" {
		p.Sandbox = SandboxEnabled
	}
	if p.FilesystemPolicy.IncludeWorkdir == nil {
		t := true
		p.FilesystemPolicy.IncludeWorkdir = &t
	}
	if p.Landlock.Compatibility == "" {
		p.Landlock.Compatibility = LandlockBestEffort
	}
	p.Network.Mode = p.NetworkMode()
	if p.Seccomp == "" {
		p.Seccomp = SeccompDefault
	}
	for i, s := range p.Network.Allow {
		p.Network.Allow[i] = strings.ToLower(s)
	}
	for key, np := range p.NetworkPolicies {
		if np.Name == "" {
			np.Name = key
		}
		for i := range np.Endpoints {
			ep := &np.Endpoints[i]
			ep.Host = strings.ToLower(ep.Host)
			for j := range ep.Rules {
				ep.Rules[j].Allow.Method = strings.ToUpper(ep.Rules[j].Allow.Method)
			}
			for j := range ep.DenyRules {
				ep.DenyRules[j].Method = strings.ToUpper(ep.DenyRules[j].Method)
			}
		}
		p.NetworkPolicies[key] = np
	}
	for key, s := range p.Secrets {
		for i, h := range s.Hosts {
			s.Hosts[i] = strings.ToLower(h)
		}
		s.Headers = secretHeaders(s.Headers)
		p.Secrets[key] = s
	}
}
