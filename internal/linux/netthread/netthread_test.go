//go:build linux

package netthread

import (
	"os"
	"testing"

	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// EnterNew, run through Go, moves a thread, and only it, into a
// namespace of its own, whose loopback LoopbackUp brings up; the process
// (its main thread, which /proc/<pid> shows) stays where it was.
func TestEnterNewMovesOnlyTheThread(t *testing.T) {
	requireRoot(t)
	host, err := vns.GetFromPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	type result struct {
		ns         vns.NsHandle
		inIt, up   bool
		inHostsToo bool
		err        error
	}
	done := make(chan result, 1)
	Go(func() {
		r := result{ns: vns.None()}
		if r.ns, r.err = EnterNew(); r.err == nil {
			r.inIt, r.inHostsToo = In(r.ns, 0), In(host, 0)
			if r.err = LoopbackUp(); r.err == nil {
				r.up, r.err = loopbackIsUp()
			}
		}
		done <- r
	})
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.ns.Close()
	if !r.inIt || r.inHostsToo || r.ns.Equal(host) {
		t.Fatalf("after EnterNew the thread is in its namespace: %v, in the process's: %v; want a namespace apart", r.inIt, r.inHostsToo)
	}
	if !r.up {
		t.Fatal("lo is not up after LoopbackUp")
	}
	if !In(host, os.Getpid()) || In(r.ns, os.Getpid()) {
		t.Fatal("the process's namespace changed with EnterNew on another thread")
	}
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

// Join moves a second thread into the namespace the first made, and In
// tells it apart from another one.
func TestJoin(t *testing.T) {
	requireRoot(t)
	type made struct {
		ns  vns.NsHandle
		err error
	}
	first := make(chan made, 2)
	for range 2 {
		Go(func() {
			ns, err := EnterNew()
			first <- made{ns, err}
		})
	}
	a, b := <-first, <-first
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	defer a.ns.Close()
	defer b.ns.Close()
	type joined struct{ inA, inB bool }
	got := make(chan joined, 1)
	var err error
	Go(func() {
		if err = Join(a.ns); err == nil {
			got <- joined{In(a.ns, 0), In(b.ns, 0)}
			return
		}
		got <- joined{}
	})
	j := <-got
	if err != nil {
		t.Fatal(err)
	}
	if !j.inA || j.inB {
		t.Fatalf("after Join(a) the thread is in a: %v, in b: %v", j.inA, j.inB)
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
