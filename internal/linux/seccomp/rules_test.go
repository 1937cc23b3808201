//go:build linux

package seccomp

import (
	"encoding/binary"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/seccomp/filter"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var (
	profiles = []Profile{ProfileDefault, ProfileRelaxed}
	netModes = []NetMode{NetBlock, NetProxy, NetAllow, NetProxyHooked}
)

func renderRules(rs []Rule) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%-13s %s", r.Action, strings.Join(r.Syscalls, ","))
		if r.Condition != "" {
			fmt.Fprintf(&b, " if %s", r.Condition)
		}
		fmt.Fprintf(&b, "  # %s\n", r.Reason)
	}
	return b.String()
}

// The golden files are the reviewable statement of what each profile blocks
// on x86_64; a change to them is a change to the security policy.
func TestRulesGolden(t *testing.T) {
	for _, p := range profiles {
		for _, m := range netModes {
			t.Run(fmt.Sprintf("%s_%s", p, m), func(t *testing.T) {
				rs, err := rulesFor(p, m, &archX86_64)
				if err != nil {
					t.Fatal(err)
				}
				got := renderRules(rs)
				path := filepath.Join("testdata", fmt.Sprintf("rules_%s_%s.golden", p, m))
				if *update {
					if err := os.MkdirAll("testdata", 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update to create)", err)
				}
				if got != string(want) {
					t.Errorf("rules differ from %s (run with -update if intended):\n%s", path, got)
				}
			})
		}
	}
}

func TestRulesNative(t *testing.T) {
	for _, p := range profiles {
		for _, m := range netModes {
			rs, err := Rules(p, m)
			if err != nil {
				t.Fatalf("%s/%s: %v", p, m, err)
			}
			if first := rs[0]; first.Action != "kill(SIGSYS)" || !strings.HasPrefix(first.Condition, "audit arch != ") {
				t.Errorf("%s/%s: first rule must be the architecture guard, got %+v", p, m, first)
			}
			if last := rs[len(rs)-1]; last.Action != "allow" || last.Condition != "" {
				t.Errorf("%s/%s: last rule must be the default allow, got %+v", p, m, last)
			}
		}
	}
}

func TestRulesRejectUnknown(t *testing.T) {
	if _, err := Rules("strict", NetBlock); err == nil {
		t.Error("unknown profile accepted")
	}
	if _, err := Rules(ProfileDefault, "open"); err == nil {
		t.Error("unknown network mode accepted")
	}
	if _, err := Program("", NetBlock); err == nil {
		t.Error("Program accepted an empty profile")
	}
}

func TestRulesContent(t *testing.T) {
	index := func(rs []Rule) map[string][]Rule {
		m := map[string][]Rule{}
		for _, r := range rs {
			for _, s := range r.Syscalls {
				m[s] = append(m[s], r)
			}
		}
		return m
	}
	def, err := rulesFor(ProfileDefault, NetProxy, &archX86_64)
	if err != nil {
		t.Fatal(err)
	}
	byName := index(def)
	for _, s := range []string{"iopl", "ioperm", "clock_settime", "settimeofday"} {
		if r := byName[s]; len(r) != 1 || r[0].Action != "kill(SIGSYS)" {
			t.Errorf("default: %s should be killed, got %+v", s, r)
		}
	}
	for _, s := range []string{"ptrace", "mount", "umount2", "bpf", "setns", "io_uring_setup", "open_tree", "fsopen", "keyctl", "chroot"} {
		if r := byName[s]; len(r) != 1 || r[0].Action != "errno(EPERM)" || r[0].Condition != "" {
			t.Errorf("default: %s should be EPERM unconditionally, got %+v", s, r)
		}
	}
	if r := byName["clone3"]; len(r) != 1 || r[0].Action != "errno(ENOSYS)" {
		t.Errorf("default: clone3 should be ENOSYS, got %+v", r)
	}
	if r := byName["clone"]; len(r) != 1 || strings.Contains(r[0].Condition, "CLONE_NEWTIME") {
		t.Errorf("default: clone must not test CLONE_NEWTIME (it is part of CSIGNAL), got %+v", r)
	}
	if r := byName["unshare"]; len(r) != 1 || !strings.Contains(r[0].Condition, "CLONE_NEWTIME") {
		t.Errorf("default: unshare must test CLONE_NEWTIME, got %+v", r)
	}

	rel, err := rulesFor(ProfileRelaxed, NetProxy, &archX86_64)
	if err != nil {
		t.Fatal(err)
	}
	relNames := index(rel)
	for _, s := range []string{"ptrace", "iopl", "mount", "bpf", "clone3", "unshare", "io_uring_setup"} {
		if _, ok := relNames[s]; ok {
			t.Errorf("relaxed must not filter %s", s)
		}
	}
	for _, s := range []string{"reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "swapon", "swapoff"} {
		if r := relNames[s]; len(r) != 1 || r[0].Action != "errno(EPERM)" {
			t.Errorf("relaxed: %s should be EPERM, got %+v", s, r)
		}
	}

	for _, p := range profiles {
		for _, m := range netModes {
			rs, err := rulesFor(p, m, &archX86_64)
			if err != nil {
				t.Fatal(err)
			}
			var netlink, inet bool
			for _, r := range index(rs)["socket"] {
				netlink = netlink || strings.Contains(r.Condition, "AF_NETLINK")
				inet = inet || strings.Contains(r.Condition, "AF_INET")
			}
			if !netlink {
				t.Errorf("%s/%s: AF_NETLINK must always be denied", p, m)
			}
			if inet != (m == NetBlock) {
				t.Errorf("%s/%s: AF_INET denied=%v, want %v", p, m, inet, m == NetBlock)
			}
		}
	}
}

// An unconditional rule listed twice, or one shadowing a conditional rule,
// means the table says something the program does not do.
func TestRulesNoShadowing(t *testing.T) {
	for _, p := range profiles {
		rs, err := profileRules(p, NetBlock)
		if err != nil {
			t.Fatal(err)
		}
		uncond := map[string]bool{}
		seen := map[string]bool{}
		for _, r := range rs {
			for _, n := range r.names {
				n = strings.TrimPrefix(n, "?")
				if uncond[n] {
					t.Errorf("%s: %s is shadowed by an earlier unconditional rule", p, n)
				}
				if r.cond == nil && seen[n] {
					t.Errorf("%s: %s appears in a conditional rule before an unconditional one", p, n)
				}
				seen[n] = true
				if r.cond == nil {
					uncond[n] = true
				}
			}
		}
	}
}

var testArches = []*archInfo{&archX86_64, &archAARCH64}

func TestProgramAssembles(t *testing.T) {
	for _, a := range testArches {
		for _, p := range profiles {
			for _, m := range netModes {
				insns, err := program(p, m, a)
				if err != nil {
					t.Errorf("%s %s/%s: %v", a.name, p, m, err)
					continue
				}
				raw, err := bpf.Assemble(insns)
				if err != nil {
					t.Errorf("%s %s/%s: assemble: %v", a.name, p, m, err)
					continue
				}
				if len(raw) > filter.MaxInsns {
					t.Errorf("%s %s/%s: %d instructions", a.name, p, m, len(raw))
				}
				if _, err := bpf.NewVM(insns); err != nil {
					t.Errorf("%s %s/%s: VM rejects program: %v", a.name, p, m, err)
				}
			}
		}
	}
}

// seccompData lays out struct seccomp_data for golang.org/x/net/bpf's VM,
// which loads words big-endian: each word is stored big-endian at the offset
// the program reads it from, which reproduces what the kernel's native-order
// loads see.
func seccompData(auditArch uint32, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], auditArch)
	for i, a := range args {
		lo := argLoOffset(i)
		hi := uint32(offArgs+8*i) + 4
		if lo != uint32(offArgs+8*i) {
			hi = uint32(offArgs + 8*i)
		}
		binary.BigEndian.PutUint32(b[lo:], uint32(a))
		binary.BigEndian.PutUint32(b[hi:], uint32(a>>32))
	}
	return b
}

func simulate(t *testing.T, p Profile, m NetMode, a *archInfo, auditArch uint32, nr uint32, args ...uint64) retAction {
	t.Helper()
	insns, err := program(p, m, a)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	r, err := vm.Run(seccompData(auditArch, nr, args...))
	if err != nil {
		t.Fatal(err)
	}
	return retAction(r)
}

func TestProgramBehaviour(t *testing.T) {
	x := &archX86_64
	nr := func(name string) uint32 {
		n, ok := x.number(name)
		if !ok {
			t.Fatalf("no syscall %s", name)
		}
		return n
	}
	native := x.id
	const hi = 1 << 32 // junk in the upper half the kernel ignores
	cases := []struct {
		name string
		p    Profile
		m    NetMode
		arch uint32
		nr   uint32
		args []uint64
		want retAction
	}{
		{"getpid", ProfileDefault, NetBlock, native, nr("getpid"), nil, retAllow},
		{"read", ProfileDefault, NetBlock, native, nr("read"), []uint64{0, 0, 10}, retAllow},
		{"ptrace", ProfileDefault, NetAllow, native, nr("ptrace"), nil, ePERM},
		{"ptrace relaxed", ProfileRelaxed, NetAllow, native, nr("ptrace"), nil, retAllow},
		{"reboot relaxed", ProfileRelaxed, NetAllow, native, nr("reboot"), nil, ePERM},
		{"iopl", ProfileDefault, NetProxy, native, nr("iopl"), []uint64{3}, retKillProcess},
		{"iopl relaxed", ProfileRelaxed, NetProxy, native, nr("iopl"), []uint64{3}, retAllow},
		{"settimeofday", ProfileDefault, NetProxy, native, nr("settimeofday"), nil, retKillProcess},
		{"i386 getpid", ProfileDefault, NetAllow, uint32(arch.I386.ID), 20, nil, retKillProcess},
		{"i386 relaxed", ProfileRelaxed, NetAllow, uint32(arch.I386.ID), 20, nil, retKillProcess},
		{"aarch64 arch", ProfileDefault, NetAllow, archAARCH64.id, 172, nil, retKillProcess},
		{"x32 getpid", ProfileDefault, NetAllow, native, x32SyscallBit | nr("getpid"), nil, eNOSYS},
		{"x32 ptrace relaxed", ProfileRelaxed, NetAllow, native, x32SyscallBit | 521, nil, eNOSYS},
		{"unshare newuser", ProfileDefault, NetProxy, native, nr("unshare"), []uint64{unix.CLONE_NEWUSER}, ePERM},
		{"unshare newtime", ProfileDefault, NetProxy, native, nr("unshare"), []uint64{unix.CLONE_NEWTIME}, ePERM},
		{"unshare newnet hi junk", ProfileDefault, NetProxy, native, nr("unshare"), []uint64{hi | unix.CLONE_NEWNET}, ePERM},
		{"unshare files", ProfileDefault, NetProxy, native, nr("unshare"), []uint64{unix.CLONE_FILES | unix.CLONE_FS}, retAllow},
		{"unshare zero", ProfileDefault, NetProxy, native, nr("unshare"), []uint64{0}, retAllow},
		{"clone thread", ProfileDefault, NetProxy, native, nr("clone"), []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM}, retAllow},
		{"clone fork", ProfileDefault, NetProxy, native, nr("clone"), []uint64{uint64(unix.SIGCHLD)}, retAllow},
		{"clone newpid", ProfileDefault, NetProxy, native, nr("clone"), []uint64{unix.CLONE_NEWPID | uint64(unix.SIGCHLD)}, ePERM},
		{"clone3", ProfileDefault, NetProxy, native, nr("clone3"), nil, eNOSYS},
		{"ioctl tiocsti", ProfileDefault, NetProxy, native, nr("ioctl"), []uint64{0, unix.TIOCSTI}, ePERM},
		{"ioctl tiocsti hi junk", ProfileDefault, NetProxy, native, nr("ioctl"), []uint64{0, hi | unix.TIOCSTI}, ePERM},
		{"ioctl tioclinux", ProfileDefault, NetProxy, native, nr("ioctl"), []uint64{0, unix.TIOCLINUX}, ePERM},
		{"ioctl tcgets", ProfileDefault, NetProxy, native, nr("ioctl"), []uint64{0, unix.TCGETS}, retAllow},
		{"ioctl fd looks like tiocsti", ProfileDefault, NetProxy, native, nr("ioctl"), []uint64{unix.TIOCSTI, unix.TCGETS}, retAllow},
		// After the ioctl block's argument load misses, A must hold the
		// syscall number again, or cmd==nr(socket) would be taken for a
		// socket call and arg0==AF_NETLINK would deny it.
		{"ioctl cmd equals socket nr", ProfileDefault, NetProxy, native, nr("ioctl"), []uint64{unix.AF_NETLINK, uint64(nr("socket"))}, retAllow},
		{"ioctl relaxed", ProfileRelaxed, NetProxy, native, nr("ioctl"), []uint64{0, unix.TIOCSTI}, retAllow},
		{"socket netlink", ProfileDefault, NetAllow, native, nr("socket"), []uint64{unix.AF_NETLINK}, ePERM},
		{"socket netlink hi junk", ProfileDefault, NetAllow, native, nr("socket"), []uint64{hi | unix.AF_NETLINK}, ePERM},
		{"socket packet relaxed", ProfileRelaxed, NetAllow, native, nr("socket"), []uint64{unix.AF_PACKET}, ePERM},
		{"socket vsock", ProfileDefault, NetProxy, native, nr("socket"), []uint64{unix.AF_VSOCK}, ePERM},
		{"socket bluetooth", ProfileDefault, NetProxy, native, nr("socket"), []uint64{unix.AF_BLUETOOTH}, ePERM},
		{"socketpair netlink", ProfileDefault, NetProxy, native, nr("socketpair"), []uint64{unix.AF_NETLINK}, ePERM},
		{"socket unix", ProfileDefault, NetBlock, native, nr("socket"), []uint64{unix.AF_UNIX}, retAllow},
		{"socket inet block", ProfileDefault, NetBlock, native, nr("socket"), []uint64{unix.AF_INET}, ePERM},
		{"socket inet6 block relaxed", ProfileRelaxed, NetBlock, native, nr("socket"), []uint64{unix.AF_INET6}, ePERM},
		{"socket inet hi junk block", ProfileDefault, NetBlock, native, nr("socket"), []uint64{hi | unix.AF_INET}, ePERM},
		{"socketpair inet block", ProfileDefault, NetBlock, native, nr("socketpair"), []uint64{unix.AF_INET}, ePERM},
		{"socket inet proxy", ProfileDefault, NetProxy, native, nr("socket"), []uint64{unix.AF_INET}, retAllow},
		{"socket inet6 allow", ProfileDefault, NetAllow, native, nr("socket"), []uint64{unix.AF_INET6}, retAllow},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := simulate(t, c.p, c.m, x, c.arch, c.nr, c.args...); got != c.want {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

// Every rule shown by Rules must be what the compiled program does, on each
// architecture the tables cover.
func TestRulesMatchProgram(t *testing.T) {
	for _, a := range testArches {
		for _, p := range profiles {
			for _, m := range netModes {
				rs, err := profileRules(p, m)
				if err != nil {
					t.Fatal(err)
				}
				resolved, err := resolve(rs, a)
				if err != nil {
					t.Fatalf("%s: %v", a.name, err)
				}
				for _, r := range resolved {
					for i, nr := range r.nrs {
						var args [6]uint64
						if r.cond != nil {
							switch {
							case len(r.cond.bitsAny) > 0:
								args[r.cond.arg] = uint64(r.cond.bitsAny[0].val)
							default:
								args[r.cond.arg] = uint64(r.cond.anyOf[len(r.cond.anyOf)-1].val)
							}
						}
						if got := simulate(t, p, m, a, a.id, nr, args[:]...); got != r.action {
							t.Errorf("%s %s/%s %s: got %v, want %v", a.name, p, m, r.syscalls[i], got, r.action)
						}
					}
				}
			}
		}
	}
}

func TestArgLoOffset(t *testing.T) {
	want := uint32(16)
	if runtime.GOARCH == "s390x" || runtime.GOARCH == "ppc64" || runtime.GOARCH == "mips" || runtime.GOARCH == "mips64" {
		want = 20
	}
	if got := argLoOffset(0); got != want {
		t.Errorf("argLoOffset(0) = %d, want %d", got, want)
	}
}

// The generated tables are go-seccomp-bpf's, whole: after an update of the
// library, go generate ./internal/linux/seccomp.
func TestSyscallTablesMatchLibrary(t *testing.T) {
	for _, c := range []struct {
		ours   *archInfo
		theirs *arch.Info
	}{{&archX86_64, arch.X86_64}, {&archAARCH64, arch.AARCH64}} {
		if c.ours.name != c.theirs.Name || c.ours.id != uint32(c.theirs.ID) || c.theirs.SeccompMask != 0 {
			t.Errorf("%s: name %q, audit arch %#x; the library has %q, %#x, mask %#x", c.ours.name, c.ours.name, c.ours.id, c.theirs.Name, c.theirs.ID, c.theirs.SeccompMask)
		}
		if !slices.IsSortedFunc(c.ours.syscalls, func(a, b syscallNr) int { return strings.Compare(a.name, b.name) }) {
			t.Errorf("%s: table not sorted by name", c.ours.name)
		}
		ours := map[string]int{}
		for _, s := range c.ours.syscalls {
			ours[s.name] = int(s.nr)
		}
		if !maps.Equal(ours, c.theirs.SyscallNames) {
			t.Errorf("%s: the generated table differs from go-seccomp-bpf's; run go generate ./internal/linux/seccomp", c.ours.name)
		}
		for name, nr := range c.theirs.SyscallNames {
			if got, ok := c.ours.number(name); !ok || got != uint32(nr) {
				t.Errorf("%s: number(%q) = %d, %v; want %d", c.ours.name, name, got, ok, nr)
			}
		}
	}
}
