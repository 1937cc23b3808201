package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindGateway(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := findGateway()
	if err == nil || !strings.Contains(err.Error(), "go build -o ") || !strings.Contains(err.Error(), "./cmd/corral-gateway") {
		t.Fatalf("missing gateway: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, gatewayBinary)
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	if got, err := findGateway(); err != nil || got != bin {
		t.Fatalf("findGateway = %q, %v; want %s", got, err, bin)
	}
}
