package policy

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

func TestDefaultPolicy(t *testing.T) {
	p := Default() // panics if default.yaml is invalid
	if p.Source != DefaultSource {
		t.Errorf("Source = %q", p.Source)
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("default policy has warnings: %v", w)
	}
	if !p.IncludeWorkdir() || p.LandlockHard() || p.SandboxDisabled() {
		t.Errorf("unexpected switches: %+v", p)
	}
	wantRO := []string{"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt"}
	if !slices.Equal(p.FilesystemPolicy.ReadOnly, wantRO) || len(p.FilesystemPolicy.ReadWrite) != 0 {
		t.Errorf("filesystem = %+v", p.FilesystemPolicy)
	}
	if p.NetworkMode() != ModeProxy || p.SeccompProfile() != SeccompDefault || p.State != StateNone {
		t.Errorf("mode %q seccomp %q state %q", p.NetworkMode(), p.SeccompProfile(), p.State)
	}
	l := p.Limits
	if l.MemoryBytes() != 4<<30 || l.PidsMax() != 1024 || l.CPUCores() != 2 || l.WalltimeDuration() != 2*time.Hour {
		t.Errorf("limits = %+v", l)
	}
}

func TestDefaultReturnsFreshCopies(t *testing.T) {
	a, b := Default(), Default()
	a.FilesystemPolicy.ReadOnly[0] = "/changed"
	a.Network.Mode = ModeAllow
	if b.FilesystemPolicy.ReadOnly[0] != "/usr" || b.Network.Mode != ModeProxy {
		t.Errorf("Default() copies share state")
	}
	y := DefaultYAML()
	y[0] = '!'
	if bytes.Equal(y, DefaultYAML()) {
		t.Errorf("DefaultYAML() returns shared bytes")
	}
}

func TestApplyDefaultsIdempotent(t *testing.T) {
	p := mustParse(t, "version: 1\nnetwork: {allow: [Example.COM]}\n")
	before := p.SHA256()
	p.ApplyDefaults()
	if p.SHA256() != before {
		t.Errorf("ApplyDefaults is not idempotent")
	}
}
