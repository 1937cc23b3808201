//go:build linux

package procident

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// tcpListen is TCP_LISTEN in the st column of /proc/net/tcp.
const tcpListen = "0A"

// findSocket returns the inode of the socket in netDir (a /proc/<pid>/net
// directory) whose local address is src: the sandbox end of a connection
// whose supervisor end sees src as its peer. An IPv4 client may also be a
// dual-stack IPv6 socket, listed in tcp6 under the v4-mapped address.
func findSocket(netDir string, src netip.AddrPort) (uint64, error) {
	type table struct {
		file string
		addr netip.Addr
	}
	tables := []table{{"tcp6", src.Addr()}}
	if src.Addr().Is4() {
		tables = []table{{"tcp", src.Addr()}, {"tcp6", netip.AddrFrom16(src.Addr().As16())}}
	}
	var found []uint64
	for _, t := range tables {
		inodes, err := scanTable(netDir+"/"+t.file, netip.AddrPortFrom(t.addr, src.Port()))
		if err != nil {
			if os.IsNotExist(err) && t.file == "tcp6" {
				continue // kernel without IPv6
			}
			return 0, fmt.Errorf("procident: %w", err)
		}
		found = append(found, inodes...)
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("procident: no sandbox socket has local address %s", src)
	case 1:
		return found[0], nil
	}
	// Two live sockets with one local address (SO_REUSEADDR/REUSEPORT
	// games) cannot be told apart from here; guessing could credit the
	// connection to the wrong process.
	return 0, fmt.Errorf("procident: %d sandbox sockets have local address %s", len(found), src)
}

// scanTable returns the inodes of the non-listening sockets in one
// /proc/net/tcp{,6} file whose local address is want. Sockets with inode 0
// (TIME_WAIT, orphans) belong to no process and are skipped.
func scanTable(path string, want netip.AddrPort) ([]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	var out []uint64
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] == tcpListen {
			continue
		}
		local, err := parseHexAddrPort(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if local != want {
			continue
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: inode %q: %w", path, fields[9], err)
		}
		if inode != 0 {
			out = append(out, inode)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// parseHexAddrPort decodes the kernel's "ADDR:PORT" notation: the address
// is printed as 32-bit words in host byte order (one word for IPv4, four
// for IPv6), the port as a plain hex number.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q: no port", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", s, err)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q: bad hex address", s)
	}
	// Each word was printed as a host-order integer, i.e. most significant
	// digit first; turning it back into memory order restores the network
	// byte order of the address.
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
