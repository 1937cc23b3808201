package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// BenchmarkRelayCPU reports the supervisor's CPU time (user + system, from
// /proc/PID/stat) per GB relayed through one transparent tunnel: the
// cost of the bytes to the rest of the machine, which on two cores also
// slows the client and the server.
func BenchmarkRelayCPU(b *testing.B) {
	e := setup(b)
	const size = 1 << 30
	tick := float64(clockTicks)
	var cpu float64
	for range b.N {
		cmd := e.command(true, "cpu", e.target(true), strconv.Itoa(netlab.PortSource), strconv.Itoa(size))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		out := bufio.NewReader(stdout)
		expect := func(want string) {
			line, err := out.ReadString('\n')
			if err != nil || strings.TrimSpace(line) != want {
				b.Fatalf("workload said %q (%v), want %q", line, err, want)
			}
		}
		expect("ready")
		before := cpuTicks(b, cmd.Process.Pid)
		io.WriteString(stdin, "\n")
		expect("done")
		after := cpuTicks(b, cmd.Process.Pid)
		io.WriteString(stdin, "\n")
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatalf("workload: %v", err)
		}
		cpu += float64(after-before) / tick
	}
	b.ReportMetric(cpu/float64(b.N)/(float64(size)/1e9), "cpu_s/GB")
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times; Linux fixes
// it at 100 on every architecture Go supports.
const clockTicks = 100

// cpuTicks is utime + stime of pid (fields 14 and 15 of /proc/PID/stat).
func cpuTicks(b *testing.B, pid int) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat too short", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	return u + st
}
