package bench

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// requestClient sends n small GETs on one keep-alive HTTPS connection and
// prints requests per second and per-request latency. Modes: "direct"
// connects to ADDR with SNI NAME; "proxy" tunnels through an explicit
// proxy with CONNECT (mitmproxy); inside corral it connects to NAME and is
// captured and inspected. With UNIQUE=1 in the environment every request
// has its own query string, so no decision can be remembered.
const requestClient = `import http.client, os, socket, ssl, sys, time
mode, name, addr, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cafile = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
unique = os.environ.get("UNIQUE") == "1"
ctx = ssl.create_default_context(cafile=cafile)

class Direct(http.client.HTTPSConnection):
    def connect(self):
        s = socket.create_connection((addr, 443))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(s, server_hostname=name)

if mode == "proxy":
    c = http.client.HTTPSConnection(sys.argv[6], int(sys.argv[7]), context=ctx)
    c.set_tunnel(addr, 443)
else:
    c = Direct(addr, 443, context=ctx)
warm = 20
lat = []
for i in range(n + warm):
    t0 = time.perf_counter()
    c.request("GET", "/bench?i=%d" % i if unique else "/bench", headers={"Host": name})
    r = c.getresponse()
    r.read()
    if r.status != 200:
        sys.exit("status %d" % r.status)
    if i >= warm:
        lat.append(time.perf_counter() - t0)
total = sum(lat)
lat.sort()
print("rps %.0f p50_us %.0f p99_us %.0f" % (len(lat) / total, lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6))
`

const requests = 2000

func setupL7(b *testing.B) *env {
	e := setup(b)
	e.script = "requests.py"
	if err := os.WriteFile(filepath.Join(e.workdir, e.script), []byte(requestClient), 0o644); err != nil {
		b.Fatal(err)
	}
	e.policy = filepath.Join(filepath.Dir(e.policy), "l7.yaml")
	writePolicy(b, e.policy, fmt.Sprintf("{host: %s, port: 443, protocol: rest, rules: [{allow: {method: GET, path: /bench}}]}", host))
	e.flags = []string{"--upstream-ca", e.lab.CAFile}
	return e
}

// BenchmarkInspectedRequests: small requests on one keep-alive connection,
// each decided by corral's HTTP inspection (TLS terminated, rules
// evaluated, TLS to the upstream), against the same client talking to the
// upstream directly (target: ≥ 0.5× the direct rate). "repeated" sends one
// request over and over (its decision is remembered after the first);
// "unique" gives each request its own query, so each is evaluated.
func BenchmarkInspectedRequests(b *testing.B) {
	e := setupL7(b)
	for _, unique := range []bool{false, true} {
		name := "repeated"
		if unique {
			name = "unique"
			e.flags = append(e.flags, "--env", "UNIQUE=1")
			os.Setenv("UNIQUE", "1")
			defer os.Unsetenv("UNIQUE")
		}
		b.Run(name, func(b *testing.B) {
			var d, c map[string]float64
			for range b.N {
				d = e.output(b, false, "direct", host, hostAddr.String(), strconv.Itoa(requests), e.lab.CAFile)
				c = e.output(b, true, "direct", host, host, strconv.Itoa(requests), "-")
			}
			b.ReportMetric(d["rps"], "direct_req/s")
			b.ReportMetric(c["rps"], "corral_req/s")
			b.ReportMetric(c["rps"]/d["rps"], "ratio")
			b.ReportMetric(c["p50_us"]-d["p50_us"], "added_p50_µs")
			b.ReportMetric(c["p99_us"]-d["p99_us"], "added_p99_µs")
		})
	}
}

// BenchmarkInspectedVsMitmproxy runs the same requests through mitmproxy
// (Debian's mitmproxy package, the engine the Airut sandbox uses),
// verifying the same upstream CA, and through corral (target: ≥ 10× its
// rate).
func BenchmarkInspectedVsMitmproxy(b *testing.B) {
	mitm, err := exec.LookPath("mitmdump")
	if err != nil {
		b.Skip("mitmdump not installed (apt-get install mitmproxy)")
	}
	e := setupL7(b)
	conf := b.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd := exec.Command(mitm, "-q", "--listen-host", "127.0.0.1", "--listen-port", port,
		"--set", "confdir="+conf, "--set", "ssl_verify_upstream_trusted_ca="+e.lab.CAFile)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	mitmCA := filepath.Join(conf, "mitmproxy-ca-cert.pem")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if _, serr := os.Stat(mitmCA); err == nil && serr == nil {
			c.Close()
			break
		}
		if c != nil {
			c.Close()
		}
		if time.Now().After(deadline) {
			b.Fatal("mitmdump did not start listening")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var m, c map[string]float64
	for range b.N {
		m = e.output(b, false, "proxy", host, hostAddr.String(), strconv.Itoa(requests), mitmCA, "127.0.0.1", port)
		c = e.output(b, true, "direct", host, host, strconv.Itoa(requests), "-")
	}
	b.ReportMetric(m["rps"], "mitmproxy_req/s")
	b.ReportMetric(c["rps"], "corral_req/s")
	b.ReportMetric(c["rps"]/m["rps"], "ratio")
}

// BenchmarkInspectedRequestsCurl is BenchmarkInspectedRequests with curl,
// which offers h2 and so, unlike Python's client, gets it from corral's
// inspection (and HTTP/1.1 with --http1.1): small GETs one after another on
// one connection (curl's URL globbing), each with its own query, timed by
// curl (-w %{time_total}), inside corral against the same requests made
// directly.
func BenchmarkInspectedRequestsCurl(b *testing.B) {
	if _, err := exec.LookPath("curl"); err != nil {
		b.Skip("curl not installed")
	}
	e := setupL7(b)
	const warm = 20
	url := fmt.Sprintf("'https://%s/bench?i=[1-%d]'", host, requests+warm)
	for _, proto := range []string{"http2", "http1.1"} {
		b.Run(proto, func(b *testing.B) {
			curl := "curl -sS --" + proto + " -o /dev/null -w '%{http_code} %{http_version} %{time_total}\\n' "
			version := strings.TrimPrefix(proto, "http")
			var d, c curlTimes
			for range b.N {
				d = runCurl(b, exec.Command("sh", "-c", curl+fmt.Sprintf("--noproxy '*' --resolve %s:443:%s --cacert %s ", host, hostAddr, e.lab.CAFile)+url), version, warm)
				argv := []string{"run", "--log-level", "error", "--state-dir", e.state, "--workdir", e.workdir,
					"--policy", e.policy, "--upstream-dns", e.lab.DNS.String()}
				argv = append(append(argv, e.flags...), "--", "/bin/sh", "-c", curl+"--noproxy '*' "+url)
				c = runCurl(b, exec.Command(e.corral, argv...), version, warm)
			}
			b.ReportMetric(d.rps, "direct_req/s")
			b.ReportMetric(c.rps, "corral_req/s")
			b.ReportMetric(c.rps/d.rps, "ratio")
			b.ReportMetric(c.p50-d.p50, "added_p50_µs")
			b.ReportMetric(c.p99-d.p99, "added_p99_µs")
		})
	}
}

type curlTimes struct{ rps, p50, p99 float64 }

// runCurl runs cmd, which prints one "status version seconds" line per
// request, checks every request got 200 over HTTP version, and returns
// the rate and latencies of all but the first warm.
func runCurl(b *testing.B, cmd *exec.Cmd, version string, warm int) curlTimes {
	b.Helper()
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	var lat []float64
	for i, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "200" || f[1] != version {
			b.Fatalf("request %d: %q", i, line)
		}
		if i < warm {
			continue
		}
		s, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, s*1e6)
	}
	total := 0.0
	for _, l := range lat {
		total += l
	}
	slices.Sort(lat)
	return curlTimes{rps: float64(len(lat)) / (total / 1e6), p50: lat[len(lat)/2], p99: lat[len(lat)*99/100]}
}
