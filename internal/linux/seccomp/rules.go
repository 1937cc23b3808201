//go:build linux

// Package seccomp builds and installs corral's seccomp filters: the "default"
// and "relaxed" profiles plus a socket-family filter that depends on the
// network mode.
//
// The filter is a deny list (default action allow). It is assembled here
// rather than with go-seccomp-bpf's Policy assembler, whose generated program
// returns the default action for a foreign audit architecture (so an i386
// `int 0x80` call would skip every rule), compares only full 64-bit argument
// values (so setting the unused upper half of an int argument such as the
// socket domain evades an equality rule) and does not reload the syscall
// number after an argument check fails (so a later rule can match on an
// argument value). go-seccomp-bpf is still the source of the syscall
// tables, which go generate copies into static data (zsyscalls.go).
//
// Rules is pure and is what `policy explain` shows; Install compiles exactly
// the same rule list, so what is shown is what is enforced.
package seccomp

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Profile names one of the two built-in syscall profiles.
type Profile string

// The built-in profiles.
const (
	ProfileDefault Profile = "default"
	ProfileRelaxed Profile = "relaxed"
)

// NetMode is the sandbox's network mode; it decides whether IP sockets may be
// created at all.
type NetMode string

// The network modes.
const (
	NetBlock NetMode = "block"
	NetProxy NetMode = "proxy"
	NetAllow NetMode = "allow"
	// NetProxyHooked is proxy mode where a cgroup hook records who
	// connects each socket (connhook), so the filter leaves connect(2)
	// to the kernel. No plan asks for it; the supervisor chooses it when
	// the hook is attached.
	NetProxyHooked NetMode = "proxy-hooked"
)

// Rule is one entry of a profile in human-readable form. Rules are evaluated
// in order and the first match decides.
type Rule struct {
	Syscalls  []string // syscall names; "*" matches every call
	Action    string   // "allow", "errno(EPERM)", "errno(ENOSYS)", "kill(SIGSYS)"
	Condition string   // empty when the rule applies unconditionally
	Reason    string
}

// Kernel ABI values of seccomp return actions (include/uapi/linux/seccomp.h).
const (
	retKillProcess retAction = unix.SECCOMP_RET_KILL_PROCESS
	retErrno       retAction = unix.SECCOMP_RET_ERRNO
	retAllow       retAction = unix.SECCOMP_RET_ALLOW
	retNotify      retAction = unix.SECCOMP_RET_USER_NOTIF
)

type retAction uint32

func errno(e unix.Errno) retAction { return retErrno | retAction(uint32(e)&unix.SECCOMP_RET_DATA) }

func (a retAction) String() string {
	switch {
	case a == retAllow:
		return "allow"
	case a == retKillProcess:
		return "kill(SIGSYS)"
	case a == retNotify:
		return "notify(supervisor)"
	case a&unix.SECCOMP_RET_ACTION_FULL == retErrno:
		return "errno(" + unix.ErrnoName(unix.Errno(a&unix.SECCOMP_RET_DATA)) + ")"
	}
	return fmt.Sprintf("action(%#x)", uint32(a))
}

// named is a constant together with the name shown in explain output.
type named struct {
	name string
	val  uint32
}

// argCond restricts a rule to calls whose argument matches. Only the low 32
// bits are examined: every argument filtered here is an int/unsigned int in
// the kernel (or, for clone/unshare, has all relevant bits in the low word),
// and the kernel ignores the upper half, so comparing it would let a caller
// dodge the rule by setting junk there.
type argCond struct {
	arg     int
	argName string
	anyOf   []named // match when the argument equals one of these
	bitsAny []named // match when the argument has any of these bits set
}

func (c *argCond) String() string {
	if c == nil {
		return ""
	}
	subject := fmt.Sprintf("arg%d (%s)", c.arg, c.argName)
	if len(c.bitsAny) > 0 {
		names := make([]string, len(c.bitsAny))
		for i, b := range c.bitsAny {
			names[i] = b.name
		}
		return fmt.Sprintf("%s & (%s) != 0", subject, strings.Join(names, "|"))
	}
	names := make([]string, len(c.anyOf))
	for i, v := range c.anyOf {
		names[i] = v.name
	}
	if len(names) == 1 {
		return subject + " == " + names[0]
	}
	return fmt.Sprintf("%s in {%s}", subject, strings.Join(names, ", "))
}

func (c *argCond) mask() uint32 {
	var m uint32
	for _, b := range c.bitsAny {
		m |= b.val
	}
	return m
}

// rule is the internal form of Rule. A name prefixed with "?" is allowed to be
// missing from the native syscall table (e.g. umount and iopl do not exist on
// arm64, stime only on 32-bit ABIs); any other unknown name is a bug and makes
// Rules and Install fail rather than silently weakening the filter.
type rule struct {
	names  []string
	action retAction
	cond   *argCond
	reason string
}

var nsFlags = []named{
	{"CLONE_NEWNS", unix.CLONE_NEWNS},
	{"CLONE_NEWUTS", unix.CLONE_NEWUTS},
	{"CLONE_NEWIPC", unix.CLONE_NEWIPC},
	{"CLONE_NEWUSER", unix.CLONE_NEWUSER},
	{"CLONE_NEWPID", unix.CLONE_NEWPID},
	{"CLONE_NEWNET", unix.CLONE_NEWNET},
	{"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP},
	{"CLONE_NEWTIME", unix.CLONE_NEWTIME},
}

// cloneNSFlags leaves out CLONE_NEWTIME: for clone(2) that bit lies inside
// CSIGNAL (the exit signal), so the kernel never reads it as a namespace flag
// there and testing it would only misfire on odd signal numbers.
var cloneNSFlags = nsFlags[:len(nsFlags)-1]

var (
	ePERM  = errno(unix.EPERM)
	eNOSYS = errno(unix.ENOSYS)
)

var defaultRules = []rule{
	{[]string{"?iopl", "?ioperm"}, retKillProcess, nil,
		"x86 I/O port access"},
	{[]string{"clock_settime", "settimeofday", "?stime", "?clock_settime64"}, retKillProcess, nil,
		"setting the system clock"},
	{[]string{"ptrace"}, ePERM, nil,
		"process injection / debugger attach"},
	{[]string{"process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"}, ePERM, nil,
		"reading other processes' memory, comparing or taking their descriptors (a connected socket would carry its holder's identity)"},
	{[]string{"kexec_load", "kexec_file_load", "reboot"}, ePERM, nil,
		"boot a new kernel or reboot"},
	{[]string{"init_module", "finit_module", "delete_module", "?create_module", "?get_kernel_syms", "?query_module"}, ePERM, nil,
		"load/unload kernel modules"},
	{[]string{"keyctl", "request_key", "add_key"}, ePERM, nil,
		"kernel keyring access (keyrings are not namespaced)"},
	{[]string{"mount", "?umount", "umount2", "pivot_root", "chroot",
		"open_tree", "?open_tree_attr", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"}, ePERM, nil,
		"mount manipulation (classic and new mount API)"},
	{[]string{"swapon", "swapoff"}, ePERM, nil,
		"swap manipulation"},
	{[]string{"?nfsservctl", "vmsplice", "migrate_pages", "move_pages", "userfaultfd"}, ePERM, nil,
		"historically exploit-prone"},
	{[]string{"bpf"}, ePERM, nil,
		"loading BPF programs from inside the sandbox"},
	{[]string{"perf_event_open"}, ePERM, nil,
		"performance-counter side channels"},
	{[]string{"io_uring_setup", "io_uring_enter", "io_uring_register"}, ePERM, nil,
		"io_uring performs I/O without passing through seccomp and has a long exploit record"},
	{[]string{"acct", "sethostname", "setdomainname", "?lookup_dcookie", "quotactl", "?quotactl_fd",
		"syslog", "vhangup", "adjtimex", "clock_adjtime", "?clock_adjtime64",
		"?uselib", "?ustat", "?sysfs", "?_sysctl",
		"name_to_handle_at", "open_by_handle_at"}, ePERM, nil,
		"CAP_SYS_*-class or obsolete interfaces (catch-all)"},
	{[]string{"setns"}, ePERM, nil,
		"re-namespacing: joining another namespace"},
	{[]string{"unshare"}, ePERM, &argCond{arg: 0, argName: "flags", bitsAny: nsFlags},
		"re-namespacing: creating namespaces (plain unshare of files/fs stays allowed)"},
	{[]string{"clone"}, ePERM, &argCond{arg: 0, argName: "flags", bitsAny: cloneNSFlags},
		"re-namespacing: creating namespaces while forking"},
	{[]string{"clone3"}, eNOSYS, nil,
		"flags live in memory seccomp cannot read; ENOSYS makes libc fall back to clone(2), which is filtered"},
	{[]string{"ioctl"}, ePERM, &argCond{arg: 1, argName: "cmd", anyOf: []named{
		{"TIOCSTI", unix.TIOCSTI}, {"TIOCLINUX", unix.TIOCLINUX}}},
		"injecting input into the controlling terminal"},
}

var relaxedRules = []rule{
	{[]string{"reboot", "kexec_load", "kexec_file_load"}, ePERM, nil,
		"boot a new kernel or reboot"},
	{[]string{"init_module", "finit_module", "delete_module"}, ePERM, nil,
		"load/unload kernel modules"},
	{[]string{"swapon", "swapoff"}, ePERM, nil,
		"swap manipulation"},
}

// initPID is the sandbox's init as its pid namespace numbers it.
var initPID = []named{{"1 (the sandbox's init)", 1}}

// initRules keep the workload's signals and pidfds away from its init,
// whatever the profile. The init shares the workload's uid when rootless
// and, having forked it, its Landlock domain on the init's main thread
// (pid 1), the one thread a signal scope would let through; every other
// init thread is in a domain of its own that the scope refuses.
var initRules = []rule{
	{[]string{"kill", "tkill", "rt_sigqueueinfo", "pidfd_open"}, ePERM,
		&argCond{arg: 0, argName: "pid", anyOf: initPID},
		"signalling or opening the sandbox's init, which reaps and reports the workload's end"},
	{[]string{"tgkill", "rt_tgsigqueueinfo"}, ePERM,
		&argCond{arg: 0, argName: "tgid", anyOf: initPID},
		"signalling the sandbox's init, which reaps and reports the workload's end"},
}

var alwaysDeniedFamilies = []named{
	{"AF_NETLINK", unix.AF_NETLINK},
	{"AF_PACKET", unix.AF_PACKET},
	{"AF_VSOCK", unix.AF_VSOCK},
	{"AF_BLUETOOTH", unix.AF_BLUETOOTH},
}

var ipFamilies = []named{
	{"AF_INET", unix.AF_INET},
	{"AF_INET6", unix.AF_INET6},
}

func socketRules(m NetMode) []rule {
	rs := []rule{{[]string{"socket", "socketpair"}, ePERM,
		&argCond{arg: 0, argName: "domain", anyOf: alwaysDeniedFamilies},
		"kernel configuration, raw link-layer and host-guest sockets bypass the network policy"}}
	switch m {
	case NetBlock:
		rs = append(rs, rule{[]string{"socket", "socketpair"}, ePERM,
			&argCond{arg: 0, argName: "domain", anyOf: ipFamilies},
			"network mode block: no IP sockets"})
	case NetProxy:
		rs = append(rs, connectRule)
	}
	return rs
}

// connectRule has the supervisor note which process connects each socket
// before the kernel connects it. Who holds a socket when its connection is
// identified says nothing about who made it: a descriptor can be parked in
// flight in a unix socket while an allowed program is left holding the
// only other copy.
var connectRule = rule{[]string{"connect"}, retNotify, nil,
	"the supervisor records which process connects each socket, the identity its connection is decided for"}

// Notifies tells whether the filter for network mode m hands calls to the
// supervisor, which must then hold the filter's listener: without one the
// kernel fails those calls with ENOSYS.
func Notifies(m NetMode) bool { return m == NetProxy }

func profileRules(p Profile, m NetMode) ([]rule, error) {
	switch m {
	case NetBlock, NetProxy, NetAllow, NetProxyHooked:
	default:
		return nil, fmt.Errorf("seccomp: unknown network mode %q (want block, proxy or allow)", m)
	}
	var rs []rule
	switch p {
	case ProfileDefault:
		rs = append(rs, defaultRules...)
		rs = append(rs, setIDRules...)
	case ProfileRelaxed:
		rs = append(rs, relaxedRules...)
	default:
		return nil, fmt.Errorf("seccomp: unknown profile %q (want default or relaxed)", p)
	}
	rs = append(rs, initRules...)
	return append(rs, socketRules(m)...), nil
}

// resolvedRule is a rule whose names were looked up in one architecture's
// syscall table.
type resolvedRule struct {
	rule
	syscalls []string
	nrs      []uint32
}

func resolve(rs []rule, info *archInfo) ([]resolvedRule, error) {
	out := make([]resolvedRule, 0, len(rs))
	for _, r := range rs {
		rr := resolvedRule{rule: r}
		for _, n := range r.names {
			name, optional := strings.CutPrefix(n, "?")
			nr, ok := info.number(name)
			if !ok {
				if optional {
					continue
				}
				return nil, fmt.Errorf("seccomp: syscall %q unknown on %s", name, info.name)
			}
			rr.syscalls = append(rr.syscalls, name)
			rr.nrs = append(rr.nrs, nr)
		}
		if len(rr.nrs) > 0 {
			out = append(out, rr)
		}
	}
	return out, nil
}

// x32SyscallBit marks x32-ABI syscall numbers on x86_64; they share the
// x86_64 audit arch, so only the number tells them apart.
const x32SyscallBit = 0x40000000

// Rules returns the complete ordered rule list for profile p in network mode
// m on the native architecture, including the architecture guards that come
// first and the default action that comes last.
func Rules(p Profile, m NetMode) ([]Rule, error) {
	info, err := nativeArch()
	if err != nil {
		return nil, err
	}
	return rulesFor(p, m, info)
}

func rulesFor(p Profile, m NetMode, info *archInfo) ([]Rule, error) {
	rs, err := profileRules(p, m)
	if err != nil {
		return nil, err
	}
	resolved, err := resolve(rs, info)
	if err != nil {
		return nil, err
	}
	out := []Rule{{
		Syscalls:  []string{"*"},
		Action:    retKillProcess.String(),
		Condition: "audit arch != " + info.name,
		Reason:    "calls through another ABI (e.g. i386 int 0x80) would use different syscall numbers and skip every rule",
	}}
	if info.id == archX86_64.id {
		out = append(out, Rule{
			Syscalls:  []string{"*"},
			Action:    eNOSYS.String(),
			Condition: fmt.Sprintf("nr >= %#x (x32 ABI)", x32SyscallBit),
			Reason:    "x32 syscall numbers would skip every rule",
		})
	}
	for _, r := range resolved {
		out = append(out, Rule{
			Syscalls:  r.syscalls,
			Action:    r.action.String(),
			Condition: r.cond.String(),
			Reason:    r.reason,
		})
	}
	return append(out, Rule{
		Syscalls: []string{"*"},
		Action:   retAllow.String(),
		Reason:   "default action",
	}), nil
}
