//go:build linux

package landlock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Landlock cannot be lifted once applied, so the kernel tests run Apply in a
// re-executed copy of the test binary, which reports what it could do.
const (
	childEnv = "CORRAL_LANDLOCK_TEST_CHILD" // scenario name
	dirAEnv  = "CORRAL_LANDLOCK_TEST_A"     // granted read-only
	dirBEnv  = "CORRAL_LANDLOCK_TEST_B"     // granted read-write
	outsEnv  = "CORRAL_LANDLOCK_TEST_OUTSIDE"
)

func TestMain(m *testing.M) {
	if scenario := os.Getenv(childEnv); scenario != "" {
		os.Exit(childMain(scenario))
	}
	os.Exit(m.Run())
}

// childReport is what the child prints as JSON: the Apply outcome and the
// errno name ("OK" for success) of each attempted operation.
type childReport struct {
	Result Result
	Err    string
	Ops    map[string]string
}

func errName(err error) string {
	if err == nil {
		return "OK"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func childMain(scenario string) int {
	a, b, outside := os.Getenv(dirAEnv), os.Getenv(dirBEnv), os.Getenv(outsEnv)
	rep := childReport{Ops: map[string]string{}}

	// A thread that exists before Apply must end up restricted too.
	req, done := make(chan func() error), make(chan error)
	go func() {
		runtime.LockOSThread()
		for f := range req {
			done <- f()
		}
	}()
	onOtherThread := func(f func() error) error { req <- f; return <-done }
	onOtherThread(func() error { return nil })

	runtime.LockOSThread()
	var cfg Config
	switch scenario {
	case "enforce":
		cfg = Config{ReadOnly: []string{a}, ReadWrite: []string{b}, Compat: HardRequirement}
	case "missing_hard":
		cfg = Config{ReadOnly: []string{a, filepath.Join(a, "missing")}, Compat: HardRequirement}
	case "missing_best_effort":
		cfg = Config{ReadOnly: []string{a, filepath.Join(a, "missing")}, ReadWrite: []string{b}, Compat: BestEffort}
	default:
		fmt.Fprintln(os.Stderr, "unknown scenario", scenario)
		return 2
	}
	_, statErr := os.Stat("/etc/hostname")
	res, err := Apply(cfg)
	rep.Result = res
	if err != nil {
		rep.Err = err.Error()
	} else {
		write := func(path string) func() error {
			return func() error { return os.WriteFile(path, []byte("x"), 0o644) }
		}
		read := func(path string) error { _, err := os.ReadFile(path); return err }
		rep.Ops["write_ro"] = errName(write(filepath.Join(a, "new"))())
		rep.Ops["read_ro"] = errName(read(filepath.Join(a, "existing")))
		rep.Ops["write_rw"] = errName(write(filepath.Join(b, "new"))())
		rep.Ops["rename_rw_across_dirs"] = errName(os.Rename(filepath.Join(b, "x", "f"), filepath.Join(b, "y", "f")))
		rep.Ops["read_unlisted"] = errName(read(outside))
		if statErr == nil {
			rep.Ops["read_etc_hostname"] = errName(read("/etc/hostname"))
		}
		rep.Ops["write_ro_other_thread"] = errName(onOtherThread(write(filepath.Join(a, "new2"))))
		rep.Ops["read_unlisted_other_thread"] = errName(onOtherThread(func() error { return read(outside) }))
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

func runChild(t *testing.T, scenario string) childReport {
	t.Helper()
	a, b := t.TempDir(), t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	for _, f := range []struct{ path, data string }{
		{filepath.Join(a, "existing"), "ro"},
		{filepath.Join(b, "x", "f"), "rw"},
		{outside, "secret"},
	} {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.path, []byte(f.data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(b, "y"), 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+scenario, dirAEnv+"="+a, dirBEnv+"="+b, outsEnv+"="+outside)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child %s: %v\nstderr: %s", scenario, err, stderr.String())
	}
	var rep childReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("child %s: %v in %q", scenario, err, stdout.String())
	}
	t.Logf("child %s: %+v", scenario, rep)
	return rep
}

func requireLandlock(t *testing.T) int {
	t.Helper()
	abi, err := probeABI()
	if abi == 0 {
		t.Skipf("Landlock unavailable: %v", err)
	}
	if testing.Short() {
		t.Skip("kernel tests re-exec the test binary; skipped in -short mode")
	}
	return abi
}

func TestKernelEnforce(t *testing.T) {
	abi := requireLandlock(t)
	rep := runChild(t, "enforce")
	if rep.Err != "" {
		t.Fatalf("Apply: %s", rep.Err)
	}
	if rep.Result.ABI != min(abi, maxABI) || len(rep.Result.Skipped) != 0 || len(rep.Result.Rules) != 2 {
		t.Errorf("unexpected result %+v (kernel ABI %d)", rep.Result, abi)
	}
	want := map[string]string{
		"write_ro":                   "EACCES",
		"read_ro":                    "OK",
		"write_rw":                   "OK",
		"rename_rw_across_dirs":      "OK",
		"read_unlisted":              "EACCES",
		"write_ro_other_thread":      "EACCES",
		"read_unlisted_other_thread": "EACCES",
	}
	if _, err := os.ReadFile("/etc/hostname"); err == nil {
		want["read_etc_hostname"] = "EACCES"
	}
	if abi < 2 {
		want["rename_rw_across_dirs"] = "EXDEV" // ABI 1 forbids reparenting outright
	}
	for op, w := range want {
		if got := rep.Ops[op]; got != w {
			t.Errorf("%s: got %s, want %s", op, got, w)
		}
	}
}

func TestKernelMissingHardRequirement(t *testing.T) {
	requireLandlock(t)
	rep := runChild(t, "missing_hard")
	if !strings.Contains(rep.Err, "missing") || !strings.Contains(rep.Err, "does not exist") {
		t.Fatalf("Apply error %q, want one naming the missing path", rep.Err)
	}
	if len(rep.Ops) != 0 {
		t.Errorf("child went on after a failed Apply: %v", rep.Ops)
	}
}

func TestKernelMissingBestEffort(t *testing.T) {
	requireLandlock(t)
	rep := runChild(t, "missing_best_effort")
	if rep.Err != "" {
		t.Fatalf("Apply: %s", rep.Err)
	}
	if len(rep.Result.Skipped) != 1 || !strings.HasSuffix(rep.Result.Skipped[0].Path, "/missing") ||
		rep.Result.Skipped[0].Reason != "does not exist" {
		t.Errorf("skipped = %+v, want the missing path with reason %q", rep.Result.Skipped, "does not exist")
	}
	for op, w := range map[string]string{"write_ro": "EACCES", "write_rw": "OK", "read_unlisted": "EACCES"} {
		if got := rep.Ops[op]; got != w {
			t.Errorf("%s: got %s, want %s", op, got, w)
		}
	}
}

func TestBestABIMatchesProbe(t *testing.T) {
	got := BestABI()
	want, _ := probeABI()
	if got != want || got < 0 {
		t.Errorf("BestABI() = %d, probe = %d", got, want)
	}
}
