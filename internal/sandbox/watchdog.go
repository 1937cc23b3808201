package sandbox

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// watchdog forwards the user's signals to the workload and enforces the
// walltime: SIGTERM, then SIGKILL after Grace. It returns when done closes,
// reporting whether the walltime fired.
type watchdog struct {
	sigs     <-chan os.Signal     // from catchSignals
	signal   func(syscall.Signal) // deliver a signal to the workload
	resize   func()               // SIGWINCH: follow the user's terminal size
	walltime time.Duration        // measured from start; 0 = none
	start    time.Time
	log      *slog.Logger
}

// catchSignals starts catching the signals corral forwards. It is called
// before the workload starts: a signal that arrived in between would
// otherwise kill corral itself instead of reaching the workload.
func catchSignals() (<-chan os.Signal, func()) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGWINCH)
	return sigs, func() { signal.Stop(sigs) }
}

func (w watchdog) run(ctx context.Context, done <-chan struct{}) (timedOut bool) {
	sigs := w.sigs

	var deadline, grace <-chan time.Time
	if w.walltime > 0 {
		t := time.NewTimer(w.walltime - time.Since(w.start))
		defer t.Stop()
		deadline = t.C
	}
	stop := func() {
		w.signal(unix.SIGTERM)
		grace = time.After(Grace)
	}
	for {
		select {
		case sig := <-sigs:
			if sig == unix.SIGWINCH {
				if w.resize != nil {
					w.resize()
				}
				continue
			}
			w.signal(sig.(syscall.Signal))
		case <-ctx.Done():
			stop()
		case <-deadline:
			timedOut = true
			w.log.Warn("walltime exceeded; stopping the workload", "walltime", w.walltime, "grace", Grace)
			stop()
		case <-grace:
			w.signal(unix.SIGKILL)
		case <-done:
			return timedOut
		}
	}
}
