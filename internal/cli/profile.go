package cli

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// cpuProfileEnv names a file to write the CPU profile of one `corral run`
// to (for `go tool pprof`), set-up and proxy both: the supervisor is a
// process of its own, out of reach of a benchmark's -cpuprofile.
const cpuProfileEnv = "CORRAL_CPUPROFILE"

// startCPUProfile starts the profile cpuProfileEnv asks for; the returned
// func ends it. A profile that cannot be written is reported and skipped:
// it is a developer's aid, never part of the sandbox.
func startCPUProfile(warn func(string)) (stop func()) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		warn(fmt.Sprintf("%s=%s: no CPU profile: %v", cpuProfileEnv, path, err))
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
