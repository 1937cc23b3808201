//go:build linux

package procident

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// diag looks sockets up by their exact address pair with sock_diag in the
// sandbox's network namespace: one netlink round trip, where reading
// /proc/<pid>/net/tcp walks every TCP socket of the host.
type diag struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	buf []byte // replies; used under mu
}

// sockDiagByFamily is SOCK_DIAG_BY_FAMILY from linux/sock_diag.h.
const sockDiagByFamily = 20

// openDiag creates the netlink socket inside initPID's network namespace;
// a netlink socket serves the namespace it was created in.
func openDiag(initPID int) (*diag, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// This thread enters another namespace. It is unlocked (and so
		// reused) only if it is back in its own; otherwise the runtime
		// retires it when this goroutine returns locked.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- result{-1, err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPid(initPID)
		if err != nil {
			done <- result{-1, err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			done <- result{-1, err}
			return
		}
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("sock_diag socket in sandbox network namespace: %w", r.err)
	}
	return &diag{fd: r.fd}, nil
}

// inode returns the inode and the cookie of the TCP socket whose local
// address is src and whose peer is dst; ok is false when there is no such
// socket.
func (d *diag) inode(src, dst netip.AddrPort) (inode, cookie uint64, ok bool, err error) {
	family := byte(unix.AF_INET6)
	if src.Addr().Is4() && dst.Addr().Is4() {
		family = unix.AF_INET
	}
	req := make([]byte, 16+56)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	binary.NativeEndian.PutUint32(req[8:], d.seq)
	r := req[16:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	putAddr(id[4:20], src.Addr())
	putAddr(id[20:36], dst.Addr())
	binary.NativeEndian.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	binary.NativeEndian.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, 0, false, fmt.Errorf("sock_diag request: %w", err)
	}
	if d.buf == nil {
		d.buf = make([]byte, 8192)
	}
	buf := d.buf
	for {
		n, _, err := unix.Recvfrom(d.fd, buf, 0)
		if err != nil {
			return 0, 0, false, fmt.Errorf("sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return 0, 0, false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != d.seq {
				continue // a late answer to an earlier, abandoned request
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := -int32(binary.NativeEndian.Uint32(m.Data)); e == int32(unix.ENOENT) {
						return 0, 0, false, nil
					} else if e != 0 {
						return 0, 0, false, fmt.Errorf("sock_diag: %w", unix.Errno(e))
					}
				}
				return 0, 0, false, errors.New("sock_diag: empty error")
			case sockDiagByFamily:
				// inet_diag_msg: family, state, timer, retrans, the
				// 48-byte id (ending in the cookie, low half first),
				// expires, rqueue, wqueue, uid, then inode.
				if len(m.Data) < 72 {
					return 0, 0, false, errors.New("sock_diag: short reply")
				}
				cookie := uint64(binary.NativeEndian.Uint32(m.Data[44:])) | uint64(binary.NativeEndian.Uint32(m.Data[48:]))<<32
				return uint64(binary.NativeEndian.Uint32(m.Data[68:])), cookie, true, nil
			}
		}
	}
}

func putAddr(b []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(b, v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}
