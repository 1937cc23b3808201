package initproc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/idmap"
	"github.com/corral-sandbox/corral/internal/plan"
)

// devices are bound from the host into the minimal /dev. Binding (rather
// than mknod) works in a user namespace and keeps the host's device policy.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// buildRoot assembles the sandbox's root under dir (an empty directory) and
// pivots into it. Every bind source is cloned as a detached tree before the
// new root exists, so a recursive bind can never capture the new root itself;
// every target is reached with openat2 and no symlink following, so a symlink
// planted in a writable directory by an earlier run cannot redirect a mount.
func buildRoot(p *plan.Plan, dir string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	trees := make(map[int]int, len(p.Mounts))
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	for i, m := range p.Mounts {
		if m.Kind != plan.KindBind {
			continue
		}
		fd, err := cloneTree(m.Source, m.ReadOnly, m.IDMap)
		if err != nil {
			return fmt.Errorf("clone %s: %w", m.Source, err)
		}
		trees[i] = fd
	}

	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount root tmpfs at %s: %w", dir, err)
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open new root: %w", err)
	}
	defer unix.Close(root)

	for i, m := range p.Mounts {
		var err error
		switch m.Kind {
		case plan.KindBind:
			err = attachTree(root, trees[i], m.Target, m.Source)
		case plan.KindTmpfs:
			err = mountAt(root, m.Target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpfsOptions(m))
		case plan.KindProc:
			// hidepid: a process the workload may not ptrace (its init)
			// has no /proc entry for it, whose directory would otherwise
			// serve as a pidfd for pidfd_send_signal, which seccomp
			// cannot tell from any other.
			err = mountAt(root, m.Target, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible")
		case plan.KindDev:
			err = buildDev(root, m.Target, m.SizeBytes)
		default:
			err = fmt.Errorf("unknown mount kind %q", m.Kind)
		}
		if err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.Kind, m.Target, err)
		}
	}
	return pivot(dir)
}

// cloneTree opens src without following any symlink (the plan already
// resolved it) and returns a detached recursive copy of the mount tree there
// with read-only (when asked), nosuid and nodev applied to every submount,
// and idmapped when the plan says so. The plan probed the idmapping on this
// host, so a failure here is an error rather than a silent fallback to a
// workdir the workload cannot write.
func cloneTree(src string, readOnly bool, m *idmap.Mapping) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	pfd, err := unix.Openat2(unix.AT_FDCWD, src, &how)
	if err != nil {
		return -1, fmt.Errorf("open source: %w", err)
	}
	defer unix.Close(pfd)
	fd, err := unix.OpenTree(pfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr: %w", err)
	}
	if m != nil {
		if err := idmap.Apply(fd, *m); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("idmap %s: %w", m, err)
		}
	}
	return fd, nil
}

// attachTree moves a cloned tree onto target inside root, creating the
// mountpoint (a directory or an empty file, like the source) if needed.
func attachTree(root, tree int, target, src string) error {
	var st unix.Stat_t
	if err := unix.Fstat(tree, &st); err != nil {
		return err
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	tfd, err := mkTarget(root, target, isDir)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err := unix.MoveMount(tree, "", tfd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", src, err)
	}
	return nil
}

// mountAt mounts a fresh filesystem on target inside root. The target is
// named through /proc/self/fd so the kernel mounts on exactly the directory
// that was opened without following symlinks.
func mountAt(root int, target, fstype string, flags uintptr, data string) error {
	tfd, err := mkTarget(root, target, true)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	return unix.Mount(fstype, fdPath(tfd), fstype, flags, data)
}

// tmpfsOptions leaves out uid/gid for root-owned tmpfs: in a user namespace
// uid 0 is usually unmapped and naming it makes the mount fail.
func tmpfsOptions(m plan.Mount) string {
	opts := fmt.Sprintf("mode=%04o", m.Mode) + sizeOption(m.SizeBytes)
	if m.UID != 0 || m.GID != 0 {
		opts += fmt.Sprintf(",uid=%d,gid=%d", m.UID, m.GID)
	}
	return opts
}

// sizeOption caps a tmpfs; without it the kernel allows half the host's
// RAM per mount, charged to no limit where there is no cgroup.
func sizeOption(bytes int64) string {
	if bytes <= 0 {
		return ""
	}
	return fmt.Sprintf(",size=%d", bytes)
}

// devSize caps /dev itself, which holds only mountpoints and symlinks; in
// rootless mode it belongs to the workload's user, who could fill it.
const devSize = 1 << 20

func fdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// mkTarget walks target component by component below root, refusing any
// symlink, creating what is missing, and returns an O_PATH fd for it.
func mkTarget(root int, target string, isDir bool) (int, error) {
	parts := strings.Split(strings.Trim(filepath.Clean(target), "/"), "/")
	cur, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	if target == "/" {
		return cur, nil
	}
	for i, name := range parts {
		last := i == len(parts)-1
		how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
		next, err := unix.Openat2(cur, name, &how)
		if errors.Is(err, unix.ENOENT) {
			if !last || isDir {
				err = unix.Mkdirat(cur, name, 0o755)
			} else {
				var fd int
				fd, err = unix.Openat(cur, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
				if err == nil {
					unix.Close(fd)
				}
			}
			if err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(cur)
				return -1, fmt.Errorf("create mountpoint %s: %w", target, err)
			}
			next, err = unix.Openat2(cur, name, &how)
		}
		if errors.Is(err, unix.EXDEV) {
			// Crossing into an already attached mount (e.g. /home/u/proj
			// under a /home/u bind) is expected; only symlinks are refused.
			how.Resolve &^= unix.RESOLVE_NO_XDEV
			next, err = unix.Openat2(cur, name, &how)
		}
		unix.Close(cur)
		if err != nil {
			if errors.Is(err, unix.ELOOP) {
				return -1, fmt.Errorf("mountpoint %s passes through a symlink (%s); refusing to follow it", target, name)
			}
			return -1, fmt.Errorf("open mountpoint %s: %w", target, err)
		}
		cur = next
	}
	return cur, nil
}

// buildDev creates the minimal /dev: a few host devices, a private devpts,
// a private /dev/shm of at most shmSize bytes (0: the kernel's default)
// and the conventional symlinks.
func buildDev(root int, target string, shmSize int64) error {
	if err := mountAt(root, target, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755"+sizeOption(devSize)); err != nil {
		return err
	}
	for _, d := range devices {
		src := "/dev/" + d
		if _, err := os.Stat(src); err != nil {
			continue // a host without /dev/tty (no terminal) is fine
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("clone %s: %w", src, err)
		}
		err = attachTree(root, fd, filepath.Join(target, d), src)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	if err := mountAt(root, filepath.Join(target, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := mountAt(root, filepath.Join(target, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777"+sizeOption(shmSize)); err != nil {
		return err
	}
	dfd, err := mkTarget(root, target, true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	// dfd is O_PATH; symlinkat needs a real directory fd.
	dir, err := unix.Openat(unix.AT_FDCWD, fdPath(dfd), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	links := [][2]string{
		{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
		{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"},
	}
	for _, l := range links {
		if err := unix.Symlinkat(l[0], dir, l[1]); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", l[1], err)
		}
	}
	return nil
}

// pivot makes dir the root and detaches the host's tree, then seals the
// root tmpfs read-only so nothing can be created beside the policy's paths.
func pivot(dir string) error {
	if err := unix.Chdir(dir); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one at "/";
	// detaching it leaves only the new tree, with no directory to hide it in.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", 0, &attr); err != nil {
		return fmt.Errorf("make root read-only: %w", err)
	}
	return nil
}

// readOnlyProc remounts the sandbox's /proc read-only once set-up no longer
// writes to it. Its writable files would otherwise let one sandbox process
// write another's memory through /proc/PID/mem — the permission check is
// ptrace's, which a process of the same uid passes, and the ptrace syscall
// being denied does not cover it — and so inject code into an allowed
// binary. A read-only mount refuses every open for writing (EROFS); the
// workload cannot remount it (no capabilities, mount denied by seccomp).
func readOnlyProc() error {
	return unix.Mount("", "/proc", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}
