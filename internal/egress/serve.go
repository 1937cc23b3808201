package egress

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// Serve accepts on l until ctx is done or l is closed (both return nil) and
// runs handle for each connection in its own goroutine. Accept errors such
// as EMFILE are retried with a growing pause, so running out of descriptors
// lets open tunnels finish instead of stopping the listener.
func Serve(ctx context.Context, l net.Listener, log *slog.Logger, name string, handle func(context.Context, net.Conn)) error {
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
		go handle(ctx, c)
	}
}
