package e2e

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// Clients trust what the host trusts, plus the sandbox CA where corral
// inspects: corp.test is an endpoint corral does not inspect, served with a
// certificate from a CA the host trusts only through NODE_EXTRA_CA_CERTS
// and SSL_CERT_FILE (as with a corporate TLS-inspecting proxy); insp.test
// is inspected, so the client sees the sandbox CA's leaf. Each client must
// verify both, with the variables the sandbox gives it.

var (
	addrCorp = netip.MustParseAddr("203.0.113.30")
	addrInsp = netip.MustParseAddr("203.0.113.31")
)

const caTrustPolicy = `network_policies:
  corp:
    endpoints:
      - {host: corp.test, port: 443}
  insp:
    endpoints:
      - {host: insp.test, port: 443, protocol: rest, access: read-only}
`

// javaGet is run with `java Get.java URL` (a single-file program).
const javaGet = `import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Get {
    public static void main(String[] args) {
        try {
            HttpClient c = HttpClient.newBuilder().proxy(HttpClient.Builder.NO_PROXY).build();
            HttpResponse<String> r = c.send(HttpRequest.newBuilder(URI.create(args[0])).build(), HttpResponse.BodyHandlers.ofString());
            System.out.println("JAVASTATUS " + r.statusCode() + " " + r.body());
        } catch (Exception e) {
            System.out.println("JAVAERR " + e);
        }
    }
}
`

const caTrustScript = `#!/bin/bash
cd "$W" || exit 99
sec() { echo; echo "=== $1"; }
# The Java trust store is written while the init sets up; the workload
# must never start before it.
sec truststore_at_start
test -s /run/corral/truststore.jks && echo TRUSTSTORE_READY
for host in corp insp; do
  u=https://$host.test/$host$P
  sec curl_$host
  curl -sS --max-time 15 $u; echo " rc=$?"
  sec python_$host
  python3 -c 'import sys, urllib.request; print("PYSTATUS", urllib.request.urlopen(sys.argv[1], timeout=10).status)' $u 2>&1 | tail -1
  sec node_$host
  node -e 'require("https").get(process.argv[1], r => { console.log("NODESTATUS", r.statusCode); process.exit(0); }).on("error", e => { console.log("NODEERR", e.code, e.message); process.exit(1); })' $u
  sec go_$host
  ./attack https-get $u
  sec git_$host
  git ls-remote $u 2>&1; echo "GITRC=$?"
  sec java_$host
  if command -v java >/dev/null; then java -Xshare:off Get.java $u 2>&1 | grep -v '^Picked up'; else echo NO_JAVA; fi
done
# A client with a trust store of its own, without the sandbox CA.
sec untrusting
curl -sS --max-time 15 --cacert corp-ca.pem https://insp.test/untrusting; echo " rc=$?"
`

func TestCATrust(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"node", "git", "python3", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			requireFeature(t, tool+" is not installed")
		}
	}
	lab := netlab.Start(t, netlab.Host{Name: "corp.test", Addr: addrCorp}, netlab.Host{Name: "insp.test", Addr: addrInsp})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		P := "/" + m.name
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "ca.sh"), []byte(caTrustScript), 0o755)
		writeOwned(t, m, filepath.Join(fx.W, "Get.java"), []byte(javaGet), 0o644)
		// The host trusts the lab CA only through the variables: it is in
		// no system bundle and in no client's built-in list.
		hostCA := filepath.Join(fx.aux, "corp-ca.pem")
		if err := os.WriteFile(hostCA, lab.CAPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		writeOwned(t, m, filepath.Join(fx.W, "corp-ca.pem"), lab.CAPEM, 0o644)
		r := runCorral(t, fx, runOpts{
			args:    []string{"/usr/bin/bash", filepath.Join(fx.W, "ca.sh")},
			policy:  basePolicy(caTrustPolicy),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", hostCA, "--env", "W=" + fx.W, "--env", "P=" + P},
			env:     []string{"NODE_EXTRA_CA_CERTS=" + hostCA, "SSL_CERT_FILE=" + hostCA},
			timeout: 2 * time.Minute,
		})
		n := &netRun{t: t, r: r, sec: sections(r.stdout)}
		n.has("truststore_at_start", `TRUSTSTORE_READY`)
		for _, host := range []string{"corp", "insp"} {
			n.has("curl_"+host, `hello from `+host+`\.test GET /`+host+P+` rc=0`)
			n.has("python_"+host, `PYSTATUS 200`)
			n.has("node_"+host, `NODESTATUS 200`)
			n.has("go_"+host, `GOSTATUS 200`)
			// The lab is no git server, but git took its answer.
			n.hasNot("git_"+host, `(?i)certificate|SSL`)
			n.has("git_"+host, `GITRC=0`)
			if strings.Contains(n.sec["java_"+host], "NO_JAVA") {
				requireFeature(t, "java is not installed")
				continue
			}
			n.has("java_"+host, `JAVASTATUS 200 hello from `+host+`\.test`)
		}
		// That client is told why, in the audit log and on corral's stderr.
		n.has("untrusting", `rc=60`)
		r.requireEvent(t, "tls.handshake_failed", map[string]any{"host": "insp.test", "binary": "/usr/bin/curl", "cause": "client_does_not_trust_sandbox_ca"})
		if !strings.Contains(r.stderr, "does not trust") && !strings.Contains(r.stderr, "rejected the sandbox CA") {
			t.Errorf("corral's stderr does not warn about the client that rejected the sandbox CA:\n%s", r.stderr)
		}
	})
}
