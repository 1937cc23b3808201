// Command gen builds cmd/corral-init into ../bin, named by its SHA-256, for
// corral to embed; `go generate ./internal/sandbox/initbin` runs it. The build is reproducible
// (trimmed paths, no VCS stamp), so the same sources give the same bytes.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "initbin/gen:", err)
		os.Exit(1)
	}
}

func run() error {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir := filepath.Join(root, "internal", "sandbox", "initbin", "bin")
	tmp := filepath.Join(dir, ".corral-init.tmp")
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", tmp, "./cmd/corral-init")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build corral-init: %w", err)
	}
	prog, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(prog)
	// The hash is in the name, so a build that embeds the directory while
	// this runs sees one whole program with its own hash, or none.
	dst := filepath.Join(dir, "corral-init-"+hex.EncodeToString(sum[:16]))
	old, _ := filepath.Glob(filepath.Join(dir, "corral-init-*"))
	for _, o := range old {
		if o != dst {
			os.Remove(o)
		}
	}
	return os.Rename(tmp, dst)
}
