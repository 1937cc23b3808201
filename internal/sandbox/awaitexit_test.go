package sandbox

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// awaitExit returns once the child has exited and leaves it to be reaped:
// it is a zombie in between, and Wait still gets its status.
func TestAwaitExit(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 0.1; exit 3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := awaitExit(cmd.Process.Pid); err != nil {
		t.Fatalf("awaitExit: %v", err)
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) == 0 || f[0] != "Z" {
		t.Errorf("after awaitExit the child is %q, want a zombie (Z)", f)
	}
	if err := cmd.Wait(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 3 {
		t.Errorf("Wait after awaitExit = %v, state %v; want exit status 3", err, cmd.ProcessState)
	}
}
