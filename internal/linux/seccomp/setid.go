//go:build linux

package seccomp

import "golang.org/x/sys/unix"

// setIDBits are the mode bits that make an executable raise privileges.
var setIDBits = []named{{"S_ISUID", unix.S_ISUID}, {"S_ISGID", unix.S_ISGID}}

func setIDMode(arg int) *argCond {
	return &argCond{arg: arg, argName: "mode", bitsAny: setIDBits}
}

// setIDReason explains the rules below. Through an idmapped workdir the
// workload's files are owned on the host by the workdir's owner, root for
// a root-owned checkout: a set-user-ID file it left there would be a root
// shell for any host user. Nothing inside needs to make one (the mounts are
// nosuid and no_new_privs is set), so every call that could is refused.
const setIDReason = "creating set-user-ID/set-group-ID files, which would run with their host owner's ids (root's, in an idmapped root-owned workdir)"

// setIDRules refuse every syscall that sets a mode with S_ISUID or S_ISGID:
// chmod and its variants, and the calls that create an inode with a mode.
// The mode is tested whatever the flags (open ignores it without O_CREAT
// or O_TMPFILE, and libc then passes 0). Names marked "?" exist only on
// older ABIs such as x86_64's; aarch64 has only the *at forms. File
// capabilities (setxattr security.capability) need CAP_SETFCAP, which the
// workload never holds; hard links and renames cannot cross mounts, so no
// set-user-ID file of the system can be moved into the workdir.
var setIDRules = []rule{
	{[]string{"?chmod", "fchmod"}, ePERM, setIDMode(1), setIDReason},
	{[]string{"fchmodat", "fchmodat2"}, ePERM, setIDMode(2), setIDReason},
	{[]string{"?creat", "?mkdir", "?mknod"}, ePERM, setIDMode(1), setIDReason},
	{[]string{"?open", "mkdirat", "mknodat"}, ePERM, setIDMode(2), setIDReason},
	{[]string{"openat"}, ePERM, setIDMode(3), setIDReason},
	{[]string{"openat2"}, eNOSYS, nil,
		"its mode lives in memory seccomp cannot read; ENOSYS makes libc fall back to openat, which is filtered"},
}
