package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindGateway(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := findGateway(filepath.Join(t.TempDir(), "corral"))
	if err == nil || !strings.Contains(err.Error(), "go build -o ") || !strings.Contains(err.Error(), "./cmd/corral-gateway") {
		t.Fatalf("missing gateway: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, gatewayBinary)
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Next to the corral the user ran (for the full program, the lean
	// corral that started it, not the program in the state directory).
	if got, err := findGateway(filepath.Join(dir, "corral")); err != nil || got != bin {
		t.Fatalf("next to corral: findGateway = %q, %v; want %s", got, err, bin)
	}
	t.Setenv("PATH", dir)
	if got, err := findGateway(filepath.Join(t.TempDir(), "corral")); err != nil || got != bin {
		t.Fatalf("in PATH: findGateway = %q, %v; want %s", got, err, bin)
	}
}
