//go:build linux

package timerslack

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func slackOf(t *testing.T, tid string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + tid + "/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWidenProcess: with CAP_SYS_NICE (root) every thread of the process
// gets Wide, those the runtime made before included; what the calling
// thread had is returned.
func TestWidenProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: another thread's slack takes CAP_SYS_NICE")
	}
	runtime.LockOSThread()
	before, err := Current()
	runtime.UnlockOSThread()
	if err != nil || before == Wide {
		t.Fatalf("slack before: %d, %v; want a narrower one", before, err)
	}
	if was := WidenProcess(); was != before {
		t.Fatalf("WidenProcess returned %d, want the %d the thread had", was, before)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) < 2 {
		t.Fatalf("%d threads: want the runtime's too", len(tasks))
	}
	for _, task := range tasks {
		if got := slackOf(t, task.Name()); got != Wide {
			t.Errorf("thread %s: slack %d, want %d", task.Name(), got, Wide)
		}
	}
}

// TestStartWith: a process started through StartWith has the slack given,
// one started plainly the thread's, and the thread keeps its own.
func TestStartWith(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := Set(Wide); err != nil {
		t.Fatal(err)
	}
	read := func(start func(*exec.Cmd) error) string {
		var out strings.Builder
		cmd := exec.Command("cat", "/proc/self/timerslack_ns")
		cmd.Stdout = &out
		if err := start(cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out.String())
	}
	if got := read(func(c *exec.Cmd) error { return StartWith(61_000, c.Start) }); got != "61000" {
		t.Fatalf("started with 61000 ns: the child has %s", got)
	}
	if got := read(func(c *exec.Cmd) error { return c.Start() }); got != strconv.Itoa(Wide) {
		t.Fatalf("started plainly from a thread with %d ns: the child has %s", Wide, got)
	}
	if now, _ := Current(); now != Wide {
		t.Fatalf("the thread has %d ns after StartWith, want its %d back", now, Wide)
	}
}
