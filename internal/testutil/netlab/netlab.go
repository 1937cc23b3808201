// Package netlab is a fake internet for end-to-end tests.
//
// Tests must never send a packet off this machine: CI has no internet, and a
// test that reached a real host would test that host. So the upstream
// servers a sandbox talks to live in a network namespace the test creates. It is joined to the host namespace by a
// veth pair and uses only documentation addresses: 198.51.100.0/24
// (TEST-NET-2) on the veth link and 203.0.113.0/24 (TEST-NET-3) for the
// servers. Inside it run an authoritative DNS server and, on every Host
// address, HTTP, HTTPS (HTTP/1.1 and h2, with a test CA), a line echo server
// and a "banner" server that speaks first, as SSH does.
//
// The HTTP and HTTPS servers answer every path with "hello from <name>
// <METHOD> <path>", except these, which give tests the kinds of upstream
// behaviour a proxy has to carry:
//
//   - /stream/<id>: a text/event-stream that sends "data: first", then waits
//     for [Lab.Release] of id (at most 20 s) before sending "data: last".
//   - /ws: a WebSocket echo server (HTTP/1.1 only).
//   - /echo-headers: the request headers as a JSON object.
//   - /big?n=N: N bytes of 'x' (default 1 MiB, at most 64 MiB).
//   - /status/<code>: status code (200 to 599) with body "status <code>".
//
// Every request, to these paths too, is recorded (see [Lab.HTTPRequests]);
// a handler given with [Lab.Serve] still reads the request's whole body
// (up to 1 MiB).
//
// The namespace is never mounted: it is held only by a file descriptor and by
// the sockets created in it, so a crashed test cannot leave it behind.
package netlab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/websocket"
	"golang.org/x/sys/unix"
)

// linkPrefix names every link a lab creates, so that links left by a crashed
// run can be recognised and removed. The full name is prefix+pid+"h"/"n",
// which stays within IFNAMSIZ (15) for any pid below the kernel's maximum.
const linkPrefix = "cnlab-"

// Ports of the servers on every Host address.
const (
	PortHTTP   = 80
	PortHTTPS  = 443
	PortEcho   = 7000
	PortBanner = 2222
	// PortSource sends as many bytes as the decimal number on the first
	// line asks for (at most maxSourceBytes), then closes: a download for
	// throughput measurements.
	PortSource = 7001
)

// Banner is what the banner server sends before reading anything.
const Banner = "SSH-2.0-lab\r\n"

// Bounds, so that a misbehaving client (or a test gone wrong) cannot make a
// server hang or grow without limit.
const (
	dnsTTL          = 60
	maxBody         = 1 << 20  // request body read and discarded per HTTP request
	maxRecordedBody = 64 << 10 // part of the body kept in Seen
	maxLog          = 100000   // entries kept per log; later ones are dropped
	maxConns        = 2048     // concurrent raw TCP connections per listener
	maxSourceBytes  = 4 << 30
	ioTimeout       = 10 * time.Second
	connLifetime    = 60 * time.Second
	maxEchoBytes    = 1 << 20
	lockWait        = 90 * time.Second
	readyWait       = 5 * time.Second
	streamWait      = 20 * time.Second // longest a /stream/<id> waits for Release
	defaultBig      = 1 << 20
	maxBig          = 64 << 20
)

var (
	transitNet = netip.MustParsePrefix("198.51.100.0/24")
	hostsNet   = netip.MustParsePrefix("203.0.113.0/24")
	hostSideIP = netip.MustParseAddr("198.51.100.1")
	labSideIP  = netip.MustParseAddr("198.51.100.2")
)

// Host is a name the lab DNS server resolves and an address in
// 203.0.113.0/24 on which the lab runs its servers.
type Host struct {
	Name string
	Addr netip.Addr
}

// Seen is one request received by an HTTP or HTTPS server of the lab.
type Seen struct {
	Host       string // Host header (or :authority for h2)
	Method     string
	Path       string
	Query      string // raw query, without "?"
	Proto      string // "HTTP/1.1", "HTTP/2.0"
	Header     http.Header
	Body       []byte // first 64 KiB of the body
	RemoteAddr string // as the lab saw it, e.g. "198.51.100.1:41234"
	LocalAddr  string // server address, e.g. "203.0.113.10:443"
	TLS        bool
	ServerName string // TLS SNI, if any
}

// ConnSeen is one connection accepted by the echo or banner server.
type ConnSeen struct {
	RemoteAddr string
	LocalAddr  string
}

// Lab is a running fake internet. All its resources are released by the
// cleanup Start registers on the test.
type Lab struct {
	DNS      netip.AddrPort    // authoritative DNS server; pass to corral as --upstream-dns
	CA       *x509.Certificate // test CA that signed the TLS servers' certificates
	CAPEM    []byte
	CAFile   string     // CAPEM written to a file; pass to corral as --upstream-ca
	HostAddr netip.Addr // host end of the veth: the source address the lab sees
	Hosts    []Host

	mu         sync.Mutex
	records    map[string][]netip.Addr
	dnsQueries []string
	httpSeen   []Seen
	tcpSeen    []ConnSeen
	closers    []func()
	nsFD       int // the lab namespace, for listeners added after Start
	caKey      *ecdsa.PrivateKey
	conns      map[net.Conn]struct{}
	streams    map[string]*labStream
	sites      map[string]http.Handler // by host name, see Serve
	closed     bool
	wg         sync.WaitGroup
}

// processLock makes labs exclusive within the process: they all use the same
// fixed addresses, so two at once would collide.
var processLock = make(chan struct{}, 1)

// Start creates the lab namespace, its link to the host and its servers, and
// registers their removal with t.Cleanup. It skips the test when it cannot run
// here (not root, address ranges already used by the host); with
// CORRAL_NO_SKIP=1 in the environment it fails instead.
func Start(t testing.TB, hosts ...Host) *Lab {
	t.Helper()
	requireRoot(t)

	l := &Lab{
		DNS:      netip.AddrPortFrom(labSideIP, 53),
		HostAddr: hostSideIP,
		records:  map[string][]netip.Addr{},
		conns:    map[net.Conn]struct{}{},
		streams:  map[string]*labStream{},
	}
	// byAddr groups names per address: several names may share a server
	// (virtual hosting), and each address gets one set of listeners.
	byAddr := map[netip.Addr][]string{}
	var addrs []netip.Addr
	for _, h := range hosts {
		name := normName(h.Name)
		if name == "" {
			t.Fatalf("netlab: host with empty name")
		}
		a := h.Addr.Unmap()
		// Only 203.0.113.0/24 is routed to the lab, and the network and
		// broadcast addresses would confuse the test rather than help it.
		if !hostsNet.Contains(a) || a == hostsNet.Addr() || a.As4()[3] == 255 {
			t.Fatalf("netlab: host %s address %s is not a host address in %s", name, h.Addr, hostsNet)
		}
		if _, ok := byAddr[a]; !ok {
			addrs = append(addrs, a)
		}
		byAddr[a] = append(byAddr[a], name)
		l.records[name] = append(l.records[name], a)
		l.Hosts = append(l.Hosts, Host{Name: name, Addr: a})
	}

	acquireLocks(t)

	hh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		skipOrFail(t, "netlab: netlink: %v", err)
	}
	t.Cleanup(hh.Close)
	removeStale(t, hh)
	if reason := rangesInUse(hh); reason != "" {
		skipOrFail(t, "netlab: cannot use the test ranges: %s", reason)
	}

	ca, caKey, caDER := newCA(t)
	l.CA, l.caKey = ca, caKey
	l.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	l.CAFile = filepath.Join(t.TempDir(), "netlab-ca.pem")
	if err := os.WriteFile(l.CAFile, l.CAPEM, 0o644); err != nil {
		t.Fatalf("netlab: %v", err)
	}
	certs := map[netip.Addr]tls.Certificate{}
	for _, a := range addrs {
		certs[a] = newLeaf(t, ca, caKey, byAddr[a], a)
	}

	w, err := startNSWorker()
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			skipOrFail(t, "netlab: cannot create a network namespace: %v", err)
		}
		t.Fatalf("netlab: %v", err)
	}
	// Registered before everything that lives in the namespace so that it
	// runs after them (cleanups run last-in first-out): once the fd and all
	// sockets are closed the kernel frees the namespace and its veth end.
	t.Cleanup(func() { unix.Close(w.fd) })
	defer w.stop()
	l.nsFD = w.fd

	pid := strconv.Itoa(os.Getpid())
	hostName, labName := linkPrefix+pid+"h", linkPrefix+pid+"n"
	veth := netlink.NewVeth(netlink.LinkAttrs{Name: hostName})
	veth.PeerName = labName
	// Creating the peer directly in the lab namespace means its name never
	// exists in the host namespace, even for a moment.
	veth.PeerNamespace = netlink.NsFd(w.fd)
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatalf("netlab: add veth %s: %v", hostName, err)
	}
	hostLink, err := hh.LinkByName(hostName)
	if err != nil {
		_ = hh.LinkDel(veth)
		t.Fatalf("netlab: %v", err)
	}
	route := &netlink.Route{
		LinkIndex: hostLink.Attrs().Index,
		Dst:       prefixToIPNet(hostsNet),
		Gw:        labSideIP.AsSlice(),
	}
	t.Cleanup(func() {
		// Deleting the host end removes the pair and every route through it;
		// the route is deleted first anyway so that a failure to delete the
		// link cannot leave 203.0.113.0/24 pointing at it.
		if err := hh.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENODEV) {
			t.Errorf("netlab: delete route %s: %v", hostsNet, err)
		}
		if err := hh.LinkDel(hostLink); err != nil && !errors.Is(err, unix.ENODEV) {
			t.Errorf("netlab: delete link %s: %v", hostName, err)
		}
	})

	// IPv6 on the veth would only add router solicitations and neighbour
	// discovery the tests never asked for; best effort, as it is cosmetic.
	disableIPv6(hostName)
	if err := hh.AddrAdd(hostLink, &netlink.Addr{IPNet: &net.IPNet{IP: hostSideIP.AsSlice(), Mask: net.CIDRMask(transitNet.Bits(), 32)}}); err != nil {
		t.Fatalf("netlab: address on %s: %v", hostName, err)
	}
	if err := hh.LinkSetUp(hostLink); err != nil {
		t.Fatalf("netlab: up %s: %v", hostName, err)
	}

	var (
		udpDNS  net.PacketConn
		tcpDNS  net.Listener
		perAddr = map[netip.Addr]map[int]net.Listener{}
	)
	err = w.run(func() error {
		// Everything here runs on the thread that is inside the lab
		// namespace: the netlink socket and the listening sockets are
		// created in it and stay there whichever thread later uses them.
		lh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer lh.Close()
		lo, err := lh.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := lh.LinkSetUp(lo); err != nil {
			return fmt.Errorf("lo up: %w", err)
		}
		for _, a := range addrs {
			if err := lh.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return fmt.Errorf("address %s on lo: %w", a, err)
			}
		}
		disableIPv6(labName)
		ll, err := lh.LinkByName(labName)
		if err != nil {
			return err
		}
		if err := lh.AddrAdd(ll, &netlink.Addr{IPNet: &net.IPNet{IP: labSideIP.AsSlice(), Mask: net.CIDRMask(transitNet.Bits(), 32)}}); err != nil {
			return fmt.Errorf("address on %s: %w", labName, err)
		}
		if err := lh.LinkSetUp(ll); err != nil {
			return fmt.Errorf("up %s: %w", labName, err)
		}
		// The lab only ever answers; the default route is there so that the
		// replies to the host's addresses have a way back.
		if err := lh.RouteAdd(&netlink.Route{LinkIndex: ll.Attrs().Index, Gw: hostSideIP.AsSlice()}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}

		if udpDNS, err = net.ListenPacket("udp4", l.DNS.String()); err != nil {
			return err
		}
		if tcpDNS, err = net.Listen("tcp4", l.DNS.String()); err != nil {
			return err
		}
		for _, a := range addrs {
			perAddr[a] = map[int]net.Listener{}
			for _, port := range []int{PortHTTP, PortHTTPS, PortEcho, PortBanner, PortSource} {
				ln, err := net.Listen("tcp4", netip.AddrPortFrom(a, uint16(port)).String())
				if err != nil {
					return err
				}
				perAddr[a][port] = ln
			}
		}
		return nil
	})
	// Whatever was created is closed by shutdown, also after a failure.
	t.Cleanup(func() {
		l.shutdown(t, func() {
			if udpDNS != nil {
				udpDNS.Close()
			}
			if tcpDNS != nil {
				tcpDNS.Close()
			}
			for _, m := range perAddr {
				for _, ln := range m {
					ln.Close()
				}
			}
		})
	})
	if err != nil {
		t.Fatalf("netlab: set up lab namespace: %v", err)
	}

	// The host route needs the lab end up, so that its gateway is reachable.
	if err := hh.RouteAdd(route); err != nil {
		t.Fatalf("netlab: route %s via %s: %v", hostsNet, labSideIP, err)
	}

	l.serveDNS(t, udpDNS, tcpDNS)
	for _, a := range addrs {
		l.serveHTTP(perAddr[a][PortHTTP], byAddr[a], nil)
		l.serveHTTP(perAddr[a][PortHTTPS], byAddr[a], &tls.Config{
			Certificates: []tls.Certificate{certs[a]},
			NextProtos:   []string{"h2", "http/1.1"},
			MinVersion:   tls.VersionTLS12,
		})
		l.serveTCP(perAddr[a][PortEcho], "")
		l.serveTCP(perAddr[a][PortBanner], Banner)
		l.serveRaw(perAddr[a][PortSource], source)
	}

	// A freshly raised veth may drop packets until the kernel has attached
	// its queueing discipline, so wait until the lab really answers.
	probes := []string{l.DNS.String()}
	if len(addrs) > 0 {
		probes = append(probes, netip.AddrPortFrom(addrs[0], PortHTTP).String())
	}
	for _, p := range probes {
		if err := waitDial(p, readyWait); err != nil {
			t.Fatalf("netlab: lab not reachable: %v", err)
		}
	}
	return l
}

// AddRecord adds an address record for name. The address need not exist
// anywhere, e.g. a name resolving to a loopback or private address for SSRF
// tests. IPv4 addresses are served as A records, IPv6 ones as AAAA.
func (l *Lab) AddRecord(name string, addr netip.Addr) {
	name = normName(name)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records[name] = append(l.records[name], addr.Unmap())
}

// DNSQueries returns every question name the DNS server received, in order,
// lower-case and without the trailing dot.
func (l *Lab) DNSQueries() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.dnsQueries...)
}

// HTTPRequests returns the requests the HTTP and HTTPS servers received, in
// order.
func (l *Lab) HTTPRequests() []Seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Seen(nil), l.httpSeen...)
}

// TCPConns returns the connections the echo and banner servers accepted, so a
// test can assert that a denied raw connection never arrived.
func (l *Lab) TCPConns() []ConnSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ConnSeen(nil), l.tcpSeen...)
}

// Dial connects from the host namespace, bypassing any sandbox; it is meant
// for checking the lab itself.
func (l *Lab) Dial(network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: ioTimeout}
	return d.Dial(network, addr)
}

// CertPool returns a pool holding only the lab CA.
func (l *Lab) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(l.CA)
	return p
}

// HTTPClient returns a client for use from the host namespace that trusts
// only the lab CA and ignores proxy settings from the environment, which
// could otherwise send a test's request somewhere else.
func (l *Lab) HTTPClient() *http.Client {
	return &http.Client{
		Timeout: ioTimeout,
		Transport: &http.Transport{
			Proxy:             nil,
			TLSClientConfig:   &tls.Config{RootCAs: l.CertPool()},
			ForceAttemptHTTP2: true,
		},
	}
}

// Release lets every /stream/<id> request for id send its last event and
// end, including ones that arrive later: a test need not wait for the request
// before releasing it.
func (l *Lab) Release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(id)
	if !s.released {
		s.released = true
		close(s.release)
	}
}

// StreamStarted reports whether a /stream/<id> request for id has written its
// first event.
func (l *Lab) StreamStarted(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.streams[id]
	return ok && s.started
}

// ---- DNS ----

func (l *Lab) serveDNS(t testing.TB, pc net.PacketConn, ln net.Listener) {
	h := dns.HandlerFunc(l.answer)
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: h},
		{Listener: ln, Handler: h, MaxTCPQueries: 100, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout,
			IdleTimeout: func() time.Duration { return ioTimeout }},
	} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			_ = srv.ActivateAndServe()
		}()
		// Shutdown refuses a server that has not started yet, so only
		// register it once it has.
		select {
		case <-started:
		case <-time.After(readyWait):
			t.Fatalf("netlab: DNS server did not start")
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.ShutdownContext(ctx)
		})
	}
}

func (l *Lab) answer(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if req.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		_ = w.WriteMsg(m)
		return
	}
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := normName(q.Name)

	l.mu.Lock()
	if len(l.dnsQueries) < maxLog {
		l.dnsQueries = append(l.dnsQueries, name)
	}
	addrs, ok := l.records[name]
	addrs = append([]netip.Addr(nil), addrs...)
	l.mu.Unlock()

	switch {
	case !ok:
		m.Rcode = dns.RcodeNameError
	case q.Qclass != dns.ClassINET:
		// Known name, other class: no data.
	case q.Qtype == dns.TypeA:
		for _, a := range addrs {
			if a.Is4() {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
					A:   a.AsSlice(),
				})
			}
		}
	case q.Qtype == dns.TypeAAAA:
		for _, a := range addrs {
			if a.Is6() {
				m.Answer = append(m.Answer, &dns.AAAA{
					Hdr:  dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: dnsTTL},
					AAAA: a.AsSlice(),
				})
			}
		}
	}
	_ = w.WriteMsg(m)
}

// ---- HTTP / HTTPS ----

func (l *Lab) serveHTTP(ln net.Listener, names []string, tc *tls.Config) {
	srv := &http.Server{
		Handler:           l.httpHandler(names),
		TLSConfig:         tc,
		ReadHeaderTimeout: ioTimeout,
		ReadTimeout:       ioTimeout,
		WriteTimeout:      ioTimeout,
		IdleTimeout:       ioTimeout,
		MaxHeaderBytes:    64 << 10,
		// The server forgets a connection once the WebSocket endpoint has
		// taken it over; the endpoint finds it here to register it for
		// shutdown.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		// Failed handshakes are expected in tests (that is the point of
		// many of them) and would only clutter the output.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	l.mu.Lock()
	l.closers = append(l.closers, func() { srv.Close() })
	l.mu.Unlock()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if tc != nil {
			_ = srv.ServeTLS(ln, "", "")
		} else {
			_ = srv.Serve(ln)
		}
	}()
}

func (l *Lab) httpHandler(names []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		// A site's handler (Serve) reads the body as it came.
		r.Body = io.NopCloser(bytes.NewReader(body))
		if len(body) > maxRecordedBody {
			body = body[:maxRecordedBody]
		}
		s := Seen{
			Host:       r.Host,
			Method:     r.Method,
			Path:       r.URL.Path,
			Query:      r.URL.RawQuery,
			Proto:      r.Proto,
			Header:     r.Header.Clone(),
			Body:       body,
			RemoteAddr: r.RemoteAddr,
			TLS:        r.TLS != nil,
		}
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			s.LocalAddr = a.String()
		}
		if r.TLS != nil {
			s.ServerName = r.TLS.ServerName
		}
		l.mu.Lock()
		if len(l.httpSeen) < maxLog {
			l.httpSeen = append(l.httpSeen, s)
		}
		l.mu.Unlock()

		// Several names may share an address; answer as the one asked for.
		name := names[0]
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		for _, n := range names {
			if n == normName(host) {
				name = n
			}
		}
		l.mu.Lock()
		site := l.sites[name]
		l.mu.Unlock()
		if site != nil {
			site.ServeHTTP(w, r)
			return
		}
		p := r.URL.Path
		switch {
		case strings.HasPrefix(p, "/stream/"):
			l.stream(w, r, strings.TrimPrefix(p, "/stream/"))
		case p == "/ws":
			l.webSocket(w, r)
		case p == "/echo-headers":
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(r.Header)
		case p == "/big":
			sendBig(w, r)
		case strings.HasPrefix(p, "/status/"):
			sendStatus(w, strings.TrimPrefix(p, "/status/"))
		default:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "hello from %s %s %s", name, r.Method, p)
		}
	})
}

// Serve makes h answer every HTTP and HTTPS request for the host name
// (after it is recorded, so h sees an empty body), for tests that need a
// real service's answers, such as a package registry's.
func (l *Lab) Serve(name string, h http.Handler) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sites == nil {
		l.sites = map[string]http.Handler{}
	}
	l.sites[normName(name)] = h
}

// ServeTCP runs handle for every connection to port on addr, one of the
// lab's host addresses, until the lab shuts down: a way to put a real
// server (PostgreSQL, sshd in inetd mode) behind a lab address.
func (l *Lab) ServeTCP(t testing.TB, addr netip.Addr, port int, handle func(net.Conn)) {
	t.Helper()
	if !slices.ContainsFunc(l.Hosts, func(h Host) bool { return h.Addr == addr }) {
		t.Fatalf("netlab: ServeTCP on %s, which is not one of the lab's host addresses", addr)
	}
	type result struct {
		ln  net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread joins the lab namespace, and a
		// goroutine that exits locked takes its thread with it.
		runtime.LockOSThread()
		if err := unix.Setns(l.nsFD, unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("enter the lab namespace: %w", err)}
			return
		}
		ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, uint16(port)).String())
		done <- result{ln, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("netlab: listen on %s:%d: %v", addr, port, r.err)
	}
	l.mu.Lock()
	l.closers = append(l.closers, func() { r.ln.Close() })
	l.mu.Unlock()
	l.serveRaw(r.ln, handle)
}

// ServerCert issues a certificate for the lab host name (and its address)
// signed by the lab's CA, for a real server of a test's own (PostgreSQL,
// say) to present; it returns the certificate and its key as PEM.
func (l *Lab) ServerCert(t testing.TB, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	name = normName(name)
	var addr netip.Addr
	for _, h := range l.Hosts {
		if h.Name == name {
			addr = h.Addr
		}
	}
	if !addr.IsValid() {
		t.Fatalf("netlab: ServerCert for %s, which is not one of the lab's hosts", name)
	}
	c := newLeaf(t, l.CA, l.caKey, []string{name}, addr)
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// connKey is the request context key under which serveHTTP stores the
// request's connection.
type connKey struct{}

// labStream is what Release and /stream/<id> requests share for one id.
type labStream struct {
	release  chan struct{} // closed by Release
	released bool
	started  bool
}

// streamLocked returns the state for id, creating it; l.mu must be held.
func (l *Lab) streamLocked(id string) *labStream {
	s, ok := l.streams[id]
	if !ok {
		s = &labStream{release: make(chan struct{})}
		l.streams[id] = s
	}
	return s
}

// stream serves /stream/<id>: an event stream that stays open, with its first
// event delivered, until the test releases it, as a long poll or a server-sent
// event stream would.
func (l *Lab) stream(w http.ResponseWriter, r *http.Request, id string) {
	if id == "" {
		http.Error(w, "netlab: /stream/ needs an id", http.StatusBadRequest)
		return
	}
	// The server's timeouts are sized for ordinary requests and would cut
	// the stream (or, for HTTP/1.1, cancel it through the read deadline)
	// while it waits; it stays bounded, only by streamWait instead.
	rc := http.NewResponseController(w)
	end := time.Now().Add(streamWait + ioTimeout)
	_ = rc.SetReadDeadline(end)
	_ = rc.SetWriteDeadline(end)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	if _, err := io.WriteString(w, "data: first\n\n"); err != nil {
		return
	}
	l.mu.Lock()
	s := l.streamLocked(id)
	// Marked before the flush, so that a client that has read the event
	// always finds StreamStarted true.
	s.started = true
	release := s.release
	l.mu.Unlock()
	if err := rc.Flush(); err != nil {
		return
	}
	t := time.NewTimer(streamWait)
	defer t.Stop()
	select {
	case <-release:
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, "data: last\n\n")
}

// webSocket serves /ws, echoing every message. x/net/websocket takes over the
// connection, which only HTTP/1.x allows; the connection is registered like a
// raw one so that shutdown closes it.
func (l *Lab) webSocket(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 {
		// x/net/websocket would panic on a connection it cannot take over.
		http.Error(w, "netlab: WebSocket needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return
	}
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	l.mu.Lock()
	if c == nil || l.closed {
		l.mu.Unlock()
		http.Error(w, "netlab: shutting down", http.StatusServiceUnavailable)
		return
	}
	l.conns[c] = struct{}{}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	defer l.dropConn(c)
	websocket.Server{
		// Tests dial without a browser's Origin; any client is welcome.
		Handshake: func(*websocket.Config, *http.Request) error { return nil },
		Handler:   wsEcho,
	}.ServeHTTP(w, r)
}

// wsMessage keeps a message's frame type along with its payload, so that the
// echo is the same message, text or binary.
type wsMessage struct {
	data []byte
	typ  byte
}

var wsCodec = websocket.Codec{
	Marshal: func(v any) ([]byte, byte, error) {
		m := v.(*wsMessage)
		return m.data, m.typ, nil
	},
	Unmarshal: func(data []byte, typ byte, v any) error {
		m := v.(*wsMessage)
		m.data, m.typ = data, typ
		return nil
	},
}

// wsEcho sends every message back until the client closes, an idle timeout,
// or the same per-connection byte and time limits as the line echo server.
func wsEcho(ws *websocket.Conn) {
	ws.MaxPayloadBytes = maxEchoBytes
	end := time.Now().Add(connLifetime)
	// The deadlines the HTTP server set stay on a connection taken over.
	_ = ws.SetWriteDeadline(end)
	total := 0
	for total < maxEchoBytes {
		dl := time.Now().Add(ioTimeout)
		if dl.After(end) {
			dl = end
		}
		_ = ws.SetReadDeadline(dl)
		var m wsMessage
		if err := wsCodec.Receive(ws, &m); err != nil {
			return
		}
		total += len(m.data)
		if err := wsCodec.Send(ws, &m); err != nil {
			return
		}
	}
}

// sendBig serves /big?n=N.
func sendBig(w http.ResponseWriter, r *http.Request) {
	n := int64(defaultBig)
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 || v > maxBig {
			http.Error(w, fmt.Sprintf("netlab: n must be 0 to %d", maxBig), http.StatusBadRequest)
			return
		}
		n = v
	}
	// A throughput test through a slow sandbox may need longer than the
	// server's write timeout for the largest bodies.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(connLifetime))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, min(n, 64<<10))
	for i := range buf {
		buf[i] = 'x'
	}
	writeN(w, buf, n)
}

// writeN writes n bytes to w, repeating buf.
func writeN(w io.Writer, buf []byte, n int64) {
	for n > 0 {
		k, err := w.Write(buf[:min(int64(len(buf)), n)])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

// sendStatus serves /status/<code>. Informational codes are refused: the
// server would send them as interim responses and the request would hang
// without a final one.
func sendStatus(w http.ResponseWriter, s string) {
	code, err := strconv.Atoi(s)
	if err != nil || code < 200 || code > 599 {
		http.Error(w, "netlab: /status/ needs a code from 200 to 599", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, "status %d", code)
}

// ---- raw TCP: echo and banner ----

func (l *Lab) serveTCP(ln net.Listener, banner string) {
	l.serveRaw(ln, func(c net.Conn) { echo(c, banner) })
}

// serveRaw accepts on ln and runs handle for each connection, at most
// maxConns at a time; every connection is recorded and closed on shutdown.
func (l *Lab) serveRaw(ln net.Listener, handle func(net.Conn)) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		sem := make(chan struct{}, maxConns)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // listener closed
			}
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				c.Close()
				return
			}
			l.conns[c] = struct{}{}
			if len(l.tcpSeen) < maxLog {
				l.tcpSeen = append(l.tcpSeen, ConnSeen{RemoteAddr: c.RemoteAddr().String(), LocalAddr: c.LocalAddr().String()})
			}
			l.mu.Unlock()
			select {
			case sem <- struct{}{}:
			default:
				l.dropConn(c)
				continue
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer func() { <-sem }()
				defer l.dropConn(c)
				handle(c)
			}()
		}
	}()
}

func (l *Lab) dropConn(c net.Conn) {
	c.Close()
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// source sends as many bytes as the connection's first line asks for.
func source(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(connLifetime))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	n, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil || n < 0 || n > maxSourceBytes {
		return
	}
	writeN(c, make([]byte, 256<<10), n)
}

// echo sends banner (if any), then writes back every line it reads until EOF,
// an idle timeout, or the per-connection byte and time limits.
func echo(c net.Conn, banner string) {
	end := time.Now().Add(connLifetime)
	_ = c.SetWriteDeadline(end)
	if banner != "" {
		if _, err := io.WriteString(c, banner); err != nil {
			return
		}
	}
	br := bufio.NewReaderSize(c, 4096)
	total := 0
	for total < maxEchoBytes {
		dl := time.Now().Add(ioTimeout)
		if dl.After(end) {
			dl = end
		}
		_ = c.SetReadDeadline(dl)
		// ReadSlice returns at most a buffer's worth; longer lines are
		// echoed in pieces, which is the same byte stream.
		b, err := br.ReadSlice('\n')
		if len(b) > 0 {
			total += len(b)
			if _, werr := c.Write(b); werr != nil {
				return
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// ---- shutdown ----

// shutdown stops every server: closeListeners ends the accept loops, the
// closers stop the HTTP servers, and open raw connections are closed so that
// their goroutines return; then it waits, boundedly, for all of them.
func (l *Lab) shutdown(t testing.TB, closeListeners func()) {
	closeListeners()
	l.mu.Lock()
	l.closed = true
	closers := l.closers
	conns := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, f := range closers {
		f()
	}
	for _, c := range conns {
		c.Close()
	}
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Errorf("netlab: servers did not stop within 5s")
	}
}

// ---- namespace ----

// nsWorker is a goroutine locked to a thread that has been moved into a new
// network namespace; work sent to it runs inside that namespace.
type nsWorker struct {
	fd     int // the lab namespace, /proc/thread-self/ns/net of the worker
	work   chan func()
	exited chan struct{}
}

func startNSWorker() (*nsWorker, error) {
	w := &nsWorker{fd: -1, work: make(chan func()), exited: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		defer close(w.exited)
		// Never unlocked: this thread's namespace is changed, and a
		// goroutine that exits while locked makes the runtime discard the
		// thread instead of handing it to other goroutines.
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open lab netns: %w", err)
			return
		}
		w.fd = fd
		errc <- nil
		for fn := range w.work {
			fn()
		}
		// Tidy, though the thread is discarded anyway on return.
		_ = unix.Setns(orig, unix.CLONE_NEWNET)
	}()
	if err := <-errc; err != nil {
		<-w.exited
		return nil, err
	}
	return w, nil
}

func (w *nsWorker) run(fn func() error) error {
	errc := make(chan error, 1)
	w.work <- func() { errc <- fn() }
	return <-errc
}

func (w *nsWorker) stop() {
	close(w.work)
	<-w.exited
}

// disableIPv6 turns IPv6 off on a link of the calling thread's namespace
// (/proc/sys/net follows the namespace of the thread that opens it).
func disableIPv6(link string) {
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+link+"/disable_ipv6", []byte("1"), 0)
}

// removeStale deletes lab links left by runs that are gone. Links of a live
// process other than this one are left alone: rangesInUse then reports them.
func removeStale(t testing.TB, h *netlink.Handle) {
	links, err := h.LinkList()
	if err != nil {
		t.Fatalf("netlab: list links: %v", err)
	}
	for _, lk := range links {
		name := lk.Attrs().Name
		if !strings.HasPrefix(name, linkPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimRight(strings.TrimPrefix(name, linkPrefix), "hn"))
		// This process holds the lab lock, so a link with its own pid is a
		// leftover of an earlier lab whose cleanup failed.
		if err == nil && pid != os.Getpid() && processAlive(pid) {
			continue
		}
		// ENODEV: already gone with its veth peer, deleted just before.
		if err := h.LinkDel(lk); errors.Is(err, unix.ENODEV) {
			continue
		} else if err != nil {
			t.Fatalf("netlab: remove stale link %s: %v", name, err)
		}
		t.Logf("netlab: removed stale link %s", name)
	}
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// rangesInUse reports why the host cannot lend the lab its address ranges:
// an address or a route (other than a default route) overlapping them.
func rangesInUse(h *netlink.Handle) string {
	overlaps := func(p netip.Prefix) bool { return p.Overlaps(transitNet) || p.Overlaps(hostsNet) }
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Sprintf("list addresses: %v", err)
	}
	for _, a := range addrs {
		if p, ok := ipNetToPrefix(a.IPNet); ok && overlaps(p) {
			return fmt.Sprintf("address %s is on link index %d", p, a.LinkIndex)
		}
	}
	// All tables, not only main: a policy-routed table could claim the ranges too.
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Sprintf("list routes: %v", err)
	}
	for _, r := range routes {
		if p, ok := ipNetToPrefix(r.Dst); ok && p.Bits() > 0 && overlaps(p) {
			return fmt.Sprintf("route %s (table %d, link index %d) exists", p, r.Table, r.LinkIndex)
		}
	}
	return ""
}

func ipNetToPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// ---- locking ----

// acquireLocks makes the lab exclusive within this process and across
// processes (go test runs packages in parallel, and they would all want the
// same addresses). Both waits are bounded.
func acquireLocks(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(lockWait)
	select {
	case processLock <- struct{}{}:
	case <-time.After(lockWait):
		skipOrFail(t, "netlab: another lab in this process stayed active for %s", lockWait)
	}
	t.Cleanup(func() { <-processLock })

	f, err := os.OpenFile(lockFile(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("netlab: lock file: %v", err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the flock
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("netlab: flock: %v", err)
		}
		if time.Now().After(deadline) {
			skipOrFail(t, "netlab: another process kept the lab lock %s for %s", f.Name(), lockWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lockFile() string {
	if st, err := os.Stat("/run/lock"); err == nil && st.IsDir() {
		return "/run/lock/corral-netlab.lock"
	}
	return filepath.Join(os.TempDir(), "corral-netlab.lock")
}

// ---- certificates ----

func newCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "corral netlab test CA", Organization: []string{"corral tests"}},
		NotBefore:             now.Add(-time.Hour), // tolerate small clock differences
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	return ca, key, der
}

func newLeaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names []string, addr netip.Addr) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		IPAddresses:  []net.IP{addr.AsSlice()},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	return n
}

// ---- helpers ----

func normName(s string) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), "."))
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "netlab: needs root to create network namespaces")
	}
}

// skipOrFail skips for conditions of the machine rather than of the code;
// CORRAL_NO_SKIP=1 turns them into failures so CI cannot silently skip.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CORRAL_NO_SKIP") == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func waitDial(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp4", addr, 250*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
