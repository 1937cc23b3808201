//go:build linux

package seccomp

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The setid rules test only the mode bits of a mode argument: an ordinary
// file mode passes, either set-id bit (alone, or with junk in the upper
// half the kernel ignores) is refused, and openat2 is ENOSYS.
func TestSetIDProgram(t *testing.T) {
	const hi = 1 << 32
	for _, a := range testArches {
		nr := a.number
		cases := []struct {
			syscall string
			modeArg int
		}{
			{"chmod", 1}, {"fchmod", 1}, {"fchmodat", 2}, {"fchmodat2", 2},
			{"creat", 1}, {"open", 2}, {"openat", 3},
			{"mkdir", 1}, {"mkdirat", 2}, {"mknod", 1}, {"mknodat", 2},
		}
		for _, c := range cases {
			n, ok := nr(c.syscall)
			if !ok {
				continue // not on this architecture (aarch64 has only the *at forms)
			}
			for _, tc := range []struct {
				mode uint64
				want retAction
			}{
				{0o755, retAllow}, {0o1777, retAllow}, {unix.S_IFREG | 0o644, retAllow},
				{0o4755, ePERM}, {0o2755, ePERM}, {0o6755, ePERM}, {unix.S_IFREG | 0o4755, ePERM},
				{hi | 0o4755, ePERM},
			} {
				// Set-id bits in every other argument (a path pointer,
				// flags) must not be mistaken for the mode.
				args := []uint64{0o6000, 0o6000, 0o6000, 0o6000}
				args[c.modeArg] = tc.mode
				t.Run(fmt.Sprintf("%s/%s/%#o", a.name, c.syscall, tc.mode), func(t *testing.T) {
					if got := simulate(t, ProfileDefault, NetProxy, a, a.id, n, args...); got != tc.want {
						t.Errorf("got %v, want %v", got, tc.want)
					}
				})
			}
		}
		n, _ := nr("openat2")
		if got := simulate(t, ProfileDefault, NetProxy, a, a.id, n, 0, 0, 0, 24); got != eNOSYS {
			t.Errorf("%s openat2: got %v, want ENOSYS", a.name, got)
		}
		// The relaxed profile leaves modes alone (corral refuses to idmap a
		// writable mount under it instead).
		n, _ = nr("fchmodat")
		if got := simulate(t, ProfileRelaxed, NetProxy, a, a.id, n, 0, 0, 0o4755); got != retAllow {
			t.Errorf("%s relaxed fchmodat: got %v, want allow", a.name, got)
		}
	}
}

// setIDDirEnv names the directory the kernel probes create files in.
const setIDDirEnv = "CORRAL_SECCOMP_TEST_DIR"

func setIDPath(name string) *byte {
	b, _ := unix.BytePtrFromString(filepath.Join(os.Getenv(setIDDirEnv), name))
	return b
}

func init() {
	atFDCWD := unix.AT_FDCWD
	probes["fchmodat_setuid"] = func() unix.Errno {
		p := setIDPath("fchmodat")
		if fd, err := unix.Open(filepath.Join(os.Getenv(setIDDirEnv), "fchmodat"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o755); err == nil {
			unix.Close(fd)
		}
		_, _, e := unix.RawSyscall6(unix.SYS_FCHMODAT, uintptr(atFDCWD), uintptr(unsafe.Pointer(p)), 0o4755, 0, 0, 0)
		return e
	}
	probes["openat_setgid"] = openatProbe("openat", 0o2755)
	probes["openat_plain"] = openatProbe("plain", 0o755)
	probes["openat2"] = func() unix.Errno {
		fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Join(os.Getenv(setIDDirEnv), "openat2"),
			&unix.OpenHow{Flags: unix.O_CREAT | unix.O_WRONLY | unix.O_CLOEXEC, Mode: 0o4755})
		if err != nil {
			return err.(unix.Errno)
		}
		unix.Close(fd)
		return 0
	}
}

// openatProbe creates name with mode through a raw openat.
func openatProbe(name string, mode uintptr) func() unix.Errno {
	return func() unix.Errno {
		atFDCWD := unix.AT_FDCWD
		p := setIDPath(name)
		fd, _, e := unix.RawSyscall6(unix.SYS_OPENAT, uintptr(atFDCWD), uintptr(unsafe.Pointer(p)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, mode, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return e
	}
}

// TestKernelSetID runs the probes against the real filter: unfiltered each
// makes its set-id file, filtered each is refused, and a plain create works.
func TestKernelSetID(t *testing.T) {
	requireSeccomp(t)
	for _, c := range []struct {
		probe string
		want  unix.Errno
	}{
		{"fchmodat_setuid", unix.EPERM}, {"openat_setgid", unix.EPERM}, {"openat2", unix.ENOSYS}, {"openat_plain", 0},
	} {
		t.Run(c.probe, func(t *testing.T) {
			env := setIDDirEnv + "=" + t.TempDir()
			if base := runChild(t, noFilter, "", c.probe, env); base.errno != 0 {
				t.Fatalf("unfiltered %s: %v (the probe itself is broken)", c.probe, base)
			}
			env = setIDDirEnv + "=" + t.TempDir()
			if got := runChild(t, string(ProfileDefault), string(NetProxy), c.probe, env); got != (childResult{errno: c.want}) {
				t.Errorf("filtered %s: got %v, want %v", c.probe, got, childResult{errno: c.want})
			}
		})
	}
}
