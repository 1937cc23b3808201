//go:build linux

// Package netthread runs work on OS threads of their own in a sandbox's
// network namespace: it starts them off the main thread, moves one into a
// new namespace or another into that one (github.com/vishvananda/netns
// does the moving; this package checks where the thread ends up), and
// brings up a namespace's loopback. As root the supervisor makes the
// sandbox's namespace this way, on the thread it clones the init from,
// while the rest of its set-up goes on; rootless, the namespace must
// belong to the sandbox's user namespace, which only the init's clone
// makes, so the init brings up its loopback itself.
package netthread

import (
	"errors"
	"fmt"
	"runtime"

	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Go runs f on a new goroutine locked to an OS thread other than the
// process's main one, and never unlocks it, so f may move the thread into
// other namespaces: the runtime retires the thread with the goroutine
// rather than run other goroutines there. The main thread is avoided
// because /proc/<pid> shows its namespaces as the whole process's, and
// the runtime never retires it.
func Go(f func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			f()
			return
		}
		// While this goroutine holds the main thread, the next one
		// starts on another; the main thread goes back once it has.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			f()
		}()
		<-locked
		runtime.UnlockOSThread()
	}()
}

// EnterNew moves the calling thread into a new network namespace and
// returns a handle to it, which the caller closes. The caller must be
// running under Go.
func EnterNew() (vns.NsHandle, error) {
	before, err := vns.Get()
	if err != nil {
		return vns.None(), fmt.Errorf("network namespace: %w", err)
	}
	defer before.Close()
	ns, err := vns.New()
	if err != nil {
		return vns.None(), fmt.Errorf("new network namespace: %w", err)
	}
	// What the caller sets up next (routes, nftables rules that redirect
	// every connection) is meant for the new namespace alone: in the
	// host's it would capture the host's traffic.
	if ns.Equal(before) {
		ns.Close()
		return vns.None(), errors.New("new network namespace: the thread is still in the namespace it started in")
	}
	return ns, nil
}

// Join moves the calling thread into ns and returns an error if the thread
// is not there after. The caller must be running under Go.
func Join(ns vns.NsHandle) error {
	if err := vns.Set(ns); err != nil {
		return fmt.Errorf("enter network namespace: %w", err)
	}
	if !In(ns, 0) {
		return errors.New("enter network namespace: the thread is not in it after setns")
	}
	return nil
}

// In reports whether process pid (or, for 0, the calling thread) is in
// the network namespace ns; false when that cannot be read.
func In(ns vns.NsHandle, pid int) bool {
	get := vns.Get
	if pid != 0 {
		get = func() (vns.NsHandle, error) { return vns.GetFromPid(pid) }
	}
	now, err := get()
	if err != nil {
		return false
	}
	defer now.Close()
	return now.Equal(ns)
}

// LoopbackUp sets IFF_UP on lo with the classic ioctl: a new network
// namespace starts with loopback down and nothing else.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}
