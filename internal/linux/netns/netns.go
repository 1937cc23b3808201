//go:build linux

// Package netns makes a fresh network namespace usable: it moves the
// calling OS thread into a new one, and brings up a namespace's loopback.
// As root the supervisor does both on the thread it clones the sandbox's
// init from, while the rest of its set-up goes on; rootless, the namespace
// must belong to the sandbox's user namespace, which only the init's clone
// makes, so the init brings up its loopback itself.
package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

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
// returns that namespace's inode. The caller must be running under Go.
func EnterNew() (uint64, error) {
	before, err := Thread()
	if err != nil {
		return 0, err
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return 0, fmt.Errorf("new network namespace: %w", err)
	}
	after, err := Thread()
	if err != nil {
		return 0, err
	}
	// What the caller sets up next (routes, nftables rules that redirect
	// every connection) is meant for the new namespace alone: in the
	// host's it would capture the host's traffic.
	if after == before {
		return 0, errors.New("new network namespace: the thread is still in the namespace it started in")
	}
	return after, nil
}

// Open opens the calling thread's network namespace, for Join on
// another thread.
func Open() (*os.File, error) {
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	return f, nil
}

// Join moves the calling thread into the network namespace ns, which must
// be the one whose inode is ino, and returns an error if the thread is
// not there after. The caller's goroutine is locked as for EnterNew.
func Join(ns *os.File, ino uint64) error {
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace: %w", err)
	}
	now, err := Thread()
	if err != nil {
		return err
	}
	if now != ino {
		return fmt.Errorf("enter network namespace: the thread is in %d, not %d", now, ino)
	}
	return nil
}

// Thread returns the inode of the calling thread's network namespace.
func Thread() (uint64, error) { return inode("/proc/thread-self/ns/net") }

// Of returns the inode of process pid's network namespace.
func Of(pid int) (uint64, error) { return inode(fmt.Sprintf("/proc/%d/ns/net", pid)) }

func inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("network namespace: %w", err)
	}
	return st.Ino, nil
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
