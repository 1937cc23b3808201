package control

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of a control connection.
type Peer struct {
	PID, UID int
	// PIDNamespace is the pid namespace the client lives in. Every
	// sandbox's processes live in a pid namespace of their own that they
	// cannot leave, so this tells a client in any sandbox from one on the
	// host, whatever its uid.
	PIDNamespace Namespace
}

// Namespace identifies a namespace the way the kernel does: the device
// and inode of its nsfs file.
type Namespace struct{ Dev, Ino uint64 }

// OwnPIDNamespace is the pid namespace of the calling process.
func OwnPIDNamespace() (Namespace, error) {
	return statNamespace("/proc/self/ns/pid")
}

// pidfdGetPIDNamespace is PIDFD_GET_PID_NAMESPACE (_IO(0xFF, 5), Linux
// 6.11), which golang.org/x/sys does not name yet.
const pidfdGetPIDNamespace = 0xff05

// peerOf reads the client's credentials from the kernel (SO_PEERCRED),
// which the client cannot forge, and its pid namespace through a pidfd
// for that very process (SO_PEERPIDFD), so a client that exits and has
// its pid reused cannot lend the newcomer's namespace to its request.
func peerOf(c net.Conn) (Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, errors.New("not a unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var (
		cred  *unix.Ucred
		pidfd = -1
		cerr  error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if cerr == nil {
			pidfd, cerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
			if errors.Is(cerr, unix.ENOPROTOOPT) {
				// Before Linux 6.5: a pidfd opened now is as good as the
				// pid, and still pins the process for the check below.
				pidfd, cerr = unix.PidfdOpen(int(cred.Pid), 0)
			}
		}
	}); err != nil {
		return Peer{}, err
	}
	if cerr != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", cerr)
	}
	defer unix.Close(pidfd)
	ns, err := pidNamespaceOf(pidfd, int(cred.Pid))
	if err != nil {
		return Peer{}, fmt.Errorf("pid namespace of client %d: %w", cred.Pid, err)
	}
	return Peer{PID: int(cred.Pid), UID: int(cred.Uid), PIDNamespace: ns}, nil
}

// pidNamespaceOf asks the pidfd for its process's pid namespace; on
// kernels without that ioctl it reads /proc/<pid>/ns/pid and then checks
// that the pidfd's process is still alive, which proves the pid still
// named it when /proc was read.
func pidNamespaceOf(pidfd, pid int) (Namespace, error) {
	nsfd, err := unix.IoctlRetInt(pidfd, pidfdGetPIDNamespace)
	if err == nil {
		defer unix.Close(nsfd)
		var st unix.Stat_t
		if err := unix.Fstat(nsfd, &st); err != nil {
			return Namespace{}, err
		}
		return Namespace{Dev: st.Dev, Ino: st.Ino}, nil
	}
	if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
		return Namespace{}, err
	}
	ns, err := statNamespace(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return Namespace{}, err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return Namespace{}, fmt.Errorf("client exited while being identified: %w", err)
	}
	return ns, nil
}

func statNamespace(path string) (Namespace, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Namespace{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return Namespace{Dev: st.Dev, Ino: st.Ino}, nil
}
