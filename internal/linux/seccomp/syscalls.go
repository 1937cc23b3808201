//go:build linux

package seccomp

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
)

//go:generate go run ./gensyscalls

// archInfo is what a filter needs of an architecture: its name (as
// go-seccomp-bpf spells it), its audit arch, and its syscall numbers.
type archInfo struct {
	name string
	id   uint32
	// syscalls is sorted by name (zsyscalls.go, generated).
	syscalls []syscallNr
}

type syscallNr struct {
	name string
	nr   uint32
}

// number is the syscall called name on a.
func (a *archInfo) number(name string) (uint32, bool) {
	i, ok := slices.BinarySearchFunc(a.syscalls, name, func(s syscallNr, n string) int { return strings.Compare(s.name, n) })
	if !ok {
		return 0, false
	}
	return a.syscalls[i].nr, true
}

// nativeArch refuses 32-bit targets on purpose: there socket(2) can also be
// reached through socketcall(2), whose arguments are in memory, so the
// socket-family filter would not hold.
func nativeArch() (*archInfo, error) {
	switch runtime.GOARCH {
	case "amd64":
		return &archX86_64, nil
	case "arm64":
		return &archAARCH64, nil
	}
	return nil, fmt.Errorf("seccomp: architecture %s is not supported (x86_64 and aarch64 are)", runtime.GOARCH)
}
