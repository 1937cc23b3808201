package e2e

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// traceLine is one step of corral run --trace: when it ended, how long it
// took, and its name.
var traceLine = regexp.MustCompile(`^trace +(-?[0-9.]+)ms +\+(-?[0-9.]+)ms  (.+)$`)

// TestStartupTrace runs `corral run --trace -- true` (and the same with
// CORRAL_TRACE=1) and checks that every stage's steps reach stderr on one
// timeline: the supervisor's and the init's, each once, the set-up's
// before the workload is reported running and the exit's after it, in
// order. Without either, nothing is traced.
func TestStartupTrace(t *testing.T) {
	supervisor := []string{"corral started", "audit log opened", "policy loaded", "plan built", "policy compiled", "run directory", "scratch",
		"cgroup", "init started (clone with namespaces)", "control socket", "workload running"}
	stages := []string{"init: process started", "init: config received", "init: root filesystem (mounts)",
		"init: terminal, read-only /proc", "init: command found", "init: capabilities",
		"init: landlock", "init: seccomp, verified", "init: workload exec'd and verified"}
	// The init's own "workload exited" may come before the supervisor
	// has reported the workload running: `true` is that quick.
	exit := []string{"init exited, namespaces torn down", "cleaned up (cgroup, run directory)", "audit flushed, corral exiting"}
	proxy := []string{"egress prepared (decision index, sandbox CA, model routes)", "CA files written",
		"listeners received, egress serving"}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		// Rootless the init makes the capture in its namespace; as root
		// the supervisor's threads make the namespace, loopback and
		// capture, and the init does neither.
		capture := []string{"init: capture rules, listeners handed to the supervisor"}
		notCapture := []string{"capture rules, listeners (supervisor's capture thread)"}
		var namespace []string
		if !m.rootless {
			capture, notCapture = notCapture, capture
			namespace = []string{"network namespace, loopback (supervisor's init thread)"}
		}
		for _, tc := range []struct {
			name   string
			policy string // "" is the built-in default: proxy mode
			flags  []string
			env    []string
			want   []string
			absent []string
		}{
			{name: "proxy", flags: []string{"--trace"}, want: concat(supervisor, stages, proxy, capture, namespace), absent: notCapture},
			{name: "block-env", policy: systemPolicy(""), env: []string{"CORRAL_TRACE=1"}, want: concat(supervisor, stages, namespace),
				absent: concat(proxy, capture, notCapture)},
			{name: "off", policy: systemPolicy("")},
		} {
			t.Run(tc.name, func(t *testing.T) {
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{args: []string{"true"}, policy: tc.policy, flags: tc.flags, env: tc.env})
				if r.code != 0 {
					t.Fatalf("want exit 0\n%s", r)
				}
				steps := map[string]float64{}
				for _, l := range strings.Split(r.stderr, "\n") {
					if !strings.HasPrefix(l, "trace") {
						continue
					}
					mm := traceLine.FindStringSubmatch(l)
					if mm == nil {
						t.Fatalf("malformed trace line %q\n%s", l, r)
					}
					at, _ := strconv.ParseFloat(mm[1], 64)
					took, _ := strconv.ParseFloat(mm[2], 64)
					// One timeline: no step ends before the run began
					// or takes longer than the run so far.
					if at <= 0 || took < 0 || took > at || at > r.elapsed.Seconds()*1000 {
						t.Errorf("step %q at %.1fms taking %.1fms does not fit a run of %v", mm[3], at, took, r.elapsed)
					}
					if _, dup := steps[mm[3]]; dup {
						t.Errorf("step %q traced twice", mm[3])
					}
					steps[mm[3]] = at
				}
				if tc.want == nil && len(steps) > 0 {
					t.Fatalf("traced without --trace or %s:\n%s", "CORRAL_TRACE", r.stderr)
				}
				running := -1.0
				for name, at := range steps {
					if name == "workload running" {
						running = at
					}
				}
				for _, w := range tc.want {
					at, ok := findStep(steps, w)
					if !ok {
						t.Errorf("no trace step %q\n%s", w, r.stderr)
					} else if at > running {
						t.Errorf("step %q at %.1fms comes after the workload was reported running (%.1fms)", w, at, running)
					}
				}
				last := running
				for _, w := range exit {
					if tc.want == nil {
						break
					}
					at, ok := findStep(steps, w)
					switch {
					case !ok:
						t.Errorf("no trace step %q\n%s", w, r.stderr)
					case at < last:
						t.Errorf("exit step %q at %.1fms comes before the one it follows (%.1fms)\n%s", w, at, last, r.stderr)
					}
					last = at
				}
				if at, ok := findStep(steps, "init: workload exited"); tc.want != nil && (!ok || at < steps["init: workload exec'd and verified"]) {
					t.Errorf("the init's \"workload exited\" is missing or before the exec\n%s", r.stderr)
				}
				for _, a := range tc.absent {
					if _, ok := findStep(steps, a); ok {
						t.Errorf("step %q traced, which this mode and policy do not have", a)
					}
				}
			})
		}
	})
}

func concat(s ...[]string) []string {
	var out []string
	for _, x := range s {
		out = append(out, x...)
	}
	return out
}

// findStep finds the step named part, or else one whose name contains it.
func findStep(steps map[string]float64, part string) (float64, bool) {
	if at, ok := steps[part]; ok {
		return at, true
	}
	for name, at := range steps {
		if strings.Contains(name, part) {
			return at, true
		}
	}
	return 0, false
}

// TestInitProgram: corral runs the sandbox's init from the program it
// carries for the mode (corral-init as root, corral-netinit rootless),
// written once to the state directory, and a corral built without
// it (tag corral_selfinit) re-executes itself as the init with the same
// result: the workload runs confined and cannot signal its init.
func TestInitProgram(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, tc := range []struct {
			name, bin string
			carried   bool
		}{{"carried", corralBin, true}, {"self", selfInitBin, false}} {
			t.Run(tc.name, func(t *testing.T) {
				fx := newFixture(t, m)
				attack := filepath.Join(fx.W, "attack")
				copyFile(t, attackBin, attack, 0o755)
				r := runCorral(t, fx, runOpts{bin: tc.bin, args: []string{attack, "signal-init-all"}})
				if r.code != 3 || !strings.Contains(r.stdout, "BLOCKED") {
					t.Fatalf("want the init out of the workload's reach (exit 3, BLOCKED)\n%s", r)
				}
				// As root the supervisor makes the network and the init
				// that leaves it out runs; rootless, the one that makes it.
				want := "corral-init-"
				if m.rootless {
					want = "corral-netinit-"
				}
				progs, _ := filepath.Glob(filepath.Join(fx.state, "bin", "corral-*init-*"))
				if tc.carried && (len(progs) != 1 || !strings.HasPrefix(filepath.Base(progs[0]), want)) {
					t.Fatalf("want one init program, %s*, in %s/bin, found %v", want, fx.state, progs)
				}
				if !tc.carried && len(progs) != 0 {
					t.Fatalf("a corral without an init program wrote %v", progs)
				}
			})
		}
	})
}

// Garbage collection is paused while corral sets a sandbox up; the
// supervisor of a caged run must resume it once the workload runs, or a
// long session would collect nothing until its heap reached the backstop.
func TestCollectionResumesWhenRunning(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, tc := range []struct{ name, policy string }{{"proxy", ""}, {"block", systemPolicy("")}} {
			t.Run(tc.name, func(t *testing.T) {
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{args: []string{"true"}, policy: tc.policy, flags: []string{"--log-level", "debug"}})
				if r.code != 0 {
					t.Fatalf("want exit 0\n%s", r)
				}
				running := strings.Index(r.stderr, "msg=\"workload running\"")
				resumed := strings.Index(r.stderr, "garbage collection resumed")
				if running < 0 || resumed < running {
					t.Errorf("collection was not resumed once the workload ran\n%s", r.stderr)
				}
			})
		}
	})
}
