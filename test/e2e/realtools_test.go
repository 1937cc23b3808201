package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNetworkOnlyPolicyFile: a policy file that says only what it allows
// on the network inherits the default's filesystem, so real tools still
// run; `policy check` says which sections came from the default.
func TestNetworkOnlyPolicyFile(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		pol := `version: 1
network_policies:
  forge:
    endpoints: [{host: forge.test, port: 443}]
`
		r := runCorral(t, fx, runOpts{policy: pol, args: []string{"/bin/sh", "-c",
			"/usr/bin/git init -q repo && cd repo && /usr/bin/git -c user.name=a -c user.email=a@b commit -q --allow-empty -m first && /usr/bin/git log --oneline | wc -l"}})
		if r.code != 0 || strings.TrimSpace(r.stdout) != "1" {
			t.Fatalf("git under a network-only policy file failed\n%s", r)
		}
		code, out := corralCLI(t, m, "policy", "check", fx.writePolicy(t, pol))
		if code != 0 || !strings.Contains(out, "filesystem_policy, network, limits from the built-in default") {
			t.Errorf("policy check does not say what the file inherits (exit %d):\n%s", code, out)
		}
	})
}

// TestPolicyCheckListsEveryProblem: one run of `policy check` names every
// mistake in the file, each with its place and a fix.
func TestPolicyCheckListsEveryProblem(t *testing.T) {
	t.Parallel()
	m := getRootMode(t)
	fx := newFixture(t, m)
	p := fx.writePolicy(t, `version: 1
network:
  mode: proxi
limits:
  memory: lots
filesystem_policy:
  read_only: [relative/path]
  raed_write: [/x]
`)
	code, out := corralCLI(t, m, "policy", "check", p)
	if code != 2 {
		t.Errorf("policy check of a broken file: exit %d, want 2\n%s", code, out)
	}
	for _, want := range []string{
		`network.mode: unknown value "proxi" — did you mean "proxy"?`,
		`limits.memory: cannot parse size "lots"`,
		`filesystem_policy.read_only[0]: path "relative/path" is not absolute`,
		`filesystem_policy.raed_write: unknown field (line 8) — did you mean "read_write"?`,
		fmt.Sprintf("%s: 4 problem(s)", p),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("policy check output lacks %q:\n%s", want, out)
		}
	}
}

// TestWalltimeInSummary: the start summary states the walltime in force,
// which --timeout sets.
func TestWalltimeInSummary(t *testing.T) {
	t.Parallel()
	fx := newFixture(t, getRootMode(t))
	r := runCorral(t, fx, runOpts{args: []string{filepath.Join("/bin", "true")}, flags: []string{"--timeout", "7s"}})
	if r.code != 0 {
		t.Fatalf("run failed\n%s", r)
	}
	ev := r.requireEvent(t, "sandbox.start", nil)
	if s := fmt.Sprint(ev["summary"]); !strings.Contains(s, " walltime=7s ") {
		t.Errorf("sandbox.start summary %q does not say walltime=7s", s)
	}
}

// TestOwnHostnameResolves: tools look their own host's name up (git for
// its default identity, Java's InetAddress.getLocalHost, Python's getfqdn).
// The sandbox's name resolves, without the network (block) and without a
// denied name or a policy draft for it (proxy). corral runs under umask
// 077 here, and what it made for the workload stays readable to it.
// localHostJava prints what InetAddress.getLocalHost() finds, which throws
// when the host's name does not resolve (run as java LocalHost.java).
const localHostJava = `public class LocalHost {
    public static void main(String[] args) throws Exception {
        System.out.println("JAVA " + java.net.InetAddress.getLocalHost());
    }
}
`

func TestOwnHostnameResolves(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/java"); err != nil {
		requireFeature(t, "java is not installed (Debian's default-jre-headless)")
	}
	const script = `n=$(hostname)
echo "UMASK $(umask)"
for f in /etc/hosts /etc/resolv.conf /run/corral/ca-bundle.pem /etc/ssl/certs/ca-certificates.crt; do [ -e "$f" ] && { head -c1 "$f" >/dev/null && echo "READ $f" || echo "UNREADABLE $f"; }; done
getent ahosts "$n" | awk '{print "AHOSTS", $1}' | sort -u
getent hosts "$n" | awk '{print "HOSTS", $1}'
python3 -c 'import socket; print("PY", socket.gethostbyname(socket.gethostname()), socket.getfqdn())'
java LocalHost.java 2>&1 | grep -v 'Picked up'
# A server of the workload's, reached by the sandbox's name with the proxy
# variables set (proxy mode; block mode has no inet sockets at all).
python3 -m http.server --bind 127.0.1.1 8000 >/dev/null 2>&1 &
srv=$!
# Up to 10 s for the server to listen; less once it has given up (block).
i=0
until curl -s -o /dev/null "http://$n:8000/" || ! kill -0 $srv 2>/dev/null || [ $((i += 1)) -ge 100 ]; do sleep 0.1; done
curl -sS -o /dev/null -w "OWN_SERVER %{http_code}\n" "http://$n:8000/"
kill $srv 2>/dev/null; true
`
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, net := range []string{"block", "proxy"} {
			t.Run(net, func(t *testing.T) {
				fx := newFixture(t, m)
				writeOwned(t, m, filepath.Join(fx.W, "LocalHost.java"), []byte(localHostJava), 0o644)
				pol := basePolicy("network:\n  mode: " + net + "\n")
				// Under a strict umask, as on hardened hosts: what corral
				// writes for the workload must stay readable to it.
				r := runCorral(t, fx, runOpts{policy: pol, args: []string{"/bin/sh", "-c", script}, umask: "077"})
				id := r.sandboxID(t)
				if r.code != 0 || !strings.Contains(r.stdout, "AHOSTS 127.0.1.1\n") || !strings.Contains(r.stdout, "HOSTS 127.0.1.1\n") || !strings.Contains(r.stdout, "PY 127.0.1.1 corral-"+id+"\n") {
					t.Fatalf("the sandbox's hostname does not resolve to %s\n%s", "127.0.1.1", r)
				}
				if strings.Contains(r.stdout, "UNREADABLE") || !strings.Contains(r.stdout, "READ /etc/hosts") || net == "proxy" && !strings.Contains(r.stdout, "READ /run/corral/ca-bundle.pem") {
					t.Errorf("a file corral wrote for the workload is unreadable under umask 077\n%s", r)
				}
				if !strings.Contains(r.stdout, "JAVA corral-"+id+"/127.0.1.1\n") {
					t.Errorf("Java's InetAddress.getLocalHost() does not find the sandbox's name\n%s", r)
				}
				if net == "proxy" && !strings.Contains(r.stdout, "OWN_SERVER 200\n") {
					t.Errorf("a server in the sandbox is not reached by the sandbox's name (NO_PROXY)\n%s", r)
				}
				if !strings.Contains(r.stdout, "UMASK 0077\n") {
					t.Errorf("the workload did not get corral's umask 077\n%s", r)
				}
				for _, e := range []string{"net.dns.denied", "draft.proposed"} {
					if len(r.find(e)) != 0 {
						t.Errorf("looking up its own name gave %s events\n%s", e, r)
					}
				}
			})
		}
	})
}
