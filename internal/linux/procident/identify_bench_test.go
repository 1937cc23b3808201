//go:build linux

package procident

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pyClient is an interpreter running a script, the common workload: its
// identity has a script path to check and a long list of mapped libraries.
const pyClient = `import os, socket
host, port = os.environ["CORRAL_PROCIDENT_TEST_ADDR"].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
s.sendall(b"%d\n" % os.getpid())
while s.recv(4096):
    pass
`

// BenchmarkIdentify is the supervisor's per-connection identity lookup in
// the production arrangement (sandbox namespaces, capture listener), for a
// process whose binary and ancestors are already known: the cost every
// connection after a process's first pays.
func BenchmarkIdentify(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (namespaces, nftables)")
	}
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		b.Skip("no /usr/bin/python3")
	}
	watch, err := WatchExecs()
	if err != nil {
		b.Fatal(err)
	}
	defer watch.Close()
	script := filepath.Join(b.TempDir(), "client.py")
	if err := os.WriteFile(script, []byte(pyClient), 0o644); err != nil {
		b.Fatal(err)
	}
	ns := startInNamespaces(b, "t4", "203.0.113.9:443", py, script)
	r := &Resolver{InitPID: ns.init.Process.Pid, Execs: watch}
	// The test's tree shares the host's writable root; a sandbox's system
	// directories are read-only, and only then is the process itself
	// looked at on every connection.
	r.mountsOnce.Do(func() { r.mounts = []mountPoint{{point: "/"}} })
	id, err := r.Identify(ns.conn)
	if err != nil {
		b.Fatal(err)
	}
	if len(id.CmdlinePaths) != 1 || id.Untrusted != "" {
		b.Fatalf("identity %+v: want the script and nothing untrusted", id)
	}
	b.ReportAllocs()
	// CPU time is the steadier measure on a shared machine: waiting for a
	// core inflates ns/op, not this.
	before := cpuTime(b)
	for b.Loop() {
		if _, err := r.Identify(ns.conn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the user and system time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
