package fleet

import (
	"testing"

	"github.com/corral-sandbox/corral/internal/cli"
)

// The lean corral shows a stand-in for each of these commands, with the
// summary cli keeps for it; one missing there would be unreachable from the
// corral users run.
func TestEveryCommandHasALeanStandIn(t *testing.T) {
	for _, parent := range []string{"", "policy"} {
		for _, c := range commands(parent) {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("corral %s %s: no stand-in in the lean corral: %v", parent, c.Name(), r)
					}
				}()
				if short := cli.FullShort(parent, c.Name()); c.Short != short {
					t.Errorf("corral %s %s: summary %q, the lean corral shows %q", parent, c.Name(), c.Short, short)
				}
			}()
		}
	}
}
