//go:build linux

package netns

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// EnterNew, run through Go, moves a thread, and only it, into a
// namespace of its own, whose loopback LoopbackUp brings up; the process
// (its main thread, which /proc/<pid> shows) stays where it was.
func TestEnterNewMovesOnlyTheThread(t *testing.T) {
	requireRoot(t)
	host, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ino, thread uint64
		up          bool
		err         error
	}
	done := make(chan result, 1)
	Go(func() {
		var r result
		if r.ino, r.err = EnterNew(); r.err == nil {
			if r.thread, r.err = Thread(); r.err == nil {
				if r.err = LoopbackUp(); r.err == nil {
					r.up, r.err = loopbackIsUp()
				}
			}
		}
		done <- r
	})
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.ino == host || r.thread != r.ino {
		t.Fatalf("EnterNew gave %d, the thread is in %d, the process in %d: want a namespace apart from the process's", r.ino, r.thread, host)
	}
	if !r.up {
		t.Fatal("lo is not up after LoopbackUp")
	}
	if now, err := Of(os.Getpid()); err != nil || now != host {
		t.Fatalf("the process's namespace is %d (%v) after EnterNew on another thread, want %d", now, err, host)
	}
}

func loopbackIsUp() (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return false, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return false, err
	}
	return ifr.Uint16()&unix.IFF_UP != 0, nil
}

// Go never runs f on the main thread, even when its goroutine starts
// there, which happens: a first version of the test above, locking its
// own goroutine, saw the process's namespace change.
func TestGoAvoidsTheMainThread(t *testing.T) {
	for range 50 {
		tid := make(chan int, 1)
		Go(func() { tid <- unix.Gettid() })
		if got := <-tid; got == os.Getpid() {
			t.Fatal("f ran on the main thread")
		}
	}
}

// Join moves a second thread into the namespace the first made, and says
// so when the namespace it found is not the one it was told to expect.
func TestJoin(t *testing.T) {
	requireRoot(t)
	type made struct {
		ns  *os.File
		ino uint64
		err error
	}
	first := make(chan made, 1)
	Go(func() {
		var m made
		if m.ino, m.err = EnterNew(); m.err == nil {
			m.ns, m.err = Open()
		}
		first <- m
	})
	m := <-first
	if m.err != nil {
		t.Fatal(m.err)
	}
	defer m.ns.Close()
	joined := make(chan error, 2)
	Go(func() {
		err := Join(m.ns, m.ino)
		if err == nil {
			var now uint64
			if now, err = Thread(); err == nil && now != m.ino {
				t.Errorf("after Join the thread is in %d, want %d", now, m.ino)
			}
		}
		joined <- err
	})
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	Go(func() { joined <- Join(m.ns, m.ino+1) })
	if err := <-joined; err == nil {
		t.Fatal("Join into a namespace other than the one expected did not fail")
	}
}

// requireRoot skips a test that needs root, unless CORRAL_NO_SKIP asks
// for every skip to count as a failure (as CI does).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CORRAL_NO_SKIP") != "" {
		t.Fatal("needs root (CAP_SYS_ADMIN to make and enter a network namespace); CORRAL_NO_SKIP is set")
	}
	t.Skip("needs root (CAP_SYS_ADMIN to make and enter a network namespace)")
}
