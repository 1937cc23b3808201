// Package bench measures corral's egress path against the same work done
// without corral, side by side in one run, on the project's own test hosts
// (internal/testutil/netlab). Run it with bench/egress.sh, which prints the
// ratios; it needs root.
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

// client is the workload: the same Python program runs inside corral and
// directly on the host, so the only difference measured is corral.
const client = `import socket, sys, time, resource
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "download":
    s = socket.create_connection((host, port))
    s.sendall(b"%d\n" % n)
    got, t0 = 0, time.perf_counter()
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got += len(b)
    dt = time.perf_counter() - t0
    assert got == n, got
    print("mbps %.1f" % (got / dt / 1e6))
elif mode == "setup":
    # Resolve once: the set-up cost measured is the connection's, not DNS's.
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    # The whole set-up, and its connect() alone: inside corral the kernel
    # completes the handshake with the capture listener, and what connect
    # costs is the supervisor noting the socket.
    lat, con = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        s = socket.create_connection(addr)
        con.append(time.perf_counter() - t0)
        s.sendall(b"x\n")
        s.recv(16)
        lat.append(time.perf_counter() - t0)
        s.close()
    lat.sort()
    con.sort()
    print("p50_us %.0f p99_us %.0f connect_p50_us %.0f" % (lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6, con[len(con) // 2] * 1e6))
elif mode == "cpu":
    # Download when told, so the supervisor's CPU time can be read just
    # before and after; stay until told, so it is still there to read.
    print("ready", flush=True)
    sys.stdin.readline()
    s = socket.create_connection((host, port))
    s.sendall(b"%d\n" % n)
    got = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got += len(b)
    assert got == n, got
    print("done", flush=True)
    sys.stdin.readline()
elif mode == "hold":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
    conns = []
    for _ in range(n):
        s = socket.create_connection((host, port))
        s.sendall(b"x\n")
        s.recv(16)
        conns.append(s)
    print("held", flush=True)
    sys.stdin.readline()
`

const host = "bulk.test"

var hostAddr = netip.MustParseAddr("203.0.113.20")

type env struct {
	lab     *netlab.Lab
	corral  string
	workdir string
	state   string
	policy  string
	// script is the client program in workdir; flags are extra corral
	// run flags.
	script string
	flags  []string
}

func setup(b *testing.B) *env {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the test hosts live in a network namespace")
	}
	dir := b.TempDir()
	e := &env{corral: filepath.Join(dir, "corral"), workdir: filepath.Join(dir, "w"), state: filepath.Join(dir, "state"), script: "client.py"}
	buildCorral(b, e.corral)
	if err := os.MkdirAll(e.workdir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.workdir, "client.py"), []byte(client), 0o644); err != nil {
		b.Fatal(err)
	}
	e.policy = filepath.Join(dir, "policy.yaml")
	writePolicy(b, e.policy, fmt.Sprintf("{host: %s, ports: [%d, %d]}", host, netlab.PortEcho, netlab.PortSource))
	e.lab = netlab.Start(b, netlab.Host{Name: host, Addr: hostAddr})
	// As installed: the first run in a state directory writes the init
	// program corral carries, which no later run pays for again.
	if out, err := exec.Command(e.corral, "run", "--log-level", "error", "--state-dir", e.state, "--workdir", e.workdir, "--", "true").CombinedOutput(); err != nil {
		b.Fatalf("first run: %v\n%s", err, out)
	}
	return e
}

// writePolicy writes the benchmarks' policy: the system directories and
// one network policy with the given endpoint (a YAML flow mapping).
func writePolicy(b *testing.B, path, endpoint string) {
	pol := "version: 1\nfilesystem_policy:\n  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc]\n" +
		"network_policies:\n  bench:\n    endpoints:\n      - " + endpoint + "\n"
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		b.Fatal(err)
	}
}

// run runs the client inside corral (by name, captured transparently) or
// directly (by address; the host's resolver does not know the test names).
func (e *env) command(caged bool, args ...string) *exec.Cmd {
	if !caged {
		return exec.Command("python3", append([]string{filepath.Join(e.workdir, e.script)}, args...)...)
	}
	argv := []string{"run", "--log-level", "error", "--state-dir", e.state, "--workdir", e.workdir,
		"--policy", e.policy, "--upstream-dns", e.lab.DNS.String()}
	argv = append(append(argv, e.flags...), "--", "/usr/bin/python3", "./"+e.script)
	return exec.Command(e.corral, append(argv, args...)...)
}

func (e *env) target(caged bool) string {
	if caged {
		return host
	}
	return hostAddr.String()
}

func (e *env) output(b *testing.B, caged bool, args ...string) map[string]float64 {
	b.Helper()
	out, err := e.command(caged, args...).CombinedOutput()
	if err != nil {
		b.Fatalf("client %v (caged=%v): %v\n%s", args, caged, err, out)
	}
	fields := strings.Fields(string(out))
	m := map[string]float64{}
	for i := 0; i+1 < len(fields); i += 2 {
		if v, err := strconv.ParseFloat(fields[i+1], 64); err == nil {
			m[fields[i]] = v
		}
	}
	return m
}

// BenchmarkTunnelThroughput downloads 512 MiB through the transparent
// tunnel and directly, and reports both and their ratio (target ≥ 0.9).
func BenchmarkTunnelThroughput(b *testing.B) {
	e := setup(b)
	const size = 512 << 20
	var direct, caged float64
	for range b.N {
		direct += e.output(b, false, "download", e.target(false), strconv.Itoa(netlab.PortSource), strconv.Itoa(size))["mbps"]
		caged += e.output(b, true, "download", e.target(true), strconv.Itoa(netlab.PortSource), strconv.Itoa(size))["mbps"]
	}
	b.ReportMetric(direct/float64(b.N), "direct_MB/s")
	b.ReportMetric(caged/float64(b.N), "corral_MB/s")
	b.ReportMetric(caged/direct, "ratio")
}

// BenchmarkConnectionSetup measures connect + one echo round trip, 500
// times sequentially, through corral and directly. The added cost per
// connection is the difference (targets: p50 ≤ 300 µs, p99 ≤ 2 ms).
func BenchmarkConnectionSetup(b *testing.B) {
	e := setup(b)
	var d, c map[string]float64
	for range b.N {
		d = e.output(b, false, "setup", e.target(false), strconv.Itoa(netlab.PortEcho), "500")
		c = e.output(b, true, "setup", e.target(true), strconv.Itoa(netlab.PortEcho), "500")
	}
	b.ReportMetric(d["p50_us"], "direct_p50_µs")
	b.ReportMetric(d["p99_us"], "direct_p99_µs")
	b.ReportMetric(c["p50_us"], "corral_p50_µs")
	b.ReportMetric(c["p99_us"], "corral_p99_µs")
	b.ReportMetric(c["p50_us"]-d["p50_us"], "added_p50_µs")
	b.ReportMetric(c["p99_us"]-d["p99_us"], "added_p99_µs")
	// How much of the added time connect() itself takes, the rest being
	// the first exchange: identification, decision, the upstream dial and
	// the relay.
	b.ReportMetric(c["connect_p50_us"]-d["connect_p50_us"], "connect_added_p50_µs")
}

// BenchmarkSupervisorRSS reports the supervisor's resident memory while the
// workload is idle and while it holds 1000 open tunnels (targets: 40 and
// 120 MiB).
func BenchmarkSupervisorRSS(b *testing.B) {
	e := setup(b)
	for range b.N {
		cmd := e.command(true, "hold", e.target(true), strconv.Itoa(netlab.PortEcho), "1000")
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
		time.Sleep(300 * time.Millisecond) // the workload is starting; nothing is open yet
		idle := rssMiB(b, cmd.Process.Pid)
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "held" {
			b.Fatalf("workload did not open its tunnels: %q %v", line, err)
		}
		held := rssMiB(b, cmd.Process.Pid)
		io.WriteString(stdin, "\n")
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatalf("workload: %v", err)
		}
		b.ReportMetric(idle, "idle_MiB")
		b.ReportMetric(held, "1000_tunnels_MiB")
	}
}

func rssMiB(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
