package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A policy file in the working directory (`corral policy default >
// policy.yaml`, then `corral run --policy policy.yaml`) chooses the cage of
// every later run of the same command line: the workload must not be able
// to rewrite it, replace it or move it away.
func TestPolicyFileInWorkdirIsReadOnly(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		pol := systemPolicy("")
		p := filepath.Join(fx.W, "policy.yaml")
		writeOwned(t, m, p, []byte(pol), 0o644)
		script := `echo 'sandbox: disabled' >> policy.yaml; echo append=$?
printf 'version: 1\nsandbox: disabled\n' > p2 && mv -f p2 policy.yaml; echo replace=$?
mv policy.yaml moved.yaml; echo move=$?
rm -f policy.yaml; echo remove=$?
echo done`
		r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", script}, flags: []string{"--policy", p}})
		if r.code != 0 || !strings.Contains(r.stdout, "done") {
			t.Fatalf("the script did not run through\n%s", r)
		}
		for _, op := range []string{"append=0", "replace=0", "move=0", "remove=0"} {
			if strings.Contains(r.stdout, op) {
				t.Errorf("the workload changed its policy file (%s)\n%s", op, r)
			}
		}
		if got, err := os.ReadFile(p); err != nil || string(got) != pol {
			t.Errorf("the policy file on the host is now %q (%v), want it unchanged", got, err)
		}
	})
}
