// Package initbin carries the sandbox's init (cmd/corral-init) inside the
// corral binary. Starting the init is an exec, and exec'ing corral itself
// pays for loading and initialising every package corral links (OPA, the
// CLI, the proxy), page by page: the init alone is a fraction of that. The
// user still installs one file: the first run writes the init next to
// corral's other state, and later runs exec it from there.
package initbin

//go:generate go run ./gen

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// Path returns the init program for this corral under stateDir, writing it
// there on first use, or "" when this corral carries none (built without
// go generate, or with the corral_selfinit tag); the caller then
// re-executes itself as the init.
//
// The file is named by its SHA-256, so corrals of different builds sharing
// a state directory never run each other's init, and is trusted as corral
// trusts the rest of its state directory: it must be owned by our uid in a
// directory only we can write, with no write bits for anyone else. Reading
// it back to hash it would cost each start what this saves, since on a
// virtual machine every page touched is a fault.
func Path(stateDir string) (string, error) {
	name, err := embeddedName()
	if name == "" || err != nil {
		return "", err
	}
	dir := statedir.Bin(stateDir)
	path := filepath.Join(dir, name)
	if err := ownedDir(dir); err != nil {
		return "", err
	}
	if st, err := os.Lstat(path); err == nil {
		if err := owned(path, st, 0o022); err != nil {
			return "", err
		}
		return path, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("init program: %w", err)
	}
	prog, err := embedded.Open("bin/" + name)
	if err != nil {
		return "", fmt.Errorf("read the embedded init: %w", err)
	}
	defer prog.Close()
	tmp, err := os.CreateTemp(dir, ".corral-init-*")
	if err != nil {
		return "", fmt.Errorf("write the init program: %w", err)
	}
	defer os.Remove(tmp.Name())
	// Copied in small pieces, not read whole: the supervisor lives on for
	// the whole run and would keep a program-sized heap.
	_, err = io.Copy(tmp, prog)
	if err == nil {
		err = tmp.Chmod(0o500)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	// Renamed into place, so a concurrent start never runs half a file.
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", fmt.Errorf("write the init program %s: %w", path, err)
	}
	removeStale(dir, name)
	return path, nil
}

// removeStale removes the init programs of other corral builds once they
// are a minute old: one still in use is written again at its next start,
// and a minute is far longer than any start takes from Path to exec.
func removeStale(dir, keep string) {
	old, _ := filepath.Glob(filepath.Join(dir, "corral-init-*"))
	for _, o := range old {
		if st, err := os.Lstat(o); err == nil && filepath.Base(o) != keep && time.Since(st.ModTime()) > time.Minute {
			os.Remove(o)
		}
	}
}

// embeddedName is the name of the init program this corral carries,
// corral-init-HASH, or "" when it carries none.
func embeddedName() (string, error) {
	ents, err := embedded.ReadDir("bin")
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("list the embedded init: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "corral-init-") {
			return e.Name(), nil
		}
	}
	return "", nil
}

// ownedDir makes dir, or checks the one there, as ours alone.
func ownedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("init program directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("init program directory %s is not a directory", dir)
	}
	return owned(dir, st, 0o077)
}

// owned refuses a file not owned by our uid or with any of the mode bits
// in forbidden: the init runs with every privilege corral has.
func owned(path string, st fs.FileInfo, forbidden fs.FileMode) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not owned by uid %d: remove it and let corral write it again", path, os.Geteuid())
	}
	if st.Mode().Perm()&forbidden != 0 || (!st.IsDir() && !st.Mode().IsRegular()) {
		return fmt.Errorf("%s has mode %v: remove it and let corral write it again", path, st.Mode())
	}
	return nil
}
