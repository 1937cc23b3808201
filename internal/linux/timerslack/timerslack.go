//go:build linux

// Package timerslack widens how late the kernel may wake corral's own
// threads from a timed sleep. The Go runtime's monitor thread sleeps
// 20 µs at a time while the program is busy, and with the kernel's
// default slack of 50 µs that made it the most frequent cause of context
// switches in a sandbox's start (close to half of them, `SWITCHES=30
// bench/startup.sh`), each one taking a core from the start's own work on
// a small machine. A slack of a couple of milliseconds lets the kernel
// batch those wake-ups; what corral waits for on a timer can be that late.
// The workload must not inherit it: the init puts back, on the thread it
// forks the workload from, the slack corral was started with.
package timerslack

import (
	"fmt"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Wide is the slack corral's threads run with, in nanoseconds.
const Wide = 2_000_000

// Current is the calling thread's slack in nanoseconds.
func Current() (uint64, error) {
	n, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	return uint64(n), err
}

// Set gives the calling thread a slack of ns nanoseconds, which the
// threads and processes it starts from then on inherit; the caller locks
// the goroutine to its thread. ns must not be 0, which would mean the
// thread's own default, itself inherited.
func Set(ns uint64) error {
	return unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0)
}

// WidenProcess gives every thread of this process the Wide slack, as far
// as it may, and returns the calling thread's slack from before, the one
// corral was started with (0 if it could not be read). Changing another
// thread's slack takes CAP_SYS_NICE, so without it only threads made from
// the calling one from now on get Wide: the runtime made its monitor
// thread before any of corral's code ran, and only with the capability
// does the widening reach it.
func WidenProcess() (was uint64) {
	runtime.LockOSThread()
	was, _ = Current()
	_ = Set(Wide)
	runtime.UnlockOSThread()
	dir, err := unix.Open("/proc/self/task", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return was
	}
	defer unix.Close(dir)
	var buf [4096]byte
	v := []byte(strconv.Itoa(Wide))
	for {
		n, err := unix.Getdents(dir, buf[:])
		if err != nil || n <= 0 {
			return was
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		for _, tid := range names {
			// The file is in a thread's own /proc/<tid>, not under task/.
			fd, err := unix.Open("/proc/"+tid+"/timerslack_ns", unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			_, _ = unix.Write(fd, v)
			unix.Close(fd)
		}
	}
}

// StartWith runs start (an exec.Cmd's Start, say) on a thread whose slack
// is ns for the moment, so that the process it starts inherits ns and not
// Wide; ns == 0 runs it as it is.
func StartWith(ns uint64, start func() error) error {
	if ns == 0 {
		return start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	now, err := Current()
	if err != nil {
		return fmt.Errorf("read the timer slack: %w", err)
	}
	if err := Set(ns); err != nil {
		return fmt.Errorf("set the timer slack to %d ns: %w", ns, err)
	}
	defer Set(now)
	return start()
}
