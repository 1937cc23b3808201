package initbin

import (
	"os"
	"path/filepath"
	"testing"
)

// The init go generate built is carried and written where Path says; how
// carried programs are written and trusted is internal/carried's to test.
func TestCarriesTheInit(t *testing.T) {
	name, err := program.Name()
	if err != nil {
		t.Fatal(err)
	}
	if name == "" {
		if os.Getenv("CORRAL_NO_SKIP") != "" {
			t.Fatal("this test binary carries no init program: run go generate ./internal/sandbox/initbin first (.ci/run does)")
		}
		t.Skip("no init program carried: go generate ./internal/sandbox/initbin was not run")
	}
	state := t.TempDir()
	p, err := Path(state)
	if err != nil || p != filepath.Join(state, "bin", name) {
		t.Fatalf("Path = %s, %v; want %s under %s/bin", p, err, name, state)
	}
	if st, err := os.Stat(p); err != nil || st.Size() == 0 {
		t.Fatalf("the init was not written: %v", err)
	}
}
