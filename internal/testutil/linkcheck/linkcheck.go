// Package linkcheck lets a command's tests keep packages out of its
// binary: every package a program links is initialised, and paged in, on
// each start.
package linkcheck

import (
	"os/exec"
	"strings"
	"testing"
)

// NotLinked fails t for each of forbidden that the package pkg (a path
// relative to the current directory, "." for its own) links, directly or
// not, when built with tags (comma-separated, or "").
func NotLinked(t *testing.T, pkg, tags string, forbidden []string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-tags", tags, "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, p := range forbidden {
		if deps[p] {
			t.Errorf("%s links %s; `go list -deps` shows it, and `go mod why` the path", pkg, p)
		}
	}
}
