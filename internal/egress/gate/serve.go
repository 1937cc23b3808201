package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
)

// Serve accepts on l until ctx is done or l is closed (both return nil) and
// runs handle for each connection in its own goroutine. Accept errors such
// as EMFILE are retried with a growing pause, so running out of descriptors
// lets open tunnels finish instead of stopping the listener or spinning.
// When adm refuses a connection, refuse answers it instead of handle, with
// the refusal's reason; refuse must end quickly and close the connection.
func Serve(ctx context.Context, l net.Listener, log *slog.Logger, name string, adm *Admission, handle func(context.Context, net.Conn), refuse func(net.Conn, string)) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	const minBackoff = 5 * time.Millisecond
	backoff := minBackoff
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if log != nil {
				log.Warn(name+" accept failed", "err", err, "retry_in", backoff)
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = minBackoff
		if why := adm.admit(name, c); why != "" {
			adm.refuse(c, why, refuse)
			continue
		}
		go func() {
			defer adm.release()
			handle(ctx, c)
		}()
	}
}

// Defaults of an Admission.
const (
	// maxRefusing bounds the refusals being written at once; beyond it a
	// refused connection is reset without a word, so refusing costs
	// nothing a flood could grow.
	maxRefusing = 32
	// maxReserve is how many descriptors are kept for everything that is
	// not a new tunnel: the control socket, DNS over TCP (128 clients),
	// extra upstream connections of inspected tunnels, files.
	maxReserve = 512
	// fdsPerConn is what an admitted connection costs: the client and its
	// upstream.
	fdsPerConn = 2
	// recount bounds how stale the descriptor count may get.
	recount = 100 * time.Millisecond
	// eventEvery spaces refusal events; the ones in between are counted
	// in the next one's suppressed field.
	eventEvery = time.Second
)

// Admission bounds what one sandbox's listeners hold at once: at most max
// connections between them, and never so many descriptors that the
// supervisor could not serve its control socket and DNS. A nil Admission
// admits everything. It is safe for concurrent use.
type Admission struct {
	max      int64
	active   atomic.Int64
	refusing chan struct{}
	fds      fdBudget
	audit    *audit.Logger
	log      *slog.Logger

	mu         sync.Mutex
	lastEvent  time.Time
	suppressed uint64
}

// NewAdmission allows max concurrent connections (0: no count limit, only
// the descriptor reserve). It raises the process's soft descriptor limit to
// the hard one, as Go's runtime already does at start-up (the children's
// limit is restored by os/exec), and reserves part of it.
func NewAdmission(max int, a *audit.Logger, log *slog.Logger) *Admission {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	limit := raiseNofile()
	reserve := min(maxReserve, limit/4)
	adm := &Admission{max: int64(max), refusing: make(chan struct{}, maxRefusing), audit: a, log: log}
	adm.fds.limit = limit - reserve
	if room := adm.fds.limit / fdsPerConn; max > 0 && room < max {
		log.Warn("the supervisor's descriptor limit bounds concurrent connections below the policy's",
			"connections", max, "room", room, "nofile", limit, "reserve", reserve)
	}
	return adm
}

// raiseNofile sets the soft RLIMIT_NOFILE to the hard limit and returns the
// soft limit in force.
func raiseNofile() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = want.Max
		if unix.Setrlimit(unix.RLIMIT_NOFILE, &want) == nil {
			rl = want
		}
	}
	return int(min(rl.Cur, 1<<30))
}

// admit takes a slot for c, or says why not.
func (a *Admission) admit(via string, c net.Conn) string {
	if a == nil {
		return ""
	}
	why := ""
	if n := a.active.Add(1); a.max > 0 && n > a.max {
		why = egress.ReasonConnLimit
	} else if !a.fds.take(fdsPerConn) {
		why = egress.ReasonFDReserve
	}
	if why != "" {
		a.active.Add(-1)
		a.event(via, c, why)
	}
	return why
}

func (a *Admission) release() {
	if a != nil {
		a.active.Add(-1)
	}
}

// Active is the number of connections admitted and not yet ended.
func (a *Admission) Active() int { return int(a.active.Load()) }

// refuse runs the listener's refusal without holding up the accept loop,
// or resets c when too many refusals are already being written.
func (a *Admission) refuse(c net.Conn, why string, refuse func(net.Conn, string)) {
	select {
	case a.refusing <- struct{}{}:
		go func() {
			defer func() { <-a.refusing }()
			refuse(c, why)
		}()
	default:
		Reset(c)
	}
}

// event records a refusal, at most one per eventEvery: a workload that
// keeps opening connections at the limit must not flood the audit log.
func (a *Admission) event(via string, c net.Conn, why string) {
	a.mu.Lock()
	now := time.Now()
	if !a.lastEvent.IsZero() && now.Sub(a.lastEvent) < eventEvery {
		a.suppressed++
		a.mu.Unlock()
		return
	}
	a.lastEvent = now
	suppressed := a.suppressed
	a.suppressed = 0
	a.mu.Unlock()

	detail := fmt.Sprintf("the sandbox holds %d connections, the policy's limits.connections", a.max)
	if why == egress.ReasonFDReserve {
		detail = "the supervisor is near its descriptor limit and keeps the rest for DNS and control"
	}
	if a.audit != nil {
		a.audit.Log(audit.NetAdmissionDeniedEvent{Via: via, Source: c.RemoteAddr().String(), Reason: why, Detail: detail,
			Active: a.active.Load(), Limit: a.max, Suppressed: suppressed})
	}
	a.log.Warn("network connection refused: too many connections", "via", via, "reason", why, "detail", detail, "suppressed", suppressed)
}

// Reset closes c with an RST where it is TCP, so a client sees a refusal
// rather than a clean end.
func Reset(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		l.SetLinger(0)
	}
	c.Close()
}

// fdBudget tracks how many descriptors the process has open, counting
// /proc/self/fd at most every recount and adding what it admitted since.
type fdBudget struct {
	limit int // descriptors that may be in use; the rest is reserve

	mu      sync.Mutex
	est     int
	counted time.Time
}

func (b *fdBudget) take(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit <= 0 {
		return true
	}
	// Near the limit a fresh count decides, since connections that ended
	// since the last count freed descriptors; but not more than every
	// few milliseconds, or a flood at the limit would spend its time here.
	stale := time.Since(b.counted)
	if stale > recount || (b.est+n > b.limit && stale > 5*time.Millisecond) {
		b.est = openFDs(b.limit)
		b.counted = time.Now()
	}
	if b.est+n > b.limit {
		return false
	}
	b.est += n
	return true
}

// openFDs counts this process's open descriptors without allocating per
// entry; when even the directory cannot be opened there are none to spare.
func openFDs(full int) int {
	fd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return full
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	n := 0
	for {
		m, err := unix.Getdents(fd, buf)
		if err != nil {
			return full
		}
		if m <= 0 {
			break
		}
		for off := 0; off < m; {
			reclen := int(buf[off+16]) | int(buf[off+17])<<8
			if reclen == 0 {
				break
			}
			n++
			off += reclen
		}
	}
	// ".", ".." and the directory's own descriptor.
	return n - 3
}
