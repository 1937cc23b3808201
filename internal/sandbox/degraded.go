package sandbox

import (
	"fmt"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/plan"
)

// The what field of sandbox.protection_degraded: which protection a run
// goes without. Users filter on these, so they never change meaning.
const (
	// degradedLandlock: Landlock is not enforced (best_effort on a kernel
	// without it); the mount namespace alone confines the filesystem.
	degradedLandlock = "landlock"
	// degradedExecTracking: forks and execs cannot be followed, so a
	// process forked before its parent exec'd an allowed binary is
	// identified as that binary by the network policy.
	degradedExecTracking = "exec_tracking"
)

// degradation is protection the policy asks for that this host cannot give,
// so the run goes on without it (best_effort) instead of failing.
type degradation struct{ what, reason string }

// planDegradations lists what the plan already gives up. A hard_requirement
// never gets here: building its plan fails instead.
func planDegradations(p *plan.Plan) []degradation {
	var out []degradation
	if p.Landlock.ABI == 0 {
		out = append(out, degradation{degradedLandlock,
			fmt.Sprintf("Landlock is unavailable on this kernel (landlock.compatibility: %s): the filesystem is confined by the mount namespace only", p.Landlock.Compatibility)})
	}
	return out
}

// degraded records in the audit trail, not only in the log, that this run
// is less confined than its policy reads, so a run that silently lost a
// layer can be told from one that had it.
func (s *supervisor) degraded(d degradation) {
	s.Audit.Log(audit.SandboxDegradedEvent{What: d.what, Reason: d.reason})
}
