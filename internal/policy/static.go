package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// CheckReload refuses q as the next version of a running p when it changes
// a section StaticDiff names, saying which and what may change instead.
func (p *Policy) CheckReload(q *Policy) error {
	if diff := p.StaticDiff(q); len(diff) > 0 {
		return fmt.Errorf("the new policy changes %s, which is fixed when a sandbox starts; only network policies and the hosts and headers of secrets can change — start a new sandbox for the rest",
			strings.Join(diff, ", "))
	}
	return nil
}

// StaticDiff lists the sections of q that differ from p among those fixed
// when a sandbox starts: the filesystem, Landlock, identity, limits, seccomp,
// state and network mode are applied by the kernel before the workload runs
// and cannot change afterwards, and which secrets exist and where their
// values come from, because their surrogates are already in the workload's
// environment. Network policies and secret scopes (hosts, headers) can be
// hot-reloaded.
func (p *Policy) StaticDiff(q *Policy) []string {
	sections := []struct {
		name string
		a, b any
	}{
		{"sandbox", p.Sandbox, q.Sandbox},
		{"filesystem_policy", p.FilesystemPolicy, q.FilesystemPolicy},
		{"landlock", p.Landlock, q.Landlock},
		{"process", p.Process, q.Process},
		{"limits", p.Limits, q.Limits},
		{"seccomp", p.SeccompProfile(), q.SeccompProfile()},
		{"state", p.State, q.State},
		{"network.mode", p.NetworkMode(), q.NetworkMode()},
		{"network.learn", p.Network.Learn, q.Network.Learn},
		{"secrets", secretSources(p.Secrets), secretSources(q.Secrets)},
	}
	var diff []string
	for _, s := range sections {
		a, _ := json.Marshal(s.a)
		b, _ := json.Marshal(s.b)
		if !bytes.Equal(a, b) {
			diff = append(diff, s.name)
		}
	}
	return diff
}

// secretSources is what of the secrets is fixed: their names and the
// sources of their values. "secrets: {}" and none compare equal.
func secretSources(s map[string]Secret) map[string]Secret {
	if len(s) == 0 {
		return nil
	}
	out := make(map[string]Secret, len(s))
	for k, v := range s {
		out[k] = Secret{FromEnv: v.FromEnv, FromFile: v.FromFile, FromGateway: v.FromGateway}
	}
	return out
}
