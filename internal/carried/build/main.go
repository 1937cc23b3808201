// Command build builds a program for corral to carry into the calling
// package's bin directory, named PREFIX + its SHA-256, for that package
// to embed; the packages' go:generate lines run it:
//
//	go run ../../carried/build [-tags TAGS] PREFIX PACKAGE
//
// The build is reproducible (trimmed paths, no VCS stamp), so the same
// sources give the same bytes.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	tags := flag.String("tags", "", "build tags")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: build [-tags TAGS] PREFIX PACKAGE")
		os.Exit(2)
	}
	if err := run(*tags, flag.Arg(0), flag.Arg(1)); err != nil {
		fmt.Fprintln(os.Stderr, "carried/build:", err)
		os.Exit(1)
	}
}

func run(tags, prefix, pkg string) error {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}
	dir := filepath.Join(cwd, "bin")
	tmp := filepath.Join(dir, "."+prefix+"tmp")
	build := exec.Command("go", "build", "-tags", tags, "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", tmp, pkg)
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build %s: %w", pkg, err)
	}
	prog, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(prog)
	// The hash is in the name, so a build that embeds the directory while
	// this runs sees one whole program with its own hash, or none.
	dst := filepath.Join(dir, prefix+hex.EncodeToString(sum[:16]))
	old, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	for _, o := range old {
		if o != dst {
			os.Remove(o)
		}
	}
	return os.Rename(tmp, dst)
}
