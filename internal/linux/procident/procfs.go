//go:build linux

package procident

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The lookup reads a few dozen small /proc files per connection. Through
// package os each costs several syscalls besides the read (poller
// registration, fcntl, fstat, a buffer grown from 512 bytes), which on a
// virtual machine was most of a connection's set-up time; these helpers
// make the open, the reads and the close the only syscalls.

// procBufs holds read buffers; a process's memory map runs to tens of
// kilobytes.
var procBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// readProc returns the whole content of path, read into a pooled buffer
// that the caller must hand back with putBuf once done with the bytes.
func readProc(path string) (*[]byte, error) {
	fd, err := openRetry(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	bp := procBufs.Get().(*[]byte)
	b := (*bp)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			*bp = b
			putBuf(bp)
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			*bp = b
			return bp, nil
		}
		b = b[:len(b)+n]
	}
}

// maxPooledBuf keeps a rare huge file from pinning its buffer.
const maxPooledBuf = 1 << 20

func putBuf(bp *[]byte) {
	if cap(*bp) <= maxPooledBuf {
		procBufs.Put(bp)
	}
}

// readProcString is readProc for content kept beyond the call.
func readProcString(path string) (string, error) {
	bp, err := readProc(path)
	if err != nil {
		return "", err
	}
	s := string(*bp)
	putBuf(bp)
	return s, nil
}

// listDir calls fn with each entry name of dir but "." and "..". The name
// is only valid during the call.
func listDir(dir string, fn func(name []byte)) error {
	fd, err := openRetry(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := readDirFD(fd, fn); err != nil {
		return &os.PathError{Op: "getdents", Path: dir, Err: err}
	}
	return nil
}

// readDirFD is listDir on an open directory.
func readDirFD(fd int, fn func(name []byte)) error {
	bp := procBufs.Get().(*[]byte)
	defer putBuf(bp)
	buf := (*bp)[:cap(*bp)]
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		// linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(b[16]) | int(b[17])<<8
			if reclen < 19 || reclen > len(b) {
				break
			}
			name := b[19:reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			if !(len(name) == 1 && name[0] == '.') && !(len(name) == 2 && name[0] == '.' && name[1] == '.') {
				fn(name)
			}
			b = b[reclen:]
		}
	}
}

// linkIs reports whether the symlink at path points at target, without
// allocating.
func linkIs(path, target string) bool {
	var buf [64]byte
	n, err := unix.Readlink(path, buf[:])
	return err == nil && n < len(buf) && string(buf[:n]) == target
}

// atoi parses a non-negative decimal; ok is false for anything else.
func atoi(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func openRetry(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}
