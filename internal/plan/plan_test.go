package plan

import (
	"reflect"
	"testing"
)

// ForInit drops only what explain alone reads, and leaves the plan it was
// called on as it was.
func TestForInit(t *testing.T) {
	p := Plan{
		Caged: true, Workdir: "/w", Hostname: "h", Defaults: []string{"limits"},
		Namespaces: []string{"mount"}, User: User{UID: 1, Why: "why"},
		Mounts:  []Mount{{Kind: KindBind, Source: "/usr", Target: "/usr", ReadOnly: true}},
		Skipped: []Skipped{{}}, Path: "/usr/bin", PathDropped: []string{"/opt/bin"},
		Landlock: Landlock{ReadOnly: []string{"/usr"}},
		Seccomp:  Seccomp{Profile: "default", NetMode: "proxy", Rules: []SeccompRule{{Syscalls: []string{"ptrace"}}}},
		Limits:   Limits{MemoryBytes: 1 << 30, Enforcement: []string{"memory → cgroup"}, NotEnforced: []string{"cpu"}},
		Network:  Network{Mode: "proxy"},
		State:    State{Mode: "tmpfs"},
	}
	before := p
	got := p.ForInit()
	if got.Seccomp.Rules != nil || got.Limits.Enforcement != nil || got.Limits.NotEnforced != nil ||
		got.PathDropped != nil || got.Defaults != nil {
		t.Fatalf("ForInit kept explain-only parts: %+v", got)
	}
	got.Seccomp.Rules, got.Limits.Enforcement, got.Limits.NotEnforced = p.Seccomp.Rules, p.Limits.Enforcement, p.Limits.NotEnforced
	got.PathDropped, got.Defaults = p.PathDropped, p.Defaults
	if !reflect.DeepEqual(got, p) {
		t.Errorf("ForInit changed more than the explain-only parts:\n%+v\nwant\n%+v", got, p)
	}
	if !reflect.DeepEqual(p, before) {
		t.Error("ForInit changed the plan it was called on")
	}
}
