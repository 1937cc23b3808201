package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// writeEtcFiles writes the files the plan mounts on the host's resolv.conf,
// hosts and browser configuration directories. The hosts file is written
// even when the plan does not mount it (the policy hides /etc): it is
// small, and the plan need not be asked.
func (s *supervisor) writeEtcFiles() error {
	if c := s.Plan.Network.Capture; c != nil {
		conf := fmt.Sprintf("# written by corral: every DNS query is answered by the sandbox's resolver\nnameserver %s\n", c.Addr)
		if err := writeReadable(statedir.ResolvConf(s.StateDir, s.ID), []byte(conf)); err != nil {
			return fmt.Errorf("write resolv.conf: %w", err)
		}
		if err := s.writeBrowserConfig(s.egress.BrowserPolicy()); err != nil {
			return err
		}
	}
	hosts, err := sandboxHosts("/etc/hosts", s.Plan.Hostname)
	if err != nil {
		return err
	}
	if err := writeReadable(statedir.Hosts(s.StateDir, s.ID), hosts); err != nil {
		return fmt.Errorf("write hosts: %w", err)
	}
	return nil
}

// sandboxHosts is the sandbox's /etc/hosts: the host's file at path plus
// the sandbox's own name. The host's entries stay: the sandbox saw them
// before this file covered them, and a name there decides nothing about
// egress. Only a file everyone may read, as the copy is: the workload
// reads it as another user, and what it could not read it must not get
// here.
func sandboxHosts(path, hostname string) ([]byte, error) {
	host, err := readWorldReadable(path)
	if err != nil {
		return nil, fmt.Errorf("read the host's %s: %w", path, err)
	}
	if len(host) == 0 {
		// Not the host's entries, but localhost must still resolve: with
		// "files dns" it would otherwise go to the resolver.
		host = []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	}
	if host[len(host)-1] != '\n' {
		host = append(host, '\n')
	}
	return fmt.Appendf(host, "# added by corral: the sandbox's own name\n%s\t%s\n", plan.HostnameAddr, hostname), nil
}

// readWorldReadable returns the file at path if everyone may read it, and
// nothing (no error) if it is missing, private or unreadable to corral.
func readWorldReadable(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Mode().Perm()&0o004 == 0 || !fi.Mode().IsRegular() {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, 1<<20))
}
