//go:build linux

package procident

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/pathwalk"
)

// maxArgs bounds the command-line scan: enough for any interpreter
// invocation, small enough that a huge argv costs little.
const maxArgs = 64

// cmdlinePaths returns the script an interpreter runs (see scriptArg),
// when it is a regular file, canonical (symlinks resolved) as the sandbox
// sees it. `node /usr/local/bin/claude` gives the script, and a relative
// `python3 ./tool.py` is resolved against the process's working directory.
// Only the script position counts: in `python3 evil.py
// /usr/local/bin/claude` the trusted file is a mere argument and must not
// lend evil.py its policy.
//
// Files are looked up inside the process's own root, never the
// supervisor's, and each one is integrity-checked like an executable.
func (r *Resolver) cmdlinePaths(pid int, exe string) ([]string, error) {
	proc := "/proc/" + strconv.Itoa(pid)
	// The live command line is the process's own memory, which it can
	// rewrite; the one recorded at exec is preferred where it exists.
	at, ok := execRecord{}, false
	if r.Execs != nil {
		at, ok = r.Execs.atExec(pid)
	}
	if !ok || at.args == nil {
		var err error
		if at.args, err = readArgs(pid); err != nil {
			return nil, err
		}
		if len(at.args) > 1 {
			env, err := readEnv(pid)
			if err != nil {
				return nil, err
			}
			if at.loads, err = execLoads(pid, exe, at.args[1:], env); err != nil {
				return nil, err
			}
		}
	}
	if len(at.args) <= 1 || at.loads != "" {
		// Code the environment loads runs before the script, in the
		// same process: the process is no longer only that script.
		return nil, nil
	}
	script := scriptArg(exe, at.args[1:])
	if script == "" || len(script) > unix.PathMax {
		return nil, nil
	}
	rootfd, err := unix.Open(proc+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("procident: root of pid %d: %w", pid, err)
	}
	defer unix.Close(rootfd)

	if !path.IsAbs(script) {
		cwd, err := os.Readlink(proc + "/cwd")
		if err != nil || !path.IsAbs(cwd) {
			return nil, nil
		}
		script = path.Join(cwd, script)
	}
	// A clean path that opens without meeting a symlink is its own
	// canonical form: walking it would find no link to follow. Only a path
	// that does meet one (or does not open) is walked component by
	// component.
	p, pfd, err := script, -1, error(unix.ELOOP)
	var st unix.Stat_t
	if path.Clean(p) == p {
		pfd, err = openRegular(rootfd, p, &st)
	}
	if err != nil {
		if p, err = resolveInRoot(rootfd, script); err != nil {
			return nil, nil
		}
		if pfd, err = openRegular(rootfd, p, &st); err != nil {
			return nil, nil // not a regular file in the sandbox: not a script
		}
	}
	defer unix.Close(pfd)
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	readable := func() (*os.File, error) {
		var err error
		f, err = reopen(pfd, p)
		return f, err
	}
	if _, err := r.verify(p, &st, readable, true); err != nil {
		return nil, err
	}
	return []string{p}, nil
}

// readArgs reads pid's command line, argv[0] included, at most maxArgs
// arguments after it.
func readArgs(pid int) ([]string, error) {
	raw, err := readProcString("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, fmt.Errorf("procident: cmdline of pid %d: %w", pid, err)
	}
	args := strings.Split(strings.TrimRight(raw, "\x00"), "\x00")
	if len(args) > maxArgs+1 {
		args = args[:maxArgs+1]
	}
	return args, nil
}

// readEnv reads the environment pid's exec left in its memory (which the
// process can overwrite later: the exec watch reads it at once).
func readEnv(pid int) ([]string, error) {
	raw, err := readProcString("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, fmt.Errorf("procident: environment of pid %d: %w", pid, err)
	}
	return strings.Split(strings.TrimRight(raw, "\x00"), "\x00"), nil
}

// resolveInRoot canonicalises the absolute path p inside the directory
// rootfd, following symlinks as a process chrooted there would: absolute
// link targets restart at rootfd, and ".." never climbs above it. The
// kernel cannot do this for us through /proc/<pid>/root: it would resolve
// absolute links against the supervisor's root.
func resolveInRoot(rootfd int, p string) (string, error) {
	return pathwalk.Resolve(inRoot(rootfd), p, nil)
}

// inRoot is the filesystem below rootfd.
type inRoot int

func (fd inRoot) IsLink(p string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(int(fd), rel(p), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFLNK, nil
}

func (fd inRoot) Readlink(p string) (string, error) { return readlinkat(int(fd), rel(p)) }

// rel turns an absolute in-root path into one relative to the root fd.
func rel(p string) string {
	if r := strings.TrimLeft(p, "/"); r != "" {
		return r
	}
	return "."
}

func readlinkat(dirfd int, p string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, p, buf)
	if err != nil {
		return "", err
	}
	if n == len(buf) {
		return "", unix.ENAMETOOLONG
	}
	return string(buf[:n]), nil
}

// openRegular opens the canonical path p with O_PATH, confined to rootfd
// and refusing any symlink, so a path swapped since resolveInRoot fails
// instead of leading elsewhere, and fills st. Only a regular file is
// opened: opening a device or FIFO for reading (reopen) can block or have
// side effects, and the supervisor is root.
func openRegular(rootfd int, p string, st *unix.Stat_t) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	pfd, err := unix.Openat2(rootfd, rel(p), &how)
	if err != nil {
		return -1, err
	}
	if err := unix.Fstat(pfd, st); err != nil {
		unix.Close(pfd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(pfd)
		return -1, errors.New("not a regular file")
	}
	return pfd, nil
}

// reopen opens the file an O_PATH descriptor from openRegular holds for
// reading. Going through /proc/self/fd reaches the very inode checked,
// with no second path walk.
func reopen(pfd int, name string) (*os.File, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}
