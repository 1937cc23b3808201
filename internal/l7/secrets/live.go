package secrets

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/corral-sandbox/corral/internal/hostpattern"
	"github.com/corral-sandbox/corral/internal/policy"
)

// Live is the Set in force for a running sandbox. A policy reload may move
// a secret's hosts and headers (its scope); its value and surrogate are
// fixed at start, since the surrogate is already in the workload's
// environment.
type Live struct {
	cur atomic.Pointer[Set]
	// mu keeps a reload from landing between a request's decision and
	// the loading of the Set its secrets are swapped and scrubbed with.
	mu sync.RWMutex
}

// NewLive starts with s, which may be nil (no secrets).
func NewLive(s *Set) *Live {
	l := &Live{}
	l.cur.Store(s)
	return l
}

// Load returns the Set in force; nil when there are no secrets.
func (l *Live) Load() *Set {
	if l == nil {
		return nil
	}
	return l.cur.Load()
}

// Store puts s in force; a nil Live (a sandbox without secrets) ignores it.
func (l *Live) Store(s *Set) {
	if l != nil {
		l.cur.Store(s)
	}
}

// Consistent runs decide, during which no Reload lands, and returns the Set
// in force meanwhile: a request decided under one policy has its secrets
// swapped and scrubbed under that same policy.
func (l *Live) Consistent(decide func()) *Set {
	if l == nil {
		decide()
		return nil
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	decide()
	return l.cur.Load()
}

// Reload runs swap (the decision engine's) and, when it succeeds, puts s in
// force, with no request deciding in between; when it fails, nothing
// changes.
func (l *Live) Reload(swap func() error, s *Set) error {
	if l == nil {
		return swap()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := swap(); err != nil {
		return err
	}
	l.cur.Store(s)
	return nil
}

// Rescope returns a Set with the values and surrogates of s and the hosts
// and headers specs give them. specs must name the same secrets with the
// same sources (policy.StaticDiff refuses anything else); a difference is
// an error, never a silent new value.
func (s *Set) Rescope(specs map[string]policy.Secret) (*Set, error) {
	if s == nil || len(s.entries) == 0 {
		if len(specs) > 0 {
			return nil, fmt.Errorf("secrets cannot be added to a running sandbox")
		}
		return s, nil
	}
	if len(specs) != len(s.entries) {
		return nil, fmt.Errorf("secrets cannot be added to or removed from a running sandbox")
	}
	ns := &Set{sources: map[string]*entry{}, byName: map[string]*entry{}, redact: s.redact, scrub: s.scrub}
	for _, old := range s.entries {
		spec, ok := specs[old.name]
		if !ok {
			return nil, fmt.Errorf("secret %s cannot be removed from a running sandbox", old.name)
		}
		if err := policy.CheckSecret(old.name, spec); err != nil {
			return nil, err
		}
		e := &entry{name: old.name, real: old.real, surrogate: old.surrogate, headers: policy.SecretHeaders(spec)}
		for _, h := range spec.Hosts {
			p, err := hostpattern.Compile(h)
			if err != nil {
				return nil, fmt.Errorf("secret %s: %w", old.name, err)
			}
			e.hosts = append(e.hosts, p)
		}
		ns.entries = append(ns.entries, e)
		ns.byName[e.name] = e
		if spec.FromEnv != "" {
			ns.sources[spec.FromEnv] = e
		}
	}
	return ns, nil
}
