package bench

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// BenchmarkHeldConnections has a sandboxed workload open and hold 1 000 and
// 10 000 connections at once to the test hosts' echo servers, and reports
// how many it got, the supervisor's descriptors and resident memory while
// they are held, whether the sandbox's DNS and control socket still answer
// then, and whether a fresh connection works once they are closed. Run it
// with bench/conns.sh; CORRAL_BIN measures another build of corral (e.g.
// an older one, for comparison), CONNS_POLICY adds YAML to the policy.
func BenchmarkHeldConnections(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the test hosts live in a network namespace")
	}
	dir := b.TempDir()
	corral := os.Getenv("CORRAL_BIN")
	if corral == "" {
		corral = filepath.Join(dir, "corral")
		buildCorral(b, corral)
	}
	attack := filepath.Join(dir, "w", "attack")
	gobuild(b, attack, "github.com/corral-sandbox/corral/test/e2e/attack")

	// The lab serves at most 2048 connections per listener, so the load is
	// spread over several hosts.
	var hosts []netlab.Host
	var targets, endpoints []string
	for i := range 6 {
		h := netlab.Host{Name: fmt.Sprintf("held%d.test", i), Addr: netip.AddrFrom4([4]byte{203, 0, 113, byte(70 + i)})}
		hosts = append(hosts, h)
		targets = append(targets, fmt.Sprintf("%s:%d", h.Name, netlab.PortEcho))
		endpoints = append(endpoints, fmt.Sprintf("      - {host: %s, port: %d}\n", h.Name, netlab.PortEcho))
	}
	lab := netlab.Start(b, hosts...)
	policy := filepath.Join(dir, "policy.yaml")
	pol := "version: 1\nfilesystem_policy:\n  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc]\n" +
		"network_policies:\n  held:\n    endpoints:\n" + strings.Join(endpoints, "") + os.Getenv("CONNS_POLICY")
	if err := os.WriteFile(policy, []byte(pol), 0o644); err != nil {
		b.Fatal(err)
	}

	for _, n := range []int{1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				heldRun(b, corral, policy, lab, dir, strings.Join(targets, ","), n)
			}
		})
	}
}

func gobuild(b *testing.B, out, pkg string) {
	b.Helper()
	goCmd(b, "build", "-o", out, pkg)
}

// buildCorral builds corral as installed: carrying the init and the full
// program built from these sources (go generate), not whatever an earlier
// generate left in the tree.
func buildCorral(b *testing.B, out string) {
	b.Helper()
	goCmd(b, "generate", "github.com/corral-sandbox/corral/internal/fullbin")
	gobuild(b, out, "github.com/corral-sandbox/corral/cmd/corral")
}

func goCmd(b *testing.B, args ...string) {
	b.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, o)
	}
}

func heldRun(b *testing.B, corral, policy string, lab *netlab.Lab, dir, targets string, n int) {
	w := filepath.Join(dir, "w")
	state := filepath.Join(dir, "state")
	os.Remove(filepath.Join(w, "go"))
	cmd := exec.Command(corral, "run", "--log-level", "error", "--state-dir", state, "--workdir", w,
		"--policy", policy, "--upstream-dns", lab.DNS.String(), "--env", "W="+w,
		"--", filepath.Join(w, "attack"), "conns", targets, strconv.Itoa(n), "held0.test")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Process.Kill()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var report []string
	waitFor := func(prefix string) string {
		timeout := time.After(90 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					b.Fatalf("workload ended before %q: %s\nstderr: %s", prefix, strings.Join(report, " | "), stderr.String())
				}
				report = append(report, l)
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timeout:
				b.Fatalf("no %q within 90s: %s", prefix, strings.Join(report, " | "))
			}
		}
	}
	conns := waitFor("CONNS ")
	dns := waitFor("DNS ")
	waitFor("HOLDING")
	fds := countFDs(pid)
	rss, hwm := memKiB(pid, "VmRSS:"), memKiB(pid, "VmHWM:")
	ps, psErr := exec.Command(corral, "ps", "--state-dir", state).CombinedOutput()
	control := psErr == nil && strings.Contains(string(ps), "attack")
	if err := os.WriteFile(filepath.Join(w, "go"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	fresh := waitFor("FRESH ")
	io.Copy(io.Discard, stdout)
	cmd.Wait()
	b.Logf("%d connections: %s | %s | supervisor fds %d, RSS %.1f MiB (peak %.1f MiB) | control socket answers: %v | after closing: %s",
		n, conns, dns, fds, float64(rss)/1024, float64(hwm)/1024, control, fresh)
	b.ReportMetric(float64(fds), "supervisor_fds")
	b.ReportMetric(float64(rss)/1024, "supervisor_RSS_MiB")
	b.ReportMetric(float64(hwm)/1024, "supervisor_peak_MiB")
	b.ReportMetric(boolMetric(strings.Contains(fresh, "err=<nil>")), "fresh_ok")
	b.ReportMetric(boolMetric(strings.Contains(dns, "err=<nil>")), "dns_ok")
	b.ReportMetric(boolMetric(control), "control_ok")
}

func boolMetric(ok bool) float64 {
	if ok {
		return 1
	}
	return 0
}

func countFDs(pid int) int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es)
}

func memKiB(pid int, field string) int {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
