package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/corral-sandbox/corral/internal/statedir"
)

func TestSweepRemovesOnlyStaleRuns(t *testing.T) {
	state := t.TempDir()
	live, err := newRunDir(state, "live")
	if err != nil {
		t.Fatal(err)
	}
	defer live.remove()
	stale, err := newRunDir(state, "stale")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(statedir.Ephemeral(state, "stale"), 0o700); err != nil {
		t.Fatal(err)
	}
	// A supervisor killed with SIGKILL leaves its directory with the lock
	// released (the kernel drops flocks with the process).
	stale.lock.Close()

	swept, err := sweepRunDirs(state)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(swept, []string{"stale"}) {
		t.Fatalf("swept %v, want [stale]", swept)
	}
	if _, err := os.Stat(statedir.Run(state, "stale")); !os.IsNotExist(err) {
		t.Errorf("stale run directory still exists: %v", err)
	}
	if _, err := os.Stat(filepath.Join(statedir.Run(state, "live"), "lock")); err != nil {
		t.Errorf("live run directory was touched: %v", err)
	}
}

// The root mountpoint is removed with rmdir only: if it still held files
// (a mount that somehow outlived its namespace), sweeping must not delete them.
func TestRemoveNeverRecursesIntoRoot(t *testing.T) {
	state := t.TempDir()
	r, err := newRunDir(state, "x")
	if err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(r.path, "root", "host-file")
	if err := os.WriteFile(keep, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.remove(); err == nil {
		t.Error("remove succeeded although the root mountpoint was not empty")
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("remove deleted a file under the root mountpoint: %v", err)
	}
}
