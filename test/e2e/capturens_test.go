package e2e

import (
	"os"
	"strconv"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/capture"
)

// TestCaptureStaysInTheSandbox: the capture's nftables table, which
// redirects every connection, exists in the workload's network namespace
// and never in the host's, while the sandbox runs and after. As root the
// supervisor builds it on a thread of its own before the init exists, so
// a thread that stayed in the host's namespace would capture the host;
// rootless the init builds it in the namespace its clone made.
func TestCaptureStaysInTheSandbox(t *testing.T) {
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		p, _, sleeper := startSleeper(t, fx, runOpts{})
		// Ending the workload, not corral, lets corral remove its cgroup
		// and run directory as after any run. Once: its pid is free after.
		ended := false
		end := func() {
			if !ended {
				ended = true
				_ = unix.Kill(sleeper, unix.SIGKILL)
				<-p.done
			}
		}
		defer end()
		if hasCaptureTable(t, -1) {
			t.Fatalf("the host's network namespace holds nftables table inet %s while a sandbox runs", capture.TableName)
		}
		ns, err := os.Open("/proc/" + strconv.Itoa(sleeper) + "/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		var host, sandbox unix.Stat_t
		if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fstat(int(ns.Fd()), &sandbox); err != nil {
			t.Fatal(err)
		}
		if host.Ino == sandbox.Ino {
			t.Fatal("the workload shares the host's network namespace")
		}
		if !hasCaptureTable(t, int(ns.Fd())) {
			t.Fatalf("the workload's network namespace has no nftables table inet %s", capture.TableName)
		}
		end()
		if hasCaptureTable(t, -1) {
			t.Fatalf("the host's network namespace holds nftables table inet %s after the run", capture.TableName)
		}
	})
}

// hasCaptureTable lists the tables of the network namespace nsFD, or of
// the test's own with -1.
func hasCaptureTable(t *testing.T, nsFD int) bool {
	t.Helper()
	var opts []nftables.ConnOption
	if nsFD >= 0 {
		opts = append(opts, nftables.WithNetNSFd(nsFD))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == capture.TableName {
			return true
		}
	}
	return false
}
