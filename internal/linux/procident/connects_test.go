//go:build linux

package procident

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// heldSocket connects a socket this process holds and returns it as a
// reference found by inode alone (no cookie), with its cookie.
func heldSocket(t *testing.T) (fdRef, uint64) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		t.Fatal(err)
	}
	return fdRef{pid: os.Getpid(), fd: fd, inode: st.Ino}, cookie
}

// TestCookieOf: the cookie of a socket found by inode alone is read
// through a copy of its holder's descriptor, and a descriptor that now
// holds another socket is not taken for it.
func TestCookieOf(t *testing.T) {
	ref, want := heldSocket(t)
	got, err := cookieOf(ref)
	if err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("pidfd_getfd: %v", err)
		}
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("cookieOf = %d, want %d", got, want)
	}
	other := ref
	other.inode++
	if _, err := cookieOf(other); err == nil {
		t.Error("a descriptor holding another socket gave its cookie")
	}
}

// TestVouchByKernelRecord: with the kernel's records, a socket sock_diag
// did not find (cookie 0) is looked up under the cookie read through its
// holder's descriptor, and a socket recorded for another process, or not
// at all, is refused.
func TestVouchByKernelRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: pidfd_getfd")
	}
	ref, cookie := heldSocket(t)
	var asked uint64
	recordedFor := func(tgid int, ok bool) *ConnectLog {
		return &ConnectLog{Kernel: func(c uint64) (int, uint64, bool) {
			asked = c
			return tgid, 1, ok
		}}
	}
	who, ok, err := recordedFor(os.Getpid(), true).connector(ref)
	if err != nil || !ok || asked != cookie || who.tgid != os.Getpid() || !who.timed {
		t.Fatalf("connector = %+v, %v, %v after asking for cookie %d; want the record under %d", who, ok, err, asked, cookie)
	}
	if err := recordedFor(os.Getpid()+1, true).vouch([]fdRef{ref}); err == nil || !strings.Contains(err.Error(), "no longer holds it") {
		t.Errorf("a socket recorded for another process: %v", err)
	}
	if err := recordedFor(0, false).vouch([]fdRef{ref}); !errors.Is(err, errNotConnected) {
		t.Errorf("a socket with no record: %v", err)
	}
}
