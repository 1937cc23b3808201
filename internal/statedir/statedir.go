// Package statedir names the places corral keeps host state, so that the
// code creating them, the plan describing them and the sweeper removing them
// agree on one layout:
//
//	<state>/audit.log                      default audit log
//	<state>/bin/                           programs corral carries (the init, the full program)
//	<state>/java-roots/                    the host's CA roots as Java trust stores
//	<state>/writable                       directories sandboxes could write
//	<state>/run/<id>/                      one live sandbox (lock, root mountpoint)
//	<state>/run/<id>/control.sock          the sandbox's control socket
//	<state>/run/<id>/resolv.conf           /etc/resolv.conf in proxy mode
//	<state>/run/<id>/hosts                 /etc/hosts: the host's, plus the sandbox's name
//	<state>/run/<id>/browser/<dir>         a browser's /etc directory, plus a policy trusting the CA
//	<state>/run/<id>/scratch               /scratch for state: ephemeral
//	<state>/sessions/<session>/scratch     /scratch for state: scratch
package statedir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Owned refuses what corral runs or trusts from its state directory unless
// it is owned by our uid, is a directory or a regular file, and has none of
// the mode bits in forbidden: nobody else may have put it there or be able
// to change it.
func Owned(path string, st fs.FileInfo, forbidden fs.FileMode) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not owned by uid %d: remove it and let corral write it again", path, os.Geteuid())
	}
	if st.Mode().Perm()&forbidden != 0 || (!st.IsDir() && !st.Mode().IsRegular()) {
		return fmt.Errorf("%s has mode %v: remove it and let corral write it again", path, st.Mode())
	}
	return nil
}

// OwnedDir checks the directory at dir as Owned does; a dir that is missing
// is an error wrapping fs.ErrNotExist, and a symlink is not a directory.
func OwnedDir(dir string, forbidden fs.FileMode) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory: remove it and let corral make it again", dir)
	}
	return Owned(dir, st, forbidden)
}

// Default is /var/lib/corral for root and $XDG_STATE_HOME/corral
// (~/.local/state/corral) for everyone else.
func Default() string {
	if os.Geteuid() == 0 {
		return "/var/lib/corral"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "corral")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf("corral-%d", os.Getuid()))
	}
	return filepath.Join(home, ".local", "state", "corral")
}

// Bin holds programs corral carries and runs from disk (the sandbox's init).
func Bin(state string) string { return filepath.Join(state, "bin") }

// IDMapProbes remembers the mounts found to take idmapped bind mounts.
func IDMapProbes(state string) string { return filepath.Join(state, "idmap-probes") }

// JavaRoots keeps the host's CA roots as Java trust stores, so that a
// sandbox's store is not decoded from PEM on every start.
func JavaRoots(state string) string { return filepath.Join(state, "java-roots") }

// AuditLog is the default audit log.
func AuditLog(state string) string { return filepath.Join(state, "audit.log") }

// Runs holds one directory per live sandbox.
func Runs(state string) string { return filepath.Join(state, "run") }

// Run is one sandbox's directory.
func Run(state, id string) string { return filepath.Join(Runs(state), id) }

// Control is the sandbox's control socket.
func Control(state, id string) string { return filepath.Join(Run(state, id), "control.sock") }

// ResolvConf is the sandbox's /etc/resolv.conf in proxy mode.
func ResolvConf(state, id string) string { return filepath.Join(Run(state, id), "resolv.conf") }

// Hosts is the sandbox's /etc/hosts.
func Hosts(state, id string) string { return filepath.Join(Run(state, id), "hosts") }

// Browser holds the copies of browsers' configuration directories (their
// host paths below it) that trust the sandbox CA in proxy mode.
func Browser(state, id string) string { return filepath.Join(Run(state, id), "browser") }

// TLS holds the sandbox CA certificate and the combined bundle in proxy
// mode (never the CA's key, which stays in the supervisor's memory).
func TLS(state, id string) string { return filepath.Join(Run(state, id), "tls") }

// Ephemeral is /scratch for state: ephemeral, removed with the run.
func Ephemeral(state, id string) string { return filepath.Join(Run(state, id), "scratch") }

// Session is /scratch for state: scratch, kept across runs of a session.
func Session(state, session string) string {
	return filepath.Join(state, "sessions", session, "scratch")
}
