// Package carried installs the programs corral carries inside its own
// binary (the sandbox's init, the full program with OPA) into the state
// directory and finds them there. Starting a program is an exec, and
// exec'ing corral itself pays for loading and initialising every package
// corral links; a program built for one job costs a fraction of that. The
// user still installs one file: the first run writes each program next to
// corral's other state, and later runs exec it from there.
package carried

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// Program is one carried program: FS holds it as bin/PREFIX-HASH, HASH
// being its SHA-256 (go generate writes it there), or holds nothing.
type Program struct {
	FS     fs.FS
	Prefix string // e.g. "corral-init-"
}

// Path returns the program under stateDir, writing it there on first use,
// or "" when this corral carries none (built without go generate).
//
// The file is named by its SHA-256, so corrals of different builds sharing
// a state directory never run each other's programs, and is trusted as
// corral trusts the rest of its state directory: it must be owned by our
// uid in a directory only we can write, with no write bits for anyone else.
// Reading it back to hash it would cost each start what this saves, since
// on a virtual machine every page touched is a fault.
func (p Program) Path(stateDir string) (string, error) {
	name, err := p.Name()
	if name == "" || err != nil {
		return "", err
	}
	dir := statedir.Bin(stateDir)
	path := filepath.Join(dir, name)
	if err := ownedDir(dir); err != nil {
		return "", err
	}
	if done, err := installed(path); done || err != nil {
		return path, err
	}
	// Many starts at once (a gateway starting sandboxes) would each write
	// their own copy: the first takes the directory's lock and writes, the
	// others wait for it and find the program there.
	unlock, err := lockDir(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if done, err := installed(path); done || err != nil {
		return path, err
	}
	prog, err := p.FS.Open("bin/" + name)
	if err != nil {
		return "", fmt.Errorf("read the embedded %s: %w", name, err)
	}
	defer prog.Close()
	tmp, err := os.CreateTemp(dir, "."+p.Prefix+"*")
	if err != nil {
		return "", fmt.Errorf("write %s: %w", name, err)
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
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	p.removeStale(dir, name)
	return path, nil
}

// installed reports whether path holds the program, refusing a file that
// is not ours alone.
func installed(path string) (bool, error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("carried program: %w", err)
	}
	if err := statedir.Owned(path, st, 0o022); err != nil {
		return false, err
	}
	return true, nil
}

// lockDir takes dir's exclusive lock (flock on the directory itself) and
// returns its release.
func lockDir(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// removeStale removes this program as other corral builds carry it once
// those are a minute old: one still in use is written again at its next start,
// and a minute is far longer than any start takes from Path to exec.
func (p Program) removeStale(dir, keep string) {
	old, _ := filepath.Glob(filepath.Join(dir, p.Prefix+"*"))
	for _, o := range old {
		if st, err := os.Lstat(o); err == nil && filepath.Base(o) != keep && time.Since(st.ModTime()) > time.Minute {
			os.Remove(o)
		}
	}
}

// Name is the name of the program as this corral carries it,
// PREFIX-HASH, or "" when it carries none.
func (p Program) Name() (string, error) {
	ents, err := fs.ReadDir(p.FS, "bin")
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("list the embedded %s: %w", p.Prefix, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), p.Prefix) {
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
	if err := statedir.OwnedDir(dir, 0o077); err != nil {
		return fmt.Errorf("program directory: %w", err)
	}
	return nil
}
