//go:build linux

// Package connhook records, in the kernel, which process connects each
// socket of a sandbox: a program attached to the connect hooks (IPv4 and
// IPv6) of the cgroup above every sandbox's writes the caller's process id
// and the time, keyed by the socket's cookie, into the map of the caller's
// cgroup, before the kernel connects the socket. Each sandbox has a map of
// its own, so none can push another's records out.
//
// It does what the sandbox's seccomp filter otherwise does by handing every
// connect(2) to the supervisor and waiting for its answer, without the two
// context switches that costs each connect. It also sees a connect that
// makes no connect(2) call: TCP Fast Open through sendto.
package connhook

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// maxRecords bounds a sandbox's map; the least recently written records
// go first when it is full. A record is needed from the connect until the
// connection is identified: a moment, or seconds for a workload that opens
// a thousand connections at once, so a connect is refused for want of a
// record only when the sandbox made thousands of others in between. The
// kernel allocates every entry when the map is made, which
// BenchmarkOpen/attach includes, so a sandbox that ends leaves its map for
// the next (freeSlots).
const maxRecords = 1 << 14

// freeSlots are the keys under which ended sandboxes leave their maps in
// the map of maps, for the next to take instead of making one. A map's
// old records are keyed by cookies no later socket has, so they are never
// found again; they are dropped as the new sandbox's records come in.
// Cgroup ids never have the top bit set.
const freeSlots = 4

func freeKey(i int) uint64 { return 1<<63 | uint64(i) }

// maxGroups bounds the sandboxes recorded at once; beyond it Open fails
// and the sandbox's connects are recorded by the seccomp path.
const maxGroups = 1 << 12

// Names the kernel shows for the programs and the map of maps, by which
// Open finds them again.
const (
	progName = "corral_connect"
	mapName  = "corral_connects"
)

// recordsSpec is a sandbox's map: socket cookie to record.
var recordsSpec = ebpf.MapSpec{Name: "corral_records", Type: ebpf.LRUHash, KeySize: 8, ValueSize: 16, MaxEntries: maxRecords}

// attachTypes are the hooks the program is attached to: the connect of an
// IPv4 socket and of an IPv6 one, TCP Fast Open's included.
var attachTypes = []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect}

// Record is what the hook wrote for one socket.
type Record struct {
	// TGID is the connecting process, as the initial pid namespace
	// numbers it.
	TGID int
	// At is when it connected, on CLOCK_MONOTONIC in nanoseconds: the
	// clock of the proc connector's event times.
	At uint64
}

// Hook holds one sandbox's records.
type Hook struct {
	groups  *ebpf.Map // cgroup id to that group's records
	group   uint64
	records *ebpf.Map
}

// Open records the connects of the processes of the cgroup v2 directory
// group, which is a child of dir, through the programs attached to dir,
// attaching them first if they are not there. The programs stay attached
// when the caller exits, so that the next sandbox finds them instead of
// paying to load them (BenchmarkOpen); removing dir detaches them. Another version's
// programs are left attached while other groups below dir may be using
// them, and detached once none is. It needs CAP_BPF and CAP_NET_ADMIN
// (or CAP_SYS_ADMIN).
func Open(dir, group string) (*Hook, error) {
	var st unix.Stat_t
	if err := unix.Stat(group, &st); err != nil {
		return nil, fmt.Errorf("connect hook: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("connect hook: %w", err)
	}
	defer d.Close()
	// Sandboxes starting together look, attach and take a free map one at
	// a time; the lock goes with the descriptor.
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("connect hook: lock %s: %w", dir, err)
	}
	live, err := groupIDs(dir)
	if err != nil {
		return nil, fmt.Errorf("connect hook: %w", err)
	}
	groups, err := programs(int(d.Fd()), dir, len(live) <= 1)
	if err != nil {
		return nil, err
	}
	if err := prune(groups, live); err != nil {
		groups.Close()
		return nil, fmt.Errorf("connect hook on %s: %w", dir, err)
	}
	// A cgroup2 directory's inode number is its id, what the program
	// reads of the caller.
	h := &Hook{groups: groups, group: st.Ino}
	if h.records = takeFree(groups); h.records == nil {
		if h.records, err = ebpf.NewMap(&recordsSpec); err != nil {
			groups.Close()
			return nil, fmt.Errorf("connect hook: create the sandbox's map: %w", err)
		}
	}
	if err := groups.Update(h.group, h.records, ebpf.UpdateAny); err != nil {
		h.records.Close()
		groups.Close()
		return nil, fmt.Errorf("connect hook: register %s: %w", group, err)
	}
	return h, nil
}

// takeFree takes a map an ended sandbox left, or returns nil.
func takeFree(groups *ebpf.Map) *ebpf.Map {
	for i := range freeSlots {
		var m *ebpf.Map
		if groups.Lookup(freeKey(i), &m) != nil {
			continue
		}
		if groups.Delete(freeKey(i)) != nil {
			m.Close()
			continue
		}
		return m
	}
	return nil
}

// groupIDs returns the ids of the cgroups directly below dir: the
// sandboxes that may be running there.
func groupIDs(dir string) (map[uint64]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	ids := map[uint64]bool{}
	for _, e := range entries {
		var st unix.Stat_t
		if e.IsDir() && unix.Stat(filepath.Join(dir, e.Name()), &st) == nil {
			ids[st.Ino] = true
		}
	}
	return ids, nil
}

// prune removes the registrations of groups that no longer exist: a
// supervisor killed before Close leaves its group's map registered, which
// keeps the map's memory in the kernel and a place in the map of maps, of
// which maxGroups fill it. A cgroup id is never given to another group,
// so a registration whose group is gone can only be stale. Every live
// group's registration was made under the lock the caller holds, after
// its group was made.
func prune(groups *ebpf.Map, live map[uint64]bool) error {
	var stale []uint64
	var key uint64
	err := groups.NextKey(nil, &key)
	for ; err == nil; err = groups.NextKey(key, &key) {
		if key&freeKey(0) == 0 && !live[key] {
			stale = append(stale, key)
		}
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("list registered groups: %w", err)
	}
	for _, k := range stale {
		if err := groups.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove the registration of ended group %d: %w", k, err)
		}
	}
	return nil
}

// programs finds the programs attached to the cgroup target (dir), or
// attaches them, and returns their map of maps. alone says no other
// sandbox group exists below dir.
func programs(target int, dir string, alone bool) (*ebpf.Map, error) {
	var mine, stale []attachedProg
	defer func() {
		for _, p := range append(mine, stale...) {
			p.prog.Close()
		}
	}()
	var records ebpf.MapID
	whole := true
	for _, at := range attachTypes {
		ours, err := attached(target, at)
		if err != nil {
			return nil, fmt.Errorf("connect hook on %s: %w", dir, err)
		}
		n := 0
		for _, p := range ours {
			if current(p.info) {
				mine = append(mine, p)
				n++
				id, ok := mapOf(p.info)
				whole = whole && ok && (records == 0 || id == records)
				records = id
			} else {
				stale = append(stale, p)
			}
		}
		whole = whole && n == 1
	}
	if len(stale) > 0 && alone {
		if err := detach(target, stale); err != nil {
			return nil, fmt.Errorf("connect hook on %s: detach another version's: %w", dir, err)
		}
	}
	if whole {
		m, err := ebpf.NewMapFromID(records)
		if err != nil {
			return nil, fmt.Errorf("connect hook on %s: open its map: %w", dir, err)
		}
		return m, nil
	}
	// A first run, or half of one a crash cut short: nobody can be using
	// this version's programs (every Open under the lock completes them),
	// so they are replaced whole.
	if err := detach(target, mine); err != nil {
		return nil, fmt.Errorf("connect hook on %s: detach an incomplete one: %w", dir, err)
	}
	return attach(target)
}

// detach detaches the programs from target.
func detach(target int, ps []attachedProg) error {
	for _, p := range ps {
		err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: target, Program: p.prog, Attach: p.at})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

// attach loads the map of maps and the programs and attaches them to the
// cgroup target, alongside any programs others attached there.
func attach(target int) (groups *ebpf.Map, err error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: mapName, Type: ebpf.HashOfMaps, KeySize: 8, ValueSize: 4, MaxEntries: maxGroups, InnerMap: &recordsSpec})
	if err != nil {
		return nil, fmt.Errorf("connect hook: create map: %w", err)
	}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	for _, at := range attachTypes {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: progName, Type: ebpf.CGroupSockAddr, AttachType: at,
			Instructions: program(m.FD()), License: "Dual MIT/GPL"})
		if err != nil {
			return nil, fmt.Errorf("connect hook: load program: %w", err)
		}
		err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: target, Program: prog, Attach: at, Flags: unix.BPF_F_ALLOW_MULTI})
		prog.Close() // the attachment holds it
		if err != nil {
			return nil, fmt.Errorf("connect hook: attach: %w", err)
		}
	}
	return m, nil
}

// attachedProg is a program attached to the cgroup, as the kernel
// describes it.
type attachedProg struct {
	prog *ebpf.Program
	info progInfo
	at   ebpf.AttachType
}

// progInfo is what Open reads of an attached program.
type progInfo struct {
	name string
	tag  string // hex, as ebpf.ProgramInfo has it
	maps []ebpf.MapID
}

// bpfProgInfo is struct bpf_prog_info up to the program's name, on a
// 64-bit machine. Its pointers are unsafe.Pointer, so that the garbage
// collector and a growing stack see them.
type bpfProgInfo struct {
	typ, id                 uint32
	tag                     [8]byte
	jitedLen, xlatedLen     uint32
	jitedInsns, xlatedInsns uint64
	loadTime                uint64
	createdByUID, nrMapIDs  uint32
	mapIDs                  unsafe.Pointer
	name                    [16]byte
}

// readProgInfo reads the name, tag and maps of the program fd with one
// BPF_OBJ_GET_INFO_BY_FD: ebpf.Program.Info also reads the program's
// fdinfo and its instructions, which cost every sandbox's start about a
// millisecond.
func readProgInfo(fd int) (progInfo, error) {
	var ids [4]uint32
	info := bpfProgInfo{nrMapIDs: uint32(len(ids)), mapIDs: unsafe.Pointer(&ids[0])}
	if unsafe.Sizeof(info) != 80 {
		return progInfo{}, errors.New("program info: not a 64-bit machine")
	}
	attr := struct {
		fd, infoLen uint32
		info        unsafe.Pointer
	}{uint32(fd), uint32(unsafe.Sizeof(info)), unsafe.Pointer(&info)}
	if _, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr)); errno != 0 {
		return progInfo{}, fmt.Errorf("program info: %w", errno)
	}
	pi := progInfo{name: unix.ByteSliceToString(info.name[:]), tag: hex.EncodeToString(info.tag[:])}
	for _, id := range ids[:min(int(info.nrMapIDs), len(ids))] {
		pi.maps = append(pi.maps, ebpf.MapID(id))
	}
	return pi, nil
}

// attached returns the programs named progName attached to target for at.
func attached(target int, at ebpf.AttachType) ([]attachedProg, error) {
	q, err := link.QueryPrograms(link.QueryOptions{Target: target, Attach: at})
	if err != nil {
		return nil, err
	}
	var ours []attachedProg
	for _, a := range q.Programs {
		p, err := ebpf.NewProgramFromID(a.ID)
		if errors.Is(err, unix.ENOENT) {
			continue // detached meanwhile
		}
		if err != nil {
			for _, o := range ours {
				o.prog.Close()
			}
			return nil, err
		}
		if info, err := readProgInfo(p.FD()); err == nil && info.name == progName {
			ours = append(ours, attachedProg{p, info, at})
			continue
		}
		p.Close()
	}
	return ours, nil
}

// current tells whether info describes this version's program.
func current(info progInfo) bool {
	ok, err := program(0).HasTag(info.tag, hostOrder())
	return err == nil && ok
}

// hostOrder is binary.NativeEndian as the byte order it is, which the
// instruction encoder wants.
func hostOrder() binary.ByteOrder {
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		return binary.LittleEndian
	}
	return binary.BigEndian
}

// mapOf is the one map the program info describes uses.
func mapOf(info progInfo) (ebpf.MapID, bool) {
	if len(info.maps) != 1 {
		return 0, false
	}
	return info.maps[0], true
}

// program records the caller and the time under the socket's cookie in
// the map of the caller's cgroup, and lets the connect go on: the hook
// only observes, the policy is decided when the connection reaches the
// supervisor. A cgroup with no map is not a sandbox Open registered.
//
// The stack: the cgroup id at fp-8, the record {u32 tgid, u32 zero, u64
// time} at fp-24, the cookie at fp-32.
func program(groups int) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentCgroupId.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, groups),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		// No map for this cgroup: to the end. A literal offset (the 17
		// instructions after this one), not a label: the tag Open
		// compares is computed over the instructions as written.
		{OpCode: asm.OpCode(asm.JumpClass).SetJumpOp(asm.JEq).SetSource(asm.ImmSource), Dst: asm.R0, Offset: 17},
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.RFP, -24, asm.R0, asm.Word),
		asm.StoreImm(asm.RFP, -20, 0, asm.Word),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, -16, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, -32, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -32),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -24),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 1), // let the connect proceed
		asm.Return(),
	}
}

// Lookup returns the record of the socket with this cookie.
func (h *Hook) Lookup(cookie uint64) (Record, bool) {
	var key [8]byte
	var val [16]byte
	binary.NativeEndian.PutUint64(key[:], cookie)
	if err := h.records.Lookup(key[:], val[:]); err != nil {
		return Record{}, false
	}
	return Record{TGID: int(binary.NativeEndian.Uint32(val[0:])), At: binary.NativeEndian.Uint64(val[8:])}, true
}

// Close ends the recording of the sandbox's connects and leaves its map in
// a free slot if there is one; the programs stay attached for the next.
func (h *Hook) Close() error {
	for i := range freeSlots {
		if h.groups.Update(freeKey(i), h.records, ebpf.UpdateNoExist) == nil {
			break
		}
	}
	err := h.groups.Delete(h.group)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		err = nil
	}
	return errors.Join(err, h.records.Close(), h.groups.Close())
}
