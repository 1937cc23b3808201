package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
	"github.com/corral-sandbox/corral/internal/testutil/pgserver"
)

// Real servers on the lab, reached by their real clients inside the
// sandbox: PostgreSQL with psql, OpenSSH's sshd with ssh, scp, sftp and
// git. Each policy names the one program allowed to connect, so the runs
// also show binary identity working for programs started through wrappers
// (psql is a Perl script that runs the versioned binary) and as children of
// other tools (scp, sftp and git run ssh).

var (
	addrDB  = netip.MustParseAddr("203.0.113.50")
	addrSSH = netip.MustParseAddr("203.0.113.51")
)

// relay copies bytes between a lab connection and the server at addr on
// the host: the PostgreSQL server runs outside the lab namespace, so it
// never binds to a lab address.
func relay(addr string, conns *atomic.Int64) func(net.Conn) {
	return func(c net.Conn) {
		conns.Add(1)
		u, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return
		}
		defer u.Close()
		deadline := time.Now().Add(time.Minute)
		_ = c.SetDeadline(deadline)
		_ = u.SetDeadline(deadline)
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
		<-done
	}
}

const psqlScript = `#!/bin/bash
export PGCONNECT_TIMEOUT=10
echo "=== psql"
psql -X -At -v ON_ERROR_STOP=1 "host=db.test port=5432 user=postgres dbname=postgres" \
  -c "CREATE TEMP TABLE notes (body text)" \
  -c "INSERT INTO notes VALUES ('written from the sandbox')" \
  -c "SELECT 'ROW ' || body FROM notes" \
  -c "SELECT 'SERVER ' || current_setting('server_version_num')" 2>&1
echo "PSQL_RC=$?"
echo "=== psql-tls"
# TLS after PostgreSQL's own SSLRequest, verified against the lab's CA:
# corral carries it as bytes, untouched.
psql -X -At -v ON_ERROR_STOP=1 "host=db.test port=5432 user=postgres dbname=postgres sslmode=verify-full sslrootcert=$W/lab-ca.pem" \
  -c "SELECT 'TLS ' || ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()" 2>&1
echo "=== python3"
python3 - <<'EOF' 2>&1
import socket
try:
    s = socket.create_connection(("db.test", 5432), timeout=10)
    s.settimeout(10)
    s.sendall(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")  # SSLRequest
    print("PY_GOT", s.recv(1))
except OSError as e:
    print("PY_ERR", e)
EOF
`

func TestPostgreSQLClient(t *testing.T) {
	requireRoot(t)
	psql := filepath.Join(pgserver.Bin(), "psql")
	if _, err := os.Stat(psql); err != nil {
		requireFeature(t, "PostgreSQL's psql is not installed (Debian's postgresql-client)")
	}
	for _, tool := range []string{"/usr/bin/psql", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			requireFeature(t, tool+" is not installed")
		}
	}
	srv, skip, err := pgserver.Start()
	switch {
	case err != nil:
		t.Fatalf("start PostgreSQL: %v", err)
	case skip != "":
		requireFeature(t, skip)
	}
	t.Cleanup(srv.Stop)
	lab := netlab.Start(t, netlab.Host{Name: "db.test", Addr: addrDB})
	// TLS is offered on TCP only: the lab relays to a loopback port.
	pgAddr, err := srv.EnableTLS(lab.ServerCert(t, "db.test"))
	if err != nil {
		t.Fatalf("PostgreSQL with TLS: %v", err)
	}
	var conns atomic.Int64
	lab.ServeTCP(t, addrDB, 5432, relay(pgAddr, &conns))

	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "pg.sh"), []byte(psqlScript), 0o755)
		writeOwned(t, m, filepath.Join(fx.W, "lab-ca.pem"), lab.CAPEM, 0o644)
		before := conns.Load()
		r := runCorral(t, fx, runOpts{
			args: []string{"/usr/bin/bash", filepath.Join(fx.W, "pg.sh")},
			policy: basePolicy(`network_policies:
  db:
    endpoints: [{host: db.test, port: 5432}]
    binaries: [{path: ` + psql + `}]
`),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W},
			timeout: 90 * time.Second,
		})
		out := sections(r.stdout)
		if !strings.Contains(out["psql"], "ROW written from the sandbox") || !strings.Contains(out["psql"], "PSQL_RC=0") {
			t.Fatalf("psql did not write and read a row on the lab's PostgreSQL\n%s", r)
		}
		if !strings.Contains(out["psql"], "SERVER ") {
			t.Errorf("psql did not report the server's version\n%s", r)
		}
		if !strings.Contains(out["psql-tls"], "TLS true\n") {
			t.Errorf("psql over TLS, verifying the server's certificate, did not get through\n%s", r)
		}
		r.requireEvent(t, "net.connect.allowed", map[string]any{"host": "db.test", "port": 5432, "binary": psql, "policy": "db"})
		// python3 is not the policy's binary: refused, and nothing of it
		// reaches the server.
		r.requireEvent(t, "net.connect.denied", map[string]any{"host": "db.test", "port": 5432, "reason": "binary_not_allowed"})
		if strings.Contains(out["python3"], "PY_GOT b'N'") {
			t.Errorf("python3's SSLRequest was answered by the server\n%s", r)
		}
		if got, want := conns.Load()-before, int64(len(findEvents(r, "net.connect.allowed", map[string]any{"host": "db.test"}))); got != want {
			t.Errorf("the lab's PostgreSQL saw %d connections, the audit log allowed %d\n%s", got, want, r)
		}
	})
}

// labSSHD runs the host's sshd in inetd mode (-i) for every connection to
// ssh.test:22. Its forced command serves sftp, git-upload-pack of one
// repository and, for anything else, echoes the command: a client in the
// sandbox never gets a shell on the test machine.
type labSSHD struct {
	dir       string // config, keys and served files
	hostPub   []byte
	clientKey []byte // private key the sandbox logs in with
	mu        sync.Mutex
	log       bytes.Buffer // sshd's stderr
}

func startLabSSHD(t *testing.T, lab *netlab.Lab) *labSSHD {
	t.Helper()
	for _, tool := range []string{"/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/scp", "/usr/bin/sftp", "/usr/bin/ssh-keygen", "/usr/lib/openssh/sftp-server", "/usr/bin/git"} {
		if _, err := os.Stat(tool); err != nil {
			requireFeature(t, tool+" is not installed (Debian's openssh-server, openssh-client and git)")
		}
	}
	// sshd's privilege separation directory; the Debian service creates it
	// at boot, which a machine without init never ran.
	if _, err := os.Stat("/run/sshd"); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove("/run/sshd") })
	}
	s := &labSSHD{dir: t.TempDir()}
	keygen := func(name string) {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", filepath.Join(s.dir, name)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	keygen("host_key")
	keygen("client_key")
	var err error
	if s.hostPub, err = os.ReadFile(filepath.Join(s.dir, "host_key.pub")); err != nil {
		t.Fatal(err)
	}
	if s.clientKey, err = os.ReadFile(filepath.Join(s.dir, "client_key")); err != nil {
		t.Fatal(err)
	}
	clientPub, err := os.ReadFile(filepath.Join(s.dir, "client_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	files := filepath.Join(s.dir, "files")
	repo := filepath.Join(s.dir, "repo.git")
	for p, body := range map[string]string{
		"authorized_keys":  string(clientPub),
		"files/served.txt": "served by the lab's sshd\n",
		"shell": `#!/bin/sh
case "$SSH_ORIGINAL_COMMAND" in
/usr/lib/openssh/sftp-server) exec /usr/lib/openssh/sftp-server -d ` + files + ` ;;
"git-upload-pack '/repo.git'") exec git-upload-pack ` + repo + ` ;;
*) echo "lab sshd ran: $SSH_ORIGINAL_COMMAND" ;;
esac
`,
		"sshd_config": "HostKey " + filepath.Join(s.dir, "host_key") + `
AuthorizedKeysFile ` + filepath.Join(s.dir, "authorized_keys") + `
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
Subsystem sftp /usr/lib/openssh/sftp-server
ForceCommand ` + filepath.Join(s.dir, "shell") + `
LogLevel ERROR
`,
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(s.dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.dir, p), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	work := filepath.Join(s.dir, "repo-work")
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", work},
		{"-C", work, "-c", "user.name=lab", "-c", "user.email=lab@lab.test", "commit", "-q", "--allow-empty", "-m", "cloned over ssh"},
		{"clone", "-q", "--bare", work, repo},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	lab.ServeTCP(t, addrSSH, 22, func(c net.Conn) {
		f, err := c.(*net.TCPConn).File()
		if err != nil {
			return
		}
		defer f.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/usr/sbin/sshd", "-i", "-e", "-f", filepath.Join(s.dir, "sshd_config"))
		cmd.Stdin, cmd.Stdout = f, f
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		s.mu.Lock()
		s.log.Write(stderr.Bytes())
		s.mu.Unlock()
	})
	return s
}

func (s *labSSHD) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "--- lab sshd:\n" + s.log.String()
}

const sshScript = `#!/bin/bash
cd "$W" || exit 99
export GIT_SSH_COMMAND="ssh -F $W/ssh_config"
echo "=== ssh"
ssh -F ssh_config ssh.test hello from the sandbox 2>&1; echo "SSH_RC=$?"
echo "=== scp"
scp -F ssh_config ssh.test:served.txt fetched-by-scp.txt 2>&1; echo "SCP_RC=$?"; cat fetched-by-scp.txt
echo "=== sftp"
echo "uploaded by sftp" > up.txt
printf 'put up.txt from-sandbox.txt\nget from-sandbox.txt roundtrip.txt\n' | sftp -F ssh_config -b - ssh.test 2>&1; echo "SFTP_RC=$?"; cat roundtrip.txt
echo "=== git"
git clone -q ssh.test:/repo.git clone 2>&1; echo "GIT_RC=$?"; git -C clone log --format='LOG %s' 2>&1
echo "=== curl"
curl -sS --max-time 5 telnet://ssh.test:22 </dev/null 2>&1 | head -c 200; echo
`

func TestOpenSSHClients(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t, netlab.Host{Name: "ssh.test", Addr: addrSSH})
	sshd := startLabSSHD(t, lab)

	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "ssh.sh"), []byte(sshScript), 0o755)
		writeOwned(t, m, filepath.Join(fx.W, "id_lab"), sshd.clientKey, 0o600)
		writeOwned(t, m, filepath.Join(fx.W, "known_hosts"), append([]byte("ssh.test "), sshd.hostPub...), 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "ssh_config"), []byte(`Host ssh.test
  User root
  IdentityFile `+filepath.Join(fx.W, "id_lab")+`
  IdentitiesOnly yes
  UserKnownHostsFile `+filepath.Join(fx.W, "known_hosts")+`
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
`), 0o644)
		r := runCorral(t, fx, runOpts{
			args: []string{"/usr/bin/bash", filepath.Join(fx.W, "ssh.sh")},
			policy: basePolicy(`network_policies:
  lab_ssh:
    endpoints: [{host: ssh.test, port: 22}]
    binaries: [{path: /usr/bin/ssh}]
`),
			flags:   []string{"--upstream-dns", lab.DNS.String(), "--env", "W=" + fx.W},
			timeout: 2 * time.Minute,
		})
		out := sections(r.stdout)
		for _, c := range []struct{ section, want, what string }{
			{"ssh", "lab sshd ran: hello from the sandbox", "ssh did not run a command on the lab's sshd"},
			{"ssh", "SSH_RC=0", "ssh failed"},
			{"scp", "served by the lab's sshd", "scp did not fetch a file"},
			{"sftp", "uploaded by sftp", "sftp did not put and get back a file"},
			{"git", "LOG cloned over ssh", "git did not clone over ssh"},
		} {
			if !strings.Contains(out[c.section], c.want) {
				t.Errorf("%s\n%s\n%s", c.what, r, sshd)
			}
		}
		r.requireEvent(t, "net.connect.allowed", map[string]any{"host": "ssh.test", "port": 22, "binary": "/usr/bin/ssh", "policy": "lab_ssh"})
		// curl is not the policy's binary: refused before any byte of the
		// server's banner reaches it.
		r.requireEvent(t, "net.connect.denied", map[string]any{"host": "ssh.test", "port": 22, "binary": "/usr/bin/curl", "reason": "binary_not_allowed"})
		if strings.Contains(out["curl"], "SSH-2.0") {
			t.Errorf("curl, which the policy does not allow, read the sshd's banner\n%s", r)
		}
	})
}
