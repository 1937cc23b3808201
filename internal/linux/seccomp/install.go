//go:build linux

package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/seccomp/filter"
)

// Program assembles profile p for network mode m, for this machine's
// architecture, as the bytes filter.Install loads.
func Program(p Profile, m NetMode) ([]byte, error) {
	info, err := nativeArch()
	if err != nil {
		return nil, err
	}
	insns, err := program(p, m, info)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble %s/%s: %w", p, m, err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, ins := range raw {
		prog[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	return filter.Encode(prog), nil
}
