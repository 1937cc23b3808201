//go:build linux

package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// Listeners are the sockets Setup created in the sandbox's namespace. They
// keep that namespace's view wherever the descriptors travel: the
// supervisor accepts on them from the host namespaces, and SO_ORIGINAL_DST
// works because the NAT happened where the sockets live.
type Listeners struct {
	DNSUDP, DNSTCP *os.File // 127.0.0.1:DNSPort
	Transparent4   *os.File // TCP 127.0.0.1:TransparentPort
	Transparent6   *os.File // TCP [::1]:TransparentPort; nil without IPv6
	HTTPProxy      *os.File // TCP Addr:HTTPProxyPort
	SOCKS          *os.File // TCP Addr:SOCKSPort
	// DNS over IPv6 to any resolver is redirected to [::1]:DNSPort.
	DNSUDP6, DNSTCP6 *os.File // nil without IPv6

	// IPv6 reports whether the namespace carries IPv6; when it does not,
	// NoIPv6Reason says why and IPv6 connect() fails with ENETUNREACH.
	IPv6         bool
	NoIPv6Reason string
}

// slot describes one listener: where it sits in Files() and what socket it
// must be, so FromFiles can refuse descriptors handed over in the wrong
// order or of the wrong kind.
type slot struct {
	name   string
	field  func(*Listeners) **os.File
	family int
	typ    int
	addr   netip.Addr
}

// errNotSocket is wrapped when FromFiles gets something unexpected.
var errNotSocket = errors.New("not the expected socket")

var (
	lo4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	lo6 = netip.IPv6Loopback()
)

// The IPv4 slots come first so that a handoff without IPv6 is a prefix of
// one with it.
var (
	slots4 = []slot{
		{"dns-udp", func(l *Listeners) **os.File { return &l.DNSUDP }, unix.AF_INET, unix.SOCK_DGRAM, lo4},
		{"dns-tcp", func(l *Listeners) **os.File { return &l.DNSTCP }, unix.AF_INET, unix.SOCK_STREAM, lo4},
		{"transparent4", func(l *Listeners) **os.File { return &l.Transparent4 }, unix.AF_INET, unix.SOCK_STREAM, lo4},
		{"http-proxy", func(l *Listeners) **os.File { return &l.HTTPProxy }, unix.AF_INET, unix.SOCK_STREAM, Addr},
		{"socks", func(l *Listeners) **os.File { return &l.SOCKS }, unix.AF_INET, unix.SOCK_STREAM, Addr},
	}
	slots6 = []slot{
		{"dns-udp6", func(l *Listeners) **os.File { return &l.DNSUDP6 }, unix.AF_INET6, unix.SOCK_DGRAM, lo6},
		{"dns-tcp6", func(l *Listeners) **os.File { return &l.DNSTCP6 }, unix.AF_INET6, unix.SOCK_STREAM, lo6},
		{"transparent6", func(l *Listeners) **os.File { return &l.Transparent6 }, unix.AF_INET6, unix.SOCK_STREAM, lo6},
	}
)

func (l *Listeners) slots() []slot {
	if l.IPv6 {
		return append(append([]slot(nil), slots4...), slots6...)
	}
	return slots4
}

// Files returns the sockets in the fixed order FromFiles expects: DNSUDP,
// DNSTCP, Transparent4, HTTPProxy, SOCKS, and with IPv6 also DNSUDP6,
// DNSTCP6, Transparent6. SCM_RIGHTS carries no names, so the order is the
// contract between init and supervisor.
func (l *Listeners) Files() []*os.File {
	var out []*os.File
	for _, s := range l.slots() {
		out = append(out, *s.field(l))
	}
	return out
}

// Close closes every socket. The init calls it after the handoff so that
// the workload inherits none of them.
func (l *Listeners) Close() error {
	var errs []error
	for _, s := range append(append([]slot(nil), slots4...), slots6...) {
		if f := *s.field(l); f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// FromFiles rebuilds Listeners from descriptors received in Files() order
// (5 without IPv6, 8 with). It checks each one's family, type, listening
// state and bound address, so a mixed-up handoff fails here rather than as
// a DNS server reading TCP. The caller wraps them with net.FileListener /
// net.FilePacketConn and closes the files afterwards.
func FromFiles(fs []*os.File) (*Listeners, error) {
	l := &Listeners{}
	switch len(fs) {
	case len(slots4):
		l.NoIPv6Reason = "no IPv6 listeners were handed over"
	case len(slots4) + len(slots6):
		l.IPv6 = true
	default:
		return nil, fmt.Errorf("capture: got %d listener files, want %d or %d", len(fs), len(slots4), len(slots4)+len(slots6))
	}
	for i, s := range l.slots() {
		if err := checkSocket(fs[i], s); err != nil {
			return nil, fmt.Errorf("capture: listener %d (%s): %w", i, s.name, err)
		}
		*s.field(l) = fs[i]
	}
	return l, nil
}

func checkSocket(f *os.File, s slot) error {
	if f == nil {
		return fmt.Errorf("%w: nil file", errNotSocket)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	// Control rather than Fd: Fd would switch the descriptor to blocking
	// mode behind the caller's back.
	err = rc.Control(func(fd uintptr) {
		get := func(opt int) int {
			if cerr != nil {
				return 0
			}
			v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt)
			if err != nil {
				cerr = err
			}
			return v
		}
		dom, typ := get(unix.SO_DOMAIN), get(unix.SO_TYPE)
		listening := s.typ == unix.SOCK_DGRAM || get(unix.SO_ACCEPTCONN) == 1
		if cerr != nil {
			return
		}
		if dom != s.family || typ != s.typ || !listening {
			cerr = fmt.Errorf("%w: family %d type %d listening %v", errNotSocket, dom, typ, listening)
			return
		}
		sa, err := unix.Getsockname(int(fd))
		if err != nil {
			cerr = err
			return
		}
		if got := sockaddrAddr(sa); got != s.addr {
			cerr = fmt.Errorf("%w: bound to %s, want %s", errNotSocket, got, s.addr)
		}
	})
	if err != nil {
		return err
	}
	return cerr
}

func sockaddrAddr(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr)
	}
	return netip.Addr{}
}

// listen creates the listening sockets. They are plain close-on-exec
// sockets made with socket(2) rather than net.Listen, because they are
// handed to another process and must not be tied to this one's poller.
func listen(cfg Config, v6 bool) (*Listeners, error) {
	l := &Listeners{IPv6: v6}
	ports := map[string]uint16{
		"dns-udp": cfg.DNSPort, "dns-tcp": cfg.DNSPort, "transparent4": cfg.TransparentPort,
		"http-proxy": cfg.HTTPProxyPort, "socks": cfg.SOCKSPort,
		"dns-udp6": cfg.DNSPort, "dns-tcp6": cfg.DNSPort, "transparent6": cfg.TransparentPort,
	}
	for _, s := range l.slots() {
		f, err := socketFile(s, netip.AddrPortFrom(s.addr, ports[s.name]))
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("capture: listen %s on %s: %w", s.name, netip.AddrPortFrom(s.addr, ports[s.name]), err)
		}
		*s.field(l) = f
	}
	return l, nil
}

func socketFile(s slot, ap netip.AddrPort) (*os.File, error) {
	fd, err := unix.Socket(s.family, s.typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	var sa unix.Sockaddr
	if s.family == unix.AF_INET6 {
		// The v6 listeners serve IPv6 only; v4 has its own sockets, and a
		// dual-stack socket would report v4 clients as mapped addresses.
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("IPV6_V6ONLY: %w", err)
		}
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind: %w", err)
	}
	if s.typ == unix.SOCK_STREAM {
		// The kernel caps the backlog at net.core.somaxconn.
		if err := unix.Listen(fd, 4096); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
	return os.NewFile(uintptr(fd), "corral-"+s.name+" "+ap.String()), nil
}
