package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"unsafe"

	"golang.org/x/sys/unix"
)

// Attacks that try to leave a set-user-ID or set-group-ID file (or one with
// file capabilities) in a writable directory. Where the directory is an
// idmapped mount of a root-owned workdir, such a file is owned by root on
// the host, and any host user who runs it becomes root.
func init() {
	attacks["setid"] = cmdSetID
}

const setIDBits = unix.S_ISUID | unix.S_ISGID

// cwdFD is AT_FDCWD as a variable: the constant is negative and cannot be
// converted to a syscall argument directly.
var cwdFD = unix.AT_FDCWD

// setIDVariant tries one way and returns the file it aimed at and the
// error of the attempt. check, when set, replaces the mode check.
type setIDVariant struct {
	try   func(dir string) (string, error)
	check func(path string) int
}

// setIDVariants are the portable ways; setid_amd64.go adds the legacy
// syscalls only x86_64 has.
var setIDVariants = map[string]setIDVariant{
	"fchmod": {try: func(dir string) (string, error) {
		return chmodVia(dir, "fchmod", func(p string) error {
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return callErr(unix.RawSyscall(unix.SYS_FCHMOD, uintptr(fd), 0o4755, 0))
		})
	}},
	"fchmodat":      {try: fchmodatMode("fchmodat", 0o4755)},
	"fchmodat-sgid": {try: fchmodatMode("fchmodat-sgid", 0o2755)},
	// The kernel reads only the low 16 bits of a mode; junk above them
	// must not slip past the filter.
	"fchmodat-hibits": {try: fchmodatMode("fchmodat-hibits", 1<<32|0o4755)},
	"fchmodat2": {try: func(dir string) (string, error) {
		return chmodVia(dir, "fchmodat2", func(p string) error {
			b, _ := unix.BytePtrFromString(p)
			return callErr(unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(cwdFD), uintptr(unsafe.Pointer(b)), 0o4755, 0, 0, 0))
		})
	}},
	"openat": {try: func(dir string) (string, error) {
		p := filepath.Join(dir, "setid-openat")
		b, _ := unix.BytePtrFromString(p)
		return p, closeFd(unix.Syscall6(unix.SYS_OPENAT, uintptr(cwdFD), uintptr(unsafe.Pointer(b)),
			unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755, 0, 0))
	}},
	"openat2": {try: func(dir string) (string, error) {
		p := filepath.Join(dir, "setid-openat2")
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_CREAT | unix.O_WRONLY | unix.O_CLOEXEC, Mode: 0o4755})
		if err == nil {
			unix.Close(fd)
		}
		return p, err
	}},
	// O_TMPFILE creates the inode with the mode; linking it in afterwards
	// goes through no mode argument at all.
	"tmpfile": {try: func(dir string) (string, error) {
		p := filepath.Join(dir, "setid-tmpfile")
		fd, err := unix.Openat(unix.AT_FDCWD, dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755)
		if err != nil {
			return p, err
		}
		defer unix.Close(fd)
		return p, unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW)
	}},
	"mkdirat": {try: func(dir string) (string, error) {
		p := filepath.Join(dir, "setid-mkdirat")
		b, _ := unix.BytePtrFromString(p)
		return p, callErr(unix.Syscall(unix.SYS_MKDIRAT, uintptr(cwdFD), uintptr(unsafe.Pointer(b)), 0o2755))
	}},
	"mknodat": {try: func(dir string) (string, error) {
		p := filepath.Join(dir, "setid-mknodat")
		b, _ := unix.BytePtrFromString(p)
		return p, callErr(unix.Syscall6(unix.SYS_MKNODAT, uintptr(cwdFD), uintptr(unsafe.Pointer(b)), unix.S_IFREG|0o4755, 0, 0, 0))
	}},
	// cp -p copies a set-user-ID binary of the system with its mode.
	"cp-p": {try: func(dir string) (string, error) {
		src := setIDSource()
		if src == "" {
			return "", fmt.Errorf("no set-user-ID file found in /usr/bin")
		}
		p := filepath.Join(dir, "setid-cp-p")
		out, err := exec.Command("cp", "-p", src, p).CombinedOutput()
		if err != nil {
			return p, fmt.Errorf("cp -p %s: %v: %s", src, err, bytes.TrimSpace(out))
		}
		return p, nil
	}},
	// A hard link to a set-user-ID binary of the system.
	"link": {try: func(dir string) (string, error) {
		src := setIDSource()
		if src == "" {
			return "", fmt.Errorf("no set-user-ID file found in /usr/bin")
		}
		p := filepath.Join(dir, "setid-link")
		return p, unix.Link(src, p)
	}},
	// Writing to an existing set-user-ID file must cost it its bit; dir
	// here is that file.
	"write-existing": {try: func(file string) (string, error) {
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return file, err
		}
		_, err = f.Write([]byte("\n# appended by the sandbox\n"))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return file, err
	}},
	// A file created in a set-group-ID directory takes its group, and must
	// not take the bit; dir here is that directory.
	"inherit": {try: func(dir string) (string, error) {
		p := filepath.Join(dir, "setid-inherit")
		return p, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
	}},
	// File capabilities raise privileges like a set-user-ID bit does.
	"fcap": {
		try: func(dir string) (string, error) {
			p := filepath.Join(dir, "setid-fcap")
			if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
				return p, err
			}
			return p, unix.Setxattr(p, "security.capability", capSetUID(), 0)
		},
		check: func(p string) int {
			if n, err := unix.Getxattr(p, "security.capability", make([]byte, 64)); err == nil && n > 0 {
				return escaped("fcap: %s carries security.capability (CAP_SETUID)", p)
			}
			return blocked("fcap: setxattr succeeded but %s has no file capability", p)
		},
	},
}

// capSetUID is a VFS_CAP_REVISION_2 security.capability value granting
// CAP_SETUID, permitted and effective.
func capSetUID() []byte {
	const revision2, effective = 0x02000000, 0x1
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], revision2|effective)
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_SETUID)
	return b
}

// setIDSource is a set-user-ID file of the system to copy or link.
func setIDSource() string {
	for _, name := range []string{"su", "passwd", "mount", "chsh", "newgrp"} {
		p := "/usr/bin/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSetuid != 0 {
			return p
		}
	}
	return ""
}

// chmodVia creates a plain file and asks chmod to make it set-user-ID.
func chmodVia(dir, name string, chmod func(string) error) (string, error) {
	p := filepath.Join(dir, "setid-"+name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		return p, fmt.Errorf("create the file to chmod: %w", err)
	}
	return p, chmod(p)
}

func fchmodatMode(name string, mode uint64) func(string) (string, error) {
	return func(dir string) (string, error) {
		return chmodVia(dir, name, func(p string) error {
			b, _ := unix.BytePtrFromString(p)
			return callErr(unix.Syscall6(unix.SYS_FCHMODAT, uintptr(cwdFD), uintptr(unsafe.Pointer(b)), uintptr(mode), 0, 0, 0))
		})
	}
}

func callErr(_, _ uintptr, e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// closeFd closes the descriptor a raw open returned.
func closeFd(fd, _ uintptr, e unix.Errno) error {
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	return nil
}

// cmdSetID runs one variant: setid VARIANT DIR (or FILE for
// write-existing). It escapes when the file it aimed at ends up with a
// set-user-ID or set-group-ID bit.
func cmdSetID(args []string) int {
	names := make([]string, 0, len(setIDVariants))
	for n := range setIDVariants {
		names = append(names, n)
	}
	sort.Strings(names)
	need(args, 2, "setid "+strings.Join(names, "|")+" DIR")
	v, ok := setIDVariants[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown setid variant %q (have %s)\n", args[0], strings.Join(names, " "))
		return exitUsage
	}
	path, err := v.try(args[1])
	if v.check != nil && err == nil {
		return v.check(path)
	}
	// A tool may report a failure after the damage is done (cp -p fails
	// on ownership yet may have set the mode), so the file decides.
	var st unix.Stat_t
	serr := unix.Lstat(path, &st)
	switch {
	case serr == nil && st.Mode&setIDBits != 0:
		return escaped("%s: %s has mode %#o (uid %d)", args[0], path, st.Mode&0o7777, st.Uid)
	case err != nil:
		return blocked("%s: %s", args[0], errno(err))
	case serr != nil:
		return blocked("%s: the call succeeded but %s is missing: %s", args[0], path, errno(serr))
	}
	return blocked("%s: the call succeeded but %s has no set-id bit (mode %#o)", args[0], path, st.Mode&0o7777)
}
