package bench

import (
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/fakemodel"
)

// inferenceClient asks for n small chat completions over HTTPS, a new
// connection and TLS handshake each (urllib keeps none; the trust store
// is loaded once), and prints the time to the first byte of the answer at
// p50 and the requests per second. Inside the sandbox the URL is
// https://inference.local (through the sandbox's proxy, then the router);
// on the host it is the backend itself.
const inferenceClient = `import json, ssl, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
ctx = ssl.create_default_context(cafile=sys.argv[3] if len(sys.argv) > 3 else None)
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
ttfb = []
start = time.perf_counter()
for _ in range(n):
    t0 = time.perf_counter()
    r = opener.open(urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", "Authorization": "Bearer x"}), timeout=30)
    r.read(1)
    ttfb.append(time.perf_counter() - t0)
    r.read()
total = time.perf_counter() - start
ttfb.sort()
print("ttfb_p50_us %.0f rps %.1f" % (ttfb[len(ttfb) // 2] * 1e6, n / total))
`

// BenchmarkInferenceSandbox measures inference.local end to end: a
// workload in a proxy-mode sandbox calling https://inference.local against
// the same client calling the fake backend directly from the host, in one
// run. Every call is a new connection and TLS handshake on both sides.
func BenchmarkInferenceSandbox(b *testing.B) {
	e := setup(b)
	be := fakemodel.NewTLS()
	b.Cleanup(be.Close)
	caFile := filepath.Join(e.workdir, "backend-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: be.Certificate().Raw}), 0o644); err != nil {
		b.Fatal(err)
	}
	e.script = "inference.py"
	if err := os.WriteFile(filepath.Join(e.workdir, e.script), []byte(inferenceClient), 0o644); err != nil {
		b.Fatal(err)
	}
	pol := fmt.Sprintf("version: 1\nfilesystem_policy:\n  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc]\nnetwork:\n  mode: proxy\n"+
		"inference:\n  routes:\n    - {name: bench, base_url: %s/v1, protocols: [openai_chat_completions], model: bench-model, ca: %s}\n", be.URL, caFile)
	if err := os.WriteFile(e.policy, []byte(pol), 0o644); err != nil {
		b.Fatal(err)
	}
	const n = 200
	var d, c map[string]float64
	for range b.N {
		d = e.output(b, false, be.URL+"/v1/chat/completions", strconv.Itoa(n), caFile)
		c = e.output(b, true, "https://inference.local/v1/chat/completions", strconv.Itoa(n))
	}
	b.ReportMetric(d["ttfb_p50_us"], "direct_ttfb_p50_µs")
	b.ReportMetric(c["ttfb_p50_us"], "sandbox_ttfb_p50_µs")
	b.ReportMetric(c["ttfb_p50_us"]-d["ttfb_p50_us"], "added_ttfb_p50_µs")
	b.ReportMetric(c["rps"]/d["rps"], "rps_ratio")
}
