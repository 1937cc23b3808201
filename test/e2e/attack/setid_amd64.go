package main

import (
	"path/filepath"

	"unsafe"

	"golang.org/x/sys/unix"
)

// The legacy path syscalls x86_64 still has beside their *at forms; each
// takes a mode of its own and needs a rule of its own.
func init() {
	legacy := map[string]setIDVariant{
		"chmod": {try: func(dir string) (string, error) {
			return chmodVia(dir, "chmod", func(p string) error {
				b, _ := unix.BytePtrFromString(p)
				return callErr(unix.Syscall(unix.SYS_CHMOD, uintptr(unsafe.Pointer(b)), 0o4755, 0))
			})
		}},
		"open": {try: func(dir string) (string, error) {
			p := filepath.Join(dir, "setid-open")
			b, _ := unix.BytePtrFromString(p)
			return p, closeFd(unix.Syscall(unix.SYS_OPEN, uintptr(unsafe.Pointer(b)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755))
		}},
		"creat": {try: func(dir string) (string, error) {
			p := filepath.Join(dir, "setid-creat")
			b, _ := unix.BytePtrFromString(p)
			return p, closeFd(unix.Syscall(unix.SYS_CREAT, uintptr(unsafe.Pointer(b)), 0o6755, 0))
		}},
		"mkdir": {try: func(dir string) (string, error) {
			p := filepath.Join(dir, "setid-mkdir")
			b, _ := unix.BytePtrFromString(p)
			return p, callErr(unix.Syscall(unix.SYS_MKDIR, uintptr(unsafe.Pointer(b)), 0o2755, 0))
		}},
		"mknod": {try: func(dir string) (string, error) {
			p := filepath.Join(dir, "setid-mknod")
			b, _ := unix.BytePtrFromString(p)
			return p, callErr(unix.Syscall(unix.SYS_MKNOD, uintptr(unsafe.Pointer(b)), unix.S_IFREG|0o4755, 0))
		}},
	}
	for name, v := range legacy {
		setIDVariants[name] = v
	}
}
