//go:build linux

package procident

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// A process runs its executable's code only as long as nothing else was
// loaded into it. Code mapped from a file the sandbox can write (a library
// dropped in the workdir and loaded with LD_PRELOAD, dlopen or
// LD_LIBRARY_PATH, a memfd) makes it a different program under the same
// name, so it no longer speaks for a policy bound to that name. The kernel
// keeps /proc/<pid>/maps, which the process cannot rewrite; the
// environment is the process's own memory and is only a second hint.

// untrusted returns why pid cannot be taken for exe, or "".
func (r *Resolver) untrusted(pid int, exe string) (string, error) {
	why, err := r.untrustedMaps(pid, exe)
	if why != "" || err != nil {
		return why, err
	}
	// The environment as the exec left it, where the exec watch saw it:
	// a preloaded library may have cleared the live one since.
	if r.Execs != nil {
		if at, ok := r.Execs.atExec(pid); ok {
			return at.preload, nil
		}
	}
	env, err := readEnv(pid)
	if err != nil {
		return "", err
	}
	return preloadVar(env), nil
}

// preloadVar says which variable of env has the dynamic loader load code
// besides the program, or "".
func preloadVar(env []string) string {
	for _, kv := range env {
		for _, name := range []string{"LD_PRELOAD", "LD_AUDIT"} {
			if v, ok := strings.CutPrefix(kv, name+"="); ok && v != "" {
				return "started with " + name
			}
		}
	}
	return ""
}

// untrustedMaps looks at the executable mappings of pid.
func (r *Resolver) untrustedMaps(pid int, exe string) (string, error) {
	bp, err := readProc("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return "", fmt.Errorf("procident: memory maps of pid %d: %w", pid, err)
	}
	defer putBuf(bp)
	for rest := *bp; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		// address perms offset dev inode path; only executable
		// mappings matter, and most are not.
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 || len(line) < sp+4 || line[sp+3] != 'x' {
			continue
		}
		f := strings.SplitN(string(line), " ", 6)
		if len(f) < 6 {
			continue
		}
		p := strings.TrimLeft(f[5], " ")
		switch {
		case strings.HasPrefix(p, "/memfd:"):
			return "runs code from a memfd (" + p + ")", nil
		case !strings.HasPrefix(p, "/"):
			continue // anonymous (JIT), [vdso], [vsyscall]
		}
		p = strings.TrimSuffix(p, " (deleted)")
		if p == exe {
			continue // the executable itself is hashed on its own
		}
		if m := r.mountOf(p); m.writable {
			return fmt.Sprintf("maps executable code from %s, which the sandbox can write (%s)", p, m.point), nil
		}
	}
	return "", nil
}

type mountPoint struct {
	point    string
	writable bool
}

// mountOf is the mount holding p in the sandbox: the longest mount point
// that is p or a parent of it. The table is read once from the init, whose
// mount namespace the workload shares; nothing inside can mount.
func (r *Resolver) mountOf(p string) mountPoint {
	r.mountsOnce.Do(func() { r.mounts = readMounts(r.InitPID) })
	best := mountPoint{writable: true} // no table: assume the worst
	for _, m := range r.mounts {
		if under(p, m.point) && (best.point == "" || len(m.point) > len(best.point)) {
			best = m
		}
	}
	return best
}

func under(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// readMounts reads the mount table as pid sees it: each mount point and
// whether the mount itself (not its superblock) is writable.
func readMounts(pid int) []mountPoint {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	infos, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		return nil
	}
	ms := make([]mountPoint, 0, len(infos))
	for _, m := range infos {
		ms = append(ms, mountPoint{point: m.Mountpoint, writable: slices.Contains(strings.Split(m.Options, ","), "rw")})
	}
	return ms
}
