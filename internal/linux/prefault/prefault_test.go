//go:build linux

package prefault

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestCodeIsMapped: by the time tests run, this binary's whole text is
// resident in its address space, code no test has run included.
func TestCodeIsMapped(t *testing.T) {
	segs := codeSegments()
	if len(segs) == 0 {
		t.Fatal("no executable segment found through the auxiliary vector")
	}
	pc := reflect.ValueOf(TestCodeIsMapped).Pointer()
	inside := false
	for _, s := range segs {
		inside = inside || (s[0] <= pc && pc < s[1])
	}
	if !inside {
		t.Fatalf("this test's code at %#x is in none of the segments %#x", pc, segs)
	}
	// A kernel without MADV_POPULATE_READ refuses it; then nothing is
	// expected.
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, segs[0][0], 4096, madvPopulateRead); errno != 0 {
		t.Skipf("MADV_POPULATE_READ: %v (Linux 5.14 or later)", errno)
	}
	_, size, rss := mapping(t, pc)
	if rss < size {
		t.Fatalf("the text mapping holding %#x has %d of its %d kB resident, want all", pc, rss, size)
	}
}

// mapping returns the end, size and resident size (in kB) of the mapping
// that holds addr.
func mapping(t *testing.T, addr uintptr) (end uintptr, size, rss int) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		// A mapping's first line is its range, "lo-hi perms ...".
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") {
			if in {
				break
			}
			var lo, hi uintptr
			fmt.Sscanf(fields[0], "%x-%x", &lo, &hi)
			in = lo <= addr && addr < hi
			if in {
				end = hi
			}
			continue
		}
		if in {
			fmt.Sscanf(line, "Size: %d kB", &size)
			fmt.Sscanf(line, "Rss: %d kB", &rss)
		}
	}
	if size == 0 {
		t.Fatalf("no mapping in /proc/self/smaps holds %#x", addr)
	}
	return end, size, rss
}

// TestHeapIsMapped: after Heap(n), the heap is resident from where it
// grows for n bytes, or to the end of what the runtime has mapped; far
// more than this test binary has used of it.
func TestHeapIsMapped(t *testing.T) {
	const n = 2 << 20
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	if err := unix.Madvise(page, madvPopulateWrite); err != nil {
		t.Skipf("MADV_POPULATE_WRITE: %v (Linux 5.14 or later)", err)
	}
	start := Heap(n)
	end, _, _ := mapping(t, start)
	length := min(n, end-start)
	if length < 64<<10 {
		t.Fatalf("the heap's mapping ends %d bytes after %#x: nothing to check", end-start, start)
	}
	vec := make([]byte, length/4096)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, start, length, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	resident := 0
	for _, v := range vec {
		resident += int(v & 1)
	}
	if resident != len(vec) {
		t.Fatalf("%d of the %d heap pages after %#x resident after Heap, want all", resident, len(vec), start)
	}
}
