package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/advisor/policylocal"
	"github.com/corral-sandbox/corral/internal/egress/assemble"
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
	runs := statedir.Runs(stateDir)
	if err := os.MkdirAll(runs, 0o700); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	// The directory appears under its real name only once its lock is
	// held, so a concurrent sweep can never mistake it for a stale one.
	// It is 0700: only this user (and the init, which is this user or
	// root) may enter, and the control socket lives here.
	tmp, err := os.MkdirTemp(runs, newPrefix+id+"-")
	if err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(tmp, "lock"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err == nil {
		err = os.Mkdir(filepath.Join(tmp, "root"), 0o700)
	}
	p := statedir.Run(stateDir, id)
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("create run directory %s: %w", p, err)
	}
	return &runDir{state: stateDir, id: id, path: p, lock: f}, nil
}

func (r *runDir) root() string { return filepath.Join(r.path, "root") }

// newPrefix marks run directories still being created.
const newPrefix = ".new-"

// remove deletes only what corral put there. The root mountpoint is removed
// with rmdir, never recursively: if it were somehow still a mountpoint with
// host binds below it, a recursive delete would destroy host files.
func (r *runDir) remove() error {
	skills := filepath.Join(statedir.TLS(r.state, r.id), "skills")
	errs := []error{
		os.RemoveAll(statedir.Ephemeral(r.state, r.id)),
		ignoreNotExist(unix.Rmdir(r.root())),
		ignoreNotExist(os.Remove(filepath.Join(r.path, "lock"))),
		ignoreNotExist(os.Remove(statedir.Control(r.state, r.id))),
		ignoreNotExist(os.Remove(statedir.ResolvConf(r.state, r.id))),
		ignoreNotExist(os.Remove(statedir.Hosts(r.state, r.id))),
		// Copies of host files only, never a mountpoint: the sandbox's
		// mounts of them are in its own mount namespace.
		os.RemoveAll(statedir.Browser(r.state, r.id)),
		ignoreNotExist(os.Remove(filepath.Join(statedir.TLS(r.state, r.id), "ca.pem"))),
		ignoreNotExist(os.Remove(filepath.Join(statedir.TLS(r.state, r.id), "ca-bundle.pem"))),
		ignoreNotExist(os.Remove(filepath.Join(statedir.TLS(r.state, r.id), assemble.JavaTrustStoreFile))),
		ignoreNotExist(os.Remove(filepath.Join(skills, filepath.Base(policylocal.SkillPath)))),
		ignoreNotExist(unix.Rmdir(skills)),
		ignoreNotExist(unix.Rmdir(statedir.TLS(r.state, r.id))),
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

// sweepRunDirs removes run directories left by supervisors that died
// without cleaning up, and returns their ids. A directory is stale when
// nobody holds its lock; the sweeper takes the lock itself while removing,
// so two sweepers never remove the same directory.
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
		name := e.Name()
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(statedir.Runs(stateDir), name)
		if strings.HasPrefix(name, newPrefix) {
			// A supervisor killed while creating its directory; give a
			// live one ample time to finish before treating it as dead.
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute && lockFree(dir) {
				errs = append(errs, os.RemoveAll(dir))
			}
			continue
		}
		f, err := os.Open(filepath.Join(dir, "lock"))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close()
			continue // live, or another sweeper has it
		}
		r := &runDir{state: stateDir, id: name, path: dir, lock: f}
		if err := r.remove(); err != nil {
			errs = append(errs, fmt.Errorf("remove stale %s: %w", r.path, err))
			continue
		}
		swept = append(swept, name)
	}
	return swept, errors.Join(errs...)
}

func lockFree(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		return true
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
}
