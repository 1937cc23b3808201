package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/policy"
)

// Reloadable is the part of a running sandbox that a policy reload swaps
// (the assembled egress: decisions, secrets' scopes, open connections).
// Swap must leave the old policy in force when it returns an error.
type Reloadable interface {
	Swap(p *policy.Policy) error
}

// policyState is the sandbox's live policy and its version; version 1 is
// the policy the sandbox started with.
type policyState struct {
	mu      sync.Mutex
	current *policy.Policy
	version int
	target  Reloadable
}

// allowControl admits control clients of this user (or root) that live in
// the supervisor's own pid namespace, which no sandbox's process does: each
// sandbox has a pid namespace of its own that its processes cannot leave.
// Rootless, every sandbox runs with the user's uid, so the uid alone would
// let a workload that reaches some sandbox's socket (its own, or another's
// through a policy path) change that sandbox's policy.
func (s *supervisor) allowControl(p control.Peer) error {
	if p.UID != os.Getuid() && p.UID != 0 {
		return fmt.Errorf("uid %d may not control a sandbox of uid %d", p.UID, os.Getuid())
	}
	own, err := control.OwnPIDNamespace()
	if err != nil {
		return fmt.Errorf("pid namespace of corral: %w", err)
	}
	if p.PIDNamespace != own {
		return errors.New("a process inside a sandbox may not control one")
	}
	return nil
}

// Status implements control.Handler.
func (s *supervisor) Status() control.Status {
	s.pol.mu.Lock()
	defer s.pol.mu.Unlock()
	return control.Status{
		ID: s.ID, Session: s.Session, PID: s.pid, InitPID: s.cmd.Process.Pid,
		Argv: s.Argv, Workdir: s.Plan.Workdir,
		PolicySHA256: s.pol.current.SHA256(), PolicyVersion: s.pol.version,
		NetworkMode: s.Plan.Network.Mode, Started: s.start,
	}
}

// SetPolicy implements control.Handler: last-known-good semantics, so a
// policy that fails validation, changes a static section or fails to
// compile never replaces the working one. The sections the new file leaves
// out stay as they run (unless it says extends: none), so a file holding
// only network_policies is a complete reload.
func (s *supervisor) SetPolicy(yaml []byte, source string) error {
	s.pol.mu.Lock()
	defer s.pol.mu.Unlock()
	fail := func(err error) error {
		s.Audit.Log(audit.PolicyReloadFailedEvent{Source: source, Version: s.pol.version + 1, Error: err.Error()})
		s.Log.Warn("policy reload rejected; the running policy stays in force", "err", err)
		return err
	}
	p, err := policy.ParseOnto(yaml, source, s.pol.current)
	if err != nil {
		return fail(err)
	}
	if diff := s.pol.current.StaticDiff(p); len(diff) > 0 {
		return fail(fmt.Errorf("the new policy changes %s, which is fixed when a sandbox starts; only network policies and the hosts and headers of secrets can change — start a new sandbox for the rest",
			strings.Join(diff, ", ")))
	}
	if s.pol.target != nil {
		if err := s.pol.target.Swap(p); err != nil {
			return fail(fmt.Errorf("compile network policy: %w", err))
		}
	}
	s.pol.current = p
	s.pol.version++
	s.Audit.Log(audit.PolicyReloadedEvent{Source: source, Version: s.pol.version, PolicySHA256: p.SHA256()})
	s.Log.Info("policy reloaded", "version", s.pol.version, "sha256", p.SHA256())
	return nil
}
