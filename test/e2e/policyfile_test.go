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
// to rewrite it, replace it, move it away, or move away the directory
// that holds it and build the path again.
func TestPolicyFileInWorkdirIsReadOnly(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, rel := range []string{"policy.yaml", ".corral/policy.yaml"} {
			fx := newFixture(t, m)
			pol := systemPolicy("")
			p := filepath.Join(fx.W, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			writeOwned(t, m, p, []byte(pol), 0o644)
			if err := chownTree(fx.W, m.uid, m.gid); err != nil {
				t.Fatal(err)
			}
			script := `f=` + rel + `
echo 'sandbox: disabled' >> $f; echo append=$?
printf 'version: 1\nsandbox: disabled\n' > p2 && mv -f p2 $f; echo replace=$?
mv $f moved.yaml; echo move=$?
rm -f $f; echo remove=$?
if [ "$f" != policy.yaml ]; then mv .corral .corral-old && mkdir .corral && printf 'version: 1\nsandbox: disabled\n' > $f; echo swap=$?; fi
echo done`
			r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", script}, flags: []string{"--policy", p}})
			if r.code != 0 || !strings.Contains(r.stdout, "done") {
				t.Fatalf("%s: the script did not run through\n%s", rel, r)
			}
			for _, op := range []string{"append=0", "replace=0", "move=0", "remove=0", "swap=0"} {
				if strings.Contains(r.stdout, op) {
					t.Errorf("%s: the workload changed its policy file (%s)\n%s", rel, op, r)
				}
			}
			if got, err := os.ReadFile(p); err != nil || string(got) != pol {
				t.Errorf("%s: the policy file on the host is now %q (%v), want it unchanged", rel, got, err)
			}
		}
	})
}
