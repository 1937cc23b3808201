package bench

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// upstream is the non-Go server the downloads come from: Python's own
// http.server, plain on one port and behind Python's ssl on another.
const upstream = `import http.server, socketserver, ssl, sys, threading
addr, root, cert, key = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
class S(http.server.ThreadingHTTPServer):
    def server_bind(self):
        # HTTPServer's own looks its name up in DNS, which the lab
        # namespace cannot reach.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
class H(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def log_message(self, *a):
        pass
plain = S((addr, 8000), H)
tls = S((addr, 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", flush=True)
plain.serve_forever()
`

const (
	tunnelHTTPPort  = 8000
	tunnelHTTPSPort = 8443
)

// BenchmarkTunnelCurl downloads one large file with curl from a Python
// server on the test hosts: directly from the host, inside corral through
// the transparent path, and inside corral through CONNECT (curl -p -x),
// over plain HTTP and over HTTPS, interleaved run by run. It reports the
// median speed of each in MB/s, the median of each run's ratio to its
// direct download, and the median CPU time corral adds per GiB (the
// caged command's CPU, start-up included, less the direct curl's). Run it with
// bench/tunnel.sh; TUNNEL_MB sets the file size (default 256), TUNNEL_RUNS
// the runs (default 5), CORRAL_BIN another build of corral, CORRAL_BASE a
// second build measured alongside (base_* figures).
func BenchmarkTunnelCurl(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the test hosts live in a network namespace")
	}
	for _, tool := range []string{"curl", "/usr/bin/python3", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("needs %s", tool)
		}
	}
	mb := envInt(b, "TUNNEL_MB", 256)
	runs := envInt(b, "TUNNEL_RUNS", 5)
	dir := b.TempDir()
	corral := os.Getenv("CORRAL_BIN")
	if corral == "" {
		corral = filepath.Join(dir, "corral")
		buildCorral(b, corral)
	}
	work, state, root := filepath.Join(dir, "w"), filepath.Join(dir, "state"), filepath.Join(dir, "www")
	for _, d := range []string{work, root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	// A sparse file: the server reads zeros from the page cache, so the
	// disk is not measured.
	f, err := os.Create(filepath.Join(root, "big"))
	if err == nil {
		err = f.Truncate(int64(mb) << 20)
		f.Close()
	}
	if err != nil {
		b.Fatal(err)
	}
	cert, key := filepath.Join(work, "cert.pem"), filepath.Join(dir, "key.pem")
	writeCert(b, cert, key)
	policy := filepath.Join(dir, "policy.yaml")
	writePolicy(b, policy, fmt.Sprintf("{host: %s, ports: [%d, %d]}", host, tunnelHTTPPort, tunnelHTTPSPort))

	lab := netlab.Start(b, netlab.Host{Name: host, Addr: hostAddr})
	startUpstream(b, dir, root, cert, key)

	type tcase struct{ name, url string }
	var cases []tcase
	for _, scheme := range []string{"http", "https"} {
		port := tunnelHTTPPort
		if scheme == "https" {
			port = tunnelHTTPSPort
		}
		cases = append(cases, tcase{scheme, fmt.Sprintf("%s://%s:%d/big", scheme, host, port)})
	}
	// curl's own figure covers the transfer only, not corral's start-up.
	curl := "curl -sS -o /dev/null --cacert " + cert + " -w '%{speed_download} %{size_download}\\n'"
	vias := []string{"direct", "transparent", "connect"}
	// CORRAL_BASE is another build measured in the same runs, e.g. the
	// one before a change.
	base := os.Getenv("CORRAL_BASE")
	if base != "" {
		vias = append(vias, "base_transparent", "base_connect")
	}
	speeds, ratios, cpu, sup := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for i := range b.N * runs {
		for _, c := range cases {
			got := map[string]sample{}
			// Each run starts with another of the three, so none always
			// follows the same one.
			for j := range vias {
				via := vias[(i+j)%len(vias)]
				var cmd *exec.Cmd
				switch via {
				case "direct":
					cmd = exec.Command("sh", "-c", fmt.Sprintf("%s --noproxy '*' --resolve %s:%d:%s %s", curl, host, urlPort(c.url), hostAddr, c.url))
				default:
					bin, path := corral, via
					if p, ok := strings.CutPrefix(via, "base_"); ok {
						bin, path = base, p
					}
					flag := "--noproxy '*'"
					if path == "connect" {
						flag = `-p -x "$http_proxy"`
					}
					cmd = exec.Command(bin, "run", "--log-level", "error", "--state-dir", state, "--workdir", work,
						"--policy", policy, "--upstream-dns", lab.DNS.String(), "--",
						"/bin/sh", "-c", curl+" "+flag+" "+c.url)
				}
				got[via] = download(b, cmd, mb)
				speeds[c.name+"/"+via] = append(speeds[c.name+"/"+via], got[via].mbps)
			}
			for _, via := range vias[1:] {
				k := c.name + "/" + via
				ratios[k] = append(ratios[k], got[via].mbps/got["direct"].mbps)
				// What corral's processes add, start-up included, per GiB.
				extra := (got[via].cpu - got["direct"].cpu).Seconds() * 1000
				cpu[k] = append(cpu[k], extra/(float64(mb)/1024))
				sup[k] = append(sup[k], float64(got[via].own.Milliseconds())/(float64(mb)/1024))
			}
		}
	}
	for _, c := range cases {
		b.ReportMetric(median(speeds[c.name+"/direct"]), c.name+"_direct_MB/s")
		for _, via := range vias[1:] {
			k := c.name + "/" + via
			b.ReportMetric(median(speeds[k]), c.name+"_"+via+"_MB/s")
			b.ReportMetric(median(ratios[k]), c.name+"_"+via+"_ratio")
			b.ReportMetric(median(cpu[k]), c.name+"_"+via+"_added_cpu_ms/GiB")
			b.ReportMetric(median(sup[k]), c.name+"_"+via+"_supervisor_cpu_ms/GiB")
		}
	}
}

// sample is one download: curl's speed and the CPU time of the command
// and everything it waited for (corral's supervisor, init and curl).
type sample struct {
	mbps float64
	cpu  time.Duration
	// own is the CPU time of the command's process alone: for corral,
	// the supervisor's.
	own time.Duration
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

func urlPort(u string) int {
	i := strings.LastIndexByte(u, ':')
	p, _ := strconv.Atoi(strings.TrimSuffix(u[i+1:], "/big"))
	return p
}

// download runs one curl and measures it, failing unless the whole file
// arrived.
func download(b *testing.B, cmd *exec.Cmd, mb int) sample {
	b.Helper()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Start()
	var own time.Duration
	if err == nil {
		stop := make(chan struct{})
		sampled := make(chan time.Duration)
		go func() { sampled <- sampleCPU(cmd.Process.Pid, stop) }()
		err = cmd.Wait()
		close(stop)
		own = <-sampled
	}
	var speed, size float64
	if err == nil {
		_, err = fmt.Sscan(out.String(), &speed, &size)
	}
	if err != nil || int64(size) != int64(mb)<<20 {
		b.Fatalf("%v: %v\n%s", cmd.Args, err, out.String())
	}
	return sample{mbps: speed / 1e6, cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), own: own}
}

// sampleCPU polls pid's own CPU time (its threads, not its children: for
// corral, the supervisor that relays) until stop, and returns the last
// reading, which misses at most the final poll interval.
func sampleCPU(pid int, stop <-chan struct{}) time.Duration {
	var last time.Duration
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			// Fields after the command name, which may hold spaces:
			// utime and stime are the 12th and 13th, in clock ticks
			// (100 per second on Linux).
			f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				s, _ := strconv.ParseInt(f[12], 10, 64)
				if t := time.Duration(u+s) * 10 * time.Millisecond; t > 0 {
					last = t
				}
			}
		}
		select {
		case <-stop:
			return last
		case <-tick.C:
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// startUpstream runs the Python server inside the lab's network namespace
// and waits until it listens.
func startUpstream(b *testing.B, dir, root, cert, key string) {
	b.Helper()
	ns := labNetns(b)
	script := filepath.Join(dir, "upstream.py")
	if err := os.WriteFile(script, []byte(upstream), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net="+ns, "/usr/bin/python3", script, hostAddr.String(), root, cert, key)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
	}()
	select {
	case ok := <-ready:
		if !ok {
			b.Fatal("the Python upstream did not start")
		}
	case <-time.After(10 * time.Second):
		b.Fatal("the Python upstream did not start in 10 s")
	}
}

// labNetns names the lab's network namespace as a path nsenter can open:
// netlab holds it only by a descriptor in this process, the one network
// namespace descriptor that is not this process's own namespace.
func labNetns(b *testing.B) string {
	b.Helper()
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		b.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		b.Fatal(err)
	}
	var found []string
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(link, "net:[") && link != own {
			found = append(found, fmt.Sprintf("/proc/%d/fd/%s", os.Getpid(), e.Name()))
		}
	}
	if len(found) != 1 {
		b.Fatalf("want one lab network namespace descriptor, found %v", found)
	}
	return found[0]
}

// writeCert writes a self-signed certificate for the test host, which
// curl trusts with --cacert inside and outside the sandbox.
func writeCert(b *testing.B, certPath, keyPath string) {
	b.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host},
		DNSNames: []string{host}, IPAddresses: []net.IP{hostAddr.AsSlice()},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		b.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		b.Fatal(err)
	}
}
