//go:build linux

package procident

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCookieOf: the cookie of a socket found by inode alone is read
// through a copy of its holder's descriptor, and a descriptor that now
// holds another socket is not taken for it.
func TestCookieOf(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	want, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cookieOf(fdRef{pid: os.Getpid(), fd: fd, inode: st.Ino})
	if err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("pidfd_getfd: %v", err)
		}
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("cookieOf = %d, want %d", got, want)
	}
	if _, err := cookieOf(fdRef{pid: os.Getpid(), fd: fd, inode: st.Ino + 1}); err == nil {
		t.Error("a descriptor holding another socket gave its cookie")
	}
}
