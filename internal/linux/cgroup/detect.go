// Package cgroup puts a sandbox into its own cgroup so memory, pids and CPU
// limits are enforced by the kernel, detects OOM kills, kills every process
// left in the sandbox and removes the cgroup again.
//
// It supports pure cgroup v2 hosts, pure v1 hosts and hybrid hosts (v1
// controllers plus an empty cgroup2 at /sys/fs/cgroup/unified). On hybrid
// hosts limits go through the v1 controllers, and the sandbox is additionally
// placed in a controller-less cgroup2 group when possible, only so that Kill
// can use the atomic cgroup.kill instead of a signal loop.
//
// The files are written directly instead of through
// github.com/containerd/cgroups/v3, because that library does not fit a
// static, daemonless, logger-free binary: its cgroup1 constructor creates the
// group in every mounted v1 subsystem (cpuset, devices, freezer, blkio, ...)
// unless a custom hierarchy is supplied; its cgroup2 manager and helpers log
// through the global containerd/log (logrus) logger; it drags in go-systemd,
// godbus, cilium/ebpf and protobuf, none of which the binary otherwise needs;
// and its mode detection is a cached statfs that says nothing about whether
// this process may write, or where a rootless caller's delegated subtree is.
// What is needed here is a dozen well-known files.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mode is the cgroup layout of the host.
type Mode string

const (
	ModeV2     Mode = "v2"
	ModeV1     Mode = "v1"
	ModeHybrid Mode = "hybrid"
	ModeNone   Mode = "none"
)

// Controller names, in the order they are reported.
const (
	Memory = "memory"
	Pids   = "pids"
	CPU    = "cpu"
)

var wanted = []string{Memory, Pids, CPU}

// parentName is the directory that groups every sandbox's cgroup so Sweep
// finds them without touching anything else on the host.
const parentName = "corral"

// Facts describe what this process can do with cgroups on this host.
type Facts struct {
	Mode Mode
	// Controllers are the usable controllers among memory, pids and cpu.
	Controllers []string
	// Writable says whether a sandbox cgroup can be created at all (as root,
	// or in a delegated cgroup2 subtree).
	Writable bool
	// Reason explains, for a human, why Writable is false or why some
	// controllers are missing. Empty when nothing is degraded.
	Reason string
	// Dirs maps each usable controller to the directory that holds corral/
	// for it. A controller whose directory equals Unified is driven through
	// cgroup v2 files, any other through v1 files.
	Dirs map[string]string
	// Unified is the cgroup2 directory that holds corral/, or "" when there is
	// no usable cgroup2 hierarchy.
	Unified string
	// NoSocketMemory is empty when a memory limit can also bound the
	// sandbox's TCP socket buffers, else why it cannot. Unread buffers are
	// memory the kernel holds for the workload; v2 charges them to
	// memory.max, v1 only to memory.kmem.tcp.limit_in_bytes.
	NoSocketMemory string
}

// Detect reads /proc/self/mountinfo and /proc/self/cgroup and probes
// writability by creating and removing an empty directory next to corral/.
func Detect() Facts {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return Facts{Mode: ModeNone, Reason: "cannot read /proc/self/mountinfo: " + err.Error()}
	}
	pc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return Facts{Mode: ModeNone, Reason: "cannot read /proc/self/cgroup: " + err.Error()}
	}
	mounts, err := parseMountinfo(bytes.NewReader(mi))
	if err != nil {
		return Facts{Mode: ModeNone, Reason: err.Error()}
	}
	ownV2, err := parseProcCgroupV2(bytes.NewReader(pc))
	if err != nil {
		return Facts{Mode: ModeNone, Reason: err.Error()}
	}
	f := detect(mounts, ownV2, os.Geteuid())
	cmdline, _ := os.ReadFile("/proc/cmdline")
	f.NoSocketMemory = socketMemory(f, string(cmdline))
	return f
}

// socketMemory says why the memory controller in f cannot charge TCP socket
// buffers, or "" when it can (or there is no memory controller to ask).
func socketMemory(f Facts, cmdline string) string {
	dir, ok := f.Dirs[Memory]
	switch {
	case !ok:
		return ""
	case f.isV2(Memory):
		if slices.Contains(strings.Fields(cmdline), "cgroup.memory=nosocket") {
			return "the kernel was booted with cgroup.memory=nosocket, so memory.max does not charge socket buffers"
		}
		return ""
	case !exists(dir, tcpLimitFile):
		return "this kernel's cgroup v1 memory controller has no " + tcpLimitFile + ", so TCP socket buffers are not charged"
	}
	return ""
}

type mount struct {
	root   string // path inside the cgroup hierarchy that is mounted
	point  string
	fstype string
	super  []string // super-block options; v1 controller names live here
}

func detect(mounts []mount, ownV2 string, euid int) Facts {
	var v2 *mount
	v1 := map[string]mount{}
	anyV1 := false
	for i := range mounts {
		m := mounts[i]
		switch m.fstype {
		case "cgroup2":
			// Containers sometimes carry extra cgroup2 mounts; the one under
			// /sys/fs/cgroup is the one the host's tooling agrees on.
			if v2 == nil || (!underSysfs(v2.point) && underSysfs(m.point)) {
				v2 = &mounts[i]
			}
		case "cgroup":
			anyV1 = true
			for _, o := range m.super {
				if slices.Contains(wanted, o) {
					if _, dup := v1[o]; !dup {
						v1[o] = m
					}
				}
			}
		}
	}

	f := Facts{Dirs: map[string]string{}}
	switch {
	case v2 != nil && anyV1:
		f.Mode = ModeHybrid
	case v2 != nil:
		f.Mode = ModeV2
	case anyV1:
		f.Mode = ModeV1
	default:
		f.Mode = ModeNone
		f.Reason = "no cgroup filesystem is mounted"
		return f
	}

	var reasons []string
	var v2Avail map[string]bool
	if v2 != nil {
		base, err := v2Base(*v2, ownV2, euid)
		if err == nil {
			if perr := probe(base); perr != nil {
				err = fmt.Errorf("cannot create cgroups in %s: %w", base, perr)
			}
		}
		if err == nil && euid != 0 {
			// Moving the sandbox out of our own cgroup needs write access to
			// cgroup.procs of the common ancestor, which is base.
			if aerr := unix.Access(filepath.Join(base, "cgroup.procs"), unix.W_OK); aerr != nil {
				err = fmt.Errorf("cannot move processes within %s: %w", base, aerr)
			}
		}
		switch {
		case err == nil:
			f.Unified = base
			var why []string
			v2Avail, why = v2Controllers(base)
			// On hybrid hosts a controller missing from cgroup2 is normal
			// (it is bound to v1), so only pure v2 explains the absence.
			if f.Mode == ModeV2 {
				reasons = append(reasons, why...)
			}
		case f.Mode == ModeV2:
			reasons = append(reasons, "cgroup v2: "+err.Error())
		}
	}

	probed := map[string]error{}
	// Every v1 hierarchy usually fails the same way; one sentence naming
	// all of them reads better than one per controller.
	var failMsgs []string
	failDirs := map[string][]string{}
	for _, c := range wanted {
		if m, ok := v1[c]; ok {
			perr, done := probed[m.point]
			if !done {
				perr = probe(m.point)
				probed[m.point] = perr
				if perr != nil {
					msg := perr.Error()
					if failDirs[msg] == nil {
						failMsgs = append(failMsgs, msg)
					}
					failDirs[msg] = append(failDirs[msg], m.point)
				}
			}
			if perr == nil {
				f.Dirs[c] = m.point
				f.Controllers = append(f.Controllers, c)
			}
			continue
		}
		if v2Avail[c] {
			f.Dirs[c] = f.Unified
			f.Controllers = append(f.Controllers, c)
			continue
		}
		if f.Mode != ModeV2 {
			reasons = append(reasons, fmt.Sprintf("no %s controller mounted", c))
		}
	}
	for _, msg := range failMsgs {
		reasons = append(reasons, fmt.Sprintf("cgroup v1: cannot create cgroups in %s: %s", strings.Join(failDirs[msg], ", "), msg))
	}
	f.Writable = f.Unified != "" || len(f.Controllers) > 0
	f.Reason = strings.Join(dedup(reasons), "; ")
	return f
}

func underSysfs(p string) bool {
	return p == "/sys/fs/cgroup" || strings.HasPrefix(p, "/sys/fs/cgroup/")
}

// v2Base picks the directory that will hold corral/. Root uses the top of the
// mount. Anyone else can only act inside a subtree delegated to them, and the
// sandbox cannot go below our own cgroup because a cgroup that holds processes
// may not enable controllers for children, so it goes next to it.
func v2Base(m mount, ownPath string, euid int) (string, error) {
	if euid == 0 {
		return m.point, nil
	}
	if !strings.HasPrefix(ownPath, "/") {
		return "", errors.New("not root and this process is in no cgroup2 group")
	}
	rel, ok := relInside(m.root, ownPath)
	if !ok {
		return "", fmt.Errorf("own cgroup %s is outside the mounted hierarchy %s", ownPath, m.root)
	}
	if rel == "" {
		return "", fmt.Errorf("not root and own cgroup is the top of %s, so there is no delegated parent to create a sibling in", m.point)
	}
	return filepath.Dir(filepath.Join(m.point, rel)), nil
}

func relInside(root, p string) (string, bool) {
	root = filepath.Clean(root)
	p = filepath.Clean(p)
	if root == "/" {
		return strings.TrimPrefix(p, "/"), true
	}
	if p == root {
		return "", true
	}
	if strings.HasPrefix(p, root+"/") {
		return p[len(root)+1:], true
	}
	return "", false
}

// v2Controllers reports which wanted controllers a child of base can get.
// The kernel refuses to enable a controller below a non-root cgroup that
// holds processes, so there only already-enabled ones count.
func v2Controllers(base string) (map[string]bool, []string) {
	avail := map[string]bool{}
	var why []string
	ctrl, err := readWords(filepath.Join(base, "cgroup.controllers"))
	if err != nil {
		return avail, []string{"cgroup v2: " + err.Error()}
	}
	sub, _ := readWords(filepath.Join(base, "cgroup.subtree_control"))
	// The true root has no cgroup.type, and is exempt from the
	// no-internal-processes rule.
	_, terr := os.Stat(filepath.Join(base, "cgroup.type"))
	isRoot := errors.Is(terr, os.ErrNotExist)
	busy := false
	if !isRoot {
		procs, _ := readPids(filepath.Join(base, "cgroup.procs"))
		busy = len(procs) > 0
	}
	canWrite := unix.Access(filepath.Join(base, "cgroup.subtree_control"), unix.W_OK) == nil
	for _, c := range wanted {
		switch {
		case !slices.Contains(ctrl, c):
			why = append(why, fmt.Sprintf("cgroup v2: %s not in %s/cgroup.controllers", c, base))
		case slices.Contains(sub, c):
			avail[c] = true
		case !canWrite:
			why = append(why, fmt.Sprintf("cgroup v2: cannot enable %s in %s/cgroup.subtree_control (not writable)", c, base))
		case busy:
			why = append(why, fmt.Sprintf("cgroup v2: cannot enable %s below %s because it holds processes", c, base))
		default:
			avail[c] = true
		}
	}
	return avail, why
}

// probe checks that a cgroup can be created in dir. Creating and removing a
// throw-away cgroup would be exact but costs milliseconds on every start
// (v1 rmdir is slow); write permission on the directory, checked with the
// effective ids, answers the same question. Errors carry only the errno:
// callers name the dir.
func probe(dir string) error {
	err := unix.Faccessat(unix.AT_FDCWD, dir, unix.W_OK|unix.X_OK, unix.AT_EACCESS)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EROFS):
		return fmt.Errorf("%w (the cgroup filesystem is mounted read-only, as in most containers)", err)
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w (needs root or a delegated cgroup v2 subtree)", err)
	}
	return err
}

func parseMountinfo(r io.Reader) ([]mount, error) {
	var out []mount
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || len(fields) < sep+4 {
			continue
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		out = append(out, mount{
			root:   unescapeOctal(fields[3]),
			point:  unescapeOctal(fields[4]),
			fstype: fstype,
			super:  strings.Split(fields[sep+3], ","),
		})
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return out, nil
}

// unescapeOctal undoes the \NNN escaping mountinfo applies to blanks and
// backslashes in paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// parseProcCgroupV2 returns this process's cgroup2 path, or "" when it is not
// in a cgroup2 hierarchy. v1 paths are not needed: v1 groups are always made
// at the top of each hierarchy.
func parseProcCgroupV2(r io.Reader) (string, error) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "0::"); ok {
			return rest, nil
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("reading /proc/self/cgroup: %w", err)
	}
	return "", nil
}

func readWords(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

func dedup(s []string) []string {
	var out []string
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
