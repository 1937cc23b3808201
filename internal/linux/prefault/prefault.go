//go:build linux

// Package prefault maps a program's machine code into its address space in
// one system call as the program starts, instead of one page fault at a
// time as its code first runs. On the small virtual machines corral is
// measured on a page fault costs tens of microseconds, and a Go program's
// package initialisation runs code scattered over its whole text, a fault
// for each new stretch of it (`perf stat -e page-faults corral version`
// counts them). Mapping the whole text at once (6 MB for corral, already
// in the page cache) costs less than the faults it saves;
// `bench/startup.sh` with CORRAL_BASE compares builds with and without it.
//
// Importing it is enough; it runs among the first packages initialised,
// since it needs nothing but syscall. Kernels before 5.14 lack
// MADV_POPULATE_READ, and the code is then faulted in as before.
package prefault

import (
	"syscall"
	"unsafe"
)

// MADV_POPULATE_READ and _WRITE (Linux 5.14).
const (
	madvPopulateRead  = 22
	madvPopulateWrite = 23
)

// elfPhdr is an ELF64 program header.
type elfPhdr struct {
	Type, Flags                             uint32
	Off, Vaddr, Paddr, Filesz, Memsz, Align uint64
}

func init() {
	for _, seg := range codeSegments() {
		_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, seg[0], seg[1]-seg[0], madvPopulateRead)
	}
}

// codeSegments returns the page-aligned [start, end) of each executable
// segment the kernel loaded the program from, found through the program
// headers it left in memory (the auxiliary vector's AT_PHDR); none when
// they cannot be read.
func codeSegments() [][2]uintptr {
	fd, err := syscall.Open("/proc/self/auxv", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	var auxv [64][2]uint64
	n, _ := syscall.Read(fd, unsafe.Slice((*byte)(unsafe.Pointer(&auxv)), unsafe.Sizeof(auxv)))
	syscall.Close(fd)
	var phdr, phnum uintptr
	for _, kv := range auxv[:max(n, 0)/16] {
		switch kv[0] {
		case 3: // AT_PHDR
			phdr = uintptr(kv[1])
		case 5: // AT_PHNUM
			phnum = uintptr(kv[1])
		}
	}
	if phdr == 0 || phnum == 0 {
		return nil
	}
	// The headers are in the program's own mapped image, not in Go's
	// heap: read in place.
	headers := unsafe.Slice(*(**elfPhdr)(unsafe.Pointer(&phdr)), phnum)
	var segs [][2]uintptr
	for _, p := range headers {
		const ptLoad, pfX = 1, 1
		if p.Type == ptLoad && p.Flags&pfX != 0 {
			segs = append(segs, [2]uintptr{uintptr(p.Vaddr &^ 4095), uintptr((p.Vaddr + p.Memsz + 4095) &^ 4095)})
		}
	}
	return segs
}

// heapProbe holds the object Heap allocates to find where the heap grows;
// a package variable, so that it is on the heap and not the stack.
var heapProbe []byte

// probeBytes is the size of that object: large enough to get pages of its
// own, which the runtime takes from the lowest free address, the heap's
// frontier while nothing has been freed (corral run defers garbage
// collection during set-up).
const probeBytes = 64 << 10

// Heap maps in n bytes of the Go heap from where it is growing, at once,
// and returns the address it began at: a short-lived program such as
// corral run otherwise takes a page fault for each new page its heap grows
// into, hundreds in a sandbox's start. What the runtime has not mapped yet
// is left alone (the kernel stops there), and pages mapped in but never
// used count towards the process's resident size, which n bounds.
func Heap(n uintptr) (start uintptr) {
	heapProbe = make([]byte, probeBytes)
	start = uintptr(unsafe.Pointer(unsafe.SliceData(heapProbe))) &^ 4095
	heapProbe = nil
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, start, n, madvPopulateWrite)
	return start
}
