//go:build linux

package idmap

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Through an idmapped copy of a root-owned directory, the directory is
// nobody's, and a file nobody creates there is root's on disk.
func TestApply(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("idmapped mounts need root")
	}
	dir := t.TempDir()
	m := Mapping{DiskUID: 0, DiskGID: 0, UID: 65534, GID: 65534}
	if err := Probe(dir, m); err != nil {
		t.Skipf("this host cannot idmap %s: %v", dir, err)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tree)
	if err := Apply(tree, m); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(tree, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("through the idmapped mount the directory is %d:%d, want 65534:65534", st.Uid, st.Gid)
	}
	if err := Apply(tree, m); err == nil {
		t.Error("idmapping an idmapped mount again succeeded")
	}

	// Create as nobody: fsuid/fsgid are per thread.
	err = func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		unix.Setfsgid(65534)
		unix.Setfsuid(65534)
		defer func() {
			unix.Setfsuid(0)
			unix.Setfsgid(0)
		}()
		fd, err := unix.Openat(tree, "made", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}()
	if err != nil {
		t.Fatalf("nobody cannot create a file through the idmapped mount: %v", err)
	}
	if err := unix.Lstat(filepath.Join(dir, "made"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Gid != 0 {
		t.Errorf("the file nobody created is %d:%d on disk, want 0:0", st.Uid, st.Gid)
	}
}

func TestProbeRefusesWhatItCannotMap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	// procfs does not support idmapped mounts.
	if err := Probe("/proc", Mapping{UID: 65534, GID: 65534}); err == nil {
		t.Error("Probe(/proc) succeeded")
	}
}

// A success is remembered per mount and boot; a refusal is not.
func TestProbeOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, ok := probeKey("/proc"); !ok {
		t.Skip("this kernel has no unique mount ids (Linux 6.8 or later)")
	}
	cache, work := filepath.Join(t.TempDir(), "probes"), t.TempDir()
	m := Mapping{DiskUID: 0, DiskGID: 0, UID: 65534, GID: 65534}
	if err := ProbeOnce(cache, work, m); err != nil {
		t.Skipf("this host cannot idmap %s: %v", work, err)
	}
	key, _ := probeKey(work)
	if _, err := os.Stat(filepath.Join(cache, key)); err != nil {
		t.Fatalf("the success was not remembered: %v", err)
	}
	if err := ProbeOnce(cache, "/proc", m); err == nil {
		t.Fatal("ProbeOnce(/proc) succeeded")
	}
	procKey, _ := probeKey("/proc")
	if _, err := os.Stat(filepath.Join(cache, procKey)); err == nil {
		t.Fatal("a refusal was remembered")
	}
	// What is remembered is not probed again.
	if err := os.WriteFile(filepath.Join(cache, procKey), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ProbeOnce(cache, "/proc", m); err != nil {
		t.Fatalf("a remembered success was probed again: %v", err)
	}
}
