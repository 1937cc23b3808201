package sandbox

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
		if err := mkdirReadable(root, m.Source); err != nil {
			return fmt.Errorf("browser configuration copy: %w", err)
		}
		if err := copyConfigDir(m.Target, m.Source); err != nil {
			return fmt.Errorf("copy browser configuration %s: %w (list %s in filesystem_policy to have the host's as it is, without the sandbox CA)", m.Target, err, m.Target)
		}
		p := filepath.Join(m.Source, plan.BrowserPolicyFile)
		if err := mkdirReadable(m.Source, filepath.Dir(p)); err != nil {
			return err
		}
		if err := writeReadable(p, policy); err != nil {
			return fmt.Errorf("write browser policy: %w", err)
		}
	}
	return nil
}

// copyConfigDir copies the tree at src to dst: directories, regular files
// and symbolic links (as links, which resolve inside the sandbox as they
// would have), within the bounds above. Other kinds are left out.
func copyConfigDir(src, dst string) error {
	entries, total := 0, int64(0)
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
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
		switch {
		case d.IsDir():
			return mkdirReadable(dst, out)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, out)
		case d.Type().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			return writeFile(out, func(w io.Writer) error {
				n, err := io.Copy(w, io.LimitReader(in, maxBrowserBytes-total+1))
				if total += n; err == nil && total > maxBrowserBytes {
					err = fmt.Errorf("more than %d bytes", maxBrowserBytes)
				}
				return err
			})
		}
		return nil
	})
}
