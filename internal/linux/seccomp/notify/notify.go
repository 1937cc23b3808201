//go:build linux

// Package notify serves a seccomp filter's listener: the calls the filter
// hands to user space (SECCOMP_RET_USER_NOTIF) are shown to a handler and
// then let through unchanged. corral only observes such calls; it never
// answers for the kernel, so nothing the handler reads from the caller's
// memory can decide what the call does.
package notify

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Call is one system call a filtered process is blocked in.
type Call struct {
	// ID names the notification to the kernel.
	ID uint64
	// TID is the calling thread as the listener's pid namespace numbers
	// it.
	TID int
	// Nr is the system call number, Args its arguments.
	Nr   int32
	Args [6]uint64
}

// notif is struct seccomp_notif; data is struct seccomp_data.
type notif struct {
	id    uint64
	pid   uint32
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

// resp is struct seccomp_notif_resp.
type resp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

// Valid tells whether the call is still pending on fd: its thread is still
// blocked in it, so the numbers read from /proc while it was handled named
// that thread and not a successor that took its pid.
func Valid(fd int, id uint64) bool {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_ID_VALID, uintptr(unsafe.Pointer(&id)))
	return e == 0
}

// Serve shows each call notified on the listener fd to handle and then lets
// it continue, until no filtered process is left (the listener hangs up) or
// done is closed. It closes fd when it returns. A call whose thread died
// meanwhile is skipped.
func Serve(fd int, done <-chan struct{}, handle func(Call)) error {
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		select {
		case <-done:
			return nil
		default:
		}
		// The timeout only bounds how long a closed done goes unnoticed
		// while the sandbox is quiet.
		n, err := unix.Poll(fds, 500)
		switch {
		case errors.Is(err, unix.EINTR) || n == 0:
			continue
		case err != nil:
			return fmt.Errorf("seccomp listener: poll: %w", err)
		case fds[0].Revents&unix.POLLIN == 0:
			// POLLHUP: every process the filter applied to is gone.
			return nil
		}
		var req notif
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&req))); e != 0 {
			if e == unix.EINTR || e == unix.ENOENT {
				// Interrupted, or the caller died before we took it.
				continue
			}
			return fmt.Errorf("seccomp listener: receive: %w", e)
		}
		handle(Call{ID: req.id, TID: int(req.pid), Nr: req.nr, Args: req.args})
		r := resp{id: req.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r))); e != 0 && e != unix.ENOENT {
			return fmt.Errorf("seccomp listener: answer: %w", e)
		}
	}
}
