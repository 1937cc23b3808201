package e2e

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// lendPy makes python3's connection look like curl's, three ways. parked:
// python3 lets a curl child inherit its socket (curl sits reading its
// config from stdin), connects, parks its own descriptor in flight in a
// unix socket (SCM_RIGHTS) and closes it, so that curl alone holds the
// socket while the connection is identified, then takes it back. execd:
// python3 connects, writes its request and execs curl on the same pid,
// which keeps the socket; execd-proxy and execd-socks do the same through
// the HTTP proxy and SOCKS5 listeners. threaded: a thread of python3 connects, to a
// host any program may reach, which must work.
const lendPy = `import array, os, socket, subprocess, sys, threading, time
host, mode = sys.argv[1], sys.argv[2]
addr = socket.gethostbyname(host)
req = ("GET /%s-by-python HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (mode, host)).encode()
def show(c):
    try:
        c.sendall(req)
        print(mode.upper(), c.recv(4096).split(b"\r\n\r\n")[-1].decode())
    except Exception as e:
        print(mode.upper() + "-ERR", type(e).__name__, e)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
if mode == "threaded":
    t = threading.Thread(target=lambda: s.connect((addr, 80)))
    t.start(); t.join(); s.settimeout(5); show(s); sys.exit(0)
if mode == "tfo":
    # TCP Fast Open connects from sendto: no connect(2) to record.
    try:
        s.sendto(req, socket.MSG_FASTOPEN, (addr, 80)); s.settimeout(5)
        print(mode.upper(), s.recv(4096).split(b"\r\n\r\n")[-1].decode())
    except Exception as e:
        print(mode.upper() + "-ERR", type(e).__name__, e)
    sys.exit(0)
if mode in ("execd", "execd-proxy", "execd-socks"):
    # curl will wait a second for its config on stdin, holding the socket
    # while the connection is identified and, were it allowed, carried.
    r, w = os.pipe()
    subprocess.Popen(["sleep", "1"], stdout=w)
    os.close(w)
    if mode == "execd":
        s.connect((addr, 80)); s.sendall(req)
    elif mode == "execd-proxy":
        # The same through the HTTP proxy listener.
        p = os.environ["http_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)
        s.connect((p[0], int(p[1])))
        s.sendall(("GET http://%s/%s-by-python HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (host, mode, host)).encode())
    else:
        # And through the SOCKS5 listener: the request follows CONNECT.
        p = os.environ["all_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)
        s.connect((p[0], int(p[1])))
        s.sendall(b"\x05\x01\x00"); s.recv(2)
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + (80).to_bytes(2, "big") + req)
    os.set_inheritable(s.fileno(), True)
    os.dup2(r, 0)
    os.execv("/usr/bin/curl", ["curl", "-sS", "-K", "-"])
os.set_inheritable(s.fileno(), True)
curl = subprocess.Popen(["/usr/bin/curl", "-sS", "-K", "-"], stdin=subprocess.PIPE,
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(s.fileno(),))
time.sleep(0.3)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
s.setblocking(False)
try:
    s.connect((addr, 80))
except BlockingIOError:
    pass
fd = s.fileno()
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
s.detach(); os.close(fd)
time.sleep(1.0)
_, anc, _, _ = b.recvmsg(1, socket.CMSG_LEN(4))
got = array.array("i"); got.frombytes(anc[0][2][:4])
c = socket.socket(fileno=got[0]); c.setblocking(True); c.settimeout(5)
show(c)
curl.kill()
`

const lendScript = `#!/bin/bash
cd $W
echo "=== curl"; curl -sS -m5 --noproxy '*' http://curlonly.test/curl-itself -w ' %{http_code}\n' 2>&1
echo "=== parked"; python3 lend.py curlonly.test parked 2>&1
echo "=== execd"; python3 lend.py curlonly.test execd 2>&1
echo "=== execd-proxy"; python3 lend.py curlonly.test execd-proxy 2>&1
echo "=== execd-socks"; python3 lend.py curlonly.test execd-socks 2>&1
echo "=== threaded"; python3 lend.py anyone.test threaded 2>&1
echo "=== tfo"; python3 lend.py anyone.test tfo 2>&1
echo "=== end"
`

// TestSocketLendingRefused: a connection is identified as the process that
// connected its socket, and only while that process holds it and runs the
// program it ran when it connected, checked after its identity is read
// (an exec between the two would otherwise pass as the new program). As
// root the kernel records the connects (a cgroup hook), and the run is
// repeated with the seccomp filter handing them to the supervisor, the
// path rootless runs take.
func TestSocketLendingRefused(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "curlonly.test", Addr: netip.MustParseAddr("203.0.113.13")},
		netlab.Host{Name: "anyone.test", Addr: netip.MustParseAddr("203.0.113.14")})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		recorders := map[string][]string{"seccomp": {notifyConnects}}
		if !m.rootless {
			recorders["kernel"] = nil
		}
		for want, env := range recorders {
			t.Run(want, func(t *testing.T) { lendingRefused(t, lab, m, want, env) })
		}
	})
}

// notifyConnects keeps a root run on the seccomp path.
const notifyConnects = "CORRAL_NOTIFY_CONNECTS=1"

func lendingRefused(t *testing.T, lab *netlab.Lab, m *mode, recorder string, env []string) {
	fx := newFixture(t, m)
	seen := len(lab.HTTPRequests())
	writeOwned(t, m, filepath.Join(fx.W, "lend.sh"), []byte(lendScript), 0o755)
	writeOwned(t, m, filepath.Join(fx.W, "lend.py"), []byte(lendPy), 0o644)
	pol := proxyPolicy("network_policies:\n" +
		"  curlonly:\n    endpoints:\n      - {host: curlonly.test, port: 80}\n    binaries: [{path: /usr/bin/curl}]\n" +
		"  anyone:\n    endpoints:\n      - {host: anyone.test, port: 80}\n")
	r := runCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "lend.sh")},
		policy: pol, timeout: 90 * time.Second, env: env,
		flags: []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W}})
	n := &netRun{t: t, r: r, sec: sections(r.stdout)}
	if r.code != 0 || n.sec["end"] == "" {
		t.Fatalf("the script did not complete\n%s", r)
	}
	t.Logf("sandbox output:\n%s\nnet events:\n%s", r.stdout, netEvents(r))
	if got := startField(r, "connects"); got != recorder {
		t.Fatalf("sandbox.start says connects are recorded by %q, want %q\n%s", got, recorder, r)
	}
	n.has("curl", `hello from curlonly.test GET /curl-itself 200`)
	n.hasNot("parked", `hello from`)
	n.has("threaded", `hello from anyone.test GET /threaded-by-python`)
	if recorder == "kernel" {
		// The hook sees a connect that makes no connect(2) call.
		n.has("tfo", `hello from anyone.test GET /tfo-by-python`)
	} else {
		// anyone.test takes any program, so only the missing connect
		// record refuses this one.
		n.hasNot("tfo", `hello from`)
		if !strings.Contains(netEvents(r), "corral saw no connect(2) for it") {
			t.Errorf("no refusal of the TCP Fast Open connection for want of a connect record\n%s", netEvents(r))
		}
	}
	for _, s := range lab.HTTPRequests()[seen:] {
		if s.Host == "curlonly.test" && (strings.HasPrefix(s.Path, "/parked-") || strings.HasPrefix(s.Path, "/execd-")) {
			t.Errorf("python3 reached curlonly.test as /usr/bin/curl: %s", s.Path)
		}
	}
	// Each borrowed connection is refused. Why depends on when it is
	// identified: after the lending ("which no longer holds it", "has
	// run another program since it connected"), or, on a slow machine,
	// before it, as python3's own.
	denied := 0
	for _, e := range r.find("net.connect.denied") {
		if e["host"] == "curlonly.test" {
			denied++
		}
	}
	if denied < 4 {
		t.Errorf("%d refusals for curlonly.test in the audit trail, want one for each borrowed connection\n%s", denied, netEvents(r))
	}
}

// startField is a field of the run's sandbox.start event, "" if absent.
func startField(r *result, name string) string {
	for _, e := range r.find("sandbox.start") {
		if v, ok := e[name].(string); ok {
			return v
		}
	}
	return ""
}

// TestWorkloadHoldsNoSeccompListener: the filter's listener, with which a
// workload could take its own connects from the supervisor, reaches the
// supervisor only; no descriptor of corral's reaches the workload.
func TestWorkloadHoldsNoSeccompListener(t *testing.T) {
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", `for f in /proc/$$/fd/*; do echo "$f -> $(readlink $f)"; done`},
			policy: proxyPolicy("")})
		if r.code != 0 || !strings.Contains(r.stdout, "/fd/0 ->") {
			t.Fatalf("want the shell's descriptors listed\n%s", r)
		}
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			// The shell's own: its stdio, its script and the pipe of the
			// $(...) it is running; nothing of corral's.
			if strings.Contains(l, "seccomp") || strings.Contains(l, "anon_inode") || strings.Contains(l, "socket:") {
				t.Errorf("the workload holds %s", l)
			}
		}
	})
}
