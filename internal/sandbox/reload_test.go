package sandbox

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/policy"
)

// fakeTarget records what it was given and fails when told to.
type fakeTarget struct {
	swapped []*policy.Policy
	fail    error
}

func (f *fakeTarget) Swap(p *policy.Policy) error {
	if f.fail != nil {
		return f.fail
	}
	f.swapped = append(f.swapped, p)
	return nil
}

func newReloadable(t *testing.T) (*supervisor, *fakeTarget, *bytes.Buffer) {
	t.Helper()
	start, err := policy.Parse([]byte("version: 1\nnetwork_policies:\n  a:\n    endpoints: [{host: a.test, port: 443}]\n"), "start.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var trail bytes.Buffer
	target := &fakeTarget{}
	s := &supervisor{Options: Options{Audit: audit.New(&trail), Log: slog.New(slog.DiscardHandler)}}
	s.pol = policyState{current: start, version: 1, target: target}
	return s, target, &trail
}

// TestReloadLastKnownGood: a reload that fails validation, changes a
// static section or fails to compile leaves the running policy and its
// version; one that succeeds, partial or not, is the next version.
func TestReloadLastKnownGood(t *testing.T) {
	s, target, trail := newReloadable(t)
	before := s.pol.current

	if err := s.SetPolicy([]byte("version: 1\nnetwork: {mode: proxi}\n"), "typo.yaml"); err == nil {
		t.Fatal("an invalid policy was accepted")
	}
	if err := s.SetPolicy([]byte("version: 1\nlimits: {pids: 7}\n"), "limits.yaml"); err == nil || !strings.Contains(err.Error(), "limits") {
		t.Fatalf("a reload changing limits: %v, want a refusal naming limits", err)
	}
	target.fail = errors.New("compile failed")
	if err := s.SetPolicy([]byte("version: 1\nnetwork_policies:\n  b:\n    endpoints: [{host: b.test, port: 443}]\n"), "b.yaml"); err == nil {
		t.Fatal("a policy the engine refused was accepted")
	}
	if s.pol.current != before || s.pol.version != 1 || len(target.swapped) != 0 {
		t.Fatalf("failed reloads changed the running policy (version %d, %d swaps)", s.pol.version, len(target.swapped))
	}

	target.fail = nil
	// Partial: only network_policies; the rest stays as it runs.
	if err := s.SetPolicy([]byte("version: 1\nnetwork_policies:\n  b:\n    endpoints: [{host: b.test, port: 443}]\n"), "b.yaml"); err != nil {
		t.Fatal(err)
	}
	if s.pol.version != 2 || len(target.swapped) != 1 || s.pol.current != target.swapped[0] {
		t.Fatalf("after a good reload: version %d, %d swaps", s.pol.version, len(target.swapped))
	}
	if _, ok := s.pol.current.NetworkPolicies["b"]; !ok {
		t.Errorf("the reloaded policy lacks the new network policy")
	}
	if got := strings.Count(trail.String(), `"event":"policy.reload_failed"`); got != 3 {
		t.Errorf("%d policy.reload_failed events, want 3:\n%s", got, trail)
	}
	if !strings.Contains(trail.String(), `"event":"policy.reloaded"`) || !strings.Contains(trail.String(), `"version":2`) {
		t.Errorf("no policy.reloaded event for version 2:\n%s", trail)
	}
}
