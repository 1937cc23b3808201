package cli

import (
	"runtime/debug"
	"testing"
)

func TestPauseGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(77))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(64 << 20))

	resume := pauseGC()
	if got := debug.SetGCPercent(-1); got != -1 {
		t.Errorf("GC percent during set-up = %d, want -1 (paused)", got)
	}
	// A limit the user set below the backstop is kept.
	if got := debug.SetMemoryLimit(-1); got != 64<<20 {
		t.Errorf("memory limit during set-up = %d, want the user's 64 MiB", got)
	}
	resume()
	resume() // a second call (the deferred one after Running) changes nothing
	if got := debug.SetGCPercent(-1); got != 77 {
		t.Errorf("GC percent after resume = %d, want 77", got)
	}
	debug.SetGCPercent(77)
	if got := debug.SetMemoryLimit(-1); got != 64<<20 {
		t.Errorf("memory limit after resume = %d, want 64 MiB", got)
	}

	debug.SetMemoryLimit(1 << 40)
	resume = pauseGC()
	if got := debug.SetMemoryLimit(-1); got != setupHeapLimit {
		t.Errorf("memory limit during set-up = %d, want the backstop %d", got, setupHeapLimit)
	}
	resume()
	if got := debug.SetMemoryLimit(-1); got != 1<<40 {
		t.Errorf("memory limit after resume = %d, want 1 TiB back", got)
	}
}
