package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// The network tests run real clients (curl, python3, bash's /dev/tcp)
// inside proxy-mode sandboxes against the project's fake internet
// (internal/testutil/netlab). Nothing here may send a packet off this
// machine: every allowed destination is a lab host in 203.0.113.0/24, the
// supervisor resolves through the lab's DNS server (--upstream-dns), and
// names resolving to private, loopback or metadata addresses are only ever
// used to assert that corral refuses them before dialling.

// Addresses inside the sandbox (internal/sandbox, capture).
const (
	captureAddr = "198.19.255.254"
	httpProxy   = captureAddr + ":3128"
	socksProxy  = captureAddr + ":1080"
)

var syntheticNet = netip.MustParsePrefix("198.18.0.0/16")

// Lab hosts. Several names share an address where the test only needs a
// name; each bulk host serves a share of the 1000 tunnels because the lab
// caps concurrent connections per listener.
var (
	addrAllowed = netip.MustParseAddr("203.0.113.10")
	addrOther   = netip.MustParseAddr("203.0.113.11")
	addrDenied  = netip.MustParseAddr("203.0.113.12")
	addrBind    = netip.MustParseAddr("203.0.113.13")
	addrWild    = netip.MustParseAddr("203.0.113.16")
	addrLate    = netip.MustParseAddr("203.0.113.17")
)

const bulkPerMode = 5

func bulkHost(modeIdx, i int) netlab.Host {
	n := modeIdx*bulkPerMode + i
	return netlab.Host{Name: fmt.Sprintf("bulk%d.test", n), Addr: netip.AddrFrom4([4]byte{203, 0, 113, byte(101 + n)})}
}

func labHosts() []netlab.Host {
	hs := []netlab.Host{
		{Name: "allowed.test", Addr: addrAllowed},
		{Name: "other.test", Addr: addrOther},
		{Name: "denied.test", Addr: addrDenied},
		{Name: "curlonly.test", Addr: addrBind},
		{Name: "tool.test", Addr: addrBind},
		{Name: "mycurl.test", Addr: addrBind},
		{Name: "a.wild.test", Addr: addrWild},
		{Name: "wild.test", Addr: addrWild},
		{Name: "a.b.wild.test", Addr: addrWild},
		{Name: "late.test", Addr: addrLate},
	}
	for m := 0; m < 2; m++ {
		for i := 0; i < bulkPerMode; i++ {
			hs = append(hs, bulkHost(m, i))
		}
	}
	return hs
}

// netTool is a python3 helper the workload runs for what curl cannot do.
// Every subcommand prints one line per result. CAPTURE_ADDR is replaced by
// the quoted capture address when the file is written.
const netTool = `import errno, json, os, random, socket, ssl, struct, sys, time

def resolve(name):
    try:
        print("ADDR", name, socket.gethostbyname(name))
    except socket.gaierror as e:
        print("GAIERR", name, "NXDOMAIN" if e.errno == socket.EAI_NONAME else e.errno)

def rawdns(server, name):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, (server, 53))
    data, src = s.recvfrom(4096)
    rid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", data[:12])
    i = 12
    while data[i] != 0:
        i += data[i] + 1
    i += 5
    addrs = []
    for _ in range(an):
        if data[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while data[i] != 0:
                i += data[i] + 1
            i += 1
        typ, cls, ttl, rdlen = struct.unpack(">HHIH", data[i:i + 10])
        i += 10
        if typ == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(data[i:i + 4]))
        i += rdlen
    print("DNS from=%s:%d id_ok=%s rcode=%d answers=%s" % (src[0], src[1], rid == qid, flags & 0xF, ",".join(addrs)))

def udp(*targets):
    for t in targets:
        ip, port = t.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            n = s.sendto(b"corral-udp-probe", (ip, int(port)))
            print("UDP_SENT", t, n)
        except OSError as e:
            print("UDP_ERR", t, errno.errorcode.get(e.errno, e.errno))

def sni(name, server_hostname):
    addr = socket.gethostbyname(name)
    s = socket.create_connection((addr, 443), timeout=10)
    ctx = ssl.create_default_context(cafile="ca.pem")
    try:
        t = ctx.wrap_socket(s, server_hostname=server_hostname)
        print("HANDSHAKE_OK", t.version())
    except ConnectionResetError as e:
        print("RESET", e)
    except Exception as e:
        print("ERROR", type(e).__name__, e)

def hosthdr(name, host, path):
    addr = socket.gethostbyname(name)
    s = socket.create_connection((addr, 80), timeout=10)
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, host)).encode())
    try:
        data = s.recv(4096)
        print("GOT", len(data), data[:60])
    except ConnectionResetError as e:
        print("RESET", e)
    except Exception as e:
        print("ERROR", type(e).__name__, e)

def connect(target):
    s = socket.create_connection((CAPTURE_ADDR, 3128), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        d = s.recv(4096)
        if not d:
            break
        data += d
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    print("STATUS", lines[0])
    n = 0
    for l in lines[1:]:
        if l.lower().startswith("content-length:"):
            n = int(l.split(":", 1)[1])
    while len(body) < n:
        d = s.recv(4096)
        if not d:
            break
        body += d
    if n:
        print("BODY", body.decode(errors="replace"))

globals()[sys.argv[1]](*sys.argv[2:])
`

// urlGet is run as python3 -c (no script on the command line) and as the
// script tool.py: GET argv[1], through the proxy variables when argv[2] is
// "proxy", directly (transparent capture) otherwise.
// rewriteArgv makes its own command line read "python3 TOOL" (writing the
// argument area of its own memory, as any process may) and then fetches
// URL.
const rewriteArgv = `import ctypes, sys, urllib.request
url, tool = sys.argv[1], sys.argv[2]
stat = open("/proc/self/stat").read()
fields = stat[stat.rindex(")") + 2:].split()
start, end = int(fields[45]), int(fields[46])
new = ("python3\0%s\0" % tool).encode()
ctypes.memmove(start, new + b"\0" * (end - start - len(new)), end - start)
if ("\0%s\0" % tool).encode() not in open("/proc/self/cmdline", "rb").read():
    print("REWRITE FAILED")
try:
    r = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10)
    print("STATUS", r.status, r.read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e)
`

// nodeGet fetches its last argument directly (node's http ignores the
// proxy variables), printing the status and body.
const nodeGet = `require("http").get(process.argv[process.argv.length - 1], r => {
  let b = ""; r.on("data", d => b += d); r.on("end", () => console.log("STATUS", r.statusCode, b));
}).on("error", e => console.log("ERROR", e.code));
`

const urlGet = `import sys, urllib.request, urllib.error
h = [] if len(sys.argv) > 2 and sys.argv[2] == "proxy" else [urllib.request.ProxyHandler({})]
try:
    r = urllib.request.build_opener(*h).open(sys.argv[1], timeout=10)
    print("STATUS", r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print("HTTPERR", e.code, e.read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e)
`

// A transparent refusal is a TCP reset. Depending on whether it lands
// before or after the client's connect() completes, curl reports it as
// exit 7 ("Couldn't connect") or 56 ("Connection reset by peer"); the
// audit event says why.
//
// mainScript runs most cases in one sandbox. Each case starts with a line
// "=== NAME" and ends with its output (and curl's exit code as " rc=N").
const mainScript = `#!/bin/bash
cd "$W" || exit 99
C="curl -sS --max-time 10"
sec() { echo; echo "=== $1"; }

sec env
echo "HTTP_PROXY=$HTTP_PROXY"
echo "http_proxy=$http_proxy"
echo "HTTPS_PROXY=$HTTPS_PROXY"
echo "ALL_PROXY=$ALL_PROXY"
grep '^nameserver' /etc/resolv.conf

sec http_transparent
$C --noproxy '*' http://allowed.test$P/http-transparent; echo " rc=$?"
sec http_proxy
$C http://allowed.test$P/http-proxy; echo " rc=$?"
sec https_connect
$C --cacert ca.pem https://allowed.test$P/https-connect; echo " rc=$?"
sec https_transparent
$C --noproxy '*' --cacert ca.pem https://allowed.test$P/https-transparent; echo " rc=$?"
sec socks5
$C -x socks5h://` + socksProxy + ` http://allowed.test$P/socks5; echo " rc=$?"

sec echo
if exec 3<>/dev/tcp/allowed.test/7000; then
  echo "ping$P" >&3
  read -r -t 10 line <&3
  echo "GOT:$line"
  exec 3>&-
fi
sec banner
if exec 4<>/dev/tcp/allowed.test/2222; then
  read -r -t 10 line <&4
  echo "GOT:${line%$'\r'}"
  exec 4>&-
fi

sec denied_dns
python3 nt.py resolve denied.test
sec denied_curl
$C --noproxy '*' http://denied.test$P/denied; echo " rc=$?"

sec bind_curl
$C --noproxy '*' http://curlonly.test$P/bind-curl; echo " rc=$?"
sec bind_python
python3 -c "$(cat urlget.py)" http://curlonly.test$P/bind-python proxy
# The SOCKS port serves HTTP proxy requests too (for clients that take
# ALL_PROXY for an HTTP proxy): under the same binding.
sec socksport_curl
$C -x http://SOCKS_ADDR http://curlonly.test$P/socksport-curl; echo " rc=$?"
sec socksport_python
http_proxy=http://SOCKS_ADDR python3 -c "$(cat urlget.py)" http://curlonly.test$P/socksport-python proxy

sec script_tool
python3 ./tool.py http://tool.test$P/script-tool
sec script_c
python3 -c "$(cat urlget.py)" http://tool.test$P/script-c
# The same with node: its script binds, and neither -e code nor a
# process.title naming the script does.
sec script_node
node tool.js http://tool.test$P/script-node
sec script_node_e
node -e "process.title = 'node $W/tool.js'; $(cat tool.js)" http://tool.test$P/script-node-e

# Allowed, but the upstream fails: the proxy says which way.
sec fail_dns
$C -w ' code=%{http_code}' http://nxname.test$P/fail-dns; echo " rc=$?"
sec fail_refused
$C -w ' code=%{http_code}' http://allowed.test:81$P/fail-refused; echo " rc=$?"

# Borrowed identity: none of these is curl or tool.py.
sec borrow_loader
/lib64/ld-linux-x86-64.so.2 /usr/bin/curl -sS --max-time 10 --noproxy '*' http://curlonly.test$P/borrow-loader; echo " rc=$?"
sec borrow_stdin
sed 's/sys.argv\[1\]/sys.argv[-1]/' urlget.py | python3 - /usr/bin/curl http://curlonly.test$P/borrow-stdin
sec borrow_option_value
python3 -W "$W/tool.py" urlget.py http://tool.test$P/borrow-option-value 2>/dev/null
sec borrow_preload
LD_PRELOAD="$W/libz.so.1" $C --noproxy '*' http://curlonly.test$P/borrow-preload; echo " rc=$?"
sec borrow_rewrite
python3 rewrite.py http://tool.test$P/borrow-rewrite "$W/tool.py" $(printf 'x%.0s' {1..200})
# A child forked before its parent becomes curl; curl reads the pipe the
# child holds open, so it lives until the child is done.
sec borrow_prefork
python3 - http://curlonly.test$P/borrow-prefork <<'PY'
import os, sys, time, urllib.request
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    time.sleep(0.5)
    try:
        res = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(sys.argv[1], timeout=5)
        print("STATUS", res.status, res.read().decode())
    except Exception as e:
        print("ERROR", type(e).__name__, e)
    sys.stdout.flush()
    os._exit(0)
os.close(w)
os.dup2(r, 0)
os.execv("/usr/bin/curl", ["curl", "-s", "-o", "/dev/null", "file:///dev/stdin"])
PY

sec integrity_first
./mycurl -sS --max-time 10 --noproxy '*' http://mycurl.test$P/integrity-1; echo " rc=$?"
printf 'x' >> ./mycurl
sec integrity_second
./mycurl -sS --max-time 10 --noproxy '*' http://mycurl.test$P/integrity-2; echo " rc=$?"

sec udp
python3 nt.py udp 203.0.113.10:9999 "$UDPADDR"

sec dns_hardcoded
python3 nt.py rawdns 8.8.8.8 allowed.test
sec dns_hardcoded_denied
python3 nt.py rawdns 8.8.8.8 denied.test

sec ip_direct
$C --noproxy '*' http://203.0.113.10$P/ip-direct; echo " rc=$?"
sec ipv6
$C --noproxy '*' "http://[2001:db8::1]$P/ipv6"; echo " rc=$?"

sec sni
python3 nt.py sni allowed.test other.test
sec host
python3 nt.py hosthdr allowed.test other.test $P/host-mismatch
sec connect_ip
python3 nt.py connect 203.0.113.11:443

sec private
$C --noproxy '*' http://private.test$P/private; echo " rc=$?"
sec loop
$C --noproxy '*' http://loop.test:$LOOPPORT$P/loop; echo " rc=$?"
sec self
$C --noproxy '*' http://self.test:$LOOPPORT$P/self; echo " rc=$?"
sec meta_ip
$C --noproxy '*' http://169.254.169.254/latest/meta-data/; echo " rc=$?"
sec meta_name
$C --noproxy '*' http://meta.test$P/meta; echo " rc=$?"

sec wild_resolve
python3 nt.py resolve a.wild.test
python3 nt.py resolve wild.test
python3 nt.py resolve a.b.wild.test
sec wild_curl
$C --noproxy '*' http://a.wild.test$P/wild; echo " rc=$?"
echo
echo "=== end"
`

// literalScript runs with a policy whose only endpoint is allowed_ips
// 203.0.113.10/32.
const literalScript = `#!/bin/bash
cd "$W" || exit 99
C="curl -sS --max-time 10"
sec() { echo; echo "=== $1"; }
sec literal_transparent
$C --noproxy '*' http://203.0.113.10$P/literal-transparent; echo " rc=$?"
sec literal_connect
$C --cacert ca.pem https://203.0.113.10$P/literal-connect; echo " rc=$?"
sec literal_connect_raw
python3 nt.py connect 203.0.113.10:443
sec literal_other
python3 nt.py connect 203.0.113.11:443
sec literal_other_transparent
$C --noproxy '*' http://203.0.113.11$P/literal-other; echo " rc=$?"
echo
echo "=== end"
`

// reloadScript polls late.test (not yet allowed) and allowed.test every
// 300 ms for at most 15 s and stops once late.test answers.
const reloadScript = `#!/bin/bash
cd "$W" || exit 99
end=$((SECONDS + 15))
i=0
while [ $SECONDS -lt $end ]; do
  i=$((i + 1))
  a=$(curl -s --max-time 3 --noproxy '*' -o /dev/null -w '%{http_code}' http://allowed.test$P/reload-allowed-$i)
  l=$(curl -s --max-time 3 --noproxy '*' -o /dev/null -w '%{http_code}' http://late.test$P/reload-late-$i)
  echo "iter $i allowed=$a late=$l"
  if [ "$l" = 200 ]; then echo "LATE OK"; exit 0; fi
  sleep 0.3
done
echo "LATE NEVER"
exit 1
`

// revokeScript holds a raw TCP connection to the echo port of allowed.test
// and one to other.test, and pings both every 100 ms; it reports when
// either ends, and stops when told (the file "stop" appears) or after 20 s.
const revokeScript = `import os, socket, sys, time
conns = {h: socket.create_connection((h, 7000), timeout=5) for h in ("allowed.test", "other.test")}
# An echo proves the tunnel is decided and carried, not just accepted by
# the capture listener.
for c in conns.values():
    c.sendall(b"hello\n")
    c.recv(64)
print("OPEN", flush=True)
ended = {}
end = time.time() + 20
while time.time() < end and not os.path.exists("stop"):
    for h, c in conns.items():
        if h in ended:
            continue
        try:
            c.sendall(b"ping\n")
            if not c.recv(64):
                raise OSError("closed by peer")
        except OSError as e:
            ended[h] = time.time()
            print("ENDED", h, type(e).__name__, "%.3f" % ended[h], flush=True)
    time.sleep(0.1)
print("ALIVE", " ".join(sorted(h for h in conns if h not in ended)), flush=True)
`

// tunnelsScript opens N connections at once (non-blocking) through the
// transparent capture to the echo servers of the named hosts, has each
// echo a line, keeps them all open until the test has looked at the
// supervisor, then closes them and waits again.
const tunnelsScript = `import errno, os, resource, selectors, socket, sys, time
n = int(sys.argv[1])
names = sys.argv[2:]

def wait_for(f):
    end = time.time() + 60
    while not os.path.exists(f):
        if time.time() > end:
            print("TIMEOUT waiting for", f, flush=True)
            sys.exit(2)
        time.sleep(0.02)

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
addrs = [socket.gethostbyname(h) for h in names]
print("ADDRS", " ".join(addrs), "nofile", resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
print("READY", flush=True)
wait_for("go-open")

sel = selectors.DefaultSelector()
socks, bufs = [], {}
bad = 0
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    rc = s.connect_ex((addrs[i % len(addrs)], 7000))
    socks.append(s)
    if rc not in (0, errno.EINPROGRESS):
        bad += 1
        continue
    bufs[s] = b""
    sel.register(s, selectors.EVENT_WRITE, i)
ok, pending = 0, n - bad
end = time.time() + 40
while pending and time.time() < end:
    for key, ev in sel.select(timeout=1):
        s, i = key.fileobj, key.data
        want = ("tunnel %d\n" % i).encode()
        if ev & selectors.EVENT_WRITE:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                bad += 1; pending -= 1; sel.unregister(s); continue
            s.send(want)
            sel.modify(s, selectors.EVENT_READ, i)
            continue
        try:
            d = s.recv(256)
        except OSError:
            d = b""
        if not d:
            bad += 1; pending -= 1; sel.unregister(s); continue
        bufs[s] += d
        if bufs[s].endswith(b"\n"):
            if bufs[s] == want:
                ok += 1
            else:
                bad += 1
            pending -= 1
            sel.unregister(s)
print("TUNNELS ok=%d failed=%d pending=%d open=%d" % (ok, bad, pending, len(socks)), flush=True)
wait_for("go-close")
for s in socks:
    s.close()
print("CLOSED", flush=True)
wait_for("go-exit")
`

// sections splits the main script's output into its cases.
func sections(out string) map[string]string {
	m := map[string]string{}
	name := ""
	for _, l := range strings.Split(out, "\n") {
		if n, ok := strings.CutPrefix(l, "=== "); ok {
			name = strings.TrimSpace(n)
			continue
		}
		if name != "" {
			m[name] += l + "\n"
		}
	}
	return m
}

type netRun struct {
	t   *testing.T
	r   *result
	sec map[string]string
}

// has fails unless the case's output matches the regular expression re.
func (n *netRun) has(name, re string) string {
	n.t.Helper()
	out, ok := n.sec[name]
	if !ok {
		n.t.Errorf("case %s did not run\n%s", name, n.r)
		return ""
	}
	m := regexp.MustCompile(re).FindStringSubmatch(out)
	if m == nil {
		n.t.Errorf("case %s: output does not match %q:\n%s", name, re, out)
		return ""
	}
	return m[len(m)-1]
}

// hasNot fails if the case's output matches re.
func (n *netRun) hasNot(name, re string) {
	n.t.Helper()
	if regexp.MustCompile(re).MatchString(n.sec[name]) {
		n.t.Errorf("case %s: output unexpectedly matches %q:\n%s", name, re, n.sec[name])
	}
}

// event returns the events called name carrying every field of want,
// failing (not fatally) when there is none.
func (n *netRun) event(name string, want map[string]any) map[string]any {
	n.t.Helper()
	if e := findEvent(n.r, name, want); e != nil {
		return e
	}
	n.t.Errorf("no audit event %s with %v; network events:\n%s", name, want, netEvents(n.r))
	return nil
}

func findEvent(r *result, name string, want map[string]any) map[string]any {
	if es := findEvents(r, name, want); len(es) > 0 {
		return es[0]
	}
	return nil
}

// findEvents returns the events called name carrying every field of want.
func findEvents(r *result, name string, want map[string]any) []map[string]any {
	var out []map[string]any
	for _, e := range r.find(name) {
		ok := true
		for k, v := range want {
			if fmt.Sprint(e[k]) != fmt.Sprint(v) {
				ok = false
			}
		}
		if ok {
			out = append(out, e)
		}
	}
	return out
}

func netEvents(r *result) string {
	var b strings.Builder
	for _, e := range r.events {
		if s := fmt.Sprint(e["event"]); strings.HasPrefix(s, "net.") || strings.HasPrefix(s, "policy.") {
			j, _ := json.Marshal(e)
			b.Write(j)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// denyBody parses the JSON body of a 403 printed by a case and checks it
// has the fields keys (those of a connection refusal if none are given).
func (n *netRun) denyBody(name, re string, keys ...string) map[string]any {
	n.t.Helper()
	js := n.has(name, re)
	if js == "" {
		return nil
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(js), &body); err != nil {
		n.t.Errorf("case %s: 403 body is not JSON: %v: %q", name, err, js)
		return nil
	}
	if len(keys) == 0 {
		keys = []string{"error", "reason", "host", "port", "binary", "policy", "next_steps"}
	}
	for _, k := range keys {
		if _, ok := body[k]; !ok {
			n.t.Errorf("case %s: 403 body has no %q: %s", name, k, js)
		}
	}
	return body
}

func requireFields(t *testing.T, what string, got map[string]any, want map[string]any) {
	t.Helper()
	if got == nil {
		return
	}
	for k, v := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("%s: %s = %v, want %v (%v)", what, k, got[k], v, got)
		}
	}
}

// corralCLI runs a corral subcommand as the mode's user, with the same
// environment startCorral gives corral.
func corralCLI(t *testing.T, m *mode, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(corralBin, args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	if m.rootless {
		cmd.Env = append(cmd.Env, "HOME="+m.home, "XDG_STATE_HOME="+filepath.Join(m.home, "state"))
	}
	if m.asUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(m.uid), Gid: uint32(m.gid), Groups: []uint32{}}}
	}
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("corral %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// writeFile writes a file of the workload's, owned by the mode's user.
func writeOwned(t *testing.T, m *mode, p string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, data, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(p, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
	}
}

// labCAFile writes the lab's CA among the fixture's files, readable by its
// corral, for --upstream-ca.
func labCAFile(t *testing.T, fx *fixture, lab *netlab.Lab) string {
	t.Helper()
	p := filepath.Join(fx.aux, "lab-ca.pem")
	writeOwned(t, fx.m, p, lab.CAPEM, 0o644)
	return p
}

// fdKinds summarises a process's descriptors by kind (socket, pipe, ...).
func fdKinds(pid int) map[string]int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	es, _ := os.ReadDir(dir)
	m := map[string]int{}
	for _, e := range es {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		k, _, _ := strings.Cut(l, ":")
		if strings.HasPrefix(l, "/") {
			k = "file"
		}
		m[k]++
	}
	return m
}

// waitOut is proc.waitOutput that gives up as soon as corral has exited.
func waitOut(t *testing.T, p *proc, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.stdout.String(), s) {
		select {
		case <-p.done:
			if strings.Contains(p.stdout.String(), s) {
				return
			}
			t.Fatalf("corral exited before %q appeared on stdout\n%s", s, p.wait())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q did not appear on stdout within %v\nstdout:\n%s\nstderr:\n%s", s, timeout, p.stdout, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fdSlack is how many descriptors above its starting count the supervisor
// may hold once its tunnels are gone (a resolver socket, a cached file).
const fdSlack = 3

// settledFDs waits up to 10 s for pid's descriptor count to come back
// within fdSlack of base, and returns the last count.
func settledFDs(pid, base int) int {
	n := countFDs(pid)
	for deadline := time.Now().Add(10 * time.Second); n > base+fdSlack && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		n = countFDs(pid)
	}
	return n
}

func countFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

// resetRC is curl's exit status for a connection corral reset: 56 (reset
// while receiving), 7 (refused), or 55 when the reset lands before curl
// has sent its request, as it can when the denial is quick.
const resetRC = `rc=(55|56|7)\b`

// portRules are a user's --policy-rules: connections to port 80 of the
// policy's endpoints are allowed, all else denied, port 81 with a reason
// of the rules' own.
const portRules = `package corral.egress

decision := {"allow": true, "policy": "web", "key": "web"} if {
	count(input.candidates) > 0
	input.network.port == 80
}

decision := {"allow": false, "reason": "port_81_is_closed_by_the_rules"} if input.network.port == 81

default decision := {"allow": false, "reason": "no_matching_policy"}
`

func basePolicy(network string) string {
	return `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt]
` + network
}

func TestNetwork(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t, labHosts()...)
	lab.AddRecord("private.test", netip.MustParseAddr("10.0.0.7"))
	lab.AddRecord("loop.test", netip.MustParseAddr("127.0.0.1"))
	// The host's own (non-loopback) address on the lab link.
	lab.AddRecord("self.test", lab.HostAddr)
	lab.AddRecord("meta.test", netip.MustParseAddr("169.254.169.254"))

	// A service of the host listening on every interface: the sandbox must
	// reach it neither through loopback nor through the host's own address.
	loopLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loopLn.Close() })
	var loopAccepted atomic.Int64
	go func() {
		for {
			c, err := loopLn.Accept()
			if err != nil {
				return
			}
			loopAccepted.Add(1)
			c.Close()
		}
	}()
	loopPort := loopLn.Addr().(*net.TCPAddr).Port

	// A UDP port on the host end of the lab link: a datagram from the
	// sandbox arriving here would mean UDP gets out.
	udpLn, err := net.ListenPacket("udp4", netip.AddrPortFrom(lab.HostAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udpLn.Close() })
	var udpGot atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := udpLn.ReadFrom(buf); err != nil {
				return
			}
			udpGot.Add(1)
		}
	}()
	udpAddr := udpLn.LocalAddr().String()

	// Names no policy ever allows: the lab's DNS must never hear of them.
	neverAsked := []string{"denied.test", "wild.test", "a.b.wild.test"}

	t.Run("policy-check", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		for i, ips := range []string{"127.0.0.0/8", "169.254.169.254", "169.254.169.254/32", "127.0.0.1", "198.18.1.1", "64:ff9b::a9fe:a9fe"} {
			p := filepath.Join(dir, fmt.Sprintf("p%d.yaml", i))
			pol := basePolicy(fmt.Sprintf("network_policies:\n  bad:\n    endpoints:\n      - host: allowed.test\n        port: 80\n        allowed_ips: [%q]\n", ips))
			if err := os.WriteFile(p, []byte(pol), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(corralBin, "policy", "check", p).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != 2 || !strings.Contains(string(out), "allowed_ips") {
				t.Errorf("policy check accepted allowed_ips [%s]: exit %d\n%s", ips, code, out)
			}
		}
		// The same policy with a documentation range is valid, so the
		// refusals above are about the addresses.
		p := filepath.Join(dir, "ok.yaml")
		pol := basePolicy("network_policies:\n  ok:\n    endpoints:\n      - host: allowed.test\n        port: 80\n        allowed_ips: [203.0.113.0/24]\n")
		if err := os.WriteFile(p, []byte(pol), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(corralBin, "policy", "check", p).CombinedOutput(); err != nil {
			t.Errorf("policy check rejected a valid allowed_ips: %v\n%s", err, out)
		}
	})

	t.Run("modes", func(t *testing.T) {
		forEachMode(t, true, func(t *testing.T, m *mode) {
			modeIdx := 0
			if m.rootless {
				modeIdx = 1
			}
			P := "/" + m.name // path prefix: which mode made a request
			newNetFixture := func(t *testing.T) *fixture {
				fx := newFixture(t, m)
				writeOwned(t, m, filepath.Join(fx.W, "ca.pem"), lab.CAPEM, 0o644)
				writeOwned(t, m, filepath.Join(fx.W, "nt.py"), []byte(strings.Replace(netTool, "CAPTURE_ADDR", strconv.Quote(captureAddr), 1)), 0o644)
				writeOwned(t, m, filepath.Join(fx.W, "urlget.py"), []byte(urlGet), 0o644)
				return fx
			}
			env := func(fx *fixture) []string {
				return []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W, "--env", "P=" + P}
			}

			t.Run("main", func(t *testing.T) {
				t.Parallel()
				fx := newNetFixture(t)
				writeOwned(t, m, filepath.Join(fx.W, "main.sh"), []byte(strings.ReplaceAll(mainScript, "SOCKS_ADDR", socksProxy)), 0o755)
				writeOwned(t, m, filepath.Join(fx.W, "tool.py"), []byte(urlGet), 0o644)
				writeOwned(t, m, filepath.Join(fx.W, "tool.js"), []byte(nodeGet), 0o644)
				curl, err := os.ReadFile("/usr/bin/curl")
				if err != nil {
					t.Fatal(err)
				}
				writeOwned(t, m, filepath.Join(fx.W, "mycurl"), curl, 0o755)
				// Any real library will do as the injected code.
				libz, err := os.ReadFile("/usr/lib/x86_64-linux-gnu/libz.so.1")
				if err != nil {
					t.Fatal(err)
				}
				writeOwned(t, m, filepath.Join(fx.W, "libz.so.1"), libz, 0o755)
				writeOwned(t, m, filepath.Join(fx.W, "rewrite.py"), []byte(rewriteArgv), 0o644)
				pol := basePolicy(fmt.Sprintf(`network_policies:
  web:
    endpoints:
      - host: allowed.test
        ports: [80, 81, 443, 7000, 2222]
      - host: nxname.test
        port: 80
      - host: other.test
        ports: [80, 443]
      - host: "*.wild.test"
        port: 80
      - host: private.test
        port: 80
      - host: loop.test
        port: %d
      - host: self.test
        port: %d
        allowed_ips: [198.51.100.0/24]
      - host: meta.test
        port: 80
  curlonly:
    endpoints: [{host: curlonly.test, port: 80}]
    binaries: [{path: /usr/bin/curl}]
  tool:
    endpoints: [{host: tool.test, port: 80}]
    binaries: [{path: %s/tool.py}, {path: %s/tool.js}]
  mycurl:
    endpoints: [{host: mycurl.test, port: 80}]
    binaries: [{path: %s/mycurl}]
`, loopPort, loopPort, fx.W, fx.W, fx.W))
				start := time.Now()
				r := runCorral(t, fx, runOpts{
					args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "main.sh")},
					policy: pol,
					flags:  append(env(fx), "--env", "LOOPPORT="+strconv.Itoa(loopPort), "--env", "UDPADDR="+udpAddr),
				})
				t.Logf("main run took %v", time.Since(start).Round(time.Millisecond))
				n := &netRun{t: t, r: r, sec: sections(r.stdout)}
				if r.code != 0 || n.sec["end"] == "" {
					t.Fatalf("the script did not complete\n%s", r)
				}
				r.requireEvent(t, "sandbox.start", map[string]any{"network": "proxy"})
				defer func() {
					if t.Failed() {
						t.Logf("full run:\n%s", r)
					}
				}()

				// The environment points at the capture address.
				n.has("env", `(?m)^HTTP_PROXY=http://`+regexp.QuoteMeta(httpProxy)+`/?$`)
				n.has("env", `(?m)^http_proxy=http://`+regexp.QuoteMeta(httpProxy)+`/?$`)
				n.has("env", `(?m)^HTTPS_PROXY=http://`+regexp.QuoteMeta(httpProxy)+`/?$`)
				n.has("env", `(?m)^ALL_PROXY=socks5h?://`+regexp.QuoteMeta(socksProxy)+`/?$`)
				n.has("env", `(?m)^nameserver `+regexp.QuoteMeta(captureAddr)+`$`)

				// Allowed host by name, every way in.
				for _, c := range []struct {
					sec, path, via string
					port           int
					tls            bool
				}{
					{"http_transparent", "/http-transparent", "transparent", 80, false},
					{"http_proxy", "/http-proxy", "http_forward", 80, false},
					{"https_connect", "/https-connect", "http_connect", 443, true},
					{"https_transparent", "/https-transparent", "transparent", 443, true},
					{"socks5", "/socks5", "socks5", 80, false},
				} {
					n.has(c.sec, `hello from allowed\.test GET `+regexp.QuoteMeta(P+c.path)+` rc=0`)
					n.event("net.connect.allowed", map[string]any{"via": c.via, "host": "allowed.test", "port": c.port, "binary": "/usr/bin/curl", "policy": "web"})
					seen := false
					for _, s := range lab.HTTPRequests() {
						if s.Path == P+c.path {
							seen = true
							if s.Host != "allowed.test" || s.TLS != c.tls || (c.tls && s.ServerName != "allowed.test") {
								t.Errorf("%s: the lab saw %+v", c.sec, s)
							}
						}
					}
					if !seen {
						t.Errorf("%s: the lab server never saw %s", c.sec, P+c.path)
					}
				}
				// The transparent event names the caller.
				if e := n.event("net.connect.allowed", map[string]any{"via": "transparent", "host": "allowed.test", "port": 80}); e != nil {
					if pid, _ := e["pid"].(float64); pid <= 1 {
						t.Errorf("allowed event without the caller's pid: %v", e)
					}
					if !strings.Contains(fmt.Sprint(e["ancestors"]), "/usr/bin/bash") {
						t.Errorf("allowed event ancestors lack the script's bash: %v", e)
					}
					if _, err := netip.ParseAddrPort(fmt.Sprint(e["source"])); err != nil {
						t.Errorf("allowed event without a source address: %v", e)
					}
				}

				// Raw TCP, client first and server first.
				n.has("echo", `GOT:ping`+regexp.QuoteMeta(P)+`\n`)
				n.event("net.connect.allowed", map[string]any{"via": "transparent", "host": "allowed.test", "port": netlab.PortEcho, "binary": "/usr/bin/bash"})
				n.has("banner", `GOT:SSH-2\.0-lab\n`)
				n.event("net.connect.allowed", map[string]any{"via": "transparent", "host": "allowed.test", "port": netlab.PortBanner, "binary": "/usr/bin/bash"})

				// Denied name: NXDOMAIN inside, never asked upstream.
				n.has("denied_dns", `GAIERR denied\.test NXDOMAIN`)
				n.has("denied_curl", `rc=6\b`)
				n.event("net.dns.denied", map[string]any{"name": "denied.test", "qtype": "A", "reason": "not_allowed"})

				// Binary binding: curl yes, python3 no (403 JSON).
				n.has("bind_curl", `hello from curlonly\.test GET `+regexp.QuoteMeta(P)+`/bind-curl rc=0`)
				n.event("net.connect.allowed", map[string]any{"host": "curlonly.test", "binary": "/usr/bin/curl", "policy": "curlonly"})
				n.has("bind_python", `HTTPERR 403 `)
				body := n.denyBody("bind_python", `HTTPERR 403 (\{.*\})`)
				requireFields(t, "bind_python 403 body", body, map[string]any{"reason": "binary_not_allowed", "host": "curlonly.test", "port": 80, "binary": "/usr/bin/python3.11", "policy": "curlonly"})
				n.event("net.connect.denied", map[string]any{"via": "http_forward", "host": "curlonly.test", "port": 80, "binary": "/usr/bin/python3.11", "reason": "binary_not_allowed"})
				n.has("socksport_curl", `hello from curlonly\.test GET `+regexp.QuoteMeta(P)+`/socksport-curl rc=0`)
				n.has("socksport_python", `HTTPERR 403 \{.*"reason":"binary_not_allowed"`)

				// Script binding: python3 ./tool.py yes, python3 -c no.
				n.has("script_tool", `STATUS 200 hello from tool\.test GET `+regexp.QuoteMeta(P)+`/script-tool`)
				if e := n.event("net.connect.allowed", map[string]any{"host": "tool.test", "binary": "/usr/bin/python3.11", "policy": "tool"}); e != nil {
					if !strings.Contains(fmt.Sprint(e["cmdline_paths"]), fx.W+"/tool.py") {
						t.Errorf("allowed event for tool.py lacks its cmdline path: %v", e)
					}
				}
				if _, err := exec.LookPath("node"); err == nil || noSkip() {
					n.has("script_node", `STATUS 200 hello from tool\.test GET `+regexp.QuoteMeta(P)+`/script-node`)
					n.has("script_node_e", `ERROR `)
					n.hasNot("script_node_e", `STATUS 200`)
				}
				n.has("script_c", `ERROR `)
				n.hasNot("script_c", `STATUS 200`)
				n.event("net.connect.denied", map[string]any{"via": "transparent", "host": "tool.test", "binary": "/usr/bin/python3.11", "reason": "binary_not_allowed"})

				// Upstream failures are 502s that say what failed.
				n.has("fail_dns", `"reason":"upstream_dns_failed".* code=502`)
				n.event("net.connect.failed", map[string]any{"via": "http_forward", "host": "nxname.test", "port": 80, "reason": "upstream_dns_failed"})
				n.has("fail_refused", `"reason":"upstream_connect_failed".* code=502`)
				n.event("net.connect.failed", map[string]any{"via": "http_forward", "host": "allowed.test", "port": 81, "reason": "upstream_connect_failed"})

				// Borrowed identities reach nothing.
				for _, sec := range []string{"borrow_loader", "borrow_stdin", "borrow_option_value", "borrow_preload", "borrow_prefork", "borrow_rewrite"} {
					n.hasNot(sec, `hello from`)
					path := P + "/" + strings.ReplaceAll(sec, "_", "-")
					for _, s := range lab.HTTPRequests() {
						if s.Path == path {
							t.Errorf("%s: a borrowed identity reached the lab: %+v", sec, s)
						}
					}
				}
				// The child forked before its parent became curl asked;
				// curl was its living parent, and lent it nothing.
				n.has("borrow_prefork", `ERROR `)
				// The rewrite itself worked; the command line recorded at
				// exec is what counts.
				n.has("borrow_rewrite", `ERROR `)
				n.hasNot("borrow_rewrite", `REWRITE FAILED`)
				if e := n.event("net.connect.denied", map[string]any{"host": "curlonly.test", "binary": "/usr/bin/curl", "reason": "binary_not_allowed"}); e != nil {
					if !strings.Contains(fmt.Sprint(e["untrusted"]), fx.W+"/libz.so.1") {
						t.Errorf("the preloaded curl's denial does not say why it is not curl: %v", e)
					}
				}

				// Binary replaced mid-run.
				n.has("integrity_first", `hello from mycurl\.test GET `+regexp.QuoteMeta(P)+`/integrity-1 rc=0`)
				n.event("net.connect.allowed", map[string]any{"host": "mycurl.test", "binary": fx.W + "/mycurl", "policy": "mycurl"})
				n.has("integrity_second", resetRC)
				n.hasNot("integrity_second", `hello from`)
				n.event("net.connect.denied", map[string]any{"host": "mycurl.test", "reason": "binary_integrity"})

				// UDP goes nowhere.
				if udpGot.Load() != 0 {
					t.Errorf("a UDP datagram from the sandbox reached the host at %s", udpAddr)
				}
				n.has("udp", `UDP_(SENT|ERR) 203\.0\.113\.10:9999`)

				// A hard-coded resolver is answered by corral.
				if a := n.has("dns_hardcoded", `DNS from=8\.8\.8\.8:53 id_ok=True rcode=0 answers=([0-9.]+)\n`); a != "" {
					if ip, err := netip.ParseAddr(a); err != nil || !syntheticNet.Contains(ip) {
						t.Errorf("8.8.8.8 answered allowed.test with %s, not a synthetic address in %s", a, syntheticNet)
					}
				}
				n.has("dns_hardcoded_denied", `DNS from=8\.8\.8\.8:53 id_ok=True rcode=3 answers=\n`)

				// Literal addresses without allowed_ips.
				n.has("ip_direct", resetRC)
				n.hasNot("ip_direct", `hello from`)
				n.event("net.connect.denied", map[string]any{"via": "transparent", "ip": "203.0.113.10", "port": 80, "reason": "no_matching_policy"})
				n.has("ipv6", resetRC)
				n.hasNot("ipv6", `hello from`)
				n.event("net.connect.denied", map[string]any{"via": "transparent", "ip": "2001:db8::1", "port": 80, "reason": "no_matching_policy"})

				// What the client says must match where it connected.
				n.has("sni", `RESET`)
				n.event("net.connect.denied", map[string]any{"via": "transparent", "host": "allowed.test", "port": 443, "reason": "sni_mismatch"})
				n.has("host", `(RESET|GOT 0 )`)
				n.event("net.connect.denied", map[string]any{"via": "transparent", "host": "allowed.test", "port": 80, "reason": "host_mismatch"})
				for _, s := range lab.HTTPRequests() {
					if s.Path == P+"/host-mismatch" || s.ServerName == "other.test" || s.Host == "other.test" {
						t.Errorf("a mismatched request reached the lab: %+v", s)
					}
				}

				// CONNECT to an IP literal no endpoint allows.
				n.has("connect_ip", `STATUS HTTP/1\.1 403`)
				body = n.denyBody("connect_ip", `BODY (\{.*\})`)
				requireFields(t, "connect_ip 403 body", body, map[string]any{"reason": "no_matching_policy", "host": "203.0.113.11", "port": 443})
				n.event("net.connect.denied", map[string]any{"via": "http_connect", "ip": "203.0.113.11", "port": 443, "reason": "no_matching_policy"})

				// Internal addresses: refused after resolution, never dialled.
				n.has("private", resetRC)
				n.event("net.connect.denied", map[string]any{"host": "private.test", "port": 80, "reason": "internal_address"})
				n.has("loop", resetRC)
				n.event("net.connect.denied", map[string]any{"host": "loop.test", "port": loopPort, "reason": "internal_address"})
				n.has("self", resetRC)
				n.event("net.connect.denied", map[string]any{"host": "self.test", "port": loopPort, "reason": "internal_address"})
				if c := loopAccepted.Load(); c != 0 {
					t.Errorf("the host loopback listener accepted %d connection(s) from the sandbox", c)
				}
				n.has("meta_ip", resetRC)
				n.event("net.connect.denied", map[string]any{"ip": "169.254.169.254", "port": 80, "reason": "no_matching_policy"})
				n.has("meta_name", resetRC)
				n.event("net.connect.denied", map[string]any{"host": "meta.test", "port": 80, "reason": "internal_address"})

				// Wildcards: *.wild.test is exactly one label.
				if a := n.has("wild_resolve", `ADDR a\.wild\.test ([0-9.]+)\n`); a != "" {
					if ip, err := netip.ParseAddr(a); err != nil || !syntheticNet.Contains(ip) {
						t.Errorf("a.wild.test resolved to %s, not a synthetic address", a)
					}
				}
				n.has("wild_resolve", `GAIERR wild\.test NXDOMAIN`)
				n.has("wild_resolve", `GAIERR a\.b\.wild\.test NXDOMAIN`)
				n.has("wild_curl", `hello from a\.wild\.test GET `+regexp.QuoteMeta(P)+`/wild rc=0`)
				n.event("net.connect.allowed", map[string]any{"host": "a.wild.test", "port": 80, "policy": "web"})
				n.event("net.dns.denied", map[string]any{"name": "wild.test", "reason": "not_allowed"})
				n.event("net.dns.denied", map[string]any{"name": "a.b.wild.test", "reason": "not_allowed"})

				// Nothing denied reached the lab, and it never heard of the
				// denied names.
				for _, s := range lab.HTTPRequests() {
					if strings.HasPrefix(s.Path, P+"/") && (s.Host == "denied.test" || strings.Contains(s.Path, "ip-direct") ||
						strings.Contains(s.Path, "bind-python") || strings.Contains(s.Path, "script-c") || strings.Contains(s.Path, "integrity-2")) {
						t.Errorf("a denied request reached the lab: %+v", s)
					}
				}
				for _, q := range lab.DNSQueries() {
					if slices.Contains(neverAsked, q) {
						t.Errorf("the lab's DNS server was asked about %s", q)
					}
				}
				// Every denial is accompanied by its event; no event
				// carries an empty reason.
				for _, e := range r.find("net.connect.denied") {
					if e["reason"] == "" || e["reason"] == nil {
						t.Errorf("denied event without reason: %v", e)
					}
				}
			})

			t.Run("literal-ip", func(t *testing.T) {
				t.Parallel()
				fx := newNetFixture(t)
				writeOwned(t, m, filepath.Join(fx.W, "literal.sh"), []byte(literalScript), 0o755)
				pol := basePolicy(`network_policies:
  direct:
    endpoints:
      - allowed_ips: [203.0.113.10/32]
        ports: [80, 443]
`)
				r := runCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "literal.sh")}, policy: pol, flags: env(fx)})
				n := &netRun{t: t, r: r, sec: sections(r.stdout)}
				if r.code != 0 || n.sec["end"] == "" {
					t.Fatalf("the script did not complete\n%s", r)
				}
				defer func() {
					if t.Failed() {
						t.Logf("full run:\n%s", r)
					}
				}()
				n.has("literal_transparent", `hello from allowed\.test GET `+regexp.QuoteMeta(P)+`/literal-transparent rc=0`)
				n.event("net.connect.allowed", map[string]any{"via": "transparent", "ip": "203.0.113.10", "port": 80, "policy": "direct"})
				n.has("literal_connect", `hello from allowed\.test GET `+regexp.QuoteMeta(P)+`/literal-connect rc=0`)
				n.event("net.connect.allowed", map[string]any{"via": "http_connect", "ip": "203.0.113.10", "port": 443, "policy": "direct"})
				n.has("literal_connect_raw", `STATUS HTTP/1\.1 200`)
				n.has("literal_other", `STATUS HTTP/1\.1 403`)
				body := n.denyBody("literal_other", `BODY (\{.*\})`)
				requireFields(t, "literal_other 403 body", body, map[string]any{"reason": "no_matching_policy", "host": "203.0.113.11", "port": 443})
				n.event("net.connect.denied", map[string]any{"via": "http_connect", "ip": "203.0.113.11", "port": 443, "reason": "no_matching_policy"})
				n.has("literal_other_transparent", resetRC)
				n.event("net.connect.denied", map[string]any{"via": "transparent", "ip": "203.0.113.11", "port": 80, "reason": "no_matching_policy"})
				for _, s := range lab.HTTPRequests() {
					if s.Path == P+"/literal-other" {
						t.Errorf("a denied request reached the lab: %+v", s)
					}
				}
			})

			// The lean corral carries no OPA: a run with --policy-rules
			// starts as the full program, and the user's rules decide.
			t.Run("policy-rules", func(t *testing.T) {
				t.Parallel()
				fx := newNetFixture(t)
				rules := filepath.Join(fx.aux, "rules.rego")
				if err := os.WriteFile(rules, []byte(portRules), 0o644); err != nil {
					t.Fatal(err)
				}
				pol := basePolicy(`network_policies:
  web:
    endpoints:
      - host: allowed.test
        ports: [80, 81]
`)
				script := `curl -s -o /dev/null -w "port80=%{http_code}\n" http://allowed.test` + P + `/rules; ` +
					`curl -sf -o /dev/null --max-time 5 http://allowed.test:81` + P + `/rules; echo "port81_rc=$?"`
				r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", script}, policy: pol,
					flags: append(env(fx), "--policy-rules", rules)})
				if r.code != 0 || !strings.Contains(r.stdout, "port80=200") || strings.Contains(r.stdout, "port81_rc=0") {
					t.Fatalf("the rules did not decide as written\n%s", r)
				}
				if findEvent(r, "net.connect.denied", map[string]any{"port": 81, "reason": "port_81_is_closed_by_the_rules"}) == nil {
					t.Fatalf("no denial with the rules' own reason\n%s", r)
				}
				if full, _ := filepath.Glob(filepath.Join(fx.state, "bin", "corral-full-*")); len(full) != 1 {
					t.Fatalf("the full program was not installed in the state directory: %v\n%s", full, r)
				}
				// The lean corral hands the full program its own path in
				// CORRAL_LEAN_EXECUTABLE; the full program drops it before
				// anything reads the environment, so not even --pass-env
				// gives it to a workload.
				r = runCorral(t, fx, runOpts{args: []string{"/bin/true"}, policy: pol,
					flags: append(env(fx), "--policy-rules", rules, "--pass-env", "CORRAL_LEAN_EXECUTABLE")})
				if r.code != 125 || !strings.Contains(r.stderr, "--pass-env CORRAL_LEAN_EXECUTABLE: not set") {
					t.Fatalf("the full program kept the lean corral's variable\n%s", r)
				}
			})

			t.Run("revoke", func(t *testing.T) {
				t.Parallel()
				fx := newNetFixture(t)
				writeOwned(t, m, filepath.Join(fx.W, "revoke.py"), []byte(revokeScript), 0o644)
				both := `network_policies:
  echo:
    endpoints:
      - {host: allowed.test, port: 7000}
      - {host: other.test, port: 7000}
`
				p := startCorral(t, fx, runOpts{args: []string{"/usr/bin/python3", filepath.Join(fx.W, "revoke.py")}, policy: basePolicy(both), flags: env(fx)})
				waitOut(t, p, "OPEN", 10*time.Second)
				id := ""
				for _, e := range readEvents(t, p.audit) {
					if e["event"] == "sandbox.start" {
						id = fmt.Sprint(e["sandbox_id"])
					}
				}
				// The new policy keeps other.test only.
				next := fx.writePolicy(t, "version: 1\nnetwork_policies:\n  echo:\n    endpoints:\n      - {host: other.test, port: 7000}\n")
				reloaded := time.Now()
				if code, out := corralCLI(t, m, "policy", "set", "--state-dir", fx.state, "--sandbox", id, next); code != 0 {
					t.Fatalf("policy set failed (exit %d):\n%s", code, out)
				}
				// The script stamps when it saw the tunnel end; the sandbox
				// shares the host's clock.
				waitOut(t, p, "ENDED allowed.test", 5*time.Second)
				var stamp float64
				for _, line := range strings.Split(p.stdout.String(), "\n") {
					if f := strings.Fields(line); len(f) == 4 && f[0] == "ENDED" && f[1] == "allowed.test" {
						stamp, _ = strconv.ParseFloat(f[3], 64)
					}
				}
				ended := time.Unix(0, int64(stamp*1e9))
				if took := ended.Sub(reloaded); stamp == 0 || took > time.Second {
					t.Errorf("the revoked tunnel ended %v after the reload began, want within a second", took)
				}
				time.Sleep(500 * time.Millisecond)
				fx.signal(t, "stop")
				r := p.wait()
				if !strings.Contains(r.stdout, "ALIVE other.test") {
					t.Errorf("the tunnel the new policy still allows did not survive the reload\n%s", r)
				}
				r.requireEvent(t, "net.connect.revoked", map[string]any{"host": "allowed.test", "port": 7000, "via": "transparent", "reason": "no_matching_policy"})
				if len(r.find("net.connect.revoked")) != 1 {
					t.Errorf("want exactly one net.connect.revoked event\n%s", r)
				}
			})

			t.Run("hot-reload", func(t *testing.T) {
				t.Parallel()
				fx := newNetFixture(t)
				writeOwned(t, m, filepath.Join(fx.W, "reload.sh"), []byte(reloadScript), 0o755)
				web := `network_policies:
  web:
    endpoints:
      - host: allowed.test
        port: 80
`
				late := `  late:
    endpoints:
      - host: late.test
        port: 80
`
				p := startCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "reload.sh")}, policy: basePolicy(web), flags: env(fx)})
				waitOut(t, p, "iter 1 ", 10*time.Second)
				id := ""
				for _, e := range readEvents(t, p.audit) {
					if e["event"] == "sandbox.start" {
						id = fmt.Sprint(e["sandbox_id"])
					}
				}
				if id == "" {
					t.Fatalf("no sandbox.start event in %s", p.audit)
				}

				code, out := corralCLI(t, m, "ps", "--state-dir", fx.state)
				if code != 0 || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(id)+`\s+\d+\s.*proxy.*reload\.sh`).MatchString(out) {
					t.Errorf("corral ps does not list the running sandbox %s (exit %d):\n%s", id, code, out)
				}

				// A policy that also changes limits is refused as a whole,
				// even though it would add late.test.
				bad := fx.writePolicy(t, basePolicy(web+late)+"limits: {pids: 77}\n")
				code, out = corralCLI(t, m, "policy", "set", "--state-dir", fx.state, "--sandbox", id, bad)
				if code != 2 {
					t.Errorf("a reload changing limits: want exit 2, got %d:\n%s", code, out)
				}
				iterLines := func() []string {
					return regexp.MustCompile(`(?m)^iter \d+ .*$`).FindAllString(p.stdout.String(), -1)
				}
				before := len(iterLines())
				deadline := time.Now().Add(8 * time.Second)
				for len(iterLines()) < before+2 && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				after := iterLines()
				if len(after) < before+2 {
					t.Fatalf("the workload stopped polling after the rejected reload:\n%s", p.stdout)
				}
				for _, l := range after[before:] {
					if !strings.Contains(l, "allowed=200") || strings.Contains(l, "late=200") {
						t.Errorf("after the rejected reload the old policy should be in force, got %q", l)
					}
				}

				// A file holding only network_policies is a whole reload:
				// the sections it leaves out stay as they run.
				good := fx.writePolicy(t, "version: 1\n"+web+late)
				code, out = corralCLI(t, m, "policy", "set", "--state-dir", fx.state, "--sandbox", id, good)
				if code != 0 {
					t.Errorf("the good reload failed (exit %d):\n%s", code, out)
				}
				r := p.wait()
				if r.code != 0 || !strings.Contains(r.stdout, "LATE OK") {
					t.Fatalf("late.test never became reachable after the reload\n%s", r)
				}
				r.requireEvent(t, "policy.reload_failed", map[string]any{"version": 2})
				r.requireEvent(t, "policy.reloaded", map[string]any{"version": 2})
				r.requireEvent(t, "net.connect.allowed", map[string]any{"host": "late.test", "port": 80, "policy": "late"})
				r.requireEvent(t, "net.dns.denied", map[string]any{"name": "late.test", "reason": "not_allowed"})
				// The reload_failed event precedes the reloaded one.
				var order []string
				for _, e := range r.events {
					if s := fmt.Sprint(e["event"]); strings.HasPrefix(s, "policy.") {
						order = append(order, s)
					}
				}
				if !slices.Equal(order, []string{"policy.reload_failed", "policy.reloaded"}) {
					t.Errorf("policy events: %v", order)
				}
			})

			t.Run("tunnels", func(t *testing.T) {
				t.Parallel()
				const N = 1000
				fx := newNetFixture(t)
				writeOwned(t, m, filepath.Join(fx.W, "tunnels.py"), []byte(tunnelsScript), 0o644)
				var names []string
				pol := "network_policies:\n  bulk:\n    endpoints:\n"
				for i := 0; i < bulkPerMode; i++ {
					h := bulkHost(modeIdx, i)
					names = append(names, h.Name)
					pol += fmt.Sprintf("      - host: %s\n        port: %d\n", h.Name, netlab.PortEcho)
				}
				args := append([]string{"/usr/bin/python3", filepath.Join(fx.W, "tunnels.py"), strconv.Itoa(N)}, names...)
				p := startCorral(t, fx, runOpts{args: args, policy: basePolicy(pol), flags: env(fx), timeout: 90 * time.Second})
				waitOut(t, p, "READY", 15*time.Second)
				pid := p.cmd.Process.Pid
				exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
				if exe != corralBin {
					t.Fatalf("pid %d is %s, not corral", pid, exe)
				}
				time.Sleep(100 * time.Millisecond)
				base := countFDs(pid)
				fx.signal(t, "go-open")
				waitOut(t, p, "TUNNELS ", 60*time.Second)
				during := countFDs(pid)
				t.Logf("supervisor fds with the tunnels open: %v", fdKinds(pid))
				fx.signal(t, "go-close")
				waitOut(t, p, "CLOSED", 15*time.Second)
				after := settledFDs(pid, base)
				afterKinds := fdKinds(pid)
				fx.signal(t, "go-exit")
				r := p.wait()
				t.Logf("supervisor fds: before %d, with %d tunnels open %d, after closing %d", base, N, during, after)
				if !strings.Contains(r.stdout, fmt.Sprintf("TUNNELS ok=%d failed=0 pending=0 open=%d", N, N)) {
					t.Fatalf("not every tunnel echoed\n%s", r)
				}
				if r.code != 0 {
					t.Errorf("want exit 0\n%s", r)
				}
				if during < base+N {
					t.Errorf("with %d tunnels open the supervisor held only %d fds (before: %d); the tunnels were not concurrent", N, during, base)
				}
				if after > base+fdSlack {
					t.Errorf("supervisor fd leak: %d fds before, %d after closing %d tunnels (after: %v)", base, after, N, afterKinds)
				}
				if got := len(r.find("net.connect.allowed")); got < N {
					t.Errorf("want %d net.connect.allowed events, got %d", N, got)
				}
			})
		})
	})

	if c := loopAccepted.Load(); c != 0 {
		t.Errorf("the host loopback listener accepted %d connection(s)", c)
	}
	if c := udpGot.Load(); c != 0 {
		t.Errorf("the host received %d UDP datagram(s) from a sandbox", c)
	}
	for _, q := range lab.DNSQueries() {
		if slices.Contains(neverAsked, q) {
			t.Errorf("the lab's DNS server was asked about %s", q)
		}
	}
}
