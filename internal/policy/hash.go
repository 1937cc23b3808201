package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
)

// SHA256 returns the hex SHA-256 of the policy's canonical JSON: the
// effective policy (sections taken from the default included, extends
// dropped, since it has done its work), defaults applied (on a copy),
// struct fields in declaration order, map keys sorted. It therefore
// ignores YAML formatting, comments and key order, and whether a section
// was written out or inherited, but not list order, which can be
// meaningful. It returns "" only for a policy that
// cannot be encoded (a NaN limit, say), which validation rules out.
func (p *Policy) SHA256() string {
	b, err := p.CanonicalJSON()
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// CanonicalJSON returns the compact JSON encoding that SHA256 hashes.
func (p *Policy) CanonicalJSON() ([]byte, error) {
	c := p.clone()
	c.ApplyDefaults()
	c.Extends = ""
	return json.Marshal(c)
}

// clone copies the policy deeply enough that ApplyDefaults on the copy
// cannot change the original.
func (p *Policy) clone() *Policy {
	c := *p
	if w := p.FilesystemPolicy.IncludeWorkdir; w != nil {
		v := *w
		c.FilesystemPolicy.IncludeWorkdir = &v
	}
	c.FilesystemPolicy.ReadOnly = slices.Clone(p.FilesystemPolicy.ReadOnly)
	c.FilesystemPolicy.ReadWrite = slices.Clone(p.FilesystemPolicy.ReadWrite)
	c.FilesystemPolicy.Home = slices.Clone(p.FilesystemPolicy.Home)
	c.Inherited = slices.Clone(p.Inherited)
	c.Network.Allow = append([]string(nil), p.Network.Allow...)
	if p.NetworkPolicies != nil {
		c.NetworkPolicies = make(map[string]NetworkPolicy, len(p.NetworkPolicies))
		for k, np := range p.NetworkPolicies {
			eps := make([]Endpoint, len(np.Endpoints))
			for i, ep := range np.Endpoints {
				if ep.Rules != nil {
					ep.Rules = append([]L7Rule{}, ep.Rules...)
				}
				if ep.DenyRules != nil {
					ep.DenyRules = append([]L7Match{}, ep.DenyRules...)
				}
				eps[i] = ep
			}
			if np.Endpoints == nil {
				eps = nil
			}
			np.Endpoints = eps
			c.NetworkPolicies[k] = np
		}
	}
	if p.Secrets != nil {
		c.Secrets = make(map[string]Secret, len(p.Secrets))
		for k, s := range p.Secrets {
			s.Hosts = slices.Clone(s.Hosts)
			s.Headers = slices.Clone(s.Headers)
			c.Secrets[k] = s
		}
	}
	return &c
}
