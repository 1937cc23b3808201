package sandbox

import (
	"errors"
	"fmt"
	"os"

	"github.com/corral-sandbox/corral/internal/control"
)

// allowControl admits control clients of this user (or root) that live in
// the supervisor's own pid namespace, which no sandbox's process does: each
// sandbox has a pid namespace of its own that its processes cannot leave.
// Rootless, every sandbox runs with the user's uid, so the uid alone would
// let a workload that reaches some sandbox's socket (its own, or another's
// through a policy path) change that sandbox's policy.
func (s *supervisor) allowControl(p control.Peer) error {
	if p.UID != os.Getuid() && p.UID != 0 {
		return fmt.Errorf("uid %d may not control a sandbox of uid %d", p.UID, os.Getuid())
	}
	own, err := control.OwnPIDNamespace()
	if err != nil {
		return fmt.Errorf("pid namespace of corral: %w", err)
	}
	if p.PIDNamespace != own {
		return errors.New("a process inside a sandbox may not control one")
	}
	return nil
}

// Status implements control.Handler.
func (s *supervisor) Status() control.Status {
	snap := s.Policy.Current()
	return control.Status{
		ID: s.ID, Session: s.Session, PID: s.pid, InitPID: s.cmd.Process.Pid,
		Argv: s.Argv, Workdir: s.Plan.Workdir,
		PolicySHA256: snap.Policy.SHA256, PolicyVersion: snap.Version,
		NetworkMode: s.Plan.Network.Mode, Started: s.start,
	}
}

// SetPolicy implements control.Handler through the sandbox's reloader.
func (s *supervisor) SetPolicy(yaml []byte, source string) error {
	return s.Policy.Set(yaml, source)
}
