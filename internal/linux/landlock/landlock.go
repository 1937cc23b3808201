//go:build linux

// Package landlock confines the sandbox's filesystem access with Landlock, as
// a second layer under the mount namespace: only the listed paths (and what
// lies beneath them) stay reachable, read-only or read-write.
//
// Apply uses the best Landlock ABI the kernel offers (through go-landlock)
// and restricts every thread of the process, not only the caller's:
//
//   - ABI >= 8: landlock_restrict_self with LANDLOCK_RESTRICT_SELF_TSYNC.
//   - ABI < 8: go-landlock runs prctl(PR_SET_NO_NEW_PRIVS) and
//     landlock_restrict_self on each thread through the psx package, which
//     with CGO_ENABLED=0 is syscall.AllThreadsSyscall. AllThreadsSyscall
//     fails with ENOTSUP in a cgo binary, where psx instead needs its C
//     library linked in; corral is built without cgo.
//
// The caller needs nothing beyond calling Apply before exec; locking the OS
// thread is harmless. Landlock survives execve, so the workload inherits it.
package landlock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	ll "github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Compatibility says what to do when the kernel cannot enforce the policy.
type Compatibility string

// The compatibility modes of the policy's landlock.compatibility key.
const (
	// BestEffort enforces what the kernel supports and reports the rest in
	// Result.Skipped. It is the default when Compat is empty.
	BestEffort Compatibility = "best_effort"
	// HardRequirement fails instead of enforcing less than asked.
	HardRequirement Compatibility = "hard_requirement"
)

// Config is the filesystem allowlist. Paths are absolute as the sandboxed
// process sees them (after pivot_root); a directory entry covers everything
// beneath it. Whatever is not listed is denied, including execute. ReadOnly
// grants read and execute; ReadWrite grants everything, including renames
// across directories, device ioctls and connecting to UNIX sockets as far as
// the kernel's ABI can express them. A path in both lists is read-write.
//
// Network rules (TCP bind/connect ports, ABI >= 4) are meant to join as
// further fields; Apply already builds one ruleset for the whole Config.
type Config struct {
	ReadOnly  []string
	ReadWrite []string
	// ListOnly directories may be listed (READ_DIR) but grant no access to
	// the files in them. The sandbox's root is one: its entries are exactly
	// the policy's mountpoints, and tools expect `ls /` to work.
	ListOnly []string
	Compat   Compatibility
}

// Skipped is a path (or, with an empty Path, Landlock as a whole) that was
// not enforced in best_effort mode, with the reason to log.
type Skipped struct{ Path, Reason string }

// Result describes what Apply enforced or Plan would enforce.
type Result struct {
	ABI     int      // Landlock ABI used; 0 = Landlock not enforced
	Rules   []string // e.g. "ro /usr", "rw /tmp", "ro /etc/hosts (file)"
	Skipped []Skipped
}

// maxABI is the newest ABI go-landlock knows; a newer kernel is used at this
// level, which it supports by Landlock's backward compatibility.
const maxABI = 11

var abiConfigs = [maxABI + 1]ll.Config{
	1: ll.V1, 2: ll.V2, 3: ll.V3, 4: ll.V4, 5: ll.V5, 6: ll.V6,
	7: ll.V7, 8: ll.V8, 9: ll.V9, 10: ll.V10, 11: ll.V11,
}

// BestABI returns the Landlock ABI version usable on the running kernel
// (landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)), or 0
// when Landlock is not built in or not enabled at boot.
func BestABI() int {
	v, _ := probeABI()
	return v
}

func probeABI() (int, error) {
	v, err := llsys.LandlockGetABIVersion()
	switch {
	case errors.Is(err, unix.ENOSYS):
		return 0, errors.New("kernel built without Landlock (ENOSYS)")
	case errors.Is(err, unix.EOPNOTSUPP):
		return 0, errors.New("landlock disabled at boot; add landlock to the lsm= kernel parameter (EOPNOTSUPP)")
	case err != nil:
		return 0, fmt.Errorf("querying the Landlock ABI: %w", err)
	case v < 1:
		return 0, fmt.Errorf("kernel reports Landlock ABI %d", v)
	}
	// go-landlock treats an ABI >= 6 kernel lacking the fix for Landlock
	// erratum 2 as ABI 5; asking it for more would fail in
	// hard_requirement mode.
	if v >= 6 {
		if errata, err := llsys.LandlockGetErrata(); err != nil || errata&0x2 == 0 {
			v = 5
		}
	}
	return v, nil
}

// Apply restricts the calling process to cfg. On success in best_effort mode
// the Result may list skipped paths, or report ABI 0 when the kernel has no
// Landlock at all; the caller should log those as warnings.
func Apply(cfg Config) (Result, error) {
	abi, why := probeABI()
	p, err := plan(cfg, abi, why, statPath)
	if err != nil {
		return Result{}, err
	}
	if p.res.ABI == 0 {
		return p.res, nil
	}

	llcfg := abiConfigs[p.res.ABI]
	// Network rights stay unhandled (the network namespace and seccomp
	// govern the network); IPC scoping (ABI >= 6) is kept: the workload
	// cannot signal processes outside its domain, such as the sandbox's
	// init, nor reach abstract UNIX sockets created outside it, such as the
	// host's when the policy shares the host network.
	llcfg.HandledAccessNet = 0
	if p.bestEffort {
		llcfg = llcfg.BestEffort()
	}
	if err := llcfg.Restrict(p.rules(p.bestEffort)...); err != nil {
		return Result{}, fmt.Errorf("landlock: restricting to ABI %d ruleset: %w", p.res.ABI, err)
	}
	return p.res, nil
}

func statPath(path string) (bool, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return fi.IsDir(), nil
}

// Plan reports what Apply would enforce for cfg on a kernel offering abi,
// using stat to look at the paths (isDir, or an error wrapping
// fs.ErrNotExist for a missing path). It makes no system calls of its own.
func Plan(cfg Config, abi int, stat func(string) (isDir bool, err error)) (Result, error) {
	var why error
	if abi < 1 {
		why = errors.New("kernel reports no Landlock ABI")
	}
	p, err := plan(cfg, abi, why, stat)
	if err != nil {
		return Result{}, err
	}
	return p.res, nil
}

type planned struct {
	res        Result
	bestEffort bool
	abi        int
	roDirs     []string
	roFiles    []string
	rwDirs     []string
	rwFiles    []string
	listDirs   []string
}

func plan(cfg Config, abi int, unavailable error, stat func(string) (bool, error)) (planned, error) {
	var p planned
	switch cfg.Compat {
	case BestEffort, "":
		p.bestEffort = true
	case HardRequirement:
	default:
		return p, fmt.Errorf("landlock: unknown compatibility %q (want best_effort or hard_requirement)", cfg.Compat)
	}
	ro, err := cleanPaths(cfg.ReadOnly)
	if err != nil {
		return p, err
	}
	rw, err := cleanPaths(cfg.ReadWrite)
	if err != nil {
		return p, err
	}

	if abi < 1 {
		if !p.bestEffort {
			return p, fmt.Errorf("landlock is required by policy (landlock.compatibility: hard_requirement) but unavailable: %v", unavailable)
		}
		p.res.Skipped = []Skipped{{Reason: fmt.Sprintf("landlock unavailable on this kernel: %v", unavailable)}}
		return p, nil
	}
	p.abi = min(abi, maxABI)
	p.res.ABI = p.abi

	add := func(path, mode string, dirs, files *[]string) error {
		isDir, err := stat(path)
		if err != nil {
			reason := err.Error()
			if errors.Is(err, fs.ErrNotExist) {
				reason = "does not exist"
			}
			if !p.bestEffort {
				return fmt.Errorf("landlock: %s path %s: %s (landlock.compatibility: hard_requirement)", mode, path, reason)
			}
			p.res.Skipped = append(p.res.Skipped, Skipped{Path: path, Reason: reason})
			return nil
		}
		if isDir {
			*dirs = append(*dirs, path)
			p.res.Rules = append(p.res.Rules, mode+" "+path)
		} else {
			*files = append(*files, path)
			p.res.Rules = append(p.res.Rules, mode+" "+path+" (file)")
		}
		return nil
	}
	for _, path := range ro {
		if err := add(path, "ro", &p.roDirs, &p.roFiles); err != nil {
			return p, err
		}
	}
	for _, path := range rw {
		if err := add(path, "rw", &p.rwDirs, &p.rwFiles); err != nil {
			return p, err
		}
	}
	list, err := cleanPaths(cfg.ListOnly)
	if err != nil {
		return p, err
	}
	var notDirs []string
	for _, path := range list {
		if err := add(path, "list", &p.listDirs, &notDirs); err != nil {
			return p, err
		}
	}
	if len(notDirs) > 0 {
		return p, fmt.Errorf("landlock: list-only paths must be directories: %v", notDirs)
	}
	return p, nil
}

func cleanPaths(paths []string) ([]string, error) {
	out := make([]string, 0, len(paths))
	seen := map[string]bool{}
	for _, path := range paths {
		if !filepath.IsAbs(path) {
			return nil, fmt.Errorf("landlock: path %q is not absolute", path)
		}
		path = filepath.Clean(path)
		if !seen[path] {
			seen[path] = true
			out = append(out, path)
		}
	}
	return out, nil
}

// rules turns the plan into go-landlock rules. Beyond go-landlock's presets,
// read-write paths also get
//   - REFER on directories (ABI >= 2), so renames and hard links between
//     writable directories work instead of failing with EXDEV;
//   - IOCTL_DEV (ABI >= 5), so terminals and other devices opened there
//     stay usable;
//   - RESOLVE_UNIX (ABI >= 9), so connecting to a pathname UNIX socket
//     that the policy placed in a read-write path works; read-only paths
//     do not get it.
//
// Each is only added when the ABI has it: go-landlock's best-effort mode
// drops the entire ruleset if a rule asks for REFER on a kernel without it.
func (p planned) rules(ignoreMissing bool) []ll.Rule {
	var rules []ll.Rule
	add := func(r ll.FSRule, paths []string) {
		if len(paths) == 0 {
			return
		}
		// The path was just stat'ed; if it vanished since, best_effort
		// treats it like a path that was missing from the start.
		if ignoreMissing {
			r = r.IgnoreIfMissing()
		}
		rules = append(rules, r)
	}
	add(ll.RODirs(p.roDirs...), p.roDirs)
	add(ll.ROFiles(p.roFiles...), p.roFiles)

	rwDirs, rwFiles := ll.RWDirs(p.rwDirs...), ll.RWFiles(p.rwFiles...)
	if p.abi >= 2 {
		rwDirs = rwDirs.WithRefer()
	}
	if p.abi >= 5 {
		rwDirs, rwFiles = rwDirs.WithIoctlDev(), rwFiles.WithIoctlDev()
	}
	if p.abi >= 9 {
		rwDirs, rwFiles = rwDirs.WithResolveUnix(), rwFiles.WithResolveUnix()
	}
	add(rwDirs, p.rwDirs)
	add(rwFiles, p.rwFiles)
	add(ll.PathAccess(llsys.AccessFSReadDir, p.listDirs...), p.listDirs)
	return rules
}
