package statedir

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// maxWritable bounds the record: the newest directories are kept.
const maxWritable = 4096

// Writable records the host directories sandboxes were given to write
// (working directories, read_write paths), so a later run can refuse a
// symlink found in one of them: a sandbox could have planted it to steer
// that run's working directory somewhere it should not write.
func Writable(state string) string { return filepath.Join(state, "writable") }

// WritableBefore returns the directories earlier sandboxes with this state
// directory could write; none when nothing was recorded.
func WritableBefore(state string) []string {
	f, err := os.Open(Writable(state))
	if err != nil {
		return nil
	}
	defer f.Close()
	var dirs []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if d := s.Text(); filepath.IsAbs(d) && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// RecordWritable adds dirs to the record, each once. It appends, so runs
// recording at once lose nothing; past maxWritable lines the record is
// rewritten with the newest, each once (written beside and renamed, so a
// reader never sees half of it).
func RecordWritable(state string, dirs []string) error {
	old := WritableBefore(state)
	var add []string
	for _, d := range dirs {
		if filepath.IsAbs(d) && !strings.Contains(d, "\n") && !slices.Contains(old, d) && !slices.Contains(add, d) {
			add = append(add, d)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if len(old)+len(add) > maxWritable {
		return rewriteWritable(state, append(old, add...))
	}
	f, err := os.OpenFile(Writable(state), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strings.Join(add, "\n") + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rewriteWritable replaces the record with the newest maxWritable of all.
func rewriteWritable(state string, all []string) error {
	all = all[max(0, len(all)-maxWritable):]
	tmp, err := os.CreateTemp(state, ".writable-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(strings.Join(all, "\n") + "\n"); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), Writable(state))
}
