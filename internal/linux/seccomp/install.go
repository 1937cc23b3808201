//go:build linux

package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Install compiles profile p for network mode m and loads it for every thread
// of the process (SECCOMP_FILTER_FLAG_TSYNC), so runtime threads the caller
// did not lock cannot escape it. The calling thread must already have
// no_new_privs set: Install refuses to run without it even as root, because
// then a setuid binary exec'd later would run filtered but with raised
// privileges, and because the sandbox's init promises it.
func Install(p Profile, m NetMode) error {
	info, err := nativeArch()
	if err != nil {
		return err
	}
	insns, err := program(p, m, info)
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return fmt.Errorf("seccomp: assemble %s/%s: %w", p, m, err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, ins := range raw {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}

	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("seccomp: read no_new_privs: %w", err)
	}
	if nnp != 1 {
		return errors.New("seccomp: no_new_privs is not set on the calling thread; set it before installing the filter")
	}

	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	switch {
	case e == unix.ENOSYS:
		return fmt.Errorf("seccomp: kernel has no seccomp(2): %w", e)
	case e == unix.EINVAL:
		return fmt.Errorf("seccomp: kernel rejected the filter (seccomp filters or TSYNC unsupported, or invalid program): %w", e)
	case e == unix.EACCES:
		return fmt.Errorf("seccomp: kernel refused the filter (no_new_privs not set on this thread?): %w", e)
	case e != 0:
		return fmt.Errorf("seccomp: install %s/%s: %w", p, m, e)
	case r != 0:
		// With TSYNC a positive return names a thread that could not be
		// synchronised, and no thread got the filter.
		return fmt.Errorf("seccomp: thread %d has an incompatible filter; nothing was installed", r)
	}
	return nil
}
