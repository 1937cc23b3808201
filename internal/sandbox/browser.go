package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// Bounds on a browser configuration directory copied from the host: it
// holds a few small files; anything larger is not what it should be.
const (
	maxBrowserEntries = 4096
	maxBrowserBytes   = 16 << 20
)

// writeBrowserConfig makes, for each browser configuration directory the
// plan covers, a copy of the host's directory with corral's managed policy
// added (policy is its content).
func (s *supervisor) writeBrowserConfig(policy []byte) error {
	root := statedir.Browser(s.StateDir, s.ID)
	for _, m := range s.Plan.Mounts {
		if !strings.HasPrefix(m.Source, root+"/") {
			continue
		}
		// The copy's own directory is made by copyConfigDir, as the
		// host's is. The ones above it are only the bind's source path,
		// which the workload never walks.
		if err := os.MkdirAll(filepath.Dir(m.Source), 0o700); err != nil {
			return fmt.Errorf("browser configuration copy: %w", err)
		}
		if err := copyConfigDir(m.Target, m.Source); err != nil {
			return fmt.Errorf("copy browser configuration %s: %w (list %s in filesystem_policy to have the host's as it is, without the sandbox CA)", m.Target, err, m.Target)
		}
		if err := addBrowserPolicy(m.Source, policy); err != nil {
			return err
		}
	}
	return nil
}

// addBrowserPolicy puts policy at plan.BrowserPolicyFile in the copy at
// dir. Nothing on the way is followed: a symbolic link the host has there
// would lead outside the copy, to the host's own files, so it is replaced
// by a directory of corral's (its target's policies are then not seen
// inside).
func addBrowserPolicy(dir string, policy []byte) error {
	for _, part := range strings.Split(filepath.Dir(plan.BrowserPolicyFile), "/") {
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
		if err == nil && fi.IsDir() {
			// A directory the host has keeps its mode.
			continue
		}
		if err == nil {
			if err := os.Remove(dir); err != nil {
				return fmt.Errorf("browser policy directory: %w", err)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("browser policy directory: %w", err)
		}
		// 0755, for the browser to read as the workload's user.
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("browser policy directory: %w", err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return fmt.Errorf("browser policy directory: %w", err)
		}
	}
	file := filepath.Join(dir, filepath.Base(plan.BrowserPolicyFile))
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write browser policy: %w", err)
	}
	if err := writeReadable(file, policy); err != nil {
		return fmt.Errorf("write browser policy: %w", err)
	}
	return nil
}

// copyConfigDir copies the tree at src to dst: directories, regular files
// and symbolic links (as links, which resolve inside the sandbox as they
// would have), within the bounds above; other kinds are left out. Modes,
// and owners where corral may set them, are the host's, so the copy
// protects what the host's bind did: a 0600 file stays unreadable to the
// workload. What corral itself cannot read (rootless) is left out, as the
// workload could not have read it either.
func copyConfigDir(src, dst string) error {
	entries, total := 0, int64(0)
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrPermission) && p != src {
				if d != nil && d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			return err
		}
		if entries++; entries > maxBrowserEntries {
			return fmt.Errorf("more than %d entries", maxBrowserEntries)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(out, 0o700); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, out)
		case d.Type().IsRegular():
			in, err := os.Open(p)
			if errors.Is(err, fs.ErrPermission) {
				return nil
			}
			if err != nil {
				return err
			}
			defer in.Close()
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			n, err := io.Copy(f, io.LimitReader(in, maxBrowserBytes-total+1))
			if total += n; err == nil && total > maxBrowserBytes {
				err = fmt.Errorf("more than %d bytes", maxBrowserBytes)
			}
			if err := errors.Join(err, f.Close()); err != nil {
				return err
			}
		default:
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
			if err := os.Lchown(out, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
		return os.Chmod(out, info.Mode().Perm())
	})
}
