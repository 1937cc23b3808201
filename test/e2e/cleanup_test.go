package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"
)

// These tests are not parallel: each one's corral runs sweep host state, and
// a test that kills a supervisor must find its leftovers undisturbed.

// TestCleanupAfterSupervisorKill: kill -9 of the supervisor takes the
// workload with it, and the next run in the same state dir sweeps what the
// dead run left behind and says so.
func TestCleanupAfterSupervisorKill(t *testing.T) {
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		state := filepath.Join(newDir(t, m, "state-"), "corral")
		p, n, _ := startSleeper(t, fx, runOpts{state: state})
		started := readEvents(t, p.audit)
		id := ""
		for _, e := range started {
			if e["event"] == "sandbox.start" {
				id = fmt.Sprint(e["sandbox_id"])
			}
		}
		if id == "" {
			t.Fatalf("no sandbox.start event while the workload runs")
		}
		runDir := filepath.Join(state, "run", id)
		if _, err := os.Stat(runDir); err != nil {
			t.Fatalf("a live sandbox has no run directory %s: %v", runDir, err)
		}
		if !m.rootless && len(existing(cgroupDirs(id))) == 0 {
			t.Fatalf("a live root-mode sandbox has no cgroup in %v", cgroupDirs(id))
		}

		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		gone := time.Now().Add(3 * time.Second)
		for len(hostProcs("/bin/sleep", n)) > 0 {
			if time.Now().After(gone) {
				t.Fatalf("the workload (pids %v) outlived its SIGKILLed supervisor by 3 s", hostProcs("/bin/sleep", n))
			}
			time.Sleep(20 * time.Millisecond)
		}
		<-p.done

		r := runCorral(t, fx, runOpts{args: []string{fx.attack, "exit", "0"}, state: state})
		if r.code != 0 {
			t.Fatalf("the run after the kill failed\n%s", r)
		}
		if !regexp.MustCompile(`(?i)(stale|removed).*` + id).MatchString(r.stderr) {
			t.Fatalf("the sweep of %s was not reported on stderr\n%s", id, r)
		}
		r.requireEvent(t, "sandbox.stale_swept", map[string]any{"stale_sandbox_id": id})
		if _, err := os.Lstat(runDir); err == nil {
			t.Fatalf("stale run directory %s is still there", runDir)
		}
		if left := existing(cgroupDirs(id)); len(left) > 0 {
			t.Fatalf("stale cgroups still there: %v", left)
		}
	})
}

// TestSweepSparesOtherStateDirs: a run with its own --state-dir must not
// treat a live sandbox of another state dir as stale. Two users or two
// tools with different state dirs on one machine must not kill each other.
func TestSweepSparesOtherStateDirs(t *testing.T) {
	m := getRootMode(t)
	fx := newFixture(t, m)
	stateA := filepath.Join(newDir(t, m, "stateA-"), "corral")
	stateB := filepath.Join(newDir(t, m, "stateB-"), "corral")
	a := startCorral(t, fx, runOpts{args: []string{fx.attack, "sleep", "3"}, state: stateA})

	b := runCorral(t, fx, runOpts{args: []string{fx.attack, "exit", "0"}, state: stateB})
	if b.code != 0 {
		t.Fatalf("run B failed\n%s", b)
	}
	ra := a.wait()
	if ra.code != 0 {
		t.Fatalf("a run in state dir B killed the live sandbox of state dir A (B swept %v)\nA: %s\nB: %s",
			b.find("sandbox.stale_swept"), ra, b)
	}
}

// TestConcurrentStartsShareStateDir starts many runs at once in one state
// dir, as parallel agents or CI jobs would. Each must run its command. The
// race it looks for is narrow, so it tries a few rounds.
func TestConcurrentStartsShareStateDir(t *testing.T) {
	forEachMode(t, false, func(t *testing.T, m *mode) {
		state := filepath.Join(newDir(t, m, "state-"), "corral")
		const n, rounds = 24, 3
		fxs := make([]*fixture, n)
		for i := range fxs {
			fxs[i] = newFixture(t, m)
		}
		for round := 0; round < rounds && !t.Failed(); round++ {
			var wg sync.WaitGroup
			results := make([]*result, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p := startCorral(t, fxs[i], runOpts{args: []string{fxs[i].attack, "exit", "0"}, state: state})
					results[i] = p.wait()
				}()
			}
			wg.Wait()
			for _, r := range results {
				if r == nil {
					t.Errorf("a concurrent run could not be started or waited for")
				} else if r.code != 0 {
					t.Errorf("one of %d concurrent runs in one state dir failed (round %d)\n%s", n, round+1, r)
				}
			}
		}
	})
}
