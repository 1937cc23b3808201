//go:build linux

package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Setup reconfigures the network namespace it runs in, so the kernel tests
// run it in a re-executed copy of the test binary inside a fresh network
// (and mount) namespace, which reports the outcome of each probe as JSON.
const childEnv = "CORRAL_CAPTURE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

// requireRoot skips a test that needs root, unless CORRAL_NO_SKIP=1 asks
// for every skip to count as a failure (as CI does).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	skipOrFail(t, "needs root (CAP_NET_ADMIN to create a network namespace, routes and nftables rules)")
}

// childReport maps probe names to "OK" or what went wrong.
type childReport struct {
	Setup  string
	IPv6   bool
	NoIPv6 string
	Probes map[string]string
}

var testCfg = Config{DNSPort: 53, TransparentPort: 15001, HTTPProxyPort: 3128, SOCKSPort: 1080}

func TestCaptureInNamespace(t *testing.T) {
	requireRoot(t)
	runChild(t, &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS})
}

// TestCaptureInUserNamespace runs Setup where a rootless corral runs it:
// in a network namespace owned by a new user namespace, with capabilities
// only there. Unprivileged, the user namespace maps the caller's own uid.
func TestCaptureInUserNamespace(t *testing.T) {
	uid, gid := os.Getuid(), os.Getgid()
	attr := &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET | unix.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		skipOrFail(t, "no user namespaces: "+err.Error())
	}
	runChild(t, attr)
}

func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CORRAL_NO_SKIP") == "1" {
		t.Fatal(msg + "; CORRAL_NO_SKIP=1 forbids skipping")
	}
	t.Skip(msg)
}

func runChild(t *testing.T, attr *syscall.SysProcAttr) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.SysProcAttr = attr
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, unix.EPERM) && attr.Cloneflags&unix.CLONE_NEWUSER != 0 {
			skipOrFail(t, "cannot create a user namespace here: "+err.Error())
		}
		t.Fatalf("child: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	var rep childReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("child report: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if rep.Setup != "OK" {
		t.Fatalf("Setup: %s", rep.Setup)
	}
	want := []string{
		"only_loopback", "transparent4", "transparent4_capture_addr", "transparent4_proxy_port_elsewhere", "dns_udp", "dns_udp_capture_addr", "dns_tcp", "udp_other_dropped",
		"icmp_raw_dropped", "http_proxy", "socks", "handoff_roundtrip", "handoff_wrong_order",
	}
	if rep.IPv6 {
		want = append(want, "transparent6", "dns_udp6", "udp6_other_dropped", "icmp6_raw_dropped")
	} else {
		t.Logf("IPv6 not available in the namespace (%s); IPv6 probes not run", rep.NoIPv6)
		if os.Getenv("CORRAL_NO_SKIP") == "1" {
			t.Errorf("IPv6 capture untested: %s", rep.NoIPv6)
		}
	}
	for _, name := range want {
		t.Run(name, func(t *testing.T) {
			got, ok := rep.Probes[name]
			if !ok {
				t.Fatal("probe did not run")
			}
			if got != "OK" {
				t.Fatal(got)
			}
		})
	}
}

func childMain() int {
	rep := childReport{Probes: map[string]string{}}
	defer func() {
		b, _ := json.Marshal(rep)
		os.Stdout.Write(b)
	}()
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		rep.Setup = "lo up: " + err.Error()
		return 0
	}
	l, err := Setup(testCfg)
	if err != nil {
		rep.Setup = err.Error()
		return 0
	}
	rep.Setup, rep.IPv6, rep.NoIPv6 = "OK", l.IPv6, l.NoIPv6Reason

	probe := func(name string, f func() error) {
		if err := f(); err != nil {
			rep.Probes[name] = err.Error()
		} else {
			rep.Probes[name] = "OK"
		}
	}
	tcpTo := func(lf *os.File, dial string, wantOrig string) func() error {
		return func() error { return tcpProbe(lf, dial, wantOrig) }
	}
	// No device but lo: nothing the rules let through can leave.
	probe("only_loopback", func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, k := range links {
			if k.Attrs().Name != "lo" {
				return fmt.Errorf("the namespace has a device %s", k.Attrs().Name)
			}
		}
		return nil
	})
	probe("transparent4", tcpTo(l.Transparent4, "203.0.113.9:443", "203.0.113.9:443"))
	// Only the proxy ports of the capture address are exempt.
	probe("transparent4_capture_addr", tcpTo(l.Transparent4, "198.19.255.254:80", "198.19.255.254:80"))
	// The proxy ports are exempt only on the capture address.
	probe("transparent4_proxy_port_elsewhere", tcpTo(l.Transparent4, "203.0.113.9:3128", "203.0.113.9:3128"))
	probe("dns_udp", func() error { return udpProbe(l.DNSUDP, "203.0.113.9:53") })
	// What resolv.conf names.
	probe("dns_udp_capture_addr", func() error { return udpProbe(l.DNSUDP, "198.19.255.254:53") })
	probe("dns_tcp", tcpTo(l.DNSTCP, "203.0.113.9:53", "203.0.113.9:53"))
	probe("udp_other_dropped", func() error { return udpDropped("udp4", "203.0.113.9:9999") })
	probe("icmp_raw_dropped", icmpDropped)
	// Reached directly: the conntrack entry has no NAT, so the "original"
	// destination is the proxy's own address.
	probe("http_proxy", tcpTo(l.HTTPProxy, "198.19.255.254:3128", "198.19.255.254:3128"))
	probe("socks", tcpTo(l.SOCKS, "198.19.255.254:1080", "198.19.255.254:1080"))
	if l.IPv6 {
		probe("transparent6", tcpTo(l.Transparent6, "[2001:db8::1]:80", "[2001:db8::1]:80"))
		probe("dns_udp6", func() error { return udpProbe(l.DNSUDP6, "[2001:db8::53]:53") })
		probe("udp6_other_dropped", func() error { return udpDropped("udp6", "[2001:db8::1]:9999") })
		probe("icmp6_raw_dropped", icmp6Dropped)
	}
	probe("handoff_roundtrip", func() error {
		got, err := FromFiles(l.Files())
		if err != nil {
			return err
		}
		if got.IPv6 != l.IPv6 || got.SOCKS != l.SOCKS || got.DNSUDP != l.DNSUDP {
			return fmt.Errorf("FromFiles rebuilt a different set: %+v", got)
		}
		return nil
	})
	probe("handoff_wrong_order", func() error {
		fs := l.Files()
		fs[0], fs[1] = fs[1], fs[0] // DNS TCP where DNS UDP belongs
		if _, err := FromFiles(fs); !errors.Is(err, errNotSocket) {
			return fmt.Errorf("FromFiles accepted swapped sockets (err %v)", err)
		}
		return nil
	})
	return 0
}

// tcpProbe dials through the capture and checks the connection arrives on
// the listener lf with the expected original destination.
func tcpProbe(lf *os.File, dial, wantOrig string) error {
	ln, err := net.FileListener(lf)
	if err != nil {
		return err
	}
	defer ln.Close()
	type result struct {
		c   net.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		acc <- result{c, err}
	}()
	c, err := net.DialTimeout("tcp", dial, 2*time.Second)
	if err != nil {
		return fmt.Errorf("dial %s: %w", dial, err)
	}
	defer c.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
	r := <-acc
	if r.err != nil {
		return fmt.Errorf("accept: %w", r.err)
	}
	defer r.c.Close()
	if r.c.RemoteAddr().String() != c.LocalAddr().String() {
		return fmt.Errorf("accepted %s, dialer is %s", r.c.RemoteAddr(), c.LocalAddr())
	}
	// The supervisor sees one client address per family, whatever the
	// destination; loopback stays loopback.
	src := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr()
	if want := map[bool]netip.Addr{false: Addr, true: Addr6}[src.Is6()]; !src.IsLoopback() && src != want {
		return fmt.Errorf("connection from %s, want %s", src, want)
	}
	orig, err := ConnOriginalDst(r.c)
	if err != nil {
		return err
	}
	if orig != netip.MustParseAddrPort(wantOrig) {
		return fmt.Errorf("original destination %s, want %s", orig, wantOrig)
	}
	return nil
}

// udpProbe sends a datagram to a foreign resolver address, expects it at the
// DNS listener, and expects the reply to come back from that address.
func udpProbe(lf *os.File, dest string) error {
	pc, err := net.FilePacketConn(lf)
	if err != nil {
		return err
	}
	defer pc.Close()
	c, err := net.Dial("udp", dest)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("query")); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	pc.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		return fmt.Errorf("DNS listener: %w", err)
	}
	if string(buf[:n]) != "query" {
		return fmt.Errorf("DNS listener got %q", buf[:n])
	}
	if _, err := pc.WriteTo([]byte("answer"), from); err != nil {
		return fmt.Errorf("reply: %w", err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	uc := c.(*net.UDPConn)
	n, src, err := uc.ReadFromUDPAddrPort(buf)
	if err != nil {
		return fmt.Errorf("client reply: %w", err)
	}
	if string(buf[:n]) != "answer" || src.String() != dest {
		return fmt.Errorf("client got %q from %s", buf[:n], src)
	}
	return nil
}

// udpDropped expects the OUTPUT filter to refuse the datagram: the kernel
// reports a netfilter drop of a local packet as EPERM from sendto.
func udpDropped(network, dest string) error {
	c, err := net.Dial(network, dest)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	_, err = c.Write([]byte("leak"))
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("send to %s: got %v, want EPERM", dest, err)
	}
	return nil
}

func icmpDropped() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	echo := []byte{8, 0, 0xf7, 0xff, 0, 0, 0, 0} // echo request, checksum precomputed
	err = unix.Sendto(fd, echo, 0, &unix.SockaddrInet4{Addr: [4]byte{203, 0, 113, 9}})
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("ICMP echo: got %v, want EPERM", err)
	}
	return nil
}

// icmp6Dropped: an ICMPv6 echo to any address is dropped too; with every
// address routed to lo it would otherwise be answered by the namespace
// itself, telling the workload the address is there.
func icmp6Dropped() error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	echo := []byte{128, 0, 0, 0, 0, 0, 0, 0} // echo request; the kernel fills in the checksum
	err = unix.Sendto(fd, echo, 0, &unix.SockaddrInet6{Addr: netip.MustParseAddr("2001:db8::9").As16()})
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("ICMPv6 echo: got %v, want EPERM", err)
	}
	return nil
}

func TestRules(t *testing.T) {
	got := strings.Join(Rules(Config{DNSPort: 5353, TransparentPort: 15001, HTTPProxyPort: 3128, SOCKSPort: 1080}), "\n")
	for _, want := range []string{
		"add chain inet corral capture { type nat hook output priority -100; policy accept; }",
		"add chain inet corral egress { type filter hook output priority 0; policy drop; }",
		"add rule inet corral capture ip daddr 127.0.0.0/8 return",
		"add rule inet corral capture ip6 daddr ::1 return",
		"add rule inet corral capture ip daddr 198.19.255.254 tcp dport 3128 return",
		"add rule inet corral capture ip daddr 198.19.255.254 tcp dport 1080 return",
		"add rule inet corral capture udp dport 53 redirect to :5353",
		"add rule inet corral capture tcp dport 53 redirect to :5353",
		"add rule inet corral capture meta l4proto tcp redirect to :15001",
		"add rule inet corral egress ip daddr 127.0.0.0/8 accept",
		"add rule inet corral egress ip daddr 198.19.255.254 accept",
		"add rule inet corral egress ip6 daddr ::1 accept",
		"add rule inet corral egress ip6 daddr fd00:c0ff::1 accept",
		"add rule inet corral egress ct status dnat accept",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Rules lacks %q; got:\n%s", want, got)
		}
	}
	// The redirect to the transparent listener must come after every
	// exemption, or the proxies and DNS would be swallowed by it.
	if strings.Index(got, "meta l4proto tcp redirect") < strings.Index(got, "dport 53 redirect") {
		t.Errorf("transparent redirect precedes DNS redirect:\n%s", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{DNSPort: 53, TransparentPort: 53, HTTPProxyPort: 3128, SOCKSPort: 1080},
		{DNSPort: 53, TransparentPort: 15001, HTTPProxyPort: 3128, SOCKSPort: 0},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := DefaultConfig.validate(); err != nil {
		t.Error(err)
	}
}

func TestFromFilesCount(t *testing.T) {
	if _, err := FromFiles(make([]*os.File, 3)); err == nil {
		t.Error("3 files accepted")
	}
	if _, err := FromFiles(make([]*os.File, 5)); !errors.Is(err, errNotSocket) {
		t.Errorf("nil files: %v", err)
	}
}
