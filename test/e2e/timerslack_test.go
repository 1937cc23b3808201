package e2e

import (
	"strconv"
	"strings"
	"testing"
)

// TestWorkloadKeepsTimerSlack: corral's threads and the init sleep with a
// wider timer slack than a program normally has (timerslack), and the
// workload must not inherit it: caged or not, it gets the slack corral was
// started with, here one no default would give.
func TestWorkloadKeepsTimerSlack(t *testing.T) {
	t.Parallel()
	const slack = 73_000
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, c := range []struct {
			name  string
			flags []string
		}{
			{"caged", nil},
			{"uncaged", []string{"--no-sandbox"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				fx := newFixture(t, m)
				// cat, the shell's child, reads its own: no process may
				// read another's without CAP_SYS_NICE.
				r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "cat /proc/self/timerslack_ns; true"},
					flags: c.flags, timerSlack: slack})
				if r.code != 0 || strings.TrimSpace(r.stdout) != strconv.Itoa(slack) {
					t.Fatalf("the workload should have corral's timer slack, %d ns\n%s", slack, r)
				}
			})
		}
	})
}
