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
	"os"
	"time"
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
//
// It waits in Go's network poller rather than in a blocking system call:
// a goroutine woken from the poller runs at once, where one returning from
// a long blocking call must first win back a processor, and every connect
// of the sandbox waits for this loop.
func Serve(fd int, done <-chan struct{}, handle func(Call)) error {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("seccomp listener: %w", err)
	}
	// Each connect waits for this loop and this loop for it: the kernel
	// may hand the core straight across in both directions (Linux 6.6;
	// earlier kernels refuse the flag and wake the other side as usual).
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
	f := os.NewFile(uintptr(fd), "seccomp listener")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("seccomp listener: %w", err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-done:
			_ = f.SetReadDeadline(time.Now())
		case <-stop:
		}
	}()
	for {
		var req notif
		var hup bool
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			ready := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(ready, 0)
			switch {
			case errors.Is(err, unix.EINTR) || (err == nil && n == 0):
				return false // nothing pending: wait in the poller
			case err != nil:
				rerr = fmt.Errorf("seccomp listener: poll: %w", err)
				return true
			case ready[0].Revents&unix.POLLIN == 0:
				// POLLHUP: every process the filter applied to is gone.
				hup = true
				return true
			}
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&req))); e != 0 {
				if e != unix.EINTR && e != unix.ENOENT {
					rerr = fmt.Errorf("seccomp listener: receive: %w", e)
				}
				// Interrupted, or the caller died before we took it.
				req.id = 0
			}
			return true
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil
		case err != nil:
			return fmt.Errorf("seccomp listener: %w", err)
		case rerr != nil:
			return rerr
		case hup:
			return nil
		case req.id == 0 && req.pid == 0:
			continue
		}
		handle(Call{ID: req.id, TID: int(req.pid), Nr: req.nr, Args: req.args})
		r := resp{id: req.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r))); e != 0 && e != unix.ENOENT {
			return fmt.Errorf("seccomp listener: answer: %w", e)
		}
	}
}
