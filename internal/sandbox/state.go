package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// runDir is one live sandbox's host state: a lock held for the supervisor's
// lifetime (so a later run can tell a live sandbox from a stale one), the
// empty directory the init mounts its root on, and the ephemeral scratch.
type runDir struct {
	state, id string
	path      string
	lock      *os.File
}

func newRunDir(stateDir, id string) (*runDir, error) {
	p := statedir.Run(stateDir, id)
	if err := os.MkdirAll(filepath.Join(p, "root"), 0o700); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	// Only the supervisor's user (and the init, which is that user or root)
	// may enter: the control socket lives here.
	if err := os.Chmod(p, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(p, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock run directory %s: %w", p, err)
	}
	return &runDir{state: stateDir, id: id, path: p, lock: f}, nil
}

func (r *runDir) root() string { return filepath.Join(r.path, "root") }

// remove deletes only what corral put there. The root mountpoint is removed
// with rmdir, never recursively: if it were somehow still a mountpoint with
// host binds below it, a recursive delete would destroy host files.
func (r *runDir) remove() error {
	errs := []error{
		os.RemoveAll(statedir.Ephemeral(r.state, r.id)),
		ignoreNotExist(unix.Rmdir(r.root())),
		ignoreNotExist(os.Remove(filepath.Join(r.path, "lock"))),
		ignoreNotExist(os.Remove(statedir.Control(r.state, r.id))),
	}
	r.lock.Close()
	errs = append(errs, ignoreNotExist(unix.Rmdir(r.path)))
	return errors.Join(errs...)
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// isLive reports whether a supervisor still holds the run's lock.
func isLive(stateDir, id string) bool {
	f, err := os.Open(filepath.Join(statedir.Run(stateDir, id), "lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// sweepRunDirs removes run directories left by supervisors that died
// without cleaning up, and returns their ids.
func sweepRunDirs(stateDir string) ([]string, error) {
	entries, err := os.ReadDir(statedir.Runs(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var swept []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || isLive(stateDir, e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(statedir.Run(stateDir, e.Name()), "lock"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		r := &runDir{state: stateDir, id: e.Name(), path: statedir.Run(stateDir, e.Name()), lock: f}
		if f == nil {
			r.lock, _ = os.Open(os.DevNull)
		}
		if err := r.remove(); err != nil {
			errs = append(errs, fmt.Errorf("remove stale %s: %w", r.path, err))
			continue
		}
		swept = append(swept, e.Name())
	}
	return swept, errors.Join(errs...)
}
