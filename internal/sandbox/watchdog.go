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
	// after is the clock; nil means time.After.
	after func(time.Duration) <-chan time.Time
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
	after := w.after
	if after == nil {
		after = time.After
	}
	sigs, cancelled := w.sigs, ctx.Done()
	var deadline, grace <-chan time.Time
	if w.walltime > 0 {
		deadline = after(w.walltime - time.Since(w.start))
	}
	// stop asks once and arms the one SIGKILL; a second reason to stop
	// (the walltime after a cancel) changes neither.
	stopping := false
	stop := func() {
		if stopping {
			return
		}
		stopping = true
		w.signal(unix.SIGTERM)
		grace = after(Grace)
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
		case <-cancelled:
			// A closed channel stays ready: take it out of the select.
			cancelled = nil
			stop()
		case <-deadline:
			deadline = nil
			timedOut = true
			w.log.Warn("walltime exceeded; stopping the workload", "walltime", w.walltime, "grace", Grace)
			stop()
		case <-grace:
			grace = nil
			w.signal(unix.SIGKILL)
		case <-done:
			return timedOut
		}
	}
}
