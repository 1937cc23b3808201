package initbin

import (
	"os"
	"path/filepath"
	"testing"
)

// Both inits go generate built are carried and written where Path says,
// each only when asked for; how carried programs are written and trusted is
// internal/carried's to test.
func TestCarriesTheInits(t *testing.T) {
	for _, network := range []bool{false, true} {
		prog, other := program, netProgram
		if network {
			prog, other = netProgram, program
		}
		name, err := prog.Name()
		if err != nil {
			t.Fatal(err)
		}
		if name == "" {
			if os.Getenv("CORRAL_NO_SKIP") != "" {
				t.Fatalf("this test binary carries no %s program: run go generate ./internal/sandbox/initbin first (.ci/run does)", prog.Prefix)
			}
			t.Skipf("no %s program carried: go generate ./internal/sandbox/initbin was not run", prog.Prefix)
		}
		state := t.TempDir()
		p, err := Path(state, network)
		if err != nil || p != filepath.Join(state, "bin", name) {
			t.Fatalf("Path(network %v) = %s, %v; want %s under %s/bin", network, p, err, name, state)
		}
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Fatalf("the init was not written: %v", err)
		}
		otherName, _ := other.Name()
		if _, err := os.Stat(filepath.Join(state, "bin", otherName)); err == nil {
			t.Errorf("Path(network %v) also wrote %s", network, otherName)
		}
	}
}
