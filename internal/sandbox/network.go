package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/corral-sandbox/corral/internal/advisor/policylocal"
	"github.com/corral-sandbox/corral/internal/egress/assemble"
	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/sandbox/initproc"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// writeCA puts the CA certificate and the combined bundle where the plan
// mounts them inside the sandbox, and starts writing the Java trust store
// there; the returned wait reports when that is done. The directory is
// bind-mounted, so the store only has to exist before the workload runs.
func (s *supervisor) writeCA() (wait func() error, err error) {
	dir := statedir.TLS(s.StateDir, s.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CA directory: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone, and the umask
	// may have narrowed a new one; the workload's user must read it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("CA directory: %w", err)
	}
	for name, parts := range s.egress.TrustFiles() {
		err := writeFile(filepath.Join(dir, name), func(w io.Writer) error {
			for _, p := range parts {
				if _, err := w.Write(p); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("write sandbox CA: %w", err)
		}
	}
	// The plan mounts this directory at /run/corral: the policy advisor's
	// skill file for agents lands at policylocal.SkillPath.
	skills := filepath.Join(dir, "skills")
	if err := os.MkdirAll(skills, 0o755); err != nil {
		return nil, fmt.Errorf("create skills directory: %w", err)
	}
	if err := os.Chmod(skills, 0o755); err != nil {
		return nil, fmt.Errorf("skills directory: %w", err)
	}
	if err := writeReadable(filepath.Join(skills, filepath.Base(policylocal.SkillPath)), policylocal.Skill); err != nil {
		return nil, fmt.Errorf("write policy advisor skill: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		err := writeFile(filepath.Join(dir, assemble.JavaTrustStoreFile), func(w io.Writer) error {
			bw := bufio.NewWriterSize(w, 32<<10)
			if err := s.egress.JavaTrustStore(bw, statedir.JavaRoots(s.StateDir)); err != nil {
				return err
			}
			return bw.Flush()
		})
		if err != nil {
			err = fmt.Errorf("write the Java trust store: %w", err)
		}
		done <- err
	}()
	return func() error { return <-done }, nil
}

// writeFile writes what write produces to a new file at path, straight
// from where it is: set-up's heap is kept small, so that no garbage
// collection runs as the workload starts (GODEBUG=gctrace=1). The file is
// 0644 whatever the umask: the workload reads it as another user.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	return errors.Join(f.Chmod(0o644), write(f), f.Close())
}

// writeReadable writes data to path as writeFile does.
func writeReadable(path string, data []byte) error {
	return writeFile(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// startEgress starts the policy advisor, takes the listeners of the
// sandbox's network namespace (from the launcher, or from the init where
// the init made them) and has the egress serve them until ctx ends.
func (s *supervisor) startEgress(ctx context.Context, sup *os.File, ln *launcher) error {
	// The advisor needs no listener, and reading the session's drafts takes
	// milliseconds: it starts while the init builds the root and the
	// capture, not after.
	s.startAdvisor(ctx)
	s.Trace.Step("policy advisor started (the session's drafts read)")
	var l *capture.Listeners
	var err error
	if ln.prepares {
		l, err = ln.network()
	} else {
		l, err = receiveListeners(sup)
	}
	if err != nil {
		return err
	}
	if !l.IPv6 {
		s.Log.Info("IPv6 is not available inside the sandbox", "reason", l.NoIPv6Reason)
	}
	return s.egress.Start(ctx, assemble.Sandbox{Listeners: l, InitPID: s.cmd.Process.Pid, Execs: s.execs, Connects: s.connects})
}

// receiveListeners takes the listeners the init created inside the
// sandbox's network namespace.
func receiveListeners(sup *os.File) (*capture.Listeners, error) {
	m, files, err := initproc.RecvFDs(sup)
	if err != nil {
		return nil, fmt.Errorf("receive network listeners from sandbox init: %w", err)
	}
	if m.Type == initproc.MsgError {
		return nil, &initproc.StepError{Step: m.Step, Code: m.Code, Err: errors.New(m.Error)}
	}
	if m.Type != initproc.MsgNetwork {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("sandbox init sent %q instead of its network listeners", m.Type)
	}
	l, err := capture.FromFiles(files)
	if err != nil {
		return nil, fmt.Errorf("network listeners: %w", err)
	}
	return l, nil
}
