package secrets

import (
	"fmt"

	"github.com/corral-sandbox/corral/internal/policy"
)

// Rescope returns a Set with the values and surrogates of s and the hosts
// and headers scopes give them. scopes must name the same secrets with the
// same sources (policy.StaticDiff refuses anything else); a difference is
// an error, never a silent new value.
func (s *Set) Rescope(scopes []policy.SecretScope) (*Set, error) {
	if s == nil || len(s.entries) == 0 {
		if len(scopes) > 0 {
			return nil, fmt.Errorf("secrets cannot be added to a running sandbox")
		}
		return s, nil
	}
	if len(scopes) != len(s.entries) {
		return nil, fmt.Errorf("secrets cannot be added to or removed from a running sandbox")
	}
	ns := &Set{sources: map[string]*entry{}, byName: map[string]*entry{}, vals: s.vals}
	for _, sc := range scopes {
		old, ok := s.byName[sc.Name]
		if !ok {
			return nil, fmt.Errorf("secret %s cannot be added to a running sandbox", sc.Name)
		}
		e := &entry{name: old.name, surrogate: old.surrogate, gateway: old.gateway, headers: sc.Headers, hosts: sc.Hosts}
		ns.entries = append(ns.entries, e)
		ns.byName[e.name] = e
		if sc.Source.FromEnv != "" {
			ns.sources[sc.Source.FromEnv] = e
		}
	}
	return ns, nil
}
