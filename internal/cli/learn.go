package cli

import (
	"fmt"
	"io"

	"github.com/corral-sandbox/corral/internal/policy"
)

// learnMode turns learn mode on for --learn and, whether the flag or the
// policy asked for it, warns loudly: the sandbox's network is then open
// to every public destination.
func learnMode(p *policy.Policy, flag bool, stderr io.Writer) error {
	if flag {
		if mode := p.NetworkMode(); mode != policy.ModeProxy {
			return fmt.Errorf("--learn needs network mode proxy; the policy's is %s", mode)
		}
		p.Network.Learn = true
	}
	if p.Network.Learn {
		fmt.Fprint(stderr, `corral: WARNING: LEARN MODE. Connections no policy allows are let through (internal
corral: addresses stay refused) and recorded as "decision: learn". This sandbox's
corral: network is open. Review what it needed with "corral draft", keep it with
corral: "corral draft approve --all", then run again without learn mode.
`)
	}
	return nil
}
