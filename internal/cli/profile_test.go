package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStartCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	t.Setenv(cpuProfileEnv, path)
	var warned []string
	stop := startCPUProfile(func(m string) { warned = append(warned, m) })
	stop()
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("profile %s: %v (warnings %q)", path, err, warned)
	}

	// A path that cannot be written is reported, never fatal.
	t.Setenv(cpuProfileEnv, filepath.Join(t.TempDir(), "missing", "cpu.prof"))
	startCPUProfile(func(m string) { warned = append(warned, m) })()
	if len(warned) != 1 || !strings.Contains(warned[0], cpuProfileEnv) {
		t.Errorf("warnings = %q, want one naming %s", warned, cpuProfileEnv)
	}

	t.Setenv(cpuProfileEnv, "")
	startCPUProfile(func(m string) { t.Errorf("unset: warned %q", m) })()
}
