//go:build linux

// Package filter loads an assembled seccomp BPF program into every thread
// of the process. It knows no syscall names: the supervisor assembles the
// program from a profile (package seccomp, with every architecture's
// syscall table), and the sandbox's init, which only loads it, links none
// of that and starts the faster for it.
package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// insnSize is the size of struct sock_filter: code, jt, jf, k.
const insnSize = 8

// MaxInsns is the kernel's BPF_MAXINSNS.
const MaxInsns = 4096

// Encode turns a program into the bytes Install loads: each instruction as
// struct sock_filter in native byte order.
func Encode(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, len(prog)*insnSize)
	for _, in := range prog {
		out = binary.NativeEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out
}

func decode(b []byte) ([]unix.SockFilter, error) {
	n := len(b) / insnSize
	if len(b)%insnSize != 0 || n == 0 || n > MaxInsns {
		return nil, fmt.Errorf("seccomp: a program of %d bytes is not 1 to %d instructions", len(b), MaxInsns)
	}
	prog := make([]unix.SockFilter, n)
	for i := range prog {
		in := b[i*insnSize:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.NativeEndian.Uint32(in[4:])}
	}
	return prog, nil
}

// Install loads the program (as Encode made it) for every thread of the
// process (SECCOMP_FILTER_FLAG_TSYNC), so runtime threads the caller did
// not lock cannot escape it. The calling thread must already have
// no_new_privs set: Install refuses to run without it even as root,
// because then a setuid binary exec'd later would run filtered but with
// raised privileges, and because the sandbox's init promises it.
//
// With listen, the filter gets a listener (SECCOMP_FILTER_FLAG_NEW_LISTENER)
// for the calls it hands to user space, and Install returns its descriptor;
// otherwise it returns -1.
func Install(program []byte, listen bool) (int, error) {
	prog, err := decode(program)
	if err != nil {
		return -1, err
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return -1, fmt.Errorf("seccomp: read no_new_privs: %w", err)
	}
	if nnp != 1 {
		return -1, errors.New("seccomp: no_new_privs is not set on the calling thread; set it before installing the filter")
	}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_TSYNC)
	if listen {
		// A listener's descriptor is the return value, where TSYNC
		// reports a thread it could not synchronise; TSYNC_ESRCH makes
		// that an error instead (Linux 5.7).
		flags |= unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	switch {
	case e == unix.ENOSYS:
		return -1, fmt.Errorf("seccomp: kernel has no seccomp(2): %w", e)
	case e == unix.EINVAL:
		return -1, fmt.Errorf("seccomp: kernel rejected the filter (seccomp filters, TSYNC or, in proxy mode, user notification (Linux 5.7) unsupported, or invalid program): %w", e)
	case e == unix.EACCES:
		return -1, fmt.Errorf("seccomp: kernel refused the filter (no_new_privs not set on this thread?): %w", e)
	case e == unix.ESRCH:
		return -1, fmt.Errorf("seccomp: a thread has an incompatible filter; nothing was installed: %w", e)
	case e == unix.EBUSY:
		return -1, fmt.Errorf("seccomp: a filter with a listener is already installed; nothing was installed: %w", e)
	case e != 0:
		return -1, fmt.Errorf("seccomp: install filter: %w", e)
	case listen:
		return int(r), nil
	case r != 0:
		// With TSYNC a positive return names a thread that could not be
		// synchronised, and no thread got the filter.
		return -1, fmt.Errorf("seccomp: thread %d has an incompatible filter; nothing was installed", r)
	}
	return -1, nil
}
