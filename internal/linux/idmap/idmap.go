//go:build linux

// Package idmap makes idmapped bind mounts: a detached copy of a mount tree
// through which files of one owner on disk appear owned by another uid and
// gid, and files that uid creates land on disk owned by the original owner.
// corral uses it so a workload that is not root can write a root-owned
// workdir as its owner without anything on disk changing.
package idmap

//go:generate go tool msgp -file idmap.go -o idmap_msgp.go -tests=false -io=false -d "tag json"

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mapping maps one owner on disk to the ids seen through the mount. Only
// that uid and gid are mapped; every other owner stays unmapped, so its
// files show up as the overflow id and grant nothing as owner.
type Mapping struct {
	DiskUID uint32 `json:"disk_uid"`
	DiskGID uint32 `json:"disk_gid"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
}

func (m Mapping) String() string {
	return fmt.Sprintf("%d:%d on disk as %d:%d", m.DiskUID, m.DiskGID, m.UID, m.GID)
}

// Apply turns the detached mount tree tree (from open_tree with
// OPEN_TREE_CLONE) into an idmapped one, every submount included.
func Apply(tree int, m Mapping) error {
	ns, err := userNS(m)
	if err != nil {
		return err
	}
	defer unix.Close(ns)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return explain(err)
	}
	return nil
}

// Probe tells whether path (resolved, no symlinks) can be bind-mounted with
// m here: it makes the idmapped copy and throws it away. Closing the
// detached tree unmounts it, so nothing outlives the call.
func Probe(path string, m Mapping) error {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	pfd, err := unix.Openat2(unix.AT_FDCWD, path, &how)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(pfd)
	tree, err := unix.OpenTree(pfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return explain(err)
	}
	defer unix.Close(tree)
	return Apply(tree, m)
}

// explain says which of the usual reasons a refusal most likely has.
func explain(err error) error {
	switch {
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("this kernel has no mount_setattr (idmapped mounts need Linux 5.12 or later): %w", err)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("the filesystem (or a mount below it) does not support idmapped mounts, or the kernel is too old: %w", err)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("not permitted (a mount below it is already idmapped, or corral is not root): %w", err)
	}
	return fmt.Errorf("idmapped mount: %w", err)
}

// userNS returns a descriptor for a new user namespace whose uid_map and
// gid_map hold exactly m. The namespace is made by a short-lived child
// forked for the purpose: a multithreaded Go process cannot unshare one for
// itself. The namespace outlives the child through the descriptor.
func userNS(m Mapping) (int, error) {
	pid, pidfd, err := forkUserNS()
	if err != nil {
		return -1, fmt.Errorf("create a user namespace for the idmapping: %w", err)
	}
	defer func() {
		_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, 0, nil)
		unix.Close(pidfd)
	}()
	// The pid clone returned is in our pid namespace, which need not be the
	// one /proc shows (the sandbox's init runs in a new pid namespace with
	// the host's /proc still mounted); the pidfd's fdinfo gives the pid in
	// /proc's own namespace.
	procPid, err := procPID(pidfd)
	if err != nil {
		return -1, err
	}
	dir := "/proc/" + strconv.Itoa(procPid)
	if err := os.WriteFile(dir+"/uid_map", fmt.Appendf(nil, "%d %d 1\n", m.DiskUID, m.UID), 0); err != nil {
		return -1, fmt.Errorf("write uid_map: %w", err)
	}
	if err := os.WriteFile(dir+"/gid_map", fmt.Appendf(nil, "%d %d 1\n", m.DiskGID, m.GID), 0); err != nil {
		return -1, fmt.Errorf("write gid_map: %w", err)
	}
	fd, err := unix.Open(dir+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the user namespace: %w", err)
	}
	// The pidfd still names our child, so the pid was not reused between
	// reading fdinfo and opening the namespace.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("user namespace child vanished: %w", err)
	}
	return fd, nil
}

// forkUserNS forks a copy of the calling thread into a new user namespace.
// The copy runs no Go code that could touch the runtime: it blocks in
// ppoll until it is killed. Every signal is blocked around the fork, so the
// copy inherits a full mask and no Go signal handler ever runs in it.
func forkUserNS() (pid, pidfd int, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^all.Val[i]
	}
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old); err != nil {
		return 0, 0, fmt.Errorf("block signals: %w", err)
	}
	var fd int32 = -1
	r, _, errno := unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD)|unix.CLONE_NEWUSER|unix.CLONE_PIDFD,
		0, uintptr(unsafe.Pointer(&fd)), 0, 0, 0)
	if errno == 0 && r == 0 {
		for {
			unix.RawSyscall6(unix.SYS_PPOLL, 0, 0, 0, 0, 0, 0)
		}
	}
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil); err != nil {
		panic("idmap: cannot restore the signal mask: " + err.Error())
	}
	if errno != 0 {
		return 0, 0, fmt.Errorf("clone(CLONE_NEWUSER): %w", errno)
	}
	return int(r), int(fd), nil
}

// procPID reads the "Pid:" line of a pidfd's fdinfo.
func procPID(pidfd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0, fmt.Errorf("read pidfd fdinfo: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Pid:")); ok {
			n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("pidfd fdinfo: bad Pid line %q (the child is not visible in /proc's pid namespace)", v)
			}
			return n, nil
		}
	}
	return 0, errors.New("pidfd fdinfo has no Pid line (kernel older than 5.4?)")
}
