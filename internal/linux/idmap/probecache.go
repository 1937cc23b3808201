//go:build linux

package idmap

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ProbeOnce is Probe with a success remembered in dir until the machine
// restarts. Whether a mount takes an idmapping depends on its filesystem
// and the kernel, not on the run; and a probe forks the calling process,
// whose every page is then copied on its next write, which cost each
// start of a sandbox with an idmapped workdir tens of milliseconds on a
// VM. A remembered success that no longer holds (a mount added below path
// since) makes the sandbox's own idmapped mount fail, and the run with it:
// never a silent downgrade.
func ProbeOnce(dir, path string, m Mapping) error {
	key, ok := probeKey(path)
	if !ok {
		return Probe(path, m)
	}
	marker := filepath.Join(dir, key)
	if fi, err := os.Lstat(marker); err == nil && fi.Mode().IsRegular() {
		return nil
	}
	if err := Probe(path, m); err != nil {
		return err
	}
	// Best effort: a marker that cannot be written costs the next run a
	// probe, nothing else.
	if os.MkdirAll(dir, 0o700) == nil {
		_ = os.WriteFile(marker, nil, 0o600)
	}
	return nil
}

// probeKey names the mount holding path in this boot: the boot id and the
// mount's unique id, which the kernel (6.8 and later) never gives another
// mount. Without either there is no key and every probe runs.
func probeKey(path string) (string, bool) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &st); err != nil || st.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return "", false
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	id := strings.TrimSpace(string(boot))
	if err != nil || id == "" || strings.ContainsAny(id, "/.") {
		return "", false
	}
	return id + "-" + strconv.FormatUint(st.Mnt_id, 10), true
}
