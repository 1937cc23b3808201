package relay

import (
	"errors"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Opening waits for whichever end of a new tunnel speaks first and, if it
// is the client, looks at what it sent without consuming it. It returns
// the client's bytes once enough says that they can be decided on, or nil
// when up spoke first, the client ended or stopped for quiet before enough
// arrived, or max bytes were not enough: in every such case nothing has
// been read, so the caller carries on as if Opening had not been called.
// With idle > 0 a tunnel in which neither end spoke for idle ends with
// ErrIdle, as Relay would have ended it.
func Opening(client, up *net.TCPConn, idle, quiet time.Duration, max int, enough func([]byte) bool) ([]byte, error) {
	rc, err := client.SyscallConn()
	if err != nil {
		return nil, err
	}
	ru, err := up.SyscallConn()
	if err != nil {
		return nil, err
	}
	// up's watcher reports first, then wakes the client's wait, so a wait
	// that starts after the report finds it and one before is woken.
	upSpoke := make(chan error, 1)
	watched := make(chan struct{})
	go func() {
		upSpoke <- ru.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return !errors.Is(err, unix.EAGAIN)
		})
		client.SetReadDeadline(time.Unix(1, 0))
		close(watched)
	}()
	defer func() {
		up.SetReadDeadline(time.Unix(1, 0))
		<-watched
		client.SetReadDeadline(time.Time{})
		up.SetReadDeadline(time.Time{})
	}()

	var idleAt, quietAt time.Time
	if idle > 0 {
		idleAt = time.Now().Add(idle)
	}
	buf := make([]byte, max)
	for {
		// Until the client speaks the idle timeout applies; once it has,
		// the rest of its opening must follow within quiet.
		deadline := idleAt
		if !quietAt.IsZero() {
			deadline = quietAt
		}
		if err := client.SetReadDeadline(deadline); err != nil {
			return nil, err
		}
		select {
		case <-upSpoke:
			return nil, nil
		default:
		}
		var n int
		var perr error
		err := rc.Read(func(fd uintptr) bool {
			n, _, perr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if errors.Is(perr, unix.EAGAIN) {
				return false
			}
			// A first part returns so the quiet timeout can start;
			// after that only more bytes, a new edge for the poller,
			// make it worth looking again.
			return perr != nil || n == 0 || n == max || quietAt.IsZero() || enough(buf[:n])
		})
		select {
		case <-upSpoke:
			return nil, nil
		default:
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) && quietAt.IsZero():
			return nil, ErrIdle
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, nil
		case err != nil:
			return nil, err
		case perr != nil, n == 0, n == max:
			return nil, nil
		case enough(buf[:n]):
			return buf[:n:n], nil
		}
		if quietAt.IsZero() {
			quietAt = time.Now().Add(quiet)
		}
	}
}
