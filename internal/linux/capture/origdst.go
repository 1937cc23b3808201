//go:build linux

package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/
// ip6_tables.h; it has the same value as SO_ORIGINAL_DST but lives at
// SOL_IPV6, and x/sys/unix does not name it.
const ip6tSOOriginalDst = 80

// OriginalDst returns the destination a redirected TCP connection was
// addressed to before the capture rules rewrote it, read from conntrack with
// getsockopt(SO_ORIGINAL_DST). fd is an accepted socket of a capture
// listener; v6 selects IPv6 (the Transparent6 listener). For a connection
// that was not NATed it returns the socket's own local address.
func OriginalDst(fd uintptr, v6 bool) (netip.AddrPort, error) {
	if v6 {
		var sa unix.RawSockaddrInet6
		if err := getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), unsafe.Sizeof(sa)); err != nil {
			return netip.AddrPort{}, fmt.Errorf("IP6T_SO_ORIGINAL_DST: %w", err)
		}
		if sa.Family != unix.AF_INET6 {
			return netip.AddrPort{}, fmt.Errorf("IP6T_SO_ORIGINAL_DST: unexpected family %d", sa.Family)
		}
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port(sa.Port)), nil
	}
	var sa unix.RawSockaddrInet4
	if err := getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa)); err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	if sa.Family != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: unexpected family %d", sa.Family)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port(sa.Port)), nil
}

// ConnOriginalDst is OriginalDst for an accepted connection. It goes through
// SyscallConn so the connection stays non-blocking, and picks the family
// from the connection's local address (the v6 listener is IPv6-only).
func ConnOriginalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("original destination: connection has no file descriptor")
	}
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, errors.New("original destination: not a TCP connection")
	}
	v6 := la.IP.To4() == nil
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var (
		ap   netip.AddrPort
		oerr error
	)
	if err := rc.Control(func(fd uintptr) { ap, oerr = OriginalDst(fd, v6) }); err != nil {
		return netip.AddrPort{}, err
	}
	return ap, oerr
}

// port converts a sockaddr port, stored in network byte order, to a number.
func port(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

// getsockopt is the raw system call: x/sys/unix has no getsockopt returning
// an arbitrary struct, and these options return a sockaddr.
func getsockopt(fd uintptr, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}
