package secrets

import (
	"fmt"
	"slices"
)

// maxKnown bounds how many replaced values a Set keeps covering in
// redaction and scrubbing; rotations are rare, and the oldest values are
// the least likely to still be in flight.
const maxKnown = 64

// UpdateGateway puts in force the values lookup returns for the secrets
// taken from_gateway, keeping their surrogates: the workload holds those
// already. It returns the names of the secrets whose value changed. A
// secret lookup has no value for keeps the one it has.
//
// A new value must fit the surrogate (the same length, and the same bytes
// where the surrogate kept the value's punctuation), because responses are
// scrubbed in place on the promise that a surrogate is exactly as long as
// the value it stands for in every encoding. A value that does not fit is
// an error naming the secret, and no value changes: the running sandbox
// keeps the old ones until it is started again.
func (s *Set) UpdateGateway(lookup func(name string) (string, bool)) ([]string, error) {
	if s == nil || s.vals == nil {
		return nil, nil
	}
	s.vals.mu.Lock()
	defer s.vals.mu.Unlock()
	cur := s.vals.cur.Load()
	real := make(map[string]string, len(cur.real))
	for k, v := range cur.real {
		real[k] = v
	}
	var changed []string
	var added []*entry
	for _, e := range s.entries {
		if e.gateway == "" {
			continue
		}
		v, ok := lookup(e.gateway)
		if !ok || v == cur.real[e.name] {
			continue
		}
		if err := checkValue(v); err != nil {
			return nil, fmt.Errorf("secret %s: new value from_gateway %s: %w", e.name, e.gateway, err)
		}
		if !fits(v, e.surrogate) {
			return nil, fmt.Errorf("secret %s: new value from_gateway %s has another length or punctuation than the one the sandbox started with, so the workload's surrogate cannot stand for it; the old value stays in force until the sandbox is started again", e.name, e.gateway)
		}
		var others []*entry
		for _, o := range s.entries {
			if o != e {
				others = append(others, &entry{real: real[o.name], surrogate: o.surrogate})
			}
		}
		if !acceptable(e.surrogate, v, others) {
			return nil, fmt.Errorf("secret %s: new value from_gateway %s overlaps another secret's value or surrogate", e.name, e.gateway)
		}
		real[e.name] = v
		changed = append(changed, e.name)
		added = append(added, &entry{name: e.name, real: v, surrogate: e.surrogate})
	}
	if len(changed) == 0 {
		return nil, nil
	}
	known := slices.Concat(cur.known, added)
	if extra := len(known) - len(s.entries) - maxKnown; extra > 0 {
		known = slices.DeleteFunc(known, func(k *entry) bool {
			if extra > 0 && k.real != real[k.name] {
				extra--
				return true
			}
			return false
		})
	}
	s.vals.cur.Store(newValues(real, known))
	return changed, nil
}

// fits reports whether sur can stand for real in scrubbed text: the same
// length, letters and digits where real has them, and the same bytes
// elsewhere.
func fits(real, sur string) bool {
	if len(real) != len(sur) {
		return false
	}
	for i := 0; i < len(real); i++ {
		if (class(real[i]) == "") != (class(sur[i]) == "") {
			return false
		}
		if class(real[i]) == "" && real[i] != sur[i] {
			return false
		}
	}
	return true
}
