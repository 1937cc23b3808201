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
		if d := s.Text(); filepath.IsAbs(d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// RecordWritable adds dirs to the record, each once, keeping the newest
// maxWritable. The file is replaced whole (written beside and renamed),
// so a reader never sees half of it.
func RecordWritable(state string, dirs []string) error {
	old := WritableBefore(state)
	all := old
	for _, d := range dirs {
		if filepath.IsAbs(d) && !slices.Contains(all, d) && !strings.Contains(d, "\n") {
			all = append(all, d)
		}
	}
	if len(all) == len(old) {
		return nil
	}
	if len(all) > maxWritable {
		all = all[len(all)-maxWritable:]
	}
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
