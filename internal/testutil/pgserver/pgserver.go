// Package pgserver runs a real PostgreSQL server for tests: the gateway's
// store tests use it through its unix socket, the end-to-end tests put it
// behind a lab address for clients inside a sandbox.
package pgserver

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Server is a PostgreSQL server listening on its unix socket in Dir (and,
// after EnableTLS, on a loopback port), with trust authentication for the
// user postgres.
type Server struct {
	Dir  string // data/, the socket and the log live here
	bin  string // directory of initdb, pg_ctl
	cred *syscall.Credential
	port int // set by EnableTLS; 0 is PostgreSQL's 5432
}

// portOr5432 is the port the server listens on (its socket's name).
func (s *Server) portOr5432() int {
	if s.port == 0 {
		return 5432
	}
	return s.port
}

// pgDirPrefix names the server directories in the temp dir, so a run can
// find and remove what a crashed run left behind.
const pgDirPrefix = "corral-pgtest-"

// Start initialises and starts a server of the newest installed major
// version, run as the postgres (or nobody) user when the caller is root.
// When PostgreSQL is not installed it returns why, and no error, so the
// caller can skip (or fail on CI).
func Start() (*Server, string, error) {
	bin := Bin()
	if bin == "" {
		return nil, "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb)", nil
	}
	s := &Server{bin: bin}
	removeStalePostgres(s.bin)

	dir, err := os.MkdirTemp("", pgDirPrefix)
	if err != nil {
		return nil, "", err
	}
	s.Dir = dir
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, "", err
	}
	// PostgreSQL refuses to run as root: run it as its own system user.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return nil, "", fmt.Errorf("no unprivileged user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, "", err
		}
	}
	data := filepath.Join(dir, "data")
	if err := s.run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		s.remove()
		return nil, "", err
	}
	// Unix socket only; durability is not what these tests check.
	conf := fmt.Sprintf("listen_addresses = ''\nunix_socket_directories = '%s'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n", dir)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.remove()
		return nil, "", err
	}
	if err := s.run("pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		s.remove()
		return nil, "", fmt.Errorf("%w\nserver log:\n%s", err, log)
	}
	return s, "", nil
}

// Bin is the program directory of the newest installed major version (the
// one Debian's wrappers in /usr/bin run), or "" when none is installed.
func Bin() string {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return ""
	}
	// Numerically: 10 after 9.
	sort.Slice(bins, func(i, j int) bool { return pgMajor(bins[i]) < pgMajor(bins[j]) })
	return filepath.Dir(bins[len(bins)-1])
}

func pgMajor(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// run runs one of the server's tools as the server's user.
func (s *Server) run(tool string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, tool), args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", tool, err, out)
	}
	return nil
}

// EnableTLS restarts the server listening on a loopback TCP port too (it
// offers TLS on TCP only, never on its unix socket), with the certificate
// and key given (PEM), and returns that port's address.
func (s *Server) EnableTLS(certPEM, keyPEM []byte) (string, error) {
	data := filepath.Join(s.Dir, "data")
	for name, b := range map[string][]byte{"server.crt": certPEM, "server.key": keyPEM} {
		p := filepath.Join(data, name)
		// The server refuses a key others may read.
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return "", err
		}
		if s.cred != nil {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return "", err
			}
		}
	}
	// A port free now; the socket's name follows it (.s.PGSQL.PORT).
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return "", err
	}
	_, err = fmt.Fprintf(f, "ssl = on\nlisten_addresses = '127.0.0.1'\nport = %d\n", port)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := s.run("pg_ctl", "-D", data, "-l", filepath.Join(s.Dir, "server.log"), "-w", "-t", "60", "-m", "fast", "restart"); err != nil {
		return "", err
	}
	s.port = port
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// Stop stops the server at once and removes its directory.
func (s *Server) Stop() {
	if err := s.run("pg_ctl", "-D", filepath.Join(s.Dir, "data"), "stop", "-m", "immediate"); err != nil {
		fmt.Fprintln(os.Stderr, "stop PostgreSQL:", err)
	}
	s.remove()
}

func (s *Server) remove() {
	if err := os.RemoveAll(s.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "remove PostgreSQL test directory:", err)
	}
}

// removeStalePostgres stops and removes the servers of test binaries that
// died before their TestMain could (a timeout, a kill), leaving alone those
// of runs still going (a test binary's TestMain, a test's cleanup).
func removeStalePostgres(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), pgDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		stale := &Server{bin: bin, Dir: dir}
		if fi, err := os.Stat(dir); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
				stale.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			stale.run("pg_ctl", "-D", filepath.Join(dir, "data"), "stop", "-m", "immediate")
		}
		stale.remove()
	}
}

// URL is a connection URL for database db over the unix socket.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres:///%s?host=%s&port=%d&user=postgres", db, s.Dir, s.portOr5432())
}
