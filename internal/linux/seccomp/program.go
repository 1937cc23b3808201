//go:build linux

package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/seccomp/filter"
)

// Offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLoOffset is where the low 32 bits of argument i sit: the kernel hands
// the filter seccomp_data in native byte order.
func argLoOffset(i int) uint32 {
	off := uint32(offArgs + 8*i)
	var probe [2]byte
	binary.NativeEndian.PutUint16(probe[:], 1)
	if probe[0] == 0 {
		off += 4
	}
	return off
}

// program compiles the rules for p/m against one architecture's syscall
// table.
//
// Layout: an architecture guard, then one small self-contained block per
// syscall and finally "allow". Every jump stays inside its block, so no jump
// ever exceeds the 8-bit conditional offset however many rules there are.
// The price is a linear scan: an allowed call walks about one instruction
// per listed syscall, like libseccomp's default output.
func program(p Profile, m NetMode, info *archInfo) ([]bpf.Instruction, error) {
	rs, err := profileRules(p, m)
	if err != nil {
		return nil, err
	}
	resolved, err := resolve(rs, info)
	if err != nil {
		return nil, err
	}

	loadNr := bpf.LoadAbsolute{Off: offNr, Size: 4}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: info.id, SkipTrue: 1},
		bpf.RetConstant{Val: uint32(retKillProcess)},
		loadNr,
	}
	if info.id == archX86_64.id {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
			bpf.RetConstant{Val: uint32(eNOSYS)},
		)
	}

	for _, r := range resolved {
		for _, nr := range r.nrs {
			prog = append(prog, syscallBlock(nr, r.action, r.cond, loadNr)...)
		}
	}
	prog = append(prog, bpf.RetConstant{Val: uint32(retAllow)})

	if len(prog) > filter.MaxInsns {
		return nil, fmt.Errorf("seccomp: program has %d instructions, kernel limit is %d", len(prog), filter.MaxInsns)
	}
	return prog, nil
}

// syscallBlock emits the test for one syscall number. On entry and on every
// exit that falls through to the next block, A holds the syscall number.
func syscallBlock(nr uint32, act retAction, c *argCond, loadNr bpf.Instruction) []bpf.Instruction {
	ret := bpf.RetConstant{Val: uint32(act)}
	if c == nil {
		return []bpf.Instruction{
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1},
			ret,
		}
	}

	var tests []bpf.Instruction
	if len(c.bitsAny) > 0 {
		tests = []bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: c.mask(), SkipFalse: 1}}
	} else {
		// Each equality test jumps to the shared ret on a match; the last one
		// skips over it to the reload on a miss.
		n := len(c.anyOf)
		for k, v := range c.anyOf {
			j := bpf.JumpIf{Cond: bpf.JumpEqual, Val: v.val, SkipTrue: uint8(n - 1 - k)}
			if k == n-1 {
				j.SkipFalse = 1
			}
			tests = append(tests, j)
		}
	}

	// The argument load clobbers A, so both the miss path and the path past
	// this block must end with A = nr again: a miss falls onto the reload,
	// another syscall skips the whole block including it (A is still nr).
	block := []bpf.Instruction{
		nil, // syscall number test, filled in below
		bpf.LoadAbsolute{Off: argLoOffset(c.arg), Size: 4},
	}
	block = append(block, tests...)
	block = append(block, ret, loadNr)
	block[0] = bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: uint8(len(block) - 1)}
	return block
}

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
