package cli

import (
	"runtime/debug"
	"sync"
)

// setupHeapLimit bounds the heap while collection is paused: set-up holds a
// few MiB (BenchmarkSupervisorRSS: about 26 MiB resident, idle), so only a
// policy far beyond any real one would reach it, and then the collector
// runs as usual.
const setupHeapLimit = 256 << 20

// pauseGC stops garbage collection until the returned func is called, so
// no collection runs while the sandbox is set up: on a small virtual
// machine each one costs the start milliseconds (`corral run --trace`,
// "workload running", with and without). It resumes as the workload starts: held
// for a second longer, the proxy's first requests each took fresh heap
// pages and inspected HTTPS fell from 0.41x to 0.36x of direct
// (BenchmarkInspectedRequests). A GOMEMLIMIT below setupHeapLimit still
// holds. What set-up leaves on the heap stays under the first collection's
// trigger (a few MB), so a short command runs with no collection at all:
// one started at resume ran beside the init and the workload on the same
// cores (GODEBUG=gctrace=1 shows whether one did).
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
