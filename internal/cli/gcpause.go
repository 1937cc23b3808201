package cli

import (
	"runtime/debug"
	"sync"
	"time"
)

// setupHeapLimit bounds the heap while collection is paused: set-up holds a
// few MiB (measured: the whole supervisor's RSS stays near 25 MiB), so only
// a policy far beyond any real one would reach it, and then the collector
// runs as usual.
const setupHeapLimit = 256 << 20

// collectAfterStart is how long after the workload starts collection
// resumes. Most commands an agent runs end sooner, and their supervisor then
// exits without ever collecting; resuming at the start itself would run a
// collection beside the workload's own start.
const collectAfterStart = time.Second

// pauseGC stops garbage collection until the returned func is called, so
// no collection runs while the sandbox is set up: on a small virtual
// machine one costs the start about 10 ms (`corral run --trace`, "workload
// running", with and without). A GOMEMLIMIT below setupHeapLimit still
// holds.
func pauseGC() (resume func()) {
	percent := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(min(limit, setupHeapLimit))
	var once sync.Once
	return func() {
		once.Do(func() {
			debug.SetGCPercent(percent)
			debug.SetMemoryLimit(limit)
		})
	}
}
