package assemble

import (
	"net"

	"github.com/corral-sandbox/corral/internal/egress"
)

// SetAdvice has refusals (403 bodies, denial events) name the pending
// policy chunk a has for them. Call it before Start.
func (e *Egress) SetAdvice(a egress.Advice) { e.advice = a }

// Resolver is the resolver the egress dials allowed names with (the
// policy advisor's DNS probe asks the same one).
func (e *Egress) Resolver() *net.Resolver { return e.dial.Resolver }

// Rules are the decision rules the egress runs (--policy-rules), nil for
// the built-in ones; the policy advisor checks its drafts with the same.
func (e *Egress) Rules() []byte { return e.cfg.Rules }
